from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from suite import REPO_ROOT

NAME = "demo"
HELP = "The embedded default: generate the tiny MoE if missing and run matrices/smoke-cpu.yaml on the CPU."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", type=Path, default=REPO_ROOT / "matrices" / "smoke-cpu.yaml")
    p.add_argument("--model-dir", type=Path, default=REPO_ROOT / "models" / "tiny-moe")
    p.add_argument("--out", type=Path, default=Path("runs"))


def run(args: argparse.Namespace) -> int:
    from suite.commands.run import say_report
    from suite.fixtures.tiny_moe import generate_tiny_moe, is_tiny_moe
    from suite.runner import execute, prepare

    console = Console()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    if not is_tiny_moe(args.model_dir):
        console.print(f"generating the tiny MoE model in {args.model_dir} (random weights, local tokenizer)")
        generate_tiny_moe(args.model_dir)
    timings["model"] = time.monotonic() - t0
    t0 = time.monotonic()
    ctx = prepare(args.matrix, args.out, None, console)
    timings["prepare arms"] = time.monotonic() - t0
    console.print(f"run directory: {ctx.store.root}")
    t0 = time.monotonic()
    counts = execute(ctx)
    timings["run (servers + benches)"] = time.monotonic() - t0
    t0 = time.monotonic()
    say_report(ctx.store.root, console)  # as `suite run` ends: the words and the paths, not the report
    timings["report"] = time.monotonic() - t0
    console.print("wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    console.print(counts.line())
    return 0 if counts.all_ok else 1
