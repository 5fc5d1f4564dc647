"""The `suite` command line: one subcommand per module in suite/commands/ (each: NAME, HELP, add_arguments,
run), listed here. This file only dispatches and turns SuiteError into a one-line message and exit status 2."""

from __future__ import annotations

import argparse
import signal
import sys

from suite import __version__
from suite.commands import (
    build,
    compare,
    demo,
    doctor,
    fetch,
    history,
    init,
    kernel,
    patches,
    plan,
    report,
    run,
    slurm_scripts,
    validate,
)
from suite.errors import SuiteError
from suite.proc import signals_as_interrupt

COMMANDS = (build, compare, demo, doctor, fetch, history, init, kernel, patches, plan, report, run, slurm_scripts,
            validate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="suite", description="Baseline-vs-patched vLLM router-gate benchmarks, end to end."
    )
    parser.add_argument("--version", action="version", version=f"suite {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in sorted(COMMANDS, key=lambda m: m.NAME):
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # a run started in the background (`cmd &`, setsid, nohup) inherits SIGINT ignored: take it back, and
    # let SIGTERM / SIGHUP end a run the way Ctrl-C does (servers stopped, GPU memory freed, manifest written)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with signals_as_interrupt():
            return int(args._run(args) or 0)
    except SuiteError as exc:
        print(f"suite {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"suite {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
