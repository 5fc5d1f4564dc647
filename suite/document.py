"""The report as format-neutral pieces: sections of paragraphs, notes, tables, charts and verdict cards.

Built by `suite.analysis` users (`suite.report_sections`, `suite.report_verdict`, the stage summaries) and drawn by the two renderers
in `suite.render` (markdown, HTML) from the same `Document`, so the two reports cannot disagree. Nothing here
knows an output format: text is CommonMark *inline* markdown (``**bold**``, `` `code` ``; a newline inside a
table cell is a line break), styles are keys a renderer maps to its own look, a chart is a declarative spec.

Text that comes from outside (tool errors, arm names in free text, log lines) goes through `literal` so that
a stray ``*`` or `` ` `` cannot turn into markup.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from suite.stats import Comparison, Verdict, fmt_interval, fmt_pct

Severity = Literal["info", "warning", "unreliable", "error"]
Align = Literal["left", "right", "center"]

# Style keys. A renderer must give every one of them its own look (the HTML renderer: one CSS class each).
OUTCOME_STYLES = ("regression", "improvement", "equivalent", "mixed", "inconclusive", "no-data", "output-changed",
                  "output-identical", "control-passed", "control-failed", "control-untested")
CELL_STYLES = ("better", "worse", "not-significant", "unreliable", "missing")
STYLES = OUTCOME_STYLES + CELL_STYLES
MAX_STRENGTH = 4  # tint levels of a styled cell (a heat map: stronger with larger |Δ|)


def outcome_style(word: str) -> str:
    """The style key of a verdict word: "REGRESSION" -> "regression", "NO DATA" -> "no-data"."""
    key = word.strip().lower().replace(" ", "-")
    if key not in OUTCOME_STYLES:
        raise ValueError(f"no style for the verdict word {word!r}; known: {', '.join(OUTCOME_STYLES)}")
    return key


# --------------------------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Cell:
    text: str
    style: str | None = None  # one of CELL_STYLES / OUTCOME_STYLES
    tip: str | None = None  # plain text shown on hover (never the only place a number is shown)
    strength: int = 0  # 0..MAX_STRENGTH

    def __post_init__(self) -> None:
        if self.style is not None and self.style not in STYLES:
            raise ValueError(f"unknown cell style {self.style!r}")
        if not 0 <= self.strength <= MAX_STRENGTH:
            raise ValueError(f"strength must be in 0..{MAX_STRENGTH}, got {self.strength}")


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    caption: str | None = None
    align: list[Align] | None = None  # per column; default: first column left, the others right
    name: str = ""  # what kind of table (a renderer may style "heat", "before-after", "stats" ...)

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.headers):
                raise ValueError(f"table row {i} has {len(row)} cells for {len(self.headers)} columns")
        if self.align is not None and len(self.align) != len(self.headers):
            raise ValueError(f"{len(self.align)} alignments for {len(self.headers)} columns")

    def column_align(self, i: int) -> Align:
        if self.align is not None:
            return self.align[i]
        return "left" if i == 0 else "right"


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Note:
    """A remark a reader must not miss; ``severity`` says how bad (the text carries its own wording)."""

    text: str
    severity: Severity = "info"


@dataclass(frozen=True)
class BulletList:
    items: list[str]


@dataclass(frozen=True)
class Code:
    """Preformatted text (a resolved matrix, a command); ``title``: a caption (HTML folds it away under it)."""

    text: str
    title: str | None = None


@dataclass(frozen=True)
class Series:
    """One line of a chart: per x value the median and the min–max of the repeats (None: no value there)."""

    name: str
    median: list[float | None]
    low: list[float | None]
    high: list[float | None]
    n: list[int]


@dataclass(frozen=True)
class Chart:
    key: str  # stable id, unique in the document
    title: str
    unit: str
    x_label: str
    xs: list[str]
    series: list[Series]
    higher_is_better: bool

    def __post_init__(self) -> None:
        for s in self.series:
            if not len(s.median) == len(s.low) == len(s.high) == len(s.n) == len(self.xs):
                raise ValueError(f"chart {self.key}: series {s.name!r} does not have one value per x")
            for m, lo, hi in zip(s.median, s.low, s.high, strict=True):
                if m is not None and not (lo is not None and hi is not None and lo <= m <= hi):
                    raise ValueError(f"chart {self.key}: series {s.name!r} median {m} outside [{lo}, {hi}]")


@dataclass(frozen=True)
class FrontierPoint:
    """One serving point of one arm on a throughput-interactivity plane: the medians over its repeats and their
    min–max on both axes; ``tip``: what hovering it says (its Δ and interval against the baseline)."""

    label: str  # "c8"
    x: float
    y: float
    x_low: float
    x_high: float
    y_low: float
    y_high: float
    tip: str = ""


@dataclass(frozen=True)
class FrontierSeries:
    name: str
    points: list[FrontierPoint]


@dataclass(frozen=True)
class Frontier:
    """Output throughput against tokens a second per user, each arm a line through its concurrencies (the Pareto
    view serving benchmarks draw): up and to the right is better; a change that moves the line out helps."""

    key: str  # stable id, unique in the document
    title: str
    x_label: str
    y_label: str
    series: list[FrontierSeries]

    def __post_init__(self) -> None:
        for s in self.series:
            for q in s.points:
                if not (q.x_low <= q.x <= q.x_high and q.y_low <= q.y <= q.y_high):
                    raise ValueError(f"frontier {self.key}: {s.name} {q.label} outside its min–max")


@dataclass(frozen=True)
class Card:
    """The verdict of one candidate: the word, the headline Δ with its interval, what the run could see."""

    title: str  # "patched vs baseline"
    word: str  # REGRESSION, IMPROVEMENT, EQUIVALENT, MIXED, INCONCLUSIVE, NO DATA
    style: str  # outcome_style(word)
    headline: str  # "composite −24.8 % [−30.1, −19.2]": Δ with its interval
    mde: str | None = None  # smallest change the run could detect
    rounds: str | None = None  # rounds used (and dropped)
    correctness: list[str] = field(default_factory=list)  # greedy equivalence, accuracy gate
    lines: list[str] = field(default_factory=list)  # reason, where it changed
    points: Table | None = None  # where it acted: per serving point, before → after, Δ and that point's word

    def __post_init__(self) -> None:
        if self.style not in OUTCOME_STYLES:
            raise ValueError(f"card style {self.style!r} is not a verdict style")


@dataclass(frozen=True)
class Section:
    title: str
    level: int = 2
    blocks: list[Block] = field(default_factory=list)
    anchor: str = ""  # id for links; top-level sections with one are listed in the HTML navigation
    collapsed: bool = False  # details a reader opens on demand (HTML folds it)


Block = Paragraph | Note | BulletList | Table | Chart | Frontier | Card | Code | Section


@dataclass(frozen=True)
class Document:
    title: str
    intro: list[Paragraph | Note | BulletList] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    footer: str = ""


# ---------------------------------------------------------------------------------------- text helpers

_MD_SPECIAL = re.compile(r"([\\`*])")
_MD_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_MD_LINK = re.compile(r"\](?=[(\[])")


def literal(text: object) -> str:
    """Outside text as inline markdown that renders as itself. Escaped: backslash, backtick, ``*``; an
    underscore only where it could open or close emphasis (``ll_bf16`` stays readable in the raw file); ``<``
    only where it could open a tag; ``]`` only where it could close a link. A table's pipes are the
    renderer's business."""
    s = _MD_SPECIAL.sub(r"\\\1", str(text))
    s = _MD_UNDERSCORE.sub(r"\\_", s)
    s = _MD_TAG.sub(r"\\<", s)
    return _MD_LINK.sub(r"\\]", s)


def code(text: object) -> str:
    """An inline code span holding ``text`` exactly (backticks inside are fenced by longer runs)."""
    s = str(text).replace("\n", " ")
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{ticks}{pad}{s}{pad}{ticks}"


def fmt(value: float | None) -> str:
    """A measured value: thousands separators from 1,000, one decimal from 100, two below."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.1f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def verdict_style(verdict: Verdict) -> str:
    """The cell style of a per-cell verdict: better, worse, not-significant, unreliable."""
    return verdict.value.replace(" ", "-")


def delta_text(c: Comparison) -> str:
    """A comparison's Δ% with its interval beside it, or bare when it has none."""
    if c.ci_low_pct is None:
        return fmt_pct(c.delta_pct)
    return f"{fmt_pct(c.delta_pct)} {fmt_interval(c.ci_low_pct, c.ci_high_pct)}"


def verdict_cell(c: Comparison) -> Cell:
    """A comparison's verdict and its reason, styled by the verdict."""
    return Cell(f"{c.verdict.value}: {literal(c.reason)}", style=verdict_style(c.verdict))


def fmt_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"
