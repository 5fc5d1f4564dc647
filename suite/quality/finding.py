"""A data-quality finding, the measured repeat the checks read, and how findings are ordered and worded.

Every check (suite.stages.serve.checks, suite.quality.server_log, suite.quality.series,
suite.quality.fast_path, suite.quality.hosts, suite.quality.software) returns `Finding`s; ``severity == "unreliable"`` marks the cell (arm, point)
unreliable for the metric families the finding names (`Finding.metrics`, empty = every metric), ``"warning"``
is shown in the Data quality box only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from suite.records import ClientRecord, HostIdentity
from suite.stages.serve.read import ServeResult
from suite.stages.serve.spec import ServeParams
from suite.stats import FAMILIES, METRICS

Severity = Literal["unreliable", "warning"]

CHECK_ORDER = ("failed-requests", "other-host", "software", "fast-path-not-taken", "server-health", "client-bound", "low-concurrency",
               "coalesced-stream", "chunked-stream", "warmup-outlier", "slow-request", "session-drift", "round-outlier", "block-outlier", "bimodal-sessions",
               "drift", "hosts")


@dataclass(frozen=True)
class Finding:
    """One named data-quality problem.

    ``point`` None: the finding is about the whole arm (or session); ``round`` None: not about one repeat.
    ``metrics``: the metric families (`FAMILIES`) whose numbers it spoils; empty means all of them.
    """

    check: str
    arm: str
    point: str | None
    round: int | None
    severity: Severity
    message: str
    session: int | None = None
    metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if unknown := [m for m in self.metrics if m not in FAMILIES]:
            raise ValueError(f"finding {self.check}: unknown metric families {unknown}; known: {FAMILIES}")

    def affects(self, key: str) -> bool:
        """True when the finding spoils the metric ``key`` (e.g. "mean_ttft_ms", "output_throughput"): one of
        its families, or every metric when it names none (a key outside the registry: only then)."""
        info = METRICS.get(key)
        return not self.metrics or (info is not None and info.family in self.metrics)


@dataclass(frozen=True)
class RepeatResult:
    """One measured repeat with what the cross-repeat checks need to know about it.

    ``round``: the repeat / round index. ``session``: the server session (one server lifetime) it ran in.
    ``order``: its position in the session's run order (smaller ran earlier); None when unknown, which turns
    the warm-up check off for it. ``client``: how the point's bench client ran (``client_cpu_util`` etc.).
    """

    arm: str
    point: str
    round: int
    raw: ServeResult
    params: ServeParams | None = None  # the point as planned (None: known only from the raw result)
    session: int | None = None
    order: int | None = None
    client: ClientRecord | None = None
    end: ServeResult | None = None  # the same point measured again at the end of its session (drift_check)
    host: HostIdentity | None = None  # the machine it ran on (records before 2026-12-07: None)


def fmt_value(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def repeat_name(r: int, blocks: int) -> str:
    """Where job repeat ``r`` ran: its round, or with ``blocks`` > 1 (together: all) its round, the
    block within that round and the raw file's name (``rep-5.json``), so that repeat 5 of a two-round run is never
    read as "round 5" nor as a round's sixth block: "round 1, block 2, rep-5"."""
    return f"round {r}" if blocks == 1 else f"round {r // blocks}, block {r % blocks}, rep-{r}"


def summarize_findings(findings: Iterable[Finding],
                       metric: str | None = None) -> dict[tuple[str, str | None], list[str]]:
    """(arm, point) -> the messages of the unreliable findings of that cell, in `order_findings` order and
    without repeats. ``point`` None holds the arm-level ones. With ``metric`` (a result key), only the
    findings that spoil that metric (a coalesced stream leaves output throughput alone)."""
    out: dict[tuple[str, str | None], list[str]] = {}
    for f in order_findings(findings):
        if f.severity != "unreliable" or (metric is not None and not f.affects(metric)):
            continue
        reasons = out.setdefault((f.arm, f.point), [])
        if f.message not in reasons:
            reasons.append(f.message)
    return out


def order_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Order for the Data quality box: unreliable before warnings, then by check (`CHECK_ORDER`: what breaks
    a measurement outright first), arm, point (arm-level first), round, session."""
    rank = {c: i for i, c in enumerate(CHECK_ORDER)}
    return sorted(set(findings), key=lambda f: (f.severity != "unreliable", rank.get(f.check, len(rank)),
                                                f.check, f.arm, f.point or "", f.round if f.round is not None
                                                else -1, f.session if f.session is not None else -1, f.message))


def finding_line(f: Finding) -> str:
    """One line for the Data quality box: ``[unreliable] coalesced-stream · patched · isl128-…: message``."""
    where = " · ".join(x for x in (f.arm, f.point) if x)
    return f"[{f.severity}] {f.check} · {where}: {f.message}"
