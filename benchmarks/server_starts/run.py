"""Between-server-start spread of the demo's serve points, under named server set-ups, through the real
`suite run` (an A/A matrix: two arms of the same installed vLLM, ABBA, one server start per arm and round).

    .venv/bin/python benchmarks/server_starts/run.py                        # every set-up below
    .venv/bin/python benchmarks/server_starts/run.py --setups default,no-split --repeats 4
    .venv/bin/python benchmarks/server_starts/run.py --setups default,side-by-side --repeats 6   # issue 23
    .venv/bin/python benchmarks/server_starts/run.py --setups interleaved --repeats 6             # issue 23 item 2
    .venv/bin/python benchmarks/server_starts/run.py --analyze runs/server-starts-<time>   # re-analyse

Per set-up it prints, from the stored raw results: the between-start CV of output throughput per point (the
standard deviation of log values across the starts of one arm, pooled over both arms), the CV of a start's
geometric mean over the points, and the standard deviation of the A/A round score (the primary test's score
of arm b against arm a, per round) with the rounds the matrix's design would need to see a 5 % and a 10 %
change at 80 % power, the wall time per round and the A/A score's variance times that time relative to the
first set-up (below 1: more precision per unit of wall time). Run it on a quiet box: it prints the load
average before and after each set-up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from suite.analysis import block_scores, load_run, round_data
from suite.matrix_load import load_matrix
from suite.proc import load_average
from suite.runtime.local import find_tcmalloc
from suite.scores import round_scores
from suite.verdict import VerdictSpec, rounds_needed

REPO = Path(__file__).resolve().parents[2]
MATRIX = Path(__file__).with_name("matrix.yaml")
METRIC = "output_throughput"


def setups() -> dict[str, dict]:
    """name -> {env: overrides for `suite run`'s environment (servers inherit it), prefix: argv before it}."""
    tc = find_tcmalloc()
    return {
        "no-preload": {"env": {"SUITE_CPU_PRELOAD": "0"}, "prefix": [],
                       "what": "the runtime before 2026-12-01: nothing preloaded (server CPUs / client CPU split, "
                               "PYTHONHASHSEED=0, OpenMP bound to the server's CPUs)"},
        "default": {"env": {}, "prefix": [], "what": "the runtime's defaults: the above + tcmalloc and Intel "
                                                    "OpenMP preloaded into the server (vLLM's CPU advice)"},
        "no-split": {"env": {"SUITE_CPU_SPLIT": "0"}, "prefix": [],
                     "what": "defaults without the CPU split: server and client share every CPU"},
        "tcmalloc": {"env": {"SUITE_CPU_PRELOAD": "0", "LD_PRELOAD": tc or ""}, "prefix": [],
                     "what": f"no-preload + LD_PRELOAD={tc or '(tcmalloc not installed)'}: the allocator alone"},
        "no-aslr": {"env": {}, "prefix": ["setarch", os.uname().machine, "-R"],
                    "what": "defaults + address-space randomisation off for every process (setarch -R)"},
        "side-by-side": {"env": {}, "prefix": [], "matrix": "together: 2\n",
                         "what": "defaults + together: 2: both arms' servers of a round alive at once (started "
                                 "together, their jobs alternating A B, B A, ...), the same cores"},
        "interleaved": {"env": {}, "prefix": [], "replace": ("order: abba", "order: abba\ntogether: all\nblocks: 3"),
                        "what": "defaults + order: interleaved, blocks: 3: both arms' servers of a round (a restart "
                                "set) alive at once, three blocks of every point in them, the arms taking turns "
                                "in a fresh random order; the set is the unit of the round score"},
    }


def _load() -> str:
    la = load_average()
    return " ".join(f"{x:.2f}" for x in la) if la else "n/a"


def run_setup(name: str, setup: dict, out: Path, matrix: Path) -> dict:
    env = dict(os.environ, **setup["env"])
    base = out / name
    base.mkdir(parents=True, exist_ok=True)
    if setup.get("matrix") or setup.get("replace"):  # the set-up changes the matrix: a derived copy beside its run
        text = matrix.read_text().replace("../../models/", f"{REPO}/models/") + setup.get("matrix", "")
        if setup.get("replace"):
            old, new = setup["replace"]
            assert old in text, f"{matrix}: no {old!r} to replace"
            text = text.replace(old, new)
        matrix = base / "matrix.yaml"
        matrix.write_text(text)
    cmd = [*setup["prefix"], str(Path(sys.executable).with_name("suite")), "run", str(matrix), "--out", str(base)]
    before = _load()
    print(f"[{name}] load {before}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(base / "suite.log", "w") as log:
        rc = subprocess.run(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    after = _load()
    print(f"[{name}] exit {rc}, {wall:.0f} s, load {after}", flush=True)
    meta = {"setup": name, "what": setup["what"], "env": setup["env"], "prefix": setup["prefix"], "rc": rc,
            "wall_s": round(wall, 1), "load_before": before, "load_after": after}
    (base / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _sd_log(values: list[float]) -> float | None:
    vals = [math.log(v) for v in values if v > 0]
    return statistics.stdev(vals) if len(vals) >= 2 else None


def _pooled(sds: list[tuple[float, int]]) -> float | None:
    """Pooled standard deviation over groups (sd, n)."""
    num = sum(sd * sd * (n - 1) for sd, n in sds)
    den = sum(n - 1 for _, n in sds)
    return math.sqrt(num / den) if den > 0 else None


def _pct(sd: float | None) -> str:
    return "n/a" if sd is None else f"{100 * math.expm1(sd):.1f} %"


def analyze(base: Path) -> dict:
    runs = sorted(p.parent for p in base.glob("*/manifest.json"))
    if not runs:
        raise SystemExit(f"{base}: no run directory (did `suite run` fail? see {base / 'suite.log'})")
    run = load_run(runs[-1])
    spec = VerdictSpec()
    arms = run.arms
    per_point: dict[str, float | None] = {}
    session_means: dict[str, list[float]] = {}
    starts: dict[str, int] = {}
    for arm in arms:
        rounds, _ = round_data(run, arm, (METRIC,))
        starts[arm] = len(rounds)
        means = []
        for points in rounds.values():
            vals = [row[METRIC] for row in points.values() if METRIC in row]
            if vals and len(vals) == len(run.points):
                means.append(math.exp(statistics.fmean(math.log(v) for v in vals)))
        session_means[arm] = means
    for name, p in run.points.items():
        groups = []
        for arm in arms:
            vals = [v for raw in p.reps.get(arm, {}).values() if (v := raw.number(METRIC))]
            sd = _sd_log(vals)
            if sd is not None:
                groups.append((sd, len(vals)))
        per_point[name] = _pooled(groups)
    geo = _pooled([(s, len(m)) for m in session_means.values() if (s := _sd_log(m)) is not None])
    b_rounds = round_data(run, arms[0], spec.metrics)[0]
    c_rounds = round_data(run, arms[1], spec.metrics)[0]
    scores = list(round_scores(b_rounds, c_rounds, spec.metrics).scores.values())
    sd_score = statistics.stdev(scores) if len(scores) >= 2 else None
    blocks = {}
    if run.blocks > 1:  # the A/A score per block too: its spread inside a restart set against across sets
        sets = block_scores(run, arms[1], spec)
        within = _pooled([(statistics.stdev(v), len(v)) for v in sets.values() if len(v) >= 2])
        var_sets = sd_score ** 2 if sd_score else None
        blocks = {"block_scores_pct": {k: [round(100 * math.expm1(x), 2) for x in v] for k, v in sets.items()},
                  "within_set_block_sd": within,
                  # the restart set's own part: var(set score) = var_u + var_block / blocks
                  "between_start_sd": (math.sqrt(max(var_sets - within ** 2 / run.blocks, 0.0))
                                       if var_sets is not None and within is not None else None)}
    healthy = []
    for f in sorted(run.root.glob("*/server-*.json")):
        rec = json.loads(f.read_text())
        if rec.get("healthy_after_s"):
            healthy.append(rec["healthy_after_s"])
    return {"run": str(runs[-1]), "starts": starts, "per_point_sd": per_point, "session_geomean_sd": geo,
            "session_geomeans": {a: [round(x, 1) for x in m] for a, m in session_means.items()},
            "aa_round_scores_pct": [round(100 * math.expm1(s), 2) for s in scores], "aa_score_sd": sd_score,
            "rounds_for_5pct": rounds_needed(sd_score, 5, spec) if sd_score else None,
            "rounds_for_10pct": rounds_needed(sd_score, 10, spec) if sd_score else None,
            "healthy_after_s_median": statistics.median(healthy) if healthy else None, **blocks}


def table(rows: list[tuple[dict, dict]]) -> str:
    points = sorted({p for _, a in rows for p in a["per_point_sd"]})
    head = ["set-up", "starts", *[f"CV {p}" for p in points], "CV start geomean", "SD A/A round score",
            "rounds for 5 %", "rounds for 10 %", "start s (median)", "wall s per round", "score variance × wall",
            "load before → after"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = None
    for meta, a in rows:
        per_round = meta["wall_s"] / max(a["starts"].values()) if a["starts"] else None
        # the variance of the A/A round score times a round's wall time: what one unit of wall time buys (a
        # design twice as precise per round at twice the time per round scores the same); relative to row 1
        cost = a["aa_score_sd"] ** 2 * per_round if a["aa_score_sd"] and per_round else None
        first = first if first is not None else cost
        out.append("| " + " | ".join([
            meta["setup"], "+".join(str(n) for n in a["starts"].values()),
            *[_pct(a["per_point_sd"].get(p)) for p in points], _pct(a["session_geomean_sd"]),
            _pct(a["aa_score_sd"]), str(a["rounds_for_5pct"]), str(a["rounds_for_10pct"]),
            f"{a['healthy_after_s_median']:.0f}" if a["healthy_after_s_median"] else "n/a",
            f"{per_round:.0f}" if per_round else "n/a",
            f"{cost / first:.2f}×" if cost and first else "n/a",
            f"{meta['load_before']} → {meta['load_after']}"]) + " |")
    out.append("")
    out += [f"- {meta['setup']}: {meta['what']}; A/A round scores {a['aa_round_scores_pct']} %; "
            f"per-start geomean tok/s {a['session_geomeans']}"
            + (f"; A/A score per block, by restart set {a['block_scores_pct']} %: SD inside a set "
               f"{_pct(a['within_set_block_sd'])}, the set's own (start) part {_pct(a['between_start_sd'])}"
               if "block_scores_pct" in a else "") for meta, a in rows]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setups", default=",".join(setups()), help="comma list of: " + ", ".join(setups()))
    ap.add_argument("--repeats", type=int, default=None, help="ABBA rounds per set-up (default: the matrix's)")
    ap.add_argument("--duration", type=float, default=None, help="measuring time per point in s (default: the "
                    "matrix's duration_s)")
    ap.add_argument("--out", type=Path, default=REPO / "runs")
    ap.add_argument("--analyze", type=Path, default=None, help="re-analyse an earlier output directory")
    args = ap.parse_args()
    if args.analyze:
        out = args.analyze
        names = [p.name for p in sorted(out.iterdir()) if (p / "meta.json").is_file()]
    else:
        out = args.out / f"server-starts-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
        out.mkdir(parents=True)
        matrix = MATRIX
        if args.repeats or args.duration:
            text = MATRIX.read_text().replace("../../models/", f"{REPO}/models/")
            if args.repeats:
                text = text.replace("repeats: 4", f"repeats: {args.repeats}")
            if args.duration:
                text = text.replace("duration_s: 3,", f"duration_s: {args.duration:g},")
            matrix = out / "matrix.yaml"
            matrix.write_text(text)
        load_matrix(matrix)  # fail early on a bad matrix
        known = setups()
        names = [n.strip() for n in args.setups.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown set-up(s) {unknown}; known: {', '.join(known)}")
        if "no-aslr" in names and not shutil.which("setarch"):
            raise SystemExit("set-up no-aslr needs `setarch` (util-linux)")
        for n in names:
            run_setup(n, known[n], out, matrix)
    rows = []
    for n in names:
        meta = json.loads((out / n / "meta.json").read_text())
        rows.append((meta, analyze(out / n)))
    text = table(rows)
    (out / "table.md").write_text(text)
    (out / "table.json").write_text(json.dumps([{"meta": m, "analysis": a} for m, a in rows], indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
