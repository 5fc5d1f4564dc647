"""The report's verdict section (format neutral): one card per candidate and the A/A control's card.

The card is the primary test's (`suite.verdict`, through `suite.analysis`): the outcome word, the composite
Δ with its interval, the smallest change the run could have detected, the rounds used, each point's word
(`point_table`) and correctness (greedy equivalence, accuracy gate). The per-cell tests below it only show where
it changed. The other run-level sections: :mod:`suite.report_sections`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from suite.analysis import RunData
from suite.candidate import (
    CONTROL_FAILED,
    CONTROL_UNTESTED,
    NO_DATA,
    OUTPUT_CHANGED,
    CandidateSummary,
    CellResult,
)
from suite.document import (
    Card,
    Cell,
    Paragraph,
    Section,
    Table,
    fmt,
    fmt_p,
    literal,
    outcome_style,
)
from suite.matrix_jobs import PointLabel
from suite.records import elapsed_s
from suite.report_sections import software_line
from suite.run_facts import machines
from suite.stages.accuracy.read import GATE_FILTER, ArmsCorrectness
from suite.stats import METRICS, Verdict, fmt_interval, fmt_pct
from suite.verdict import SPENDING_LABEL, Outcome, PrimaryResult
from suite.verdict_family import COMPOSITE_WEIGHT, Evaluation, Hypothesis, PointWord, point_word

MAX_SHOWN_PCT = 1000.0  # an MDE beyond +1,000 % (×11) is said in words
# the composite's interval is shown unless it spans more than a factor 11 either way around its estimate (an
# early look or two wild rounds): past that it reads as noise, e.g. [−100.0, +5.6e+20]
MAX_CARD_HALF_WIDTH_LOG = math.log1p(MAX_SHOWN_PCT / 100)
MAX_LISTED_POINTS = 4  # the card names where its other significant cells are, for this many points
SESSION_CHECKS = ("drift", "bimodal-sessions")  # findings about an arm's rounds, which the primary test pairs


def correctness_lines(c: ArmsCorrectness) -> list[str]:
    lines = []
    eq = c.equivalence
    if eq is not None:
        div = (f"; median first divergence at {eq.unit[:-1]} {eq.median_first_divergence:g}"
               if eq.median_first_divergence is not None else "")
        lines.append(f"greedy equivalence: {eq.n_identical}/{eq.n} completions identical "
                     f"({100 * eq.share_identical:.1f} %){div}")
    acc = c.accuracy
    if acc is not None:
        f = next((x for x in acc.filters if x.filter == GATE_FILTER), acc.filters[-1] if acc.filters else None)
        if f is not None and f.uninformative:
            what = f"uninformative: no arm answers any question right ({f.filter})"
        elif f is not None:
            what = (f"{f.filter} {100 * f.delta:+.1f} pp {fmt_interval(100 * f.paired.delta_ci_low, 100 * f.paired.delta_ci_high)}"
                    f" ({f.lost} lost, {f.gained} gained of {f.n_paired})")
        else:
            what = "no samples"
        gate = f"gate **{acc.verdict}**" if acc.gates else "no gate set"
        changed = (f"; responses changed on {acc.responses_changed}/{acc.n_questions} questions"
                   if acc.responses_changed else "")
        lines.append(f"accuracy {literal(acc.task)}{' (synthetic)' if acc.synthetic else ''}: {what}; {gate}{changed}")
    lines += [literal(p) for p in c.problems]
    return lines or ["not measured (no accuracy or equivalence jobs)"]


def _interval(lo: float | None, hi: float | None) -> str:
    """An interval of the composite, or why it is not shown."""
    if lo is None or hi is None:
        return "(no interval)"
    if lo <= -100 or not math.isfinite(hi) or (math.log1p(hi / 100) - math.log1p(lo / 100)) / 2 > MAX_CARD_HALF_WIDTH_LOG:
        return "(interval wider than ×/÷ 11: too wide to show)"
    return fmt_interval(lo, hi)


def _between_looks(s: CandidateSummary, c: PrimaryResult) -> int | None:
    """The look after the one tested, when the test has more rounds than its look planned: a run that ended
    between looks (interrupted, or its budget spent) is tested at the boundary of the last look it reached."""
    k = c.look - 1
    if c.n_looks > 1 and 0 <= k < len(s.spec.looks) - 1 and c.n_rounds > s.spec.looks[k]:
        return s.spec.looks[k + 1]
    return None


def _short_of(s: CandidateSummary, c: PrimaryResult) -> int | None:
    """The rounds its look was planned after, when the test has fewer (a run stopped before that look)."""
    planned = s.spec.looks[c.look - 1] if 0 < c.look <= len(s.spec.looks) else None
    return planned if planned is not None and c.n_rounds < planned else None


def _look(s: CandidateSummary, c: PrimaryResult, unit: str) -> str:
    where = f"look {c.look} of {c.n_looks}"
    if (planned := _short_of(s, c)) is not None:  # a run stopped before its first look: say so
        return f"{c.n_rounds} {unit}s, short of {where}, planned after {planned}; tested at that look's boundary"
    return where + (f", on {c.n_rounds} {unit}s" if _between_looks(s, c) is not None else "")


def _reason(s: CandidateSummary, c: PrimaryResult, unit: str) -> str:
    """Why the word, from the test's own numbers (its interval shown only when it is not absurdly wide)."""
    p = f"p={fmt_p(c.p_value)}" if c.p_value is not None else "no p-value"
    if c.p_value is None and c.n_rounds < 2 and (planned := _short_of(s, c)) is not None:
        # one round of a run that stopped before its first look: no test yet, and not a final one either
        test = f"look {c.look} of {c.n_looks}" if c.n_looks > 1 else "the test (fixed design)"
        return f"{c.n_rounds} {unit}{'s' if c.n_rounds != 1 else ''}: no interval; {test} is planned after {planned} {unit}s"
    where = "fixed design" if c.n_looks == 1 else _look(s, c, unit)
    if c.outcome in (Outcome.IMPROVEMENT, Outcome.REGRESSION):
        return f"{p} < {c.nominal_alpha:.2g}: the interval excludes 0 ({where})"
    if c.outcome == Outcome.EQUIVALENT:
        return f"the interval lies inside ±{s.spec.target_pct:g} % (TOST p={fmt_p(c.tost)}; {where})"
    if c.p_value is None:
        return literal(c.reason)
    plan = (f"; about {c.rounds_for_target} {unit}s would detect ±{s.spec.target_pct:g} %"
            if c.rounds_for_target is not None and c.rounds_for_target > c.n_rounds else "")
    return f"neither a change nor equivalence within ±{s.spec.target_pct:g} %: {p}{plan} ({where})"


def _named_cells(cells: list[CellResult], labels: dict[str, str]) -> str:
    """`` (c1: Median TPOT, Median ITL; c8: P99 TTFT)``: where the cells are, by point, the first few points."""
    by_point: dict[str, list[str]] = {}
    for c in cells:
        by_point.setdefault(labels.get(c.point, c.point), []).append(METRICS[c.metric].label)
    if not by_point:
        return ""
    named = [f"{literal(p)}: {', '.join(ms)}" for p, ms in list(by_point.items())[:MAX_LISTED_POINTS]]
    more = len(by_point) - MAX_LISTED_POINTS
    return " (" + "; ".join(named) + (f"; {more} more points" if more > 0 else "") + ")"


def point_labels(run: RunData) -> dict[str, str]:
    """Short names of the serving points: ``c8`` when every point has one ISL/OSL, else ``1024/1024 c8``; the
    point's id where two would read alike."""
    shapes = {(p.params.isl, p.params.osl) for p in run.points.values()}
    labels = {pid: (f"c{p.params.concurrency}" if len(shapes) == 1 else
                    str(PointLabel(p.params.isl, p.params.osl, p.params.concurrency)))
              for pid, p in run.points.items()}
    seen = [*labels.values()]
    return {pid: label if seen.count(label) == 1 else pid for pid, label in labels.items()}


# a point's word tinted as the card's words are (an equal point as EQUIVALENT, an undecided one as INCONCLUSIVE)
WORD_STYLE = {PointWord.BETTER: "better", PointWord.WORSE: "worse", PointWord.BOTH: "mixed",
              PointWord.EQUAL: "equivalent", PointWord.UNDECIDED: "inconclusive"}
EXPECTED_WORDS = {"better": {PointWord.BETTER}, "worse": {PointWord.WORSE}, "flat": {PointWord.EQUAL},
                  "changed": {PointWord.BETTER, PointWord.WORSE, PointWord.BOTH}}


def _said(h: Hypothesis, way: str = "") -> str:
    """"Mean TTFT +4.1%" (``way``: "Mean TTFT worse +4.1%"): a cell by its metric and its own Δ (a latency rise
    is +)."""
    name = " ".join(x for x in (METRICS[str(h.metric)].label, way) if x)
    return f"{name} {fmt_pct(h.result.delta_pct)}" if h.result.delta_pct is not None else name


def point_says(cells: list[Hypothesis], main: Hypothesis, target_pct: float) -> str:
    """A point's own word, with the other metrics that made it (the table shows the first declared metric)."""
    word = point_word(cells)
    if word == PointWord.EQUAL:
        return f"equal within ±{target_pct:g} %"
    if word == PointWord.UNDECIDED:
        mde = main.result.mde_pct
        return ("undecided" + (f" (could detect ±{mde:.1f} %)" if mde is not None and mde < MAX_SHOWN_PCT else ""))
    others = [h for h in cells if h.confirmed is not None and h is not main]
    if word == PointWord.BOTH:  # say which way each went
        named = [_said(h, "better" if h.confirmed == Outcome.IMPROVEMENT else "worse")
                 for h in cells if h.confirmed is not None]
        return f"{word.value} ({', '.join(named)})"
    return word.value + (f" ({', '.join(_said(h) for h in others)})" if others else "")


def expectation_met(expected: str, word: PointWord) -> str:
    """Whether a point did what the matrix said the change would do there."""
    if word in EXPECTED_WORDS[expected]:
        return "as expected"
    if expected == "flat":
        return "moved where nothing should" if word != PointWord.UNDECIDED else "not shown flat (undecided)"
    if word == PointWord.UNDECIDED:
        return "not seen (undecided)"
    if word == PointWord.EQUAL:
        return "not seen: equal"
    return "the other way" if word in (PointWord.BETTER, PointWord.WORSE) else "both ways"


def point_table(run: RunData, s: CandidateSummary) -> Table | None:
    """The card's first lines: per tested point, the first declared metric before → after, Δ % with the interval
    that decided it, and the point's own word (and, where the matrix declares it, what was expected)."""
    ev = s.evaluation
    if ev is None or not ev.cells:
        return None
    labels = point_labels(run)
    first = s.spec.metrics[0]
    expect = s.spec.expect is not None
    rows = []
    for point, cells in ev.points.items():
        main = next((h for h in cells if h.metric == first), cells[0])
        cell = s.cells.get((point, str(main.metric)))
        move = (f"{fmt(cell.before)} → {fmt(cell.after)}" if cell is not None and cell.before is not None
                and cell.after is not None else "—")
        r = main.shown
        own = r.own_interval_pct
        delta = "—" if r.delta_pct is None else fmt_pct(r.delta_pct) + (
            f" {fmt_interval(*own)}" if own is not None and not r.rci_too_wide else "")
        word = point_word(cells)
        row = [Cell(literal(labels.get(point, point))), Cell(move), Cell(delta),
               Cell(point_says(cells, main, s.spec.target_pct), WORD_STYLE[word])]
        if expect:
            want = s.spec.expected(point)
            row.append(Cell("—" if want is None else f"{want}: {expectation_met(want, word)}"))
        rows.append(row)
    m = METRICS[first]
    return Table(["Point", f"{m.label} ({m.unit})", "Δ %", "Says", *(["Expected"] if expect else [])], rows,
                 align=["left", "right", "right", "left", *(["left"] if expect else [])], name="points")


def where_it_acts(run: RunData, ev: Evaluation) -> str:
    """"better at c1; worse at c8, c16": the points by their words, the card's headline."""
    if not ev.cells:
        return ""
    labels = point_labels(run)
    by: dict[PointWord, list[str]] = {}
    for point, word in ev.point_words().items():
        by.setdefault(word, []).append(literal(labels.get(point, point)))
    if set(by) == {PointWord.EQUAL}:
        return "equal at every point"
    composite = ev.composite_test.confirmed
    if composite is not None and not any(h.confirmed for h in ev.cells):  # the whole confirmed, no point alone
        return f"{'better' if composite == Outcome.IMPROVEMENT else 'worse'} over the points as a whole, no point alone"
    order = (PointWord.BETTER, PointWord.WORSE, PointWord.BOTH, PointWord.EQUAL, PointWord.UNDECIDED)
    return "; ".join(f"{w.value} at {', '.join(by[w])}" for w in order if w in by)


def where_line(run: RunData, arms: list[str]) -> str:
    """Where the arms' jobs ran, for the card: the one machine; every machine with its rounds, in bold, when
    there were several; "not recorded" for a run from before the suite recorded it (and how it was resumed)."""
    found = machines(run, arms)
    if len(found) == 1:
        return f"where it ran: {literal(found[0].name)}"
    if found:
        return (f"**ran on {len(found)} machines**: " + "; ".join(
            f"{literal(m.name)} ({_rounds(m.rounds) or f'{m.jobs} jobs'})" for m in found)
            + " — a round whose arms ran on different machines is not paired, and the test takes the machine out "
            "(see Data quality)")
    said = "where it ran: not recorded (the run predates the suite recording it)"
    stretches = run.manifest.stretches
    if len(stretches) > 1:
        gap = elapsed_s(stretches[0].started, stretches[-1].started)
        said += (f"; it was resumed ({len(stretches)} stretches"
                 + (f", the last {gap / 3600:.1f} h after the first" if gap is not None else "")
                 + "): its stretches may have run on different machines, and nothing recorded can tell")
    return said


def software_lines(run: RunData, arm: str) -> list[str]:
    return [line] if (line := software_line(run, arm)) is not None else []


def _rounds(rounds: tuple[int, ...]) -> str:
    return f"round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))}" if rounds else ""


def card(run: RunData, s: CandidateSummary) -> Card:
    title_ = f"{literal(s.candidate)} vs {literal(s.baseline)}"
    correct = correctness_lines(s.correctness)
    ev = s.evaluation
    eq = s.correctness.equivalence
    changed = eq is not None and eq.n_identical < eq.n
    if ev is None or s.overall == NO_DATA:
        why = s.error or ("no serving result could be read (the serving section names the files)"
                          if not run.points and run.serve.unreadable else
                          "a matrix of offline stages only (no serving points)" if not run.points else
                          "no serving rounds of both arms" if run.serves(s.candidate)
                          else "a correctness-only arm (serving: false)")
        if eq is not None:  # a correctness-only arm (or one without serving rounds): judged on its outputs
            word = s.word
            head = (f"greedy outputs differ from the baseline's in {eq.n - eq.n_identical} of {eq.n} prompts"
                    if changed else f"greedy outputs identical to the baseline's in all {eq.n} prompts")
            return Card(title_, word, outcome_style(word), head, correctness=correct,
                        lines=[f"no speed verdict: {literal(why)}", where_line(run, [s.baseline, s.candidate]),
                               *software_lines(run, s.candidate)])
        # offline stages only (NO SERVING TEST: their tables hold data and verdicts), or nothing to read
        return Card(title_, s.word, outcome_style(NO_DATA), f"no primary test: {literal(why)}", correctness=correct,
                    lines=[where_line(run, [s.baseline, s.candidate]), *software_lines(run, s.candidate)])
    c = ev.composite
    unit = run.design.unit  # what the test pairs: a round
    planned = "planned: " if _short_of(s, c) is not None else ""  # no look reached yet: the design, not a result
    level = planned + ("95 % interval" if c.n_looks == 1
                       else f"repeated {100 * (1 - c.nominal_alpha):.3g} % interval, look {c.look} of {c.n_looks} "
                            f"({SPENDING_LABEL[c.spending]})"
                       + (f": {c.n_rounds} {unit}s at that look's boundary (the run ended before the look after {nxt})"
                          if (nxt := _between_looks(s, c)) is not None else ""))
    metrics = ", ".join(METRICS[m].label for m in s.spec.metrics)
    composite = f"composite {fmt_pct(c.estimate_pct)} {_interval(c.rci_low_pct, c.rci_high_pct)}"
    where = where_it_acts(run, ev) if len(ev.cells) > 1 else ""
    headline = f"{where} · {composite}" if where else composite
    if run.design.all_together:  # the round is the unit: its blocks share one start of the servers
        rounds = (f"{c.n_rounds} round{'s' if c.n_rounds != 1 else ''} of servers alive at once, each the "
                  + (f"median of its {run.blocks} blocks" if run.blocks > 2 else
                     f"geometric mean of its {run.blocks} block{'s' if run.blocks != 1 else ''}") + ", paired by round")
    else:
        rounds = f"{c.n_rounds} round{'s' if c.n_rounds != 1 else ''} paired by round index" + (
            "" if run.paired else f" ({literal(run.order or 'unordered')} order: the pairing cancels no drift)")
    if run.layouts > 1:
        rounds += (f"; crossed over {run.layouts} GPU layouts: the mean of the layouts' means, the spread within "
                   f"layouts ({c.n_rounds} rounds, {c.n_rounds - run.layouts} degrees of freedom)")
    if "machines" in c.variance:  # rounds on several machines: each machine's own speed taken out
        rounds += (f"; over the machines the {unit}s ran on: the mean of the machines' means, the spread within "
                   "machines")
    if ev.dropped:
        rounds += "; dropped: " + "; ".join(literal(d.split(" (", 1)[0]) for d in ev.dropped)
    later = sorted({r // run.blocks for p in run.points.values() for r in p.reps.get(s.candidate, {})
                    if s.decided_after is not None and r // run.blocks >= s.decided_after})
    if later:  # decided at a look, measured on for other candidates: the test stopped at its look
        rounds += (f"; decided at the look after {s.decided_after} {unit}s: {unit}{'s' if len(later) > 1 else ''} "
                   f"{', '.join(map(str, later))} measured for the other candidates, shown in the cells, not tested")
    mde = (f"smallest change it could detect: ±{c.mde_pct:.1f} % at {100 * s.spec.power:g} % power"
           if c.mde_pct is not None and c.mde_pct < MAX_SHOWN_PCT else
           "smallest change it could detect: beyond ×10" if c.mde_pct is not None else None)
    over = ("points" if s.spec.points is None else
            f"the {len(s.spec.points)} declared points ({', '.join(literal(p) for p in s.spec.points)}; the others "
            "are shown, not tested)")
    share = ev.composite_test.level
    lines = [f"{level}; better is +; composite of {metrics}, geometric mean over {over}"
             + (f"; tested at {100 * share:.3g} % of α beside {len(ev.cells)} point × metric tests (weighted Holm)"
                if len(ev.cells) > 1 else ""),
             ("composite: " if len(ev.cells) > 1 else "") + _reason(s, c, unit)]
    if c.n_rounds >= 2:  # the values the test ran on: one far from the others is what widens its interval
        lines.append(f"each {unit}'s score: " + ", ".join(
            f"{unit} {r} {fmt_pct(v)}" for r, v in zip(c.rounds, c.scores_pct, strict=True)))
    if changed:
        lines.insert(0, f"**{OUTPUT_CHANGED}**: greedy outputs differ from the baseline's in "
                        f"{eq.n - eq.n_identical} of {eq.n} prompts — a speed verdict says nothing about correctness")
    if s.geomean_throughput_pct is not None:
        over = f"{s.points} point" + ("" if s.points == 1 else "s")
        lines.append(f"output throughput {fmt_pct(s.geomean_throughput_pct)} (geometric mean over {over})")
    if s.left_out:
        lines.append(f"{len(s.left_out)} values left out of the test by data-quality checks (see Data quality)")
    lines.append(where_line(run, [s.baseline, s.candidate]))
    lines += software_lines(run, s.candidate)
    n = sum(s.counts.values())
    tested = {(h.point, h.metric) for h in ev.cells}
    others = {k: c_ for k, c_ in s.cells.items() if k not in tested}
    if others:
        worse = [c_ for c_ in others.values() if c_.verdict is Verdict.WORSE]
        better = [c_ for c_ in others.values() if c_.verdict is Verdict.BETTER]
        unreliable = sum(c_.verdict is Verdict.UNRELIABLE for c_ in s.cells.values())
        labels = point_labels(run)
        lines.append(f"the other cells (every metric at every point, {len(others)} of {n}; not part of the word, Holm "
                     f"among themselves; their numbers: Statistics per point): {len(worse)} worse"
                     + _named_cells(worse, labels) + f", {len(better)} better" + _named_cells(better, labels)
                     + (f"; {unreliable} of all {n} unreliable (each one's reason: Statistics per point)"
                        if unreliable else ""))
    doubts = sorted({f"{f.check} ({f.arm})" for f in run.findings
                     if f.check in SESSION_CHECKS and f.arm in (s.baseline, s.candidate)})
    if doubts:  # what the rounds' independence rests on: the Data quality box has the numbers
        lines.append(f"data quality: {', '.join(literal(d) for d in doubts)} — the {unit}s may not be independent "
                     "draws; see Data quality")
    for check, meaning in (("session-drift", "a server measured a point differently at its session's start and end"),
                           ("round-outlier", "a round measured a point far from its arm's other rounds")):
        by_arm: dict[str, list[int]] = {}
        for f in run.findings:  # only rounds this test used: a doubt over a round it never read is not its own
            if (f.check == check and f.arm in (s.baseline, s.candidate) and f.round is not None
                    and f.round in c.rounds):
                by_arm.setdefault(f.arm, []).append(f.round)
        if by_arm:  # a server off its level (within its session, or against the arm's others): its round is suspect
            lines.append(f"data quality: {check} (" + "; ".join(
                f"{literal(arm)} round {', '.join(map(str, sorted(set(rs))))}" for arm, rs in sorted(by_arm.items()))
                + f") — {meaning}; see Data quality")
    ctrl = run.control
    if (ctrl is not None and ctrl.control_word == CONTROL_FAILED and ctrl.evaluation is not None
            and s.candidate != run.aa_arm):
        cc = ctrl.evaluation.composite
        lines.insert(0, f"**A/A control failed**: two identical arms differed by {fmt_pct(cc.estimate_pct)} "
                        f"{_interval(cc.rci_low_pct, cc.rci_high_pct)} in this run; a speed verdict here is "
                        "evidence only for a change well beyond that (see the A/A control card)")
    return Card(title_, s.overall, outcome_style(s.overall), headline, mde=mde, rounds=rounds, correctness=correct,
                lines=lines, points=point_table(run, s))


def control_card(run: RunData, s: CandidateSummary) -> Card:
    """The A/A control: the baseline started again as its own arm, judged by the candidates' primary test."""
    base = card(run, s)
    word = s.control_word
    eq = s.correctness.equivalence
    unit = run.design.units  # "rounds" under together: all
    if word == CONTROL_FAILED:
        why = (f"the same test called two identical arms different: this run's {unit} were not independent draws "
               "(the machine's speed drifted, or sessions differed); a candidate verdict near this size is not "
               f"evidence — rerun on a steadier machine or with more {unit}")
    elif word == NO_DATA:
        why = "no A/A result: the control could not be judged"
    elif word == CONTROL_UNTESTED:
        why = (f"not tested: the test needs at least two {unit} with a spread between them, so it can neither "
               "pass nor fail this run; the between-start difference below is one draw, not a noise estimate")
    else:
        rounds = (f"every {unit.removesuffix('s')}" if run.design.aa != "alternate" or s.evaluation is None
                  else f"{unit} " + ", ".join(map(str, s.evaluation.composite.rounds)) + " (aa: alternate)")
        why = ("no false alarm: the same test found no change between two identical arms (the baseline started "
               f"again in {rounds})")
    lines = [why, *base.lines]
    alarms = len(s.regressions) + len(s.improvements)
    if alarms and word != CONTROL_FAILED:  # its test passed, yet cells of two identical arms were called changed
        lines.append(f"{alarms} of its cells significant between two identical arms (above): false alarms of the "
                     "cells, which Holm over an arm's cells allows in 5 % of runs; a candidate's lone significant "
                     "cell can be one too")
    seq = run.manifest.sequential
    if s.decided_after is not None and s.evaluation is not None and seq is not None:
        c = s.evaluation.composite
        at = (f"its own sequential test decided at its look {c.look} of {c.n_looks}, after {s.decided_after} {unit} "
              f"of the run (the A/A arm's {unit} {', '.join(map(str, c.rounds))})")
        lines.insert(1, at + (f": the A/A arm's sessions of later {unit} were not run"
                              if seq.stop_after is None or s.decided_after < seq.stop_after
                              else ", where the run stopped"))
    if eq is not None and eq.n_identical < eq.n:
        lines.insert(1, f"greedy outputs of two identical arms differ in {eq.n - eq.n_identical} of {eq.n} prompts: "
                        "the server is not deterministic here, so greedy equivalence is no evidence in this run")
    return replace(base, title=f"A/A control: {literal(s.candidate)} vs {literal(s.baseline)}", word=word,
                   style=outcome_style(word), lines=lines)


def control_stops_itself(run: RunData) -> bool:
    """Whether the runner tested this run's A/A control as a sequential test of its own (its looks record
    whether it was decided); a run recorded before that, or of fixed repeats, tested it once at the end."""
    seq = run.manifest.sequential
    return seq is not None and any(look.control_decided is not None for look in seq.looks)


def verdict_section(run: RunData) -> Section:
    if not run.summaries:
        return Section("Verdict", 2, [Paragraph("No candidate arm: nothing to compare.")], anchor="verdict")
    spec = run.summaries[0].spec
    unit = run.design.unit  # what the test pairs: a round
    legend = Paragraph(
        f"One primary test per candidate, declared before the run, asked at each point: every declared metric at "
        f"every tested point (candidate/baseline per {unit}, paired by {unit}, t test over {unit}s), and their "
        "composite (the geometric mean over them), tested as one family at family-wise α: the composite first "
        f"holds {100 * COMPOSITE_WEIGHT:g} % of α and the point × metric tests share the rest, each confirmed test "
        "passing its share to the others (weighted Holm over the looks' group-sequential boundaries). A point "
        "reads **better** / **worse** when a test there is confirmed, **equal** when its interval lies inside "
        f"±{spec.target_pct:g} % (TOST at the whole α), else **undecided** (with the change it could have "
        "detected); Δ % and its interval are the test's own, at the level that decided the point's word. "
        "**IMPROVEMENT** / **REGRESSION**: a test confirmed that way and none the other; **MIXED**: confirmed both "
        "ways (a point better and another worse, or the composite against a point); **EQUIVALENT**: every "
        f"point equal within ±{spec.target_pct:g} %; **INCONCLUSIVE**: none of these. The other cells (every "
        "metric at every point) only show where else it moved."
        + (" **A/A control**: the baseline started again as a second arm and judged by the same test; "
           "**CONTROL FAILED** means two identical arms came out different, so this run's speed verdicts are "
           "suspect; it does not say why, and in a sound run it happens by chance too ("
           + ("2.7–5.8 % of runs of the default design with the control's own sequential stop"
              if control_stops_itself(run) else "3.0–4.4 % of runs of the default design")
           + ", simulated through the real plan: docs/statistics.md)." if run.control is not None
           else ""))
    control = [control_card(run, run.control)] if run.control is not None else []
    if not run.points and not run.serve.unreadable:  # the words are the serving test's: offline stages have none
        legend = Paragraph("The verdict words belong to the serving test, and this matrix measures no serving "
                           "points; each stage's table below carries its own per-row verdicts.")
    return Section("Verdict", 2, [card(run, s) for s in run.summaries] + control + [legend], anchor="verdict")
