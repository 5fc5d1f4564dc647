"""How long does one restart set of the demo take to start? Every serving arm of `matrices/smoke-cpu.yaml`
started at once, as `order: interleaved` starts them (the suite's own runtime, overlays, CPU split and serve
arguments), timed to the last /health, in three ways:

- shipped: the demo's serve arguments (`--kv-cache-memory-bytes 64M`), each server on every CPU until it answers
  and then narrowed to the server's CPUs (`LocalServer.serving`);
- kv-64M-pinned: the same, each server pinned to the server's CPUs from its first instruction (the suite before
  2026-12-05);
- kv-1GiB-pinned: pinned from the start and the KV cache of the suite's CPU default (VLLM_CPU_KVCACHE_SPACE=1
  instead of the flag).

The three take turns in a mirrored order (a b c c b a per round), so a drifting machine weighs on each alike.

    .venv/bin/python benchmarks/server_starts/together.py --rounds 1

Prints each start, each way's median and its ratio to the shipped one, and the load average before and after:
run it with nothing else on the machine, and again when the load before was above 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.proc import cpu_list, load_average
from suite.runtime.base import free_port, wait_healthy
from suite.runtime.local import KV_BYTES_FLAG, KV_SPACE_VAR, LocalRuntime
from suite.sessions import server_argv_tail
from suite.stages.serve.client import without_flag
from suite.store import ArmDirs

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "matrices" / "smoke-cpu.yaml"


VARIANTS = ("shipped", "kv-64M-pinned", "kv-1GiB-pinned")


def start_set(runtime: LocalRuntime, matrix, plan, envs: dict, out: Path, variant: str) -> float:
    """Start every serving arm's server at once; seconds until the last answers /health (then stop them)."""
    servers = []
    for arm in envs:
        port = free_port()
        tail = server_argv_tail(matrix, arm, plan, port)
        extra = {**matrix.env, **plan.arms[arm].env}
        if variant == "kv-1GiB-pinned":
            tail, extra = without_flag(tail, KV_BYTES_FLAG), {**extra, KV_SPACE_VAR: "1"}
        spec = runtime.server_spec(envs[arm], argv_tail=tail, extra_env=extra, dirs=ArmDirs.in_run(out, arm),
                                   log_path=out / arm / f"server-{variant}.log", port=port, redact=[])
        if variant != "shipped" and spec.cpus:  # pinned before Python starts, as taskset does
            spec = dataclasses.replace(spec, argv=["taskset", "-c", cpu_list(spec.cpus), *spec.argv])
        servers.append(runtime.server(spec))
    t0 = time.monotonic()
    try:
        for s in servers:
            s.start()
        failures = wait_healthy(servers)
        took = time.monotonic() - t0
        if failures:
            raise next(iter(failures.values()))
        return took
    finally:
        for s in servers:
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="mirrored rounds: each way started twice a round")
    ap.add_argument("--out", type=Path, default=REPO / "runs")
    args = ap.parse_args()
    out = args.out / f"starts-together-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True)
    matrix = load_matrix(MATRIX)
    plan = build_plan(matrix)
    runtime = LocalRuntime(matrix, REPO / ".cache")
    serving = [a for a, spec in plan.arms.items() if spec.serving]
    envs = {a: runtime.prepare_arm(a, plan.arms[a]) for a in serving}
    order = [v for _ in range(args.rounds) for v in (*VARIANTS, *reversed(VARIANTS))]
    print(f"{len(serving)} servers at once ({', '.join(serving)}); load before {load_average()}", flush=True)
    took: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i, variant in enumerate(order):
        took[variant].append(start_set(runtime, matrix, plan, envs, out, variant))
        print(f"  start {i + 1}/{len(order)} {variant}: all healthy after {took[variant][-1]:.1f} s", flush=True)
        time.sleep(5)  # the stopped servers' memory back to the host
    med = {v: statistics.median(t) for v, t in took.items()}
    print("median to all healthy: " + ", ".join(
        f"{v} {m:.1f} s" + ("" if v == "shipped" else f" (shipped/{v} {med['shipped'] / m:.2f})")
        for v, m in med.items()) + f"; load after {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
