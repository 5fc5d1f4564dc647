"""Sensitivity of the suite's verdicts, measured through the real `suite run` (the source matrix's design, the
declared primary test, its looks): how often an injected router-gate slowdown comes out REGRESSION, and how often a
change that does nothing comes out anything but EQUIVALENT / INCONCLUSIVE.

    .venv/bin/python benchmarks/sensitivity/run.py --levels 0,300,1000 --runs 3
    .venv/bin/python benchmarks/sensitivity/run.py --tally runs/demo-1 runs/demo-2 ...   # tally earlier runs
    .venv/bin/python benchmarks/sensitivity/run.py --tally RUN_DIR... --spending pocock  # ... re-decided

Each run is one `suite run` of a two-arm matrix derived from the demo's (model, serve arguments, points,
order, repeats/budget and verdict block of `--matrix`; no eval): `baseline` (the installed vLLM) against
`gate-<d>us`, the patch set `synthetic-gate-delay` with `SUITE_GATE_DELAY_US=d`. Level 0 is the same patched
door with the delay off (the patched module tests one constant and does nothing): an A/A run whose every
REGRESSION, IMPROVEMENT or MIXED is a false positive; a run with an A/A arm (`aa: true`, as the demo) adds
its A/A control as one more row. Runs go level by level in a shuffled order per replicate, one run at a time
(the demo's matrix: interleaved, both arms' servers alive at once, three restart sets of two blocks). The table
gives, per level: the measured effect (the primary test's estimate), the verdict counts, the detection rate with a Wilson 95 % interval, rounds used and wall time per run. Run it on a
quiet box; it prints the load average before and after every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from suite.analysis import load_run, round_data, set_spread, stopped_after, summarize_candidates, verdict_spec
from suite.candidate import OUTPUT_CHANGED, OUTPUT_IDENTICAL
from suite.matrix_load import load_matrix
from suite.proc import load_average
from suite.sequential import evaluate_look
from suite.stats import OneWay, fmt_set_spread
from suite.verdict import Outcome

REPO = Path(__file__).resolve().parents[2]
SIGNIFICANT = {Outcome.REGRESSION.value, Outcome.IMPROVEMENT.value, Outcome.MIXED.value, OUTPUT_CHANGED}


def _load() -> str:
    la = load_average()
    return " ".join(f"{x:.2f}" for x in la) if la else "n/a"


def derive_matrix(source: Path, delay_us: int, budget_min: float | None) -> dict:
    """The source matrix with two arms (baseline, gate-<d>us), serving only (no other stage, no A/A control), the
    model path made absolute."""
    raw = yaml.safe_load(source.read_text())
    model_id = raw["model"]["id"]
    if (source.parent / model_id).exists():
        raw["model"]["id"] = str((source.parent / model_id).resolve())
    version = next(iter(raw["arms"].values()))["vllm"]
    raw["name"] = f"sensitivity-{delay_us}us"
    raw.pop("description", None)
    raw["arms"] = {"baseline": {"vllm": version},
                   f"gate-{delay_us}us": {"vllm": version, "patches": ["synthetic-gate-delay"],
                                          "env": {"SUITE_GATE_DELAY_US": str(delay_us)}}}
    for key in ("accuracy", "latency", "kernel", "layer", "profile", "probe", "aa"):
        raw.pop(key, None)
    if budget_min is not None:
        raw["budget_min"] = budget_min
    return raw


def run_one(out: Path, source: Path, delay_us: int, replicate: int, budget_min: float | None) -> Path:
    base = out / f"d{delay_us}-r{replicate}"
    base.mkdir(parents=True)
    matrix = base / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(derive_matrix(source, delay_us, budget_min), sort_keys=False))
    load_matrix(matrix)
    before = _load()
    t0 = time.monotonic()
    with open(base / "suite.log", "w") as log:
        rc = subprocess.run([str(Path(sys.executable).with_name("suite")), "run", str(matrix), "--out",
                             str(base / "runs")], cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    meta = {"delay_us": delay_us, "replicate": replicate, "rc": rc, "wall_s": round(wall, 1),
            "load_before": before, "load_after": _load()}
    (base / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"  d={delay_us} µs replicate {replicate}: exit {rc}, {wall:.0f} s, load {before} → {meta['load_after']}",
          flush=True)
    return base


def outcome_of(run_dir: Path) -> list[dict]:
    """One row per candidate of a stored run: its verdict word, estimate and interval, rounds used; and one
    for the A/A control when the run has one (its raw outcome: anything significant is a false alarm)."""
    run = load_run(run_dir)
    rows = []
    for s in summarize_candidates(run) + ([run.control] if run.control is not None else []):
        ev = s.evaluation
        c = ev.composite if ev else None
        arm = run.matrix.arms.get(s.candidate)
        delay = arm.env.get("SUITE_GATE_DELAY_US") if arm is not None else None
        control = s.candidate == run.aa_arm
        spread = set_spread(run, s.candidate, verdict_spec(run))
        rows.append({"run": str(run_dir), "candidate": s.candidate + (" (A/A control)" if control else ""),
                     "outcome": s.overall if control else s.word,
                     "delay_us": float(delay) if delay is not None else None,
                     "estimate_pct": c.estimate_pct if c else None, "ci": (c.rci_low_pct, c.rci_high_pct) if c
                     else None, "mde_pct": c.mde_pct if c else None, "rounds": c.n_rounds if c else None,
                     "stopped_after": stopped_after(run),
                     "set_spread": dataclasses.asdict(spread) if spread is not None else None})
    return rows


def redecide(run_dir: Path, spending: str) -> list[dict]:
    """One row per serving candidate of a stored sequential run: the word and sets it would have had with the
    matrix's looks under another alpha spending (``suite.sequential.evaluate_look`` at each look in turn on the
    stored rounds, stopping at the first look that decides, as the runner does); "needs more sets" where that
    design would have gone past the rounds the run stored."""
    run = load_run(run_dir)
    spec = verdict_spec(run).model_copy(update={"spending": spending})
    if run.manifest.sequential is None:  # a fixed design has one look: no spending to change
        return [{"run": str(run_dir), "candidate": c, "outcome": "not a sequential run", "rounds": None}
                for c in run.candidates if run.serves(c)]
    stored = len(round_data(run, run.baseline, spec.metrics, spec.points)[0])  # the baseline's rounds (sets)
    assert spec.looks is not None
    words: dict[str, tuple[str, int | None]] = {}
    for k, n in enumerate(spec.looks):
        if n > stored:
            words.update({c: ("needs more sets", None) for c in run.candidates if run.serves(c) and c not in words})
            break
        look = evaluate_look(run_dir, spec, n, final=k == len(spec.looks) - 1, control=False)
        words.update({c: (look.outcomes[c], n) for c in look.outcomes
                      if c not in words and (look.decided[c] or look.final)})
        if all(c in words for c in look.outcomes):
            break
    return [{"run": str(run_dir), "candidate": c, "outcome": w, "rounds": n} for c, (w, n) in words.items()]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def level(row: dict) -> str:
    """The table's row a run's candidate counts in: its injected delay, or (no delay) its own name."""
    return f"{row['delay_us']:g} µs" if row["delay_us"] is not None else row["candidate"]


def table(rows: list[dict], walls: dict[str, float]) -> str:
    words = [*(o.value for o in Outcome), OUTPUT_CHANGED, OUTPUT_IDENTICAL]
    head = ["candidate / delay", "runs", "measured Δ (median, range)", *words, "flagged (95 % CI)",
            "rounds (median)", "wall min (median)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(level(r), []).append(r)
    for key, rs in sorted(groups.items(), key=lambda kv: (kv[1][0]["delay_us"] is None, kv[1][0]["delay_us"] or 0,
                                                           kv[0])):
        est = [r["estimate_pct"] for r in rs if r["estimate_pct"] is not None]
        sig = sum(r["outcome"] in SIGNIFICANT for r in rs)
        lo, hi = wilson(sig, len(rs))
        rounds = [r["rounds"] for r in rs if r["rounds"]]
        wall = [walls[r["run"]] for r in rs if r["run"] in walls]
        out.append("| " + " | ".join([
            key, str(len(rs)),
            f"{statistics.median(est):+.1f} % [{min(est):+.1f}, {max(est):+.1f}]" if est else "n/a",
            *[str(sum(r["outcome"] == w for r in rs)) for w in words],
            f"{sig}/{len(rs)} ({100 * lo:.0f}–{100 * hi:.0f} %)",
            f"{statistics.median(rounds):g}" if rounds else "n/a",
            f"{statistics.median(wall) / 60:.1f}" if wall else "n/a"]) + " |")
    return "\n".join(out) + "\n"


def spread_lines(rows: list[dict]) -> str:
    """Per level, the restart sets' spread pooled over its runs (interleaved runs): how much is the blocks' noise
    and how much each set's own, the one-way analysis of every run's block scores added up."""
    pooled: dict[str, OneWay] = {}
    for r in rows:
        if r.get("set_spread"):
            key, one = level(r), OneWay(**r["set_spread"])
            pooled[key] = pooled[key] + one if key in pooled else one
    return "".join(f"- {key}: {fmt_set_spread(s)}\n" for key, s in pooled.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", type=Path, default=REPO / "matrices" / "smoke-cpu.yaml")
    ap.add_argument("--levels", default="0,300,1000", help="gate delays in µs per gate call (0 = A/A)")
    ap.add_argument("--runs", type=int, default=3, help="suite runs per level")
    ap.add_argument("--budget-min", type=float, default=None, help="override the matrix's budget_min")
    ap.add_argument("--seed", type=int, default=0, help="shuffles the level order of each replicate")
    ap.add_argument("--out", type=Path, default=REPO / "runs")
    ap.add_argument("--tally", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                    help="only tally stored run directories (e.g. repeated `make demo` runs)")
    ap.add_argument("--spending", choices=("obrien-fleming", "pocock"), default=None,
                    help="with --tally: also each run re-decided at its matrix's looks under this alpha spending")
    args = ap.parse_args()
    if args.spending and not args.tally:
        ap.error("--spending re-decides stored runs: give them with --tally")
    walls: dict[str, float] = {}
    if args.tally:
        run_dirs = []
        for d in args.tally:
            found = [d] if (d / "manifest.json").is_file() else sorted(x.parent for x in d.glob("**/manifest.json"))
            if not found:
                ap.error(f"--tally {d}: {'no such directory' if not d.is_dir() else 'holds no run (no manifest.json)'}")
            run_dirs += found
        out = None
        for d in run_dirs:
            m = json.loads((d / "manifest.json").read_text())
            try:
                walls[str(d)] = (datetime.fromisoformat(m["finished"]) -
                                 datetime.fromisoformat(m["started"])).total_seconds()
            except (KeyError, TypeError, ValueError):
                pass
    else:
        out = args.out / f"sensitivity-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
        out.mkdir(parents=True)
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
        rng = random.Random(args.seed)
        run_dirs = []
        print(f"{len(levels) * args.runs} suite runs into {out}; load {_load()}", flush=True)
        for rep in range(args.runs):
            order = levels[:]
            rng.shuffle(order)
            for d in order:
                base = run_one(out, args.matrix, d, rep, args.budget_min)
                walls_s = json.loads((base / "meta.json").read_text())["wall_s"]
                for r in sorted(x.parent for x in (base / "runs").glob("*/manifest.json")):
                    run_dirs.append(r)
                    walls[str(r)] = walls_s
    rows = [row for d in run_dirs for row in outcome_of(d)]
    text = table(rows, walls)
    if spread := spread_lines(rows):
        text += "\nRestart sets, pooled over each level's runs:\n\n" + spread
    print(text)
    for r in rows:
        speed = ("no speed test" if r["estimate_pct"] is None else
                 f"{r['estimate_pct']:+.1f} % after {r['rounds']} rounds"
                 + (f" (MDE {r['mde_pct']:.1f} %)" if r["mde_pct"] is not None else ""))
        print(f"- {r['run']}: {r['candidate']} {r['outcome']} {speed}")
    if args.spending:
        print(f"\nRe-decided at each run's looks with {args.spending} spending (as run → re-decided, sets):")
        as_run = {(r["run"], r["candidate"]): r for r in rows}
        for d in run_dirs:
            for r in redecide(d, args.spending):
                was = as_run.get((r["run"], r["candidate"]))
                print(f"- {r['run']}: {r['candidate']} {was['outcome'] if was else '?'} after "
                      f"{was['stopped_after'] if was else '?'} → {r['outcome']} after {r['rounds'] or '-'}")
    if out is not None:
        (out / "table.md").write_text(text)
        (out / "rows.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
