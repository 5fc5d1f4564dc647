"""`suite compare RUN_A RUN_B`: one arm across two runs of the same matrix (tonight vs last night), or arm X
of run A against arm Y of run B, with the same statistics and the same report (md + html).

The comparison is itself a run directory: the chosen arms' raw results and job records are linked (or
copied) under ``OUT/<name>/<label-arm>/...`` with a manifest whose plan names the run-A arm the baseline, so
`suite.report` renders it unchanged (md + html) and `suite report` can re-render it later. Runs are
independent, so the cell intervals are Welch (never paired across runs); the primary test pairs the two runs'
rounds by index, which is valid for independent runs (and cancels nothing). `--fail-on-regression` fails on
a REGRESSION verdict or on a cell that is significantly worse after Holm, each by at least --min-effect.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from suite.errors import SuiteError

if TYPE_CHECKING:  # the analysis (scipy) loads only when the command runs
    from suite.candidate import CandidateSummary, CellResult
    from suite.records import Manifest

NAME = "compare"
HELP = "Compare an arm across two runs of the same matrix (or arm X of run A vs arm Y of run B): md + html report."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="run directory (or run id in the history index): the before")
    p.add_argument("run_b", metavar="RUN_B", help="run directory (or run id in the history index): the after")
    p.add_argument("--arm", action="append", default=[], metavar="ARM",
                   help="once: this arm in both runs; twice: arm of RUN_A then arm of RUN_B; "
                        "omitted: every arm the two runs share, each compared on its own")
    p.add_argument("--label-a", help="label of RUN_A's arms (default: its run id's timestamp)")
    p.add_argument("--label-b", help="label of RUN_B's arms (default: its run id's timestamp)")
    p.add_argument("--out", type=Path, help="output directory (default: runs/compare-<a>-vs-<b>)")
    p.add_argument("--runs", type=Path, default=Path("runs"), help="where run ids are looked up (default runs/)")
    p.add_argument("--db", type=Path, help="history index for run ids (default: RUNS/history.sqlite)")
    p.add_argument("--allow-other-matrix", action="store_true", help="compare runs of different matrices")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a REGRESSION verdict or a point × metric significantly worse after Holm")
    p.add_argument("--min-effect", type=float, default=0.0, metavar="PCT",
                   help="with --fail-on-regression: ignore regressions (composite or cell) with |Δ| below PCT "
                        "percent (default 0)")


def resolve_run(ref: str, runs: Path, db: Path | None) -> Path:
    path = Path(ref)
    if (path / "manifest.json").is_file():
        return path
    if (runs / ref / "manifest.json").is_file():
        return runs / ref
    from suite.history import default_db, find_run

    row = find_run(db or default_db(runs), ref)
    if row is not None and (Path(row.path) / "manifest.json").is_file():
        return Path(row.path)
    raise SuiteError(f"{ref}: not a run directory and not an indexed run id")


def default_label(run_dir: Path) -> str:
    return run_dir.name.split("-", 1)[0]


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@+-]+", "_", name)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=_link_file, dirs_exist_ok=True)
    else:
        _link_file(src, dst)


def _link_file(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def merge_runs(run_a: Path, arm_a: str, label_a: str, run_b: Path, arm_b: str, label_b: str,
               out: Path) -> Path:
    """Write a run directory at ``out`` holding ``arm_a`` of run A (as the baseline) and ``arm_b`` of run B."""
    from suite.records import (
        ArmRecord,
        CompareRecord,
        CompareSide,
        JobCounts,
        Manifest,
        PlannedJob,
        PlanRecord,
        utc_now,
    )
    from suite.store import RunStore

    sa, sb = RunStore.open(run_a), RunStore.open(run_b)
    ma, mb = sa.manifest(), sb.manifest()
    for run, m, arm in ((run_a, ma, arm_a), (run_b, mb, arm_b)):
        if arm not in m.arms and arm not in m.plan.arms:
            raise SuiteError(f"{run}: no arm {arm!r} (arms: {', '.join(m.arm_names)})")
    la, lb = safe(f"{arm_a}@{label_a}"), safe(f"{arm_b}@{label_b}")
    if la == lb:
        raise SuiteError(f"both sides are {la!r}: give different --label-a/--label-b")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    store = RunStore(out)
    counts = JobCounts(ok=0, failed=0, missing=0)
    planned: list[PlannedJob] = []  # each side's planned jobs under its new name: the run order stays known
    for src_store, m, arm, label in ((sa, ma, arm_a, la), (sb, mb, arm_b, lb)):
        planned += [j.model_copy(update={"arm": label}) for j in m.plan.jobs if j.arm == arm]
        seen = set()
        for rec in src_store.records():
            old = rec.job
            if old.arm != arm:
                continue
            seen.add((old.key, old.hash))
            new = old.model_copy(update={"arm": label})
            for src, dst in ((src_store.result_path(old), store.result_path(new)),
                             (src_store.log_path(old), store.log_path(new))):
                if src.exists():
                    _link_or_copy(src, dst)
            store.put_record(rec.model_copy(update={"job": new}))
            if rec.ok:
                counts.ok += 1
            else:
                counts.failed += 1
        if src_store.vllm_files_path(arm).is_file():  # its software file by file, beside its manifest record
            _link_or_copy(src_store.vllm_files_path(arm), store.vllm_files_path(label))
        # planned jobs of this arm that never wrote a record stay visible as missing
        counts.missing += sum(1 for j in m.plan.jobs if j.arm == arm and (j.key, j.hash) not in seen)
    description = f"{arm_b} of run {run_b.name} against {arm_a} of run {run_a.name}. " + (mb.matrix.description or "")
    statuses = {ma.status, mb.status}
    store.write_manifest(Manifest(
        schema_version=mb.schema_version, suite_version=mb.suite_version, created=utc_now(), finished=utc_now(),
        matrix_path=mb.matrix_path, matrix=mb.matrix.model_copy(update={"description": description}),
        plan=PlanRecord(order="independent runs", baseline=la, arms=[la, lb], jobs=planned),
        host=mb.host, runtime=mb.runtime, arms={la: ma.arms.get(arm_a, ArmRecord()), lb: mb.arms.get(arm_b, ArmRecord())},
        status="complete" if statuses == {"complete"} else "/".join(sorted(statuses)), job_counts=counts,
        compare=CompareRecord(a=CompareSide(run=run_a.name, arm=arm_a, label=la, created=ma.created,
                                            host=ma.host.hostname, status=ma.status),
                              b=CompareSide(run=run_b.name, arm=arm_b, label=lb, created=mb.created,
                                            host=mb.host.hostname, status=mb.status))))
    return out


def arm_pairs(args: argparse.Namespace, ma: Manifest, mb: Manifest) -> list[tuple[str, str]]:
    if len(args.arm) > 2:
        raise SuiteError("--arm at most twice (arm of RUN_A, arm of RUN_B)")
    if len(args.arm) == 2:
        return [(args.arm[0], args.arm[1])]
    if len(args.arm) == 1:
        return [(args.arm[0], args.arm[0])]
    arms_a = ma.arm_names
    arms_b = set(mb.arm_names)
    shared = [a for a in arms_a if a in arms_b and not a.endswith(".aa")]
    if not shared:
        raise SuiteError("the runs share no arm: name them with --arm A --arm B")
    return [(a, a) for a in shared]


def _summary_lines(s: CandidateSummary, md: str, page: str) -> list[str]:
    from suite.stats import Verdict, fmt_interval, fmt_pct

    c = s.evaluation.composite if s.evaluation is not None else None
    comp = (f"composite {fmt_pct(c.estimate_pct)} {fmt_interval(c.rci_low_pct, c.rci_high_pct)}; "
            if c is not None else "")
    geo = fmt_pct(s.geomean_throughput_pct)
    return [f"- **{s.candidate} vs {s.baseline}: {s.word}** — {comp}output throughput (geomean) {geo}; cells "
            f"(Holm): {s.counts[Verdict.BETTER]} better, {s.counts[Verdict.WORSE]} worse, "
            f"{s.counts[Verdict.NOT_SIGNIFICANT]} not significant, {s.counts[Verdict.UNRELIABLE]} unreliable "
            f"([report]({md}), [html]({page}))"]


def failing_cells(s: CandidateSummary, min_effect: float) -> list[CellResult]:
    """Significantly worse cells (after Holm) with |Δ| ≥ ``min_effect`` percent."""
    return [c for c in s.regressions if abs(c.delta_pct or 0) >= min_effect]


def is_regression(s: CandidateSummary, min_effect: float) -> bool:
    """The primary test says REGRESSION (by at least ``min_effect`` percent), or a cell is worse by that much."""
    from suite.verdict import Outcome

    c = s.evaluation.composite if s.evaluation is not None else None
    composite = (s.overall == Outcome.REGRESSION.value and c is not None and c.estimate_pct is not None
                 and abs(c.estimate_pct) >= min_effect)
    return composite or bool(failing_cells(s, min_effect))


def run(args: argparse.Namespace) -> int:
    from suite.analysis import load_run
    from suite.report import build_report
    from suite.stats import fmt_interval, fmt_pct
    from suite.store import RunStore, atomic_write_text

    console = Console()
    run_a, run_b = resolve_run(args.run_a, args.runs, args.db), resolve_run(args.run_b, args.runs, args.db)
    ma, mb = RunStore.open(run_a).manifest(), RunStore.open(run_b).manifest()
    name_a, name_b = ma.matrix.name, mb.matrix.name
    if name_a != name_b and not args.allow_other_matrix:
        raise SuiteError(f"{run_a.name} is matrix {name_a!r}, {run_b.name} is {name_b!r} "
                         "(--allow-other-matrix to compare anyway)")
    label_a = args.label_a or default_label(run_a)
    label_b = args.label_b or default_label(run_b)
    if label_a == label_b and run_a.resolve() != run_b.resolve():
        label_a, label_b = f"{label_a}-a", f"{label_b}-b"
    out = (args.out or args.runs / f"compare-{safe(run_a.name)}-vs-{safe(run_b.name)}").resolve()  # as its reports
    summary = [f"# suite compare: {name_b}", "",
               f"`{run_a.name}` ({label_a}, {ma.status}) → `{run_b.name}` ({label_b}, {mb.status})", ""]
    failing = 0
    for arm_a, arm_b in arm_pairs(args, ma, mb):
        sub = out / safe(arm_a if arm_a == arm_b else f"{arm_a}-vs-{arm_b}")
        merged = merge_runs(run_a, arm_a, label_a, run_b, arm_b, label_b, sub)
        md = build_report(merged)
        page = merged / "report.html"
        for s in load_run(merged).summaries:
            summary += _summary_lines(s, str(md.relative_to(out)), str(page.relative_to(out)))
            failing += is_regression(s, args.min_effect)
            for c in failing_cells(s, args.min_effect):
                lo_hi = fmt_interval(*c.interval) if c.interval else "(no interval)"
                summary.append(f"  - ▼ {c.point} {c.metric}: {c.before:.4g} → {c.after:.4g} "
                               f"({fmt_pct(c.delta_pct)}, 95% interval {lo_hi})")
        console.print(f"{arm_a}@{label_a} → {arm_b}@{label_b}: {md} · {page}")
    summary.append("")
    effect = f" with |Δ| ≥ {args.min_effect:g}%" if args.min_effect else ""
    if failing:
        summary.append(f"**{failing} significant regression(s)**{effect}.")
    else:
        summary.append(f"No significant regression{effect}.")
    text = "\n".join(summary) + "\n"
    atomic_write_text(out / "summary.md", text)
    console.print(text, markup=False, highlight=False)
    console.print(f"summary: {out / 'summary.md'}")
    return 1 if failing and args.fail_on_regression else 0
