"""What a serving point costs through the CLI (`vllm bench serve`, one process per point) and through the
persistent client (one worker per session, suite.stages.serve.client), on the same server.

    flock /tmp/e2e.lock .venv/bin/python benchmarks/client_overhead.py [--points 5] [--prompts 16]
        [--concurrency 4] [--isl 64] [--osl 16] [--model DIR] [--base-url URL] [--json OUT]

Starts `vllm serve` of the tiny MoE (or uses --base-url), starts one persistent client, then runs N points
alternating CLI and persistent (so drift hits both alike). Prints each point's wall time and vLLM's own
measured `duration`, the medians, the ratio CLI / persistent, the measuring share (duration / wall) of each
mode, the worker's start-up, and the load average before and after. On demand, not a test: it starts a
server, so run it under the shared lock.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from suite.proc import start, stop_group
from suite.runtime.base import free_port, http_ok
from suite.stages.serve.client import PersistentClient

REPO = Path(__file__).resolve().parents[1]
SERVED = "tiny-moe"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def client_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def point_argv(base_url: str, tokenizer: str, args: argparse.Namespace, out: Path, name: str) -> list[str]:
    return [
        "--backend", "vllm", "--base-url", base_url, "--model", SERVED, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(args.isl), "--random-output-len", str(args.osl),
        "--random-range-ratio", "0.0", "--num-prompts", str(args.prompts),
        "--max-concurrency", str(args.concurrency), "--request-rate", "inf", "--num-warmups", "0",
        "--seed", "0", "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
        "--result-dir", str(out), "--result-filename", f".{name}.partial",
    ]  # fmt: skip


class Server:
    """`vllm serve` of a local model in its own process group (eager; 1 GiB KV cache on the CPU)."""

    def __init__(self, model: Path, log: Path):
        self.tmp = Path(tempfile.mkdtemp(prefix="co-", dir="/tmp"))  # short: ZMQ IPC socket paths
        self.base_url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        port = self.base_url.rsplit(":", 1)[1]
        self.cmd = [str(Path(sys.executable).parent / "vllm"), "serve", str(model), "--served-model-name",
                    SERVED, "--host", "127.0.0.1", "--port", port, "--dtype", "bfloat16", "--max-model-len",
                    "2048", "--max-num-seqs", "8", "--enforce-eager"]
        self.env = {**client_env(), "TMPDIR": str(self.tmp), "VLLM_CACHE_ROOT": str(self.tmp / "vllm-cache"),
                    "TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "inductor"), "VLLM_CPU_KVCACHE_SPACE": "1"}

    def __enter__(self) -> Server:
        self.proc = start(self.cmd, env=self.env, log_path=self.log)
        t0, deadline = time.monotonic(), time.monotonic() + 300
        while not http_ok(f"{self.base_url}/health", timeout=2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                sys.exit(f"vllm serve did not become healthy; log: {self.log}")
            time.sleep(0.5)
        self.startup_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        stop_group(self.proc, grace_s=30)


def measure(base_url: str, tokenizer: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    vllm = str(Path(sys.executable).parent / "vllm")
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with PersistentClient(sys.executable, env=client_env(), log_path=out / "worker.log", cli=[vllm]) as pc, \
            PersistentClient(sys.executable, env=client_env(), log_path=out / "cli.log", cli=[vllm],
                             mode="cli") as cli:
        startup = time.monotonic() - t0
        if pc.mode != "persistent":
            sys.exit(f"the persistent client fell back to the CLI: {pc.fallback_reason}")
        for i in range(args.points):
            for mode, client in (("cli", cli), ("persistent", pc)):
                name = f"{mode}-{i}.json"
                argv = point_argv(base_url, tokenizer, args, out, name)
                run = client.run(argv, out / name, 600, log_path=out / f"{mode}-{i}.log")
                raw = json.loads((out / name).read_text())
                rows.append({"point": i, "mode": run.mode, "wall_s": run.wall_s,
                             "duration_s": raw["duration"], "bench_wall_s": run.bench_wall_s,
                             "client_cpu_s": run.client_cpu_s, "client_cpu_util": run.client_cpu_util,
                             "completed": raw["completed"], "output_throughput": raw["output_throughput"]})
                print(f"  point {i} {mode:<10} wall {run.wall_s:7.3f} s  duration {raw['duration']:6.3f} s  "
                      f"client CPU {run.client_cpu_s:6.2f} s  {raw['output_throughput']:7.1f} tok/s",
                      flush=True)
    return {"worker_startup_s": round(startup, 3), "rows": rows}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"worker_startup_s": result["worker_startup_s"]}
    for mode in ("cli", "persistent"):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        wall = sum(r["wall_s"] for r in rows)
        out[mode] = {"median_wall_s": statistics.median(r["wall_s"] for r in rows),
                     "median_duration_s": statistics.median(r["duration_s"] for r in rows),
                     "measuring_share": sum(r["duration_s"] for r in rows) / wall,
                     "median_client_cpu_util": statistics.median(r["client_cpu_util"] for r in rows),
                     "median_output_throughput": statistics.median(r["output_throughput"] for r in rows)}
    out["ratio_median_wall_cli_over_persistent"] = (out["cli"]["median_wall_s"]
                                                    / out["persistent"]["median_wall_s"])
    cli_rows = [r for r in result["rows"] if r["mode"] == "cli"]
    p_rows = [r for r in result["rows"] if r["mode"] == "persistent"]
    out["session_wall_s"] = {
        "cli": round(sum(r["wall_s"] for r in cli_rows), 3),
        "persistent_incl_startup": round(result["worker_startup_s"] + sum(r["wall_s"] for r in p_rows), 3),
        "points": len(cli_rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--isl", type=int, default=64)
    ap.add_argument("--osl", type=int, default=16)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the tiny MoE)")
    ap.add_argument("--base-url", default=None, help="use this running server (served as tiny-moe)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and the summary here")
    args = ap.parse_args()

    model = args.model
    if model is None:
        from suite.fixtures.tiny_moe import generate_tiny_moe

        model = generate_tiny_moe(REPO / "models" / "tiny-moe")
    out = Path(tempfile.mkdtemp(prefix="client-overhead-"))
    load_before = loadavg()
    print(f"load average before: {load_before}   nproc {os.cpu_count()}   output: {out}")
    if args.base_url:
        result = measure(args.base_url, str(model), args, out)
    else:
        with Server(Path(model), out / "server.log") as server:
            print(f"server healthy after {server.startup_s:.1f} s")
            result = measure(server.base_url, str(model), args, out)
    load_after = loadavg()
    summary = summarize(result)
    c, p = summary["cli"], summary["persistent"]
    print(f"\n{'':<12}{'median wall s':>14}{'median duration s':>19}{'measuring share':>17}"
          f"{'client CPU util':>17}")
    for mode, s in (("CLI", c), ("persistent", p)):
        print(f"{mode:<12}{s['median_wall_s']:>14.3f}{s['median_duration_s']:>19.3f}"
              f"{s['measuring_share']:>17.2f}{s['median_client_cpu_util']:>17.2f}")
    ratio = summary["ratio_median_wall_cli_over_persistent"]
    print(f"ratio of median wall times, CLI / persistent: {ratio:.1f}x")
    sw = summary["session_wall_s"]
    print(f"{sw['points']} points: CLI {sw['cli']:.1f} s, persistent {sw['persistent_incl_startup']:.1f} s "
          f"(worker start-up {summary['worker_startup_s']:.1f} s included)")
    print(f"load average before {load_before}, after {load_after}")
    if args.json:
        record = {**result, "summary": summary, "load_before": load_before, "load_after": load_after,
                  "args": {k: str(v) for k, v in vars(args).items()}}
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
