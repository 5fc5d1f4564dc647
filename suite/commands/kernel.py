"""`suite kernel`: router-gate microbenchmark, one process per arm, then a before -> after table.

Each arm is ``NAME=DIR``: DIR (a directory holding that arm's ``vllm/`` package, e.g. a patched overlay) goes
first on ``PYTHONPATH`` of a fresh ``python -m suite.stages.kernel.bench`` process; an empty DIR uses the vLLM
installed in the interpreter. ``--arm-args NAME=ARGS`` passes extra measure flags to one arm (for instance
``--gate-factory`` or the CPU test aid ``--force-ll-bf16-fake``).

Writes ``OUT/<arm>/kernel.json`` (raw), ``OUT/<arm>/kernel.log``, ``OUT/kernel.md`` and ``OUT/kernel-summary.json``.
Standard library only at import time, so it also runs where the rest of the suite's dependencies are missing:
``python -m suite.commands.kernel ...`` (the GPU machine has no pydantic).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import sys
from pathlib import Path

from suite import REPO_ROOT
from suite.errors import SuiteError
from suite.proc import failure, run_tool
from suite.stages.kernel.bench import DEFAULT_M, DEFAULT_TRACE_M, parse_m_list
from suite.stages.kernel.read import KernelRun
from suite.stages.kernel.summary import comparison_rows, render_kernel_md, render_kernel_text
from suite.store import atomic_write_json

NAME = "kernel"
HELP = "Time the MoE router gate per M in each arm's vLLM tree (guard-free compile, CUDA graphs); path per M."

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SUITE_ROOT = REPO_ROOT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arm",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="arm name and the directory put first on PYTHONPATH (empty: installed vLLM); repeat",
    )
    p.add_argument("--arm-args", action="append", default=[], metavar="NAME=ARGS", help="extra measure flags")
    p.add_argument("--baseline", default=None, help="arm the speedups are relative to (default: first arm)")
    p.add_argument("--out", default=None, help="output directory (default runs/kernel-<utc>)")
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--m", type=parse_m_list, default=DEFAULT_M, help="comma list of M")
    p.add_argument("--trace-m", type=int, default=DEFAULT_TRACE_M)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--trials", type=int, default=101)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="auto")
    p.add_argument("--python", default=sys.executable, help="interpreter for the arm processes")
    p.add_argument(
        "--cache-dir", default=None, help="root of per-arm compile caches (default OUT/<arm>/cache)"
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per arm")


def parse_arms(specs: list[str]) -> list[tuple[str, str]]:
    arms: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not ARM_NAME.match(name):
            raise SuiteError(f"--arm {spec!r}: expected NAME=DIR with NAME of letters, digits, '_', '.', '-'")
        if name in {a for a, _ in arms}:
            raise SuiteError(f"--arm {name!r} given twice")
        if path and not Path(path).is_dir():
            raise SuiteError(f"--arm {name}: {path!r} is not a directory")
        arms.append((name, path))
    return arms


def parse_arm_args(specs: list[str], arm_names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if not sep or name not in arm_names:
            raise SuiteError(f"--arm-args {spec!r}: expected NAME=ARGS for one of the arms {arm_names}")
        out.setdefault(name, []).extend(shlex.split(rest))
    return out


def arm_command(args: argparse.Namespace, name: str, json_path: Path, extra: list[str]) -> list[str]:
    return [
        args.python,
        "-m",
        "suite.stages.kernel.bench",
        "--json",
        str(json_path),
        "--arm",
        name,
        "--hidden",
        str(args.hidden),
        "--experts",
        str(args.experts),
        "--m",
        ",".join(map(str, args.m)),
        "--trace-m",
        str(args.trace_m),
        "--calls",
        str(args.calls),
        "--trials",
        str(args.trials),
        "--warmup",
        str(args.warmup),
        "--backend",
        args.backend,
        "--device",
        args.device,
        *extra,
    ]


def arm_env(path: str, cache_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    parts = [str(Path(path).resolve())] if path else []
    parts.append(str(SUITE_ROOT))
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    # each arm compiles on its own: a shared cache could hand one arm the other's graphs (the cache key does not cover the patched source)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
    env["VLLM_CACHE_ROOT"] = str(cache_root / "vllm")
    env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_arm(args: argparse.Namespace, name: str, path: str, extra: list[str], out: Path) -> KernelRun:
    arm_dir = out / name
    arm_dir.mkdir(parents=True, exist_ok=True)
    json_path = arm_dir / "kernel.json"
    log_path = arm_dir / "kernel.log"
    cache_root = Path(args.cache_dir) / name if args.cache_dir else arm_dir / "cache"
    cmd = arm_command(args, name, json_path, extra)
    print(f"[{name}] {shlex.join(cmd)}", flush=True)
    log_path.unlink(missing_ok=True)
    # its own process group: a timeout or Ctrl-C ends the measurement and every compile worker it started
    run_tool(cmd, env=arm_env(path, cache_root), log_path=log_path, timeout_s=args.timeout,
             what=f"arm {name}: the kernel measurement",
             header=f"# PYTHONPATH first: {path or '(installed vLLM)'}\n# {shlex.join(cmd)}\n")
    if not json_path.exists():
        raise failure(f"arm {name}: the kernel measurement", f"wrote no {json_path.name}", cmd, log_path)
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(f"[kernel:{name}]"):
            print(line, flush=True)
    return KernelRun.model_validate(json.loads(json_path.read_text()))


def run(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arm)
    names = [a for a, _ in arms]
    extra = parse_arm_args(args.arm_args, names)
    baseline = args.baseline or names[0]
    if baseline not in names:
        raise SuiteError(f"--baseline {baseline!r} is not one of the arms {names}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else Path("runs") / f"kernel-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    results = {name: run_arm(args, name, path, extra.get(name, []), out) for name, path in arms}
    print()
    print(render_kernel_text(results, baseline))
    md = render_kernel_md(results, baseline)
    (out / "kernel.md").write_text(md)
    summary = {
        "schema_version": 1,
        "baseline": baseline,
        "arms": {name: {"dir": path or None, "args": extra.get(name, [])} for name, path in arms},
        "rows": [
            {"m": row.m,
             **{arm: (cell.result.model_dump(include={"median_us", "p10_us", "p90_us", "n", "path", "frozen_branch"})
                      if cell.result is not None else dict.fromkeys(("median_us", "p10_us", "p90_us", "n", "path",
                                                                     "frozen_branch")))
                | {"speedup": cell.speedup}
                for arm, cell in row.arms.items()}}
            for row in comparison_rows(results, baseline)
        ],
    }
    atomic_write_json(out / "kernel-summary.json", summary)
    print(f"\nwrote {out / 'kernel.md'} and {out / 'kernel-summary.json'}")
    frozen = {a: r.frozen_branch_ms for a, r in results.items() if r.frozen_branch_ms}
    for a, ms in frozen.items():
        print(f"frozen branch in arm {a} at M = {ms}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suite.commands.kernel", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SuiteError as exc:
        print(f"suite kernel: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
