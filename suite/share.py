"""A run's result in the forms it leaves the machine in: ``summary.md`` (what a pull request pastes: each
candidate's word, its per-point table, where it ran, the environment and the command that reproduces it),
``results.json`` (the same numbers and every cell, a versioned schema for tools) and ``results.csv`` (one row per
cell). All three are drawn from the analysis the report draws (`suite.analysis`) and from its cards
(`suite.report_verdict.card`), so they cannot disagree with report.md.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from suite import report_sections as sections
from suite import report_verdict as verdict_cards
from suite.analysis import RunData
from suite.candidate import CandidateSummary
from suite.document import Card, Document, Paragraph, Section, code, literal
from suite.render import markdown as md_render
from suite.run_facts import Environment, environment
from suite.stats import METRICS

RESULTS_SCHEMA = 1


class PointResult(BaseModel):
    point: str
    metric: str
    before: float | None
    after: float | None
    delta_pct: float | None  # a latency's rise is +
    ci_low_pct: float | None  # the interval that decided the point (the test's own level)
    ci_high_pct: float | None
    word: str  # better | worse | better and worse | equal | undecided
    expected: str | None = None  # verdict.expect: better | worse | changed | flat
    as_expected: bool | None = None


class CellResult(BaseModel):
    point: str
    metric: str
    before: float | None
    after: float | None
    delta_pct: float | None
    ci_low_pct: float | None  # the cell's own 95 % interval
    ci_high_pct: float | None
    p_value: float | None
    verdict: str | None  # better | worse | not significant | unreliable (the report's marks); None: not tested
    reason: str = ""


class CandidateResult(BaseModel):
    candidate: str
    baseline: str
    word: str
    where: str  # "better at c1; worse at c8, c16"
    composite_pct: float | None
    composite_ci_pct: tuple[float, float] | None
    rounds: int | None
    points: list[PointResult]
    cells: list[CellResult]


class Results(BaseModel):
    schema_version: int = RESULTS_SCHEMA
    run: str
    matrix: str
    matrix_path: str | None
    status: str
    environment: Environment
    candidates: list[CandidateResult]


def _verdict_word(cell: Any) -> str | None:
    return None if cell.verdict is None else cell.verdict.value


def candidate_result(run: RunData, s: CandidateSummary) -> CandidateResult:
    ev = s.evaluation
    points: list[PointResult] = []
    if ev is not None:
        words = ev.point_words()
        first = s.spec.metrics[0]
        for point, tests in ev.points.items():
            main = next((h for h in tests if h.metric == first), tests[0])
            cell = s.cells.get((point, str(main.metric)))
            own = main.shown.own_interval_pct
            want = s.spec.expected(point) if s.spec.expect is not None else None
            word = words[point].value
            points.append(PointResult(
                point=point, metric=str(main.metric), before=cell.before if cell else None,
                after=cell.after if cell else None, delta_pct=main.shown.delta_pct,
                ci_low_pct=own[0] if own else None, ci_high_pct=own[1] if own else None, word=word,
                expected=want, as_expected=None if want is None else verdict_cards.expectation_met(want, words[point])
                .startswith("as expected")))
    cells = [CellResult(point=c.point, metric=c.metric, before=c.before, after=c.after, delta_pct=c.delta_pct,
                        ci_low_pct=c.interval[0] if c.interval else None,
                        ci_high_pct=c.interval[1] if c.interval else None,
                        p_value=c.comparison.p_value if c.comparison else None, verdict=_verdict_word(c),
                        reason=c.reason or "")
             for c in s.cells.values()]
    comp = ev.composite if ev is not None else None
    return CandidateResult(
        candidate=s.candidate, baseline=s.baseline, word=s.word,
        where=verdict_cards.where_it_acts(run, ev) if ev is not None and len(ev.cells) > 1 else "",
        composite_pct=comp.estimate_pct if comp else None,
        composite_ci_pct=(comp.rci_low_pct, comp.rci_high_pct) if comp and comp.rci_low_pct is not None else None,
        rounds=comp.n_rounds if comp else None, points=points, cells=cells)


def results(run: RunData) -> Results:
    m = run.manifest
    return Results(run=sections.run_name(run), matrix=m.matrix.name, matrix_path=m.matrix_path, status=m.status,
                   environment=environment(run),
                   candidates=[candidate_result(run, s) for s in run.summaries])


def results_json(run: RunData) -> str:
    return json.dumps(results(run).model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def results_csv(run: RunData) -> str:
    """One row per cell (candidate, point, metric) with the cell's own interval and verdict."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["candidate", "baseline", "point", "metric", "before", "after", "delta_pct", "ci_low_pct",
                "ci_high_pct", "p_value", "verdict"])
    for c in results(run).candidates:
        for cell in c.cells:
            w.writerow([c.candidate, c.baseline, cell.point, cell.metric, cell.before, cell.after, cell.delta_pct,
                        cell.ci_low_pct, cell.ci_high_pct, cell.p_value, cell.verdict or ""])
    return out.getvalue()


def _short(card: Card) -> Card:
    """A card for a pull request: the word, the per-point table, the rounds and what it could detect, where it
    ran, whether the arms differ only by the patch, and any line in bold (an output change, a failed A/A control,
    software differing beyond the patch); the rest stays in report.md."""
    keep = [line for line in card.lines if line.startswith(("**", "where it ran", "software:", "composite:"))]
    return replace(card, lines=keep, correctness=card.correctness)


def environment_line(env: Environment) -> str:
    gpus = "; ".join(env.gpus) or (f"CPU {', '.join(env.cpus)} (no GPU)" if env.cpus else "no GPU recorded")
    arms = "; ".join(f"{literal(a)}: vLLM {literal(info.vllm or '?')}"
                     + (" + " + ", ".join(literal(('-' if p.reverse else '') + (p.name or '?')) for p in info.patches)
                        if info.patches else "")
                     + "".join(f", {name} {literal(version)}" for name, version in info.packages.items())
                     for a, info in env.arms.items())
    wall = f"; {env.running_s / 60:.0f} min running" if env.running_s is not None else ""
    return (f"{literal(gpus)}" + (f", driver {literal(', '.join(env.drivers))}" if env.drivers else "")
            + (f", CUDA/ROCm {literal(', '.join(env.cuda))}" if env.cuda else "") + f"; {arms}; suite "
            f"{literal(env.suite or '?')}{wall}")


def summary_markdown(run: RunData) -> str:
    """summary.md: the run in one screen, for a pull request."""
    env = environment(run)
    cards = [_short(verdict_cards.card(run, s)) for s in run.summaries]
    if run.control is not None:
        cards.append(_short(verdict_cards.control_card(run, run.control)))
    m = run.manifest
    blocks: list[Any] = list(cards) or [Paragraph("No candidate arm: nothing to compare.")]
    blocks.append(Paragraph(f"Environment: {environment_line(env)}."))
    if m.matrix_path:
        blocks.append(Paragraph(f"Reproduce: {code(f'suite run {m.matrix_path}')}; every metric at every point, data "
                                "quality and provenance: report.md / report.html beside this file."))
    doc = Document(sections.title(run), [], [Section("Verdict", 2, blocks, anchor="verdict")],
                   f"run {code(sections.run_name(run))}, status {literal(m.status)}; {_metrics(run)}")
    return md_render.render(doc)


def _metrics(run: RunData) -> str:
    spec = run.summaries[0].spec if run.summaries else None
    if spec is None:
        return "no primary test"
    return ("declared metrics: " + ", ".join(METRICS[k].label for k in spec.metrics) + "; Δ % in a table is the "
            "metric's own change (a latency's + is slower), the composite's is signed so that better is +")
