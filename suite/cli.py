"""The `suite` command line: one subcommand per module in suite/commands/ (each: NAME, HELP, add_arguments,
run). This file only dispatches and turns SuiteError into a one-line message and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from suite import __version__, commands
from suite.errors import SuiteError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="suite", description="Baseline-vs-patched vLLM router-gate benchmarks, end to end."
    )
    parser.add_argument("--version", action="version", version=f"suite {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"suite.commands.{info.name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except SuiteError as exc:
        print(f"suite {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"suite {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
