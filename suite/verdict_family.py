"""The family of tests of one candidate and the word it makes.

The composite and each declared metric at each tested point are tested as one family at family-wise alpha:
weighted Holm (a graphical procedure) over the group-sequential tests of `suite.verdict` (Maurer & Bretz
2013; ``evaluate_scores``). The word is the family's (``family_word``): MIXED when tests are confirmed both
ways, IMPROVEMENT / REGRESSION when confirmed one way, EQUIVALENT only when every point lies within +-target
(intersection-union), INCONCLUSIVE otherwise; each point's own word is ``point_word``. ``evaluate`` does it all
for one candidate at one look, from each round's values.

Pure functions over plain values; no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from suite.scores import round_scores
from suite.stats import METRICS, Strata, fmt_pct
from suite.verdict import Outcome, PrimaryResult, VerdictSpec, _resolve_look, primary_test

COMPOSITE_WEIGHT = 0.7  # the composite's initial share of alpha; the point × metric cells share the rest alike


class PointWord(StrEnum):
    """What the family says of one serving point (all its declared metrics)."""

    BETTER = "better"
    WORSE = "worse"
    BOTH = "better and worse"  # one metric confirmed better, another worse, at the same point
    EQUAL = "equal"  # every metric's interval inside ±target
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Hypothesis:
    """One test of the family: the composite (``point`` None) or one metric at one point."""

    point: str | None
    metric: str | None  # None: the composite of spec.metrics
    result: PrimaryResult  # at its own level: the look that confirmed it, else the look evaluated
    level: float  # its share of alpha in that test (weighted Holm: grows as others are confirmed)
    confirmed: Outcome | None  # IMPROVEMENT / REGRESSION once the family rejected its null
    # not confirmed, and its interval at the whole alpha (``equivalence``) inside ±target: intersection-union
    # TOST, each point on its own at alpha (no multiplicity: every point must pass for EQUIVALENT)
    equal: bool = False
    equivalence: PrimaryResult | None = None  # the same test at the whole alpha (the TOST's interval)

    @property
    def decided(self) -> bool:
        return self.confirmed is not None or self.equal

    @property
    def shown(self) -> PrimaryResult:
        """The test whose interval decided its word: the whole-alpha one of an equal cell, else its own."""
        return self.equivalence if self.equal and self.equivalence is not None else self.result


def point_word(cells: Sequence[Hypothesis]) -> PointWord:
    seen = {c.confirmed for c in cells} - {None}
    if {Outcome.IMPROVEMENT, Outcome.REGRESSION} <= seen:
        return PointWord.BOTH
    if seen:
        return PointWord.BETTER if Outcome.IMPROVEMENT in seen else PointWord.WORSE
    return PointWord.EQUAL if cells and all(c.equal for c in cells) else PointWord.UNDECIDED


@dataclass(frozen=True)
class Evaluation:
    """One candidate at one look: the family of tests (the composite and each declared metric at each declared
    point) and the word it makes."""

    outcome: Outcome
    reason: str
    tests: tuple[Hypothesis, ...]  # the composite's, then point × metric in the order of the points and metrics
    decided: bool  # stop now: every test of the family decided (changed or equal), the last look, or final
    dropped: tuple[str, ...] = ()  # rounds dropped from the pairing
    skipped: tuple[str, ...] = ()  # values skipped inside kept rounds (zero or missing)

    @property
    def composite(self) -> PrimaryResult:
        """The composite's test, at its level in the family."""
        return self.tests[0].result

    @property
    def composite_test(self) -> Hypothesis:
        return self.tests[0]

    @property
    def cells(self) -> tuple[Hypothesis, ...]:
        return self.tests[1:]

    @property
    def points(self) -> dict[str, list[Hypothesis]]:
        """point -> its cells, in the declared order."""
        out: dict[str, list[Hypothesis]] = {}
        for c in self.cells:
            out.setdefault(str(c.point), []).append(c)
        return out

    def point_words(self) -> dict[str, PointWord]:
        return {p: point_word(cs) for p, cs in self.points.items()}

    @property
    def confirmed(self) -> list[Hypothesis]:
        """The tests the family confirmed, the composite first."""
        return [h for h in self.tests if h.confirmed is not None]


def family_word(composite: Hypothesis, cells: Sequence[Hypothesis]) -> Outcome:
    """The word from the family: MIXED when tests are confirmed in both directions (a point better and another
    worse, or one metric better and another worse, or the composite one way and a point the other);
    IMPROVEMENT / REGRESSION when any is confirmed and all of those one way; EQUIVALENT only when every cell's
    interval lies inside ±target (intersection-union: each point within the margin); INCONCLUSIVE otherwise."""
    seen = {h.confirmed for h in (composite, *cells)} - {None}
    if {Outcome.IMPROVEMENT, Outcome.REGRESSION} <= seen:
        return Outcome.MIXED
    if seen:
        return next(iter(seen))
    if cells and all(c.equal for c in cells):
        return Outcome.EQUIVALENT
    return Outcome.INCONCLUSIVE


def _within(r: PrimaryResult, target_pct: float) -> bool:
    """The test's repeated interval lies inside ±target (TOST at its nominal alpha)."""
    if r.mean_log is None or r.se_log is None or r.boundary_t is None or not math.isfinite(r.boundary_t):
        return False
    delta = math.log1p(target_pct / 100)
    return r.mean_log - r.boundary_t * r.se_log > -delta and r.mean_log + r.boundary_t * r.se_log < delta


def _upto(scores: Mapping[int, float], n: int) -> dict[int, float]:
    """The first ``n`` rounds (by index) of a score series: what a look after n rounds had."""
    return dict(sorted(scores.items())[:n])


def evaluate_scores(
    composite_scores: Mapping[int, float],
    cell_scores: Mapping[tuple[str, str], Mapping[int, float]],
    spec: VerdictSpec,
    *,
    aa_composite: Mapping[int, float] | None = None,
    look: int | None = None,
    final: bool = False,
    strata: Strata | None = None,
) -> Evaluation:
    """The composite and every (point, metric) cell tested as one family at family-wise ``spec.alpha`` over the
    looks: weighted Holm (a graphical procedure) over group-sequential tests, Maurer & Bretz (2013).

    Initial weights: the composite COMPOSITE_WEIGHT, the cells the rest alike (one cell alone: the cell is the
    composite, tested once). At each look, from the first to ``look``, every test not yet confirmed is tested at
    that look's boundary for its current level alpha * w_i / (sum of the weights still untested), the boundary of
    the same spending function at that alpha (``look_alphas``, calibrated on the t statistics); a test confirmed
    passes its weight to the others in proportion (levels grow; the step repeats until none is confirmed), and
    stays confirmed at later looks. A look j before ``look`` is taken on the first ``spec.looks[j-1]`` rounds.
    Each test is ``primary_test`` at its level: its interval is the repeated interval that decides it; a cell not
    confirmed is equal within ±target when its test at the whole alpha lies inside the margin (intersection-union).
    The word is ``family_word``'s; decided when every point is (confirmed or equal) and the composite is or a
    point is confirmed, or at the design's last look, or final."""
    k = _resolve_look(spec, look, len(composite_scores))
    single = len(cell_scores) == 1
    w = {None: 1.0 if single else COMPOSITE_WEIGHT}
    if not single:
        w |= {key: (1 - COMPOSITE_WEIGHT) / len(cell_scores) for key in cell_scores}
    done: dict[tuple[str, str] | None, tuple[PrimaryResult, float]] = {}
    current: dict[tuple[str, str] | None, tuple[PrimaryResult, float]] = {}

    def test(key: tuple[str, str] | None, level: float, j: int, n: int | None) -> PrimaryResult:
        at = spec.model_copy(update={"alpha": spec.alpha * level})
        last = j == k
        if key is None:
            aa = _upto(aa_composite, n) if aa_composite is not None and n is not None else aa_composite
            return primary_test(composite_scores if n is None else _upto(composite_scores, n), at, look=j,
                                aa_scores=aa, final=final and last, strata=strata)
        scores = cell_scores[key]
        return primary_test(scores if n is None else _upto(scores, n), at, look=j, final=final and last,
                            metric=key[1], strata=strata)

    for j in range(1, k + 1):
        n = None if j == k else spec.looks[j - 1]
        while True:
            left = [h for h in w if h not in done]
            if not left:
                break
            total = sum(w[h] for h in left)
            current = {h: (test(h, w[h] / total, j, n), w[h] / total) for h in left}
            hits = [h for h, (r, _) in current.items() if r.significant]
            if not hits:
                break
            for h in hits:  # any order: weighted Holm rejects the same set whichever it takes first
                done[h] = current[h]
    results = {**current, **done}

    def hyp(key: tuple[str, str] | None) -> Hypothesis:
        r, level = results[key]
        if key in done:
            return Hypothesis(point=None if key is None else key[0], metric=None if key is None else key[1],
                              result=r, level=level, confirmed=r.outcome)
        whole = test(key, 1.0, k, None) if level < 1 else r
        return Hypothesis(point=None if key is None else key[0], metric=None if key is None else key[1], result=r,
                          level=level, confirmed=None, equal=_within(whole, spec.target_pct), equivalence=whole)

    composite = hyp(None)
    if single:  # the one cell is the composite's own test, under the cell's name
        (key,) = cell_scores
        r, level = results[None]
        r_cell = test(key, level, r.look, None if r.look == k else spec.looks[r.look - 1])
        cells: tuple[Hypothesis, ...] = (Hypothesis(
            point=key[0], metric=key[1], result=r_cell, level=level, confirmed=composite.confirmed,
            equal=composite.confirmed is None and _within(r_cell, spec.target_pct), equivalence=r_cell),)
    else:
        cells = tuple(hyp(key) for key in cell_scores)
    return _evaluation(composite, cells, spec, final)


def confirmed_change(h: Hypothesis) -> str:
    """"isl128-osl64-c8-n64 Mean TPOT worse (+2.4%)": a confirmed test as the reason names it, with its own Δ (a
    latency rise is +)."""
    what = "composite" if h.metric is None else f"{h.point} {METRICS[h.metric].label}"
    said = f"{what} {'better' if h.confirmed == Outcome.IMPROVEMENT else 'worse'}"
    return f"{said} ({fmt_pct(h.result.delta_pct)})" if h.result.delta_pct is not None else said


def _evaluation(composite: Hypothesis, cells: tuple[Hypothesis, ...], spec: VerdictSpec, final: bool) -> Evaluation:
    """The family's word, its reason and whether the candidate's run may stop."""
    outcome = family_word(composite, cells)
    c = composite.result
    last = final or c.look == c.n_looks
    # stop once every point is decided and the composite is, or a point already says which way
    decided = last or (all(h.decided for h in cells) and (composite.decided or any(h.confirmed for h in cells)))
    confirmed = [h for h in (composite, *cells) if h.confirmed is not None]
    if confirmed:
        reason = (f"confirmed (weighted Holm over the composite and {len(cells)} point × metric test"
                  f"{'s' if len(cells) != 1 else ''}): " + ", ".join(confirmed_change(h) for h in confirmed)
                  + f"; composite: {c.reason}")
    elif outcome == Outcome.EQUIVALENT:
        reason = f"every point within ±{spec.target_pct:g} %; composite: {c.reason}"
    else:
        reason = c.reason
    return Evaluation(outcome=outcome, reason=reason, tests=(composite, *cells), decided=decided)


def evaluate(
    base_rounds: Mapping[int, Mapping[str, Mapping[str, float]]],
    cand_rounds: Mapping[int, Mapping[str, Mapping[str, float]]],
    spec: VerdictSpec,
    *,
    aa_rounds: Mapping[int, Mapping[str, Mapping[str, float]]] | None = None,
    look: int | None = None,
    final: bool = False,
    unit: str = "round",
    strata: Strata | None = None,
) -> Evaluation:
    """Everything for one candidate at one look: pair rounds by index, score them (``round_scores``, its notes
    naming a round ``unit``): the composite, and each declared metric at each point both arms have; then
    ``evaluate_scores``. ``*_rounds``: round index -> point -> metric -> value (that round's session)."""
    comp = round_scores(base_rounds, cand_rounds, spec.metrics, unit)
    points = sorted({p for rows in (*base_rounds.values(), *cand_rounds.values()) for p in rows},
                    key=_point_order)
    cells: dict[tuple[str, str], dict[int, float]] = {}
    for point in points:
        b = {r: {point: rows[point]} for r, rows in base_rounds.items() if point in rows}
        c = {r: {point: rows[point]} for r, rows in cand_rounds.items() if point in rows}
        for m in spec.metrics:
            scores = round_scores(b, c, (m,)).scores if b and c else {}
            if len(scores) >= 1 and any(m in rows.get(point, {}) for rows in base_rounds.values()):
                cells[(point, m)] = {r: v for r, v in scores.items() if r in comp.scores or not comp.scores}
    aa_comp = round_scores(base_rounds, aa_rounds, spec.metrics).scores if aa_rounds is not None else None
    ev = evaluate_scores(comp.scores, cells, spec, aa_composite=aa_comp, look=look, final=final, strata=strata)
    return replace(ev, dropped=comp.dropped, skipped=comp.skipped)


def _point_order(point: str) -> tuple:
    """Serving points in reading order: by input length, output length, concurrency (the numbers of
    ``isl128-osl64-c8-n64``), then by name; an id of another shape sorts by name after them."""
    m = re.fullmatch(r"isl(\d+)-osl(\d+)-c(\d+)(?:-.*)?", point)
    return (0, int(m[1]), int(m[2]), int(m[3]), point) if m else (1, 0, 0, 0, point)
