"""Is the spread between server starts about the start, or about time? One server, one point, measured again
and again for a few minutes; its spread over time set beside the between-start spread of `run.py`.

    .venv/bin/python benchmarks/server_starts/one_server.py --minutes 5

The server is started exactly as the suite starts arm `a` of `matrix.yaml` (same overlay door, environment,
CPU split and serve arguments); the client is the suite's `vllm bench serve` command for the point
isl 128 / osl 32 / concurrency 4, 48 prompts, one warm-up, pinned to the client CPU. If the throughput of one
server wanders over minutes as much as it differs between starts, the spread is the machine's (a shared host),
and no control inside a server start can remove it; if one server stays steady, the start is the cause.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.proc import load_average, run_tool
from suite.runtime.base import free_port
from suite.runtime.local import LocalRuntime, vllm_command
from suite.sessions import server_argv_tail
from suite.stages.serve.run import serve_command
from suite.stages.serve.spec import ServeParams
from suite.store import ArmDirs

REPO = Path(__file__).resolve().parents[2]
MATRIX = Path(__file__).with_name("matrix.yaml")
POINT = ServeParams(isl=128, osl=32, random_range_ratio=0.0, num_prompts=48, concurrency=4, request_rate=None,
                    num_warmups=1, seed=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=REPO / "runs")
    args = ap.parse_args()
    out = args.out / f"one-server-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True)
    matrix = load_matrix(MATRIX)
    plan = build_plan(matrix)
    runtime = LocalRuntime(matrix, REPO / ".cache")
    arm_env = runtime.prepare_arm("a", matrix.arms["a"])
    model = matrix.model_of(matrix.arms["a"])
    port = free_port()
    spec = runtime.server_spec(arm_env, argv_tail=server_argv_tail(matrix, "a", plan, port),
                               extra_env=dict(matrix.env), dirs=ArmDirs.in_run(out, "a"), log_path=out / "server.log",
                               port=port, redact=[])
    client_env = {k: v for k, v in runtime.tool(arm_env, ["vllm"], ArmDirs.in_run(out, "a")).env.items() if k != "PYTHONPATH"}
    rows = []
    print(f"load {load_average()}; server log {out / 'server.log'}", flush=True)
    with runtime.server(spec) as server:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < args.minutes * 60:
            cmd = serve_command(vllm=vllm_command()[0], base_url=server.base_url, served_name=model.served_name,
                                tokenizer=model.tokenizer, params=POINT, result_dir=out, result_filename=f"{i}.json")
            run_tool(cmd, env=client_env, log_path=out / "client.log", timeout_s=300, what="vllm bench serve",
                     cpus=runtime.client_cpus())
            raw = json.loads((out / f"{i}.json").read_text())
            rows.append({"t_s": round(time.monotonic() - t0, 1), "output_throughput": raw["output_throughput"],
                         "median_tpot_ms": raw["median_tpot_ms"]})
            print(f"  t={rows[-1]['t_s']:6.1f} s  {raw['output_throughput']:7.1f} tok/s  "
                  f"TPOT {raw['median_tpot_ms']:.2f} ms", flush=True)
            i += 1
    logs = [math.log(r["output_throughput"]) for r in rows]
    sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    lag = statistics.correlation(logs[:-1], logs[1:]) if len(logs) > 3 else float("nan")
    half = len(logs) // 2
    shift = math.exp(statistics.fmean(logs[half:]) - statistics.fmean(logs[:half])) - 1 if half else float("nan")
    summary = {"runs": len(rows), "cv_over_time_pct": round(100 * math.expm1(sd), 1),
               "lag1_autocorrelation": round(lag, 2), "second_half_vs_first_pct": round(100 * shift, 1),
               "load_after": load_average(), "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{len(rows)} runs on one server: CV over time {summary['cv_over_time_pct']} %, lag-1 autocorrelation "
          f"{summary['lag1_autocorrelation']}, second half vs first {summary['second_half_vs_first_pct']:+} %; "
          f"load {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
