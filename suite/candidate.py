"""What the analysis says of one candidate, as values: its summary (`CandidateSummary`: the word, the primary
test's evaluation, the cells, correctness, when the runner's look decided it), each point × metric cell against
the baseline (`CellResult`), and the words a card says besides the primary test's outcomes (NO DATA, OUTPUT
CHANGED, the A/A control's). Computed by :mod:`suite.analysis`; read by the report, `suite history`, `suite
compare` and `suite.sequential`.
"""

from __future__ import annotations

from dataclasses import dataclass

from suite.quality.finding import repeat_name
from suite.stages.accuracy.read import ArmsCorrectness
from suite.stats import Comparison, Verdict
from suite.verdict import Outcome, VerdictSpec
from suite.verdict_family import Evaluation

FAMILY_ALPHA = 0.05  # Holm: family-wise error rate over a candidate's cells


NO_DATA = "NO DATA"


OUTPUT_CHANGED = "OUTPUT CHANGED"  # the correctness word: greedy completions differ from the baseline's


CONTROL_PASSED = "CONTROL PASSED"  # the A/A control: two identical arms, no difference found


# a candidate of a matrix with no serving points: it has data (the offline stages' tables, each row with its
# verdict), but no serving test to give the verdict words to
NO_SERVING_TEST = "NO SERVING TEST"


CONTROL_FAILED = "CONTROL FAILED"  # the A/A control: two identical arms called different (a false alarm)


CONTROL_UNTESTED = "CONTROL UNTESTED"  # the A/A control: too few rounds for the test to say anything


OUTPUT_IDENTICAL = "OUTPUT IDENTICAL"


@dataclass(frozen=True)
class CellResult:
    """One point × metric of one candidate against the baseline."""

    point: str
    metric: str
    comparison: Comparison | None  # None: a side has no value
    before: float | None  # geometric mean of the baseline values Δ came from
    after: float | None
    rounds: tuple[int, ...]  # rounds used (paired), or the rounds of both sides (independent)
    verdict: Verdict | None  # after data quality and Holm; None: missing
    reason: str
    left_out: tuple[tuple[str, int, str], ...] = ()  # (arm, job repeat, checks) a data-quality check left out
    dropped: tuple[tuple[int, str], ...] = ()  # (job repeat, arm without a value): unpaired, dropped (paired)
    blocks: int = 1  # job repeats per round (RunData.blocks): how a repeat is named

    @property
    def notes(self) -> list[str]:
        return ([f"{arm} {repeat_name(r, self.blocks)} left out ({checks})" for arm, r, checks in self.left_out]
                + [f"{repeat_name(r, self.blocks)}: no {arm} value, dropped from both sides"
                   for r, arm in self.dropped])

    @property
    def tested(self) -> bool:
        return self.comparison is not None

    @property
    def significant(self) -> bool:
        return self.verdict in (Verdict.BETTER, Verdict.WORSE)

    @property
    def reliable(self) -> bool:
        return self.verdict in (Verdict.BETTER, Verdict.WORSE, Verdict.NOT_SIGNIFICANT)

    @property
    def delta_pct(self) -> float | None:
        return self.comparison.delta_pct if self.comparison else None

    @property
    def ratio(self) -> float | None:
        return self.comparison.ratio if self.comparison else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval of Δ%, only for a reliable cell (an unreliable one shows its reason instead)."""
        c = self.comparison
        if c is None or not self.reliable or c.ci_low_pct is None or c.ci_high_pct is None:
            return None
        return c.ci_low_pct, c.ci_high_pct

    @property
    def n(self) -> tuple[int, int]:
        c = self.comparison
        return (c.baseline.n, c.candidate.n) if c else (0, 0)


@dataclass
class CandidateSummary:
    """Everything a reader wants first about one candidate, as values."""

    candidate: str
    baseline: str
    overall: str  # an Outcome word, or NO DATA
    spec: VerdictSpec
    evaluation: Evaluation | None
    cells: dict[tuple[str, str], CellResult]
    counts: dict[Verdict, int]
    geomean_throughput_pct: float | None  # geometric mean over points of the output-throughput ratio
    points: int  # points with an output-throughput comparison
    correctness: ArmsCorrectness
    left_out: tuple[str, ...] = ()  # values the primary test did not use (data quality)
    error: str | None = None  # why there is no primary test although both arms have rounds
    family_alpha: float = FAMILY_ALPHA
    decided_after: int | None = None  # the runner's look decided it after this many rounds (the test stops there)
    offline_only: bool = False  # the matrix has no serving points (and no serving result left unread)

    @property
    def word(self) -> str:
        """The card's word (and the history's): the speed outcome; for a candidate without one, what greedy
        equivalence says (a correctness-only arm), else NO SERVING TEST for a matrix of offline stages only,
        else NO DATA."""
        if self.evaluation is not None and self.overall != NO_DATA:
            return self.overall
        eq = self.correctness.equivalence
        if eq is not None:
            return OUTPUT_CHANGED if eq.n_identical < eq.n else OUTPUT_IDENTICAL
        return NO_SERVING_TEST if self.offline_only and not self.error else NO_DATA

    @property
    def control_word(self) -> str:
        """The word of this summary read as the A/A control (the A/A arm against its own baseline): any
        confirmed change between two identical arms is a false alarm."""
        if self.evaluation is None or self.overall == NO_DATA:
            return NO_DATA
        if self.evaluation.composite.rci_low_pct is None:  # one round (or no spread): no test, no pass
            return CONTROL_UNTESTED
        changed = self.overall in (Outcome.IMPROVEMENT.value, Outcome.REGRESSION.value, Outcome.MIXED.value)
        return CONTROL_FAILED if changed else CONTROL_PASSED

    @property
    def regressions(self) -> list[CellResult]:
        return [c for c in self.cells.values() if c.verdict is Verdict.WORSE]

    @property
    def improvements(self) -> list[CellResult]:
        return [c for c in self.cells.values() if c.verdict is Verdict.BETTER]

    @property
    def family_size(self) -> int:
        return sum(c.reliable for c in self.cells.values())
