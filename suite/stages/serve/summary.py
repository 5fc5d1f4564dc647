"""The serving sections of the report (format neutral): before → after per candidate, metrics against
concurrency (charts), a Δ% heat map over points × metrics, and the statistics per point.

Every number comes from `suite.analysis` (`run.summaries`): a cell's before → after are the geometric means
its Δ% was computed from, and its 95 % interval is printed beside Δ. An unreliable cell names its reason
instead of an interval; a missing one says so. Results of ok serve jobs that could not be read are named in a
warning at the top of the first serving section.
"""

from __future__ import annotations

import statistics

from suite.analysis import RunData, with_left_out
from suite.analysis import completed_failed as _completed_failed
from suite.analysis import drift_checks as _drift_checks
from suite.candidate import CandidateSummary, CellResult
from suite.document import (
    MAX_STRENGTH,
    Cell,
    Chart,
    Frontier,
    FrontierPoint,
    FrontierSeries,
    Note,
    Paragraph,
    Section,
    Series,
    Table,
    fmt,
    fmt_p,
    literal,
    verdict_style,
)
from suite.stages.serve.read import PointResults
from suite.stats import DETAIL, DUPLICATES, HEADLINE, METRICS, Verdict, fmt_interval, fmt_pct

MARK = {Verdict.BETTER: "▲", Verdict.WORSE: "▼", Verdict.NOT_SIGNIFICANT: "·", Verdict.UNRELIABLE: "?"}
HEAT_STEPS = (2.0, 5.0, 10.0, 20.0)  # |Δ| % at which a significant cell's tint steps up (MAX_STRENGTH levels)
REASON_CHARS = 110  # an unreliable cell's reason in a table; the statistics table holds it in full
SERVING_TITLE = "Serving (`vllm bench serve`): before → after"


def label(key: str) -> str:
    return f"{METRICS[key].label} ({METRICS[key].unit})"


def _short(reason: str) -> str:
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1].rstrip() + "…"


def cell_text(c: CellResult) -> str:
    """``before → after (Δ [interval]) mark``; unreliable: ``… (Δ) ? unreliable: why``; or ``missing``."""
    if c.verdict is None:
        return "missing"
    if c.comparison is None:
        return f"? unreliable: {literal(_short(c.reason))}"
    move = f"{fmt(c.before)} → {fmt(c.after)}"
    if c.interval is not None:
        return f"{move} ({fmt_pct(c.delta_pct)} {fmt_interval(*c.interval)}) {MARK[c.verdict]}"
    if c.verdict is Verdict.UNRELIABLE:
        return f"{move} ({fmt_pct(c.delta_pct)}) ? unreliable: {literal(_short(c.reason))}"
    return f"{move} ({fmt_pct(c.delta_pct)}) {MARK[c.verdict]}"


def cell_tip(c: CellResult) -> str:
    if c.verdict is None:
        return c.reason
    parts = [f"{c.verdict.value}: {c.reason}"]
    if c.comparison is not None:
        cmp = c.comparison
        parts.append(f"n={cmp.baseline.n}/{cmp.candidate.n}, {cmp.method}")
        if cmp.p_value is not None:
            parts.append(f"p={fmt_p(cmp.p_value)}")
    parts += list(c.notes)
    return "; ".join(parts)


def _strength(c: CellResult) -> int:
    if not c.significant or c.delta_pct is None:
        return 0
    return min(MAX_STRENGTH, max(1, sum(abs(c.delta_pct) >= step for step in HEAT_STEPS)))


def doc_cell(c: CellResult, text: str | None = None) -> Cell:
    style = verdict_style(c.verdict) if c.verdict is not None else "missing"
    return Cell(cell_text(c) if text is None else text, style=style, tip=cell_tip(c), strength=_strength(c))


def measured_span(point: PointResults, arm: str) -> str:
    """The shortest and longest measured duration (`duration` of the raw result) of the arm's repeats."""
    d = [raw.duration for raw in point.reps.get(arm, {}).values() if raw.duration is not None]
    if not d:
        return "–"
    return f"{min(d):.1f}" if len(d) == 1 or f"{min(d):.1f}" == f"{max(d):.1f}" else f"{min(d):.1f}–{max(d):.1f}"


# ------------------------------------------------------------------------------------------- sections


def serving_section(run: RunData) -> Section | None:
    """Before → after per point and candidate; first, a warning naming the serve results that could not be
    read (the section is that warning alone when none could)."""
    if not run.points:
        return with_left_out(None, run.serve.unreadable, SERVING_TITLE, "serving")
    blocks: list = [Paragraph(
        "Geometric mean over repeats, baseline → candidate, Δ% (the ratio of those geometric means) with its 95 % "
        "interval; a declared metric at a tested point shows the primary test's own Δ and interval instead, the "
        "card's. ▲ better, ▼ worse: for a declared metric at a tested point, confirmed by the primary test; for "
        "the other cells, significant after Holm over them; · not significant (an interval can exclude 0 and "
        "still not be confirmed), ? unreliable (with why). Prompts: the point's count, or its measuring time for a point "
        "sized by time; Measured: the shortest and longest measured duration of one repeat; completed / failed "
        "requests are summed over repeats; each baseline/candidate.")]
    for s in run.serving_summaries:
        rows = []
        for p in run.points.values():
            pr = p.params
            arms = (run.baseline, s.candidate)
            done = [_completed_failed(p, a) for a in arms]
            size = f"{pr.duration_s:g} s" if pr.duration_s else str(pr.num_prompts)
            rows.append([Cell(str(pr.isl)), Cell(str(pr.osl)), Cell(str(pr.concurrency)), Cell(size),
                         *(doc_cell(s.cells[(p.point, k)]) for k in HEADLINE),
                         Cell(" / ".join(measured_span(p, a) for a in arms)),
                         Cell("/".join(str(d[0]) for d in done)), Cell("/".join(str(d[1]) for d in done))])
        blocks.append(Section(f"{run.baseline} → {s.candidate}", 3, [Table(
            ["ISL", "OSL", "Conc", "Prompts", *(label(k) for k in HEADLINE), "Measured (s)", "Completed",
             "Failed"], rows, name="before-after")]))
    return with_left_out(Section(SERVING_TITLE, 2, blocks, anchor="serving"), run.serve.unreadable, SERVING_TITLE,
                         "serving")


def charts_section(run: RunData) -> Section | None:
    if not run.points:
        return None
    groups: dict[tuple[object, object], list] = {}
    for p in run.points.values():
        groups.setdefault((p.params.isl, p.params.osl), []).append(p)
    blocks: list = [Paragraph("Per arm: the median over repeats, with the minimum and maximum of the repeats as "
                              "whiskers; hover a point for its numbers.")]
    for (isl, osl), pts in groups.items():
        pts = sorted(pts, key=lambda p: p.params.concurrency)
        charts = []
        for key in HEADLINE:
            series = []
            for arm in (a for a in run.arms if run.serves(a)):
                med, lo, hi, n = [], [], [], []
                for p in pts:
                    vals = list(p.values(arm, key).values())
                    med.append(statistics.median(vals) if vals else None)
                    lo.append(min(vals) if vals else None)
                    hi.append(max(vals) if vals else None)
                    n.append(len(vals))
                if any(m is not None for m in med):
                    series.append(Series(arm, med, lo, hi, n))
            if series:
                charts.append(Chart(f"isl{isl}-osl{osl}-{key}", METRICS[key].label, METRICS[key].unit,
                                    "concurrency", [str(p.params.concurrency) for p in pts], series,
                                    METRICS[key].higher_is_better))
        blocks.append(Section(f"ISL {isl} / OSL {osl}", 3, charts))
    return Section("Metrics against concurrency", 2, blocks, anchor="charts")


def frontier_section(run: RunData) -> Section | None:
    """Per ISL / OSL: output throughput against tokens a second per user (1000 / mean TPOT), each serving arm a
    line through its concurrencies, medians over repeats with their min–max; a candidate's point says its Δ of
    both with the cells' intervals. Up and to the right is better."""
    if not run.points:
        return None
    cells = {s.candidate: s.cells for s in run.serving_summaries}
    groups: dict[tuple[int, int], list] = {}
    for p in run.points.values():
        groups.setdefault((p.params.isl, p.params.osl), []).append(p)
    charts: list = []
    for (isl, osl), pts in groups.items():
        series = []
        for arm in (a for a in run.arms if run.serves(a)):
            points = []
            for p in sorted(pts, key=lambda p: p.params.concurrency):
                tput = list(p.values(arm, "output_throughput").values())
                user = [1000 / v for v in p.values(arm, "mean_tpot_ms").values() if v > 0]
                if not tput or not user:
                    continue
                tip = ""
                if (own := cells.get(arm)) is not None:
                    tip = "; ".join(f"{label(k)} {fmt_pct(c.delta_pct)}" + (f" {fmt_interval(*c.interval)}"
                                                                            if c.interval else "")
                                    for k in ("output_throughput", "mean_tpot_ms")
                                    if (c := own.get((p.point, k))) is not None and c.delta_pct is not None)
                points.append(FrontierPoint(f"c{p.params.concurrency}", statistics.median(user),
                                            statistics.median(tput), min(user), max(user), min(tput), max(tput), tip))
            if points:
                series.append(FrontierSeries(arm, points))
        if series:
            charts.append(Frontier(f"frontier-isl{isl}-osl{osl}", f"ISL {isl} / OSL {osl}",
                                   "tokens/s per user (1000 / mean TPOT)", "output tokens/s", series))
    if not charts:
        return None
    return Section("Throughput against interactivity", 2, [Paragraph(
        "Per input / output length, each arm's output tokens a second against the tokens a second each user sees "
        "(1000 / mean TPOT), one point per concurrency: the median over repeats. Up and to the right is better: "
        "a change that moves its line out helps at the same load. Hover a point for its min–max and, for a "
        "candidate, its Δ of both with the cells' 95 % intervals."), *charts], anchor="frontier")


def heatmap_section(run: RunData) -> Section | None:
    if not run.points or not run.serving_summaries:
        return None
    blocks: list = [Paragraph(
        f"Δ% per point and metric against {literal(run.baseline)}: green significantly better, red significantly "
        f"worse (deeper from |Δ| ≥ {', '.join(f'{s:g}' for s in HEAT_STEPS)} %), grey not significant, amber "
        "unreliable, hatched missing. Mean ITL is left out: it equals mean TPOT by construction.")]
    for s in run.serving_summaries:
        rows = []
        for p in run.points.values():
            pr = p.params
            row = [Cell(f"ISL {pr.isl} · OSL {pr.osl} · c{pr.concurrency}")]
            for k in DETAIL:
                c = s.cells[(p.point, k)]
                mark = MARK[c.verdict] if c.verdict in (Verdict.BETTER, Verdict.WORSE, Verdict.UNRELIABLE) else ""
                text = ("" if c.delta_pct is None else fmt_pct(c.delta_pct)) + mark if c.verdict else "—"
                row.append(doc_cell(c, text))
            rows.append(row)
        blocks.append(Section(literal(s.candidate), 3, [Table(["Point", *(METRICS[k].label for k in DETAIL)], rows,
                                                              name="heat")]))
    return Section("Δ% heat map", 2, blocks, anchor="heatmap")


def _stats_row(key: str, c: CellResult) -> list[Cell]:
    if c.verdict is None:
        return [Cell(label(key)), *(Cell("") for _ in range(7)), Cell("missing", style="missing", tip=c.reason)]
    cmp = c.comparison
    if cmp is None:
        return [Cell(label(key)), *(Cell("") for _ in range(7)),
                Cell(f"unreliable: {literal(c.reason)}", style="unreliable", tip=cell_tip(c))]
    mde = cmp.min_detectable_effect_pct
    return [Cell(label(key)), Cell(fmt(c.before)), Cell(fmt(c.after)), Cell(fmt_pct(c.delta_pct)),
            Cell(fmt_interval(*c.interval) if c.interval else "—"), Cell(fmt_p(cmp.p_value)),
            Cell(f"±{mde:.1f}%" if mde is not None and c.reliable else "—"),
            Cell(f"{cmp.baseline.n}/{cmp.candidate.n}"),
            doc_cell(c, f"{c.verdict.value}: {literal(c.reason)}")]


def _point_notes(run: RunData, s: CandidateSummary, point: str) -> list[Note]:
    notes = []
    left: dict[tuple[str, int], set[str]] = {}
    dropped: dict[tuple[int, str], None] = {}
    for k in DETAIL:
        c = s.cells[(point, k)]
        for arm, r, checks in c.left_out:
            left.setdefault((arm, r), set()).update(checks.split(", "))
        dropped.update(dict.fromkeys(c.dropped))
    if left:
        notes.append(Note("Left out by data-quality checks (for the metrics they spoil): " + "; ".join(
            f"{literal(arm)} {run.repeat_name(r)} ({', '.join(sorted(checks))})"
            for (arm, r), checks in sorted(left.items())),
            "unreliable"))
    if dropped:
        notes.append(Note(("Unpaired rounds dropped from both sides: " if run.blocks == 1 else
                           "Unpaired blocks dropped from both sides, each with its round (a round is scored on all "
                           "its blocks or not at all, in every cell as in the primary test): ") + "; ".join(
            f"{run.repeat_name(r)} (no {literal(arm)} value)" for r, arm in sorted(dropped)), "warning"))
    for d in _drift_checks(run.points[point]):
        notes.append(Note(f"Drift check {literal(d.arm)} {run.repeat_name(d.round)}, the point again at the session's "
                          "end: " + ", ".join(
            f"{METRICS[k].label} {fmt(a)} → {fmt(b)} ({fmt_pct((b / a - 1) * 100)})" for k, a, b in d.values),
            "warning"))
    return notes


def statistics_section(run: RunData) -> Section | None:
    if not run.points or not run.serving_summaries:
        return None
    pairing = ("paired per round (together: all: each round the median of its blocks both arms have; of two, their geometric mean)"
               if run.blocks > 1 else "paired per round (ABBA): Δ from the rounds both arms have" if run.paired
               else "Welch (independent repeats)")
    blocks: list = [Paragraph(
        f"Before / after: geometric means of the repeats used. Interval: 95 % t interval on the log ratio, {pairing}; "
        "a declared metric at a tested point shows the primary test's Δ, interval (at the level that decided it) "
        "and p, as the verdict card does, and is significant when that test confirms it. Any other cell is "
        "significant only when its interval excludes 0, |Δ| exceeds the A/A noise floor (when measured) and it "
        "survives Holm over the other cells. MDE: the smallest |Δ| these repeats could detect "
        f"with 80 % power. Mean ITL is not shown: it equals mean TPOT ({', '.join(DUPLICATES)} = "
        f"{', '.join(DUPLICATES.values())} by construction in vLLM's benchmark).")]
    if run.floors:
        blocks.append(Paragraph("A/A noise floor (baseline vs itself): "
                                + ", ".join(f"{METRICS[k].label} {v:.2f}%" for k, v in run.floors.items())))
    headers = ["Metric", "Before", "After", "Δ%", "Interval", "p", "MDE", "n", "Verdict"]
    for s in run.serving_summaries:
        for p in run.points.values():
            rows = [_stats_row(k, s.cells[(p.point, k)]) for k in DETAIL]
            blocks.append(Section(f"{p.point}: {run.baseline} → {s.candidate}", 3,
                                  [Table(headers, rows, name="stats"), *_point_notes(run, s, p.point)],
                                  collapsed=True))
    return Section("Statistics per point", 2, blocks, anchor="details")
