"""Overhead of the suite: its wall time over the inherent time of what it measures, and the same serve
points driven by `vllm bench sweep serve` (one sweep per arm: arms differ by environment and PYTHONPATH).

    .venv/bin/python benchmarks/overhead/run.py [--matrix benchmarks/overhead/matrix.yaml]

Inherent time = server start times (process seen -> /health 200) + `vllm bench serve` durations (the
"duration" of each raw result) + eval time (the suite's equivalence and accuracy jobs, from their records).
Server start times come from a watcher thread that follows each tool's process tree and polls the
server's /health every 0.2 s, the same way for both tools; bench durations and eval times come from the
tools' own output files. Everything else (tool start-up, bench client start-up, stopping servers, cache
resets, report writing) is overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.runtime.base import free_port, http_ok
from suite.runtime.local import LocalRuntime, vllm_command
from suite.sessions import server_argv_tail
from suite.stages.serve.run import serve_command
from suite.stages.serve.spec import ServeParams, serve_points

REPO = Path(__file__).resolve().parents[2]
SWEEP_MANAGED = {"--percentile-metrics": 1, "--save-result": 0, "--result-dir": 1, "--result-filename": 1,
                 "--metadata": None}
POINT_FLAGS = {"isl": "random_input_len", "osl": "random_output_len", "num_prompts": "num_prompts",
               "concurrency": "max_concurrency", "random_range_ratio": "random_range_ratio",
               "num_warmups": "num_warmups", "seed": "seed"}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------ the watcher


@dataclass
class Proc:
    kind: str  # "server" | "client"
    pid: int
    seen: float
    port: int | None = None
    healthy: float | None = None
    gone: float | None = None


@dataclass
class Watcher:
    """Follows the process tree under root_pid: `vllm serve` servers (seen -> healthy -> gone) and
    `vllm bench serve` clients (seen -> gone)."""

    root_pid: int
    period_s: float = 0.2
    procs: dict[int, Proc] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def _table() -> dict[int, tuple[int, list[str]]]:
        out = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except (OSError, IndexError):
                continue
            if stat[0] != "Z":
                out[int(d.name)] = (int(stat[1]), argv)
        return out

    @staticmethod
    def _classify(argv: list[str]) -> str | None:
        for i, a in enumerate(argv[:-1]):
            if a.endswith("/vllm") or a == "vllm":
                rest = argv[i + 1:i + 3]
                if rest[:1] == ["serve"]:
                    return "server"
                if rest == ["bench", "serve"]:
                    return "client"
        return None

    def poll(self) -> None:
        now = time.monotonic()
        table = self._table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        tree, stack = set(), [self.root_pid]
        while stack:
            pid = stack.pop()
            tree.add(pid)
            stack += children.get(pid, [])
        for pid in tree:
            if pid in self.procs:
                continue
            kind = self._classify(table.get(pid, (0, []))[1])
            if kind:
                argv = table[pid][1]
                port = int(argv[argv.index("--port") + 1]) if kind == "server" and "--port" in argv else None
                self.procs[pid] = Proc(kind, pid, now, port)
        for p in self.procs.values():
            if p.gone is None and p.pid not in table:
                p.gone = now
            if p.kind == "server" and p.healthy is None and p.gone is None and p.port is not None:
                if http_ok(f"http://127.0.0.1:{p.port}/health", timeout=0.5):
                    p.healthy = time.monotonic()

    def run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.period_s)
        self.poll()

    def __enter__(self) -> Watcher:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()

    def servers(self) -> list[Proc]:
        return sorted((p for p in self.procs.values() if p.kind == "server"), key=lambda p: p.seen)

    def clients(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.kind == "client"]


def timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float, Watcher]:
    """Run cmd (output to log) under a watcher; (exit status, wall seconds, watcher)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=REPO)
        with Watcher(proc.pid) as w:
            try:
                rc = proc.wait()
            except BaseException:
                proc.terminate()
                proc.wait(60)
                raise
    return rc, time.monotonic() - t0, w


@dataclass
class Timings:
    """What the watcher saw of one tool: server start times and bench client lifetimes (seconds)."""

    starts: list[float]
    client_s: float
    procs: list[dict[str, Any]]

    @classmethod
    def of(cls, name: str, w: Watcher) -> Timings:
        servers = w.servers()
        missing = [p.pid for p in servers if p.healthy is None]
        if missing:
            raise SystemExit(f"{name}: server(s) {missing} never became healthy (see the logs)")
        clients = [p.gone - p.seen for p in w.clients() if p.gone is not None]
        return cls([p.healthy - p.seen for p in servers], sum(clients), [vars(p) for p in w.procs.values()])

    @classmethod
    def saved(cls, summary: dict[str, Any]) -> Timings:
        if summary.get("procs"):
            w = Watcher(0)
            w.procs = {p["pid"]: Proc(**p) for p in summary["procs"]}
            return cls.of(summary["tool"], w)
        # written before the raw process timings were kept: the summary's own numbers (0.1 s rounding)
        return cls(list(summary["server_start_each_s"]), summary["bench_client_s"], [])


def tool_summary(name: str, wall: float, t: Timings, bench_durations: list[float], eval_s: float,
                 expected_benches: int) -> dict[str, Any]:
    """Per tool: the watcher's timings (kept raw under "procs") and the tool's own files."""
    starts = t.starts
    inherent = sum(starts) + sum(bench_durations) + eval_s
    return {
        "procs": t.procs,
        "tool": name, "wall_s": wall, "server_starts": len(starts), "server_start_s": sum(starts),
        "server_start_each_s": [round(s, 1) for s in starts], "benches": len(bench_durations),
        "expected_benches": expected_benches, "bench_duration_s": sum(bench_durations),
        "bench_client_s": t.client_s, "eval_s": eval_s, "inherent_s": inherent,
        "overhead_ratio": wall / inherent, "other_s": wall - inherent,
    }


# ------------------------------------------------------------------------------------------ the two tools


def run_suite(matrix_path: Path, out: Path) -> dict[str, Any]:
    suite = Path(sys.executable).parent / "suite"
    cmd = [str(suite), "run", str(matrix_path), "--out", str(out / "suite")]
    print(f"suite: {' '.join(shlex.quote(rel(Path(c)) if '/' in c else c) for c in cmd)}", flush=True)
    rc, wall, w = timed(cmd, dict(os.environ), out / "suite.log")
    if rc != 0 or not suite_run_dirs(out):
        raise SystemExit(f"suite run failed (exit status {rc}); see {rel(out / 'suite.log')}")
    return suite_summary(out, wall, Timings.of("suite", w))


def suite_run_dirs(out: Path) -> list[Path]:
    """Run directories under OUT/suite (the suite also keeps other files there, e.g. its history)."""
    return sorted(p.parent for p in (out / "suite").glob("*/manifest.json"))


def suite_summary(out: Path, wall: float, w: Timings) -> dict[str, Any]:
    run_dir = suite_run_dirs(out)[-1]
    durations, eval_s, n_serve = [], 0.0, 0
    for path in sorted(run_dir.glob("*/*/*/*.job.json")):
        rec = json.loads(path.read_text())
        job = rec["job"]
        if job["kind"] == "serve":
            n_serve += 1
            raw = path.with_name(path.name.replace(".job.json", ".json"))
            durations.append(float(json.loads(raw.read_text())["duration"]))
        elif job["kind"] in ("accuracy", "equivalence"):
            eval_s += float(rec["seconds"])
    summary = tool_summary("suite", wall, w, durations, eval_s, n_serve)
    summary["server_logs"] = len(list(run_dir.glob("*/server-*.log")))
    summary["run_dir"] = rel(run_dir)
    return summary


def bench_base_cmd(matrix, params: ServeParams, port: int) -> list[str]:
    """`vllm bench serve` exactly as the suite runs it, minus the flags the sweep adds itself."""
    model = matrix.model_of(matrix.arms[matrix.baseline_arm])
    cmd = serve_command(vllm=vllm_command()[0], base_url=f"http://{matrix.runtime.host}:{port}",
                        served_name=model.served_name, tokenizer=model.tokenizer,
                        params=params, result_dir=Path("unused"), result_filename="unused")
    out, i = [], 0
    while i < len(cmd):
        arity = SWEEP_MANAGED.get(cmd[i], -1)
        if arity == -1:
            out.append(cmd[i])
            i += 1
        elif arity is None:  # --metadata k=v ...: to the next flag
            i += 1
            while i < len(cmd) and not cmd[i].startswith("--"):
                i += 1
        else:
            i += 1 + arity
    return out


def run_sweeps(matrix_path: Path, out: Path) -> dict[str, Any]:
    matrix = load_matrix(matrix_path)
    plan = build_plan(matrix)
    runtime = LocalRuntime(matrix, REPO / ".cache")
    points = serve_points(matrix)
    bench_params = [{"_benchmark_name": pid, **{POINT_FLAGS[k]: getattr(p, k) for k in POINT_FLAGS}} for pid, p in points]
    total_wall, watchers, expected = 0.0, [], 0
    for arm, spec in plan.arms.items():
        arm_env = runtime.prepare_arm(arm, spec)
        port = free_port(matrix.runtime.host)
        cache = out / "sweep-cache" / arm
        env = dict(os.environ)
        env.update(runtime.arm_vars(arm_env, cache))
        env.update({**matrix.env, **spec.env, "HF_HUB_OFFLINE": "1"})
        serve = [*vllm_command(), "serve", *server_argv_tail(matrix, arm, plan, port)]
        # the client runs the installed vLLM, as in the suite (the server keeps the arm's overlay)
        bench = ["env", "-u", "PYTHONPATH", *bench_base_cmd(matrix, points[0][1], port)]
        params_file = out / f"bench-params-{arm}.json"
        params_file.write_text(json.dumps(bench_params, indent=2))
        cmd = [*vllm_command(), "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve),
               "--bench-cmd", shlex.join(bench), "--bench-params", str(params_file),
               "--num-runs", str(matrix.repeats), "--output-dir", str(out / "sweep"), "--experiment-name", arm,
               "--server-ready-timeout", str(int(matrix.runtime.startup_timeout_s)), "--show-stdout"]
        (out / f"sweep-{arm}.cmd").write_text(shlex.join(cmd) + "\n")
        print(f"sweep {arm}: vllm bench sweep serve ... (command in {rel(out / f'sweep-{arm}.cmd')})", flush=True)
        rc, wall, w = timed(cmd, env, out / f"sweep-{arm}.log")
        if rc != 0:
            raise SystemExit(f"vllm bench sweep serve failed for arm {arm} (exit status {rc}); see "
                             f"{rel(out / f'sweep-{arm}.log')}")
        total_wall += wall
        watchers.append(w)
        expected += len(points) * matrix.repeats
    merged = Watcher(0)
    for w in watchers:
        merged.procs.update(w.procs)
    return sweep_summary(out, total_wall, Timings.of("sweep", merged), list(plan.arms), expected)


def sweep_summary(out: Path, wall: float, w: Timings, arms: list[str], expected: int) -> dict[str, Any]:
    durations = [float(json.loads(path.read_text())["duration"])
                 for arm in arms for path in sorted((out / "sweep" / arm).glob("*/run=*.json"))]
    return tool_summary("vllm bench sweep serve", wall, w, durations, 0.0, expected)


def reanalyze(out: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Recompute both summaries from OUT/overhead.json (wall times, watcher timings) and the tools' files."""
    saved = json.loads((out / "overhead.json").read_text())
    s, v = saved["suite"], saved["sweep"]
    arms = sorted(p.name for p in (out / "sweep").iterdir() if p.is_dir())
    return (saved["meta"], suite_summary(out, s["wall_s"], Timings.saved(s)),
            sweep_summary(out, v["wall_s"], Timings.saved(v), arms, v["expected_benches"]))


def render(meta: dict[str, Any], s: dict[str, Any], v: dict[str, Any]) -> str:
    rows = [
        ("wall time", "wall_s", "s"), ("server starts", "server_starts", ""),
        ("server start time (sum)", "server_start_s", "s"), ("bench runs", "benches", ""),
        ("bench duration (sum of `duration`)", "bench_duration_s", "s"),
        ("bench client processes (sum of lifetimes)", "bench_client_s", "s"), ("eval time", "eval_s", "s"),
        ("inherent = starts + bench + eval", "inherent_s", "s"), ("everything else", "other_s", "s"),
        ("wall / inherent", "overhead_ratio", "x"),
    ]

    def cell(d: dict[str, Any], key: str, unit: str) -> str:
        x = d[key]
        if unit == "x":
            return f"{x:.2f}x"
        return f"{x:.1f} s" if unit == "s" else str(x)

    lines = [f"overhead: matrix {meta['matrix']} ({meta['arms']} arms, {meta['points']} serve points, "
             f"{meta['repeats']} repeats); load average before {meta['loadavg_before']}, "
             f"{'between the tools ' + meta['loadavg_between'] + ', ' if 'loadavg_between' in meta else ''}"
             f"after {meta['loadavg_after']}", "",
             "| | suite run | vllm bench sweep serve (one per arm) |", "|---|---|---|"]
    lines += [f"| {label} | {cell(s, key, unit)} | {cell(v, key, unit)} |" for label, key, unit in rows]
    serve_only = s["wall_s"] - s["eval_s"]
    lines += [
        "",
        f"suite wall / sweep wall: {s['wall_s'] / v['wall_s']:.2f}x; without the suite's eval jobs "
        f"(which the sweep does not run): {serve_only / v['wall_s']:.2f}x",
        f"server starts, suite / sweep: {s['server_starts']} / {v['server_starts']}",
        f"suite run dir: {s['run_dir']} ({s['server_logs']} server logs)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--matrix", type=Path, default=REPO / "benchmarks" / "overhead" / "matrix.yaml")
    p.add_argument("--out", type=Path, help="output directory (default runs/overhead-<utc time>)")
    p.add_argument("--analyze", type=Path, metavar="DIR", help="recompute the table of a finished run")
    args = p.parse_args(argv)
    if args.analyze:
        meta, suite, sweep = reanalyze(args.analyze)
        return finish(args.analyze, meta, suite, sweep)
    matrix = load_matrix(args.matrix)
    if matrix.runtime.kind != "local":
        p.error("the overhead benchmark drives the local runtime (vllm bench sweep serve runs local servers)")
    out = args.out or REPO / "runs" / f"overhead-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"matrix": rel(args.matrix), "arms": len(matrix.arms), "points": len(serve_points(matrix)),
            "repeats": matrix.repeats, "loadavg_before": loadavg(),
            "started": datetime.now(UTC).isoformat(timespec="seconds")}
    suite = run_suite(args.matrix, out)
    meta["loadavg_between"] = loadavg()
    sweep = run_sweeps(args.matrix, out)
    meta["loadavg_after"] = loadavg()
    return finish(out, meta, suite, sweep)


def finish(out: Path, meta: dict[str, Any], suite: dict[str, Any], sweep: dict[str, Any]) -> int:
    (out / "overhead.json").write_text(json.dumps({"meta": meta, "suite": suite, "sweep": sweep}, indent=2))
    text = render(meta, suite, sweep)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {rel(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
