"""Data-quality checks: name what is wrong with a measurement instead of letting it become a verdict.

Pure functions (no I/O) over the raw `vllm bench serve` result dicts (the JSON written with
``--save-result --save-detailed``), the per-session server records and server log texts. Every check returns
`Finding`s; ``severity == "unreliable"`` marks the cell (arm, point) unreliable for the metrics the finding
names (`Finding.metrics`, empty = every metric), ``"warning"`` is shown in the Data quality box only.

Checks and thresholds (each function's docstring says why):

=================== ======================================================================= ===========
check               fires when                                                              severity
=================== ======================================================================= ===========
failed-requests     ``failed > 0``, an error string, or ``completed`` < the prompts asked   unreliable
coalesced-stream    median ITL < 0.05 ms; or ≥ 10 % of requests got every token after the   unreliable
                    first in one burst (< 0.05 ms per token); or median ITL < 10 % of the
                    mean decode time per token (bursts with gaps); fewer burst requests     warning
chunked-stream      ≥ 10 % of requests got their tokens after the first in fewer than half  unreliable
                    as many chunks (ITL then times chunks; TTFT, TPOT, E2E stay right)      (ITL only)
low-concurrency     mean in-flight requests (Σ latencies / duration) < 70 % of              unreliable
                    min(concurrency, prompts), closed-loop runs only
client-bound        the benchmark client used ≥ 90 % of a core over the measurement         unreliable
warmup-outlier      the first measurement of a shape in a session has mean TTFT > 3× or     unreliable
                    output throughput < 1/3 of the median of the other repeats (≥ 2)
server-health       restarts; time to healthy > 3× the median of the other sessions (≥ 2);  warning
                    ERROR / Traceback lines in the server log
drift               exact Mann–Kendall trend of output throughput against round, p < 0.05:  warning
                    per (arm, point), and per arm pooled over points (seasonal Kendall)
bimodal-sessions    an arm's per-session throughput levels split in two clusters (≥ 2       warning
                    each): best split R² ≥ max(0.8, its 95th percentile under one normal
                    cluster) and cluster levels ≥ 5 % apart
=================== ======================================================================= ===========

`run_checks` runs them all over a list of `RepeatResult`; `summarize_findings` gives the unreliable reasons
per cell; `order_findings` / `finding_line` order and word them for the report's Data quality box.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy.stats import norm

from suite.plan import ServeParams
from suite.stats import FAMILIES, METRICS

Severity = Literal["unreliable", "warning"]

# a finding can be limited to metric families (suite.stats.FAMILIES: a metric's family is in the registry)
TOKEN_TIMING = ("ttft", "tpot", "itl")

# ------------------------------------------------------------------ thresholds (see the check docstrings)
BURST_S_PER_TOKEN = 50e-6  # faster than any decode step: tokens that close together came in one read
BURST_REQUEST_SHARE = 0.10  # this share of burst requests (or more) makes the token timings unreliable
ITL_MEDIAN_FLOOR_MS = BURST_S_PER_TOKEN * 1000
ITL_MEDIAN_REL = 0.10  # median ITL below this share of the mean decode time per token: bursts with gaps
CHUNK_SHARE = 0.5  # a request whose chunks after the first are fewer than this share of its tokens is chunked
MIN_CONCURRENCY_SHARE = 0.70
CLIENT_CPU_MAX = 0.90
WARMUP_FACTOR = 3.0
WARMUP_MIN_OTHERS = 2
START_SLOW_FACTOR = 3.0
START_MIN_OTHERS = 2
SESSION_DRIFT_MIN_PCT = 2.0  # a session's point measured again at its end: differences below this are noise
SESSION_DRIFT_FACTOR = 5.0  # ... or below this many times the run's median difference (its own noise)
SESSION_DRIFT_MIN_PAIRS = 4  # pairs the median needs
DRIFT_ALPHA = 0.05
DRIFT_MIN_ROUNDS = 3
BIMODAL_ALPHA = 0.05
BIMODAL_MIN_R2 = 0.80
BIMODAL_MIN_GAP = 0.05
BIMODAL_MIN_CLUSTER = 2
BIMODAL_NULL_DRAWS = 20_000

CHECK_ORDER = ("failed-requests", "fast-path-not-taken", "server-health", "client-bound", "low-concurrency",
               "coalesced-stream", "chunked-stream", "warmup-outlier", "session-drift", "bimodal-sessions", "drift")
_LOG_ERROR = re.compile(r"\bERROR\b|^\s*Traceback \(most recent call last\)")


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
    the warm-up check off for it. ``client``: the client record of the point (``client_cpu_util`` etc.).
    """

    arm: str
    point: str
    round: int
    raw: Mapping[str, Any]
    params: ServeParams | None = None  # the point as planned (None: known only from the raw result)
    session: int | None = None
    order: int | None = None
    client: Mapping[str, Any] | None = None
    end: Mapping[str, Any] | None = None  # the same point measured again at the end of its session (drift_check)


# ------------------------------------------------------------------------------------ helpers


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _fmt(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _expected_prompts(raw: Mapping[str, Any], params: ServeParams | None) -> int | None:
    n = params.num_prompts if params is not None else raw.get("num_prompts")  # else: what the client sent
    return int(n) if isinstance(n, int | float) and not isinstance(n, bool) else None


def _per_request(raw: Mapping[str, Any]) -> list[tuple[float, float, int]]:
    """(latency s, ttft s, output tokens) of the successful requests with more than one output token."""
    lat, ttft, outs = raw.get("latencies"), raw.get("ttfts"), raw.get("output_lens")
    if not (isinstance(lat, list) and isinstance(ttft, list) and isinstance(outs, list)):
        return []
    if not len(lat) == len(ttft) == len(outs):
        return []
    errors = raw.get("errors")
    errors = errors if isinstance(errors, list) and len(errors) == len(lat) else [""] * len(lat)
    rows = []
    for la, tt, n, err in zip(lat, ttft, outs, errors, strict=True):
        if err or not isinstance(n, int) or n < 2 or _num(la) is None or _num(tt) is None:
            continue
        rows.append((float(la), float(tt), n))
    return rows


def _mean_decode_ms(raw: Mapping[str, Any], rows: list[tuple[float, float, int]]) -> float | None:
    """Mean time per token after the first: Σ(latency − TTFT) / Σ(output tokens − 1), in ms."""
    if rows:
        tokens = sum(n - 1 for _, _, n in rows)
        return 1000 * sum(la - tt for la, tt, _ in rows) / tokens
    e2el, ttft = _num(raw.get("mean_e2el_ms")), _num(raw.get("mean_ttft_ms"))
    total, completed = _num(raw.get("total_output_tokens")), _num(raw.get("completed"))
    if e2el is None or ttft is None or not total or not completed or total / completed <= 1:
        return None
    return (e2el - ttft) / (total / completed - 1)


def _median_itl_ms(raw: Mapping[str, Any]) -> float | None:
    value = _num(raw.get("median_itl_ms"))
    if value is not None:
        return value
    itls = raw.get("itls")
    if isinstance(itls, list):
        flat = [float(x) for per in itls if isinstance(per, list) for x in per if _num(x) is not None]
        return 1000 * statistics.median(flat) if flat else None
    return None


# ------------------------------------------------------------------------------ per repeat


def check_failed(raw: Mapping[str, Any], params: ServeParams | None, *, arm: str, point: str | None,
                 round: int | None) -> list[Finding]:
    """Failed or incomplete requests: ``failed > 0``, a non-empty error string, or ``completed`` below the
    prompts asked for. Any of them: the repeat measured a different workload than its neighbours (fewer
    requests, early exits), so the cell is unreliable for every metric. No tolerance: a healthy server
    answers every request of a benchmark."""
    failed = int(_num(raw.get("failed")) or 0)
    completed = _num(raw.get("completed"))
    expected = _expected_prompts(raw, params)
    errors = [e for e in raw.get("errors") or [] if e]
    parts = []
    if failed > 0:
        total = expected or (failed + int(completed or 0))
        parts.append(f"{failed} of {total} requests failed")
    if completed is not None and expected is not None and completed + failed < expected:
        parts.append(f"only {int(completed)} of {expected} requests completed")
    if errors and not failed:
        parts.append(f"{len(errors)} requests returned an error")
    if errors:
        first = str(errors[0]).strip().splitlines()[0][:120] if str(errors[0]).strip() else ""
        if first:
            parts.append(f'first error "{first}"')
    if not parts:
        return []
    return [Finding("failed-requests", arm, point, round, "unreliable",
                    f"{_rep(round)}{'; '.join(parts)}")]


def _rep(round: int | None) -> str:
    return "" if round is None else f"repeat {round}: "


def check_coalesced(raw: Mapping[str, Any], *, arm: str, point: str | None,
                    round: int | None) -> list[Finding]:
    """Coalesced stream: tokens reached the client in bursts, so TTFT, TPOT and ITL describe the delivery,
    not the server's decoding (E2E latency and throughput are still right: they end at the last token).

    Physics: every decode step of a vLLM server (schedule, forward, sample, detokenise, send) takes far
    longer than 50 µs (the fastest are around a millisecond). Two chunks less than ``BURST_S_PER_TOKEN`` =
    50 µs apart were therefore produced by one step or delivered by one network read (on a starved API
    server vLLM merges the pending outputs of a request; a busy client reads several events at once).
    Signatures, any of which makes the token timings unreliable:

    - median ITL < 0.05 ms: more than half of the gaps between chunks are shorter than any decode step;
    - burst requests (all tokens after the first within 0.05 ms per token: TPOT < 0.05 ms) make up
      ≥ ``BURST_REQUEST_SHARE`` = 10 % of the requests: their TTFT includes their whole decode and their
      TPOT is zero; one in ten already moves a mean by 10 %, more than the effects the suite looks for.
      Fewer burst requests (but at least one) give a warning;
    - median ITL < ``ITL_MEDIAN_REL`` = 10 % of the mean decode time per token (Σ(latency − TTFT) /
      Σ(tokens − 1), what the duration and token counts imply per token once the first token is out):
      tokens arrive in bursts separated by long gaps. In a healthy stream every gap is at least one step and
      the mean is a few steps at most, so the median stays near the mean (0.8–1.1 in the demo's clean
      repeats). The reference leaves the time to first token out on purpose: with it, a prefill-heavy point
      (long prompt, few output tokens) would look coalesced when it is not.
    """
    rows = _per_request(raw)
    median_itl = _median_itl_ms(raw)
    decode = _mean_decode_ms(raw, rows)
    bursts = sum(1 for la, tt, n in rows if la - tt < BURST_S_PER_TOKEN * (n - 1))
    reasons = []
    if median_itl is not None and median_itl < ITL_MEDIAN_FLOOR_MS:
        reasons.append(f"median ITL {median_itl:.3f} ms is below {ITL_MEDIAN_FLOOR_MS:g} ms, shorter than any "
                       "decode step")
    elif (median_itl is not None and decode is not None and decode > 0
          and median_itl < ITL_MEDIAN_REL * decode):
        reasons.append(f"median ITL {median_itl:.3f} ms is {median_itl / decode:.0%} of the {decode:.2f} ms "
                       "per token the request times imply")
    if rows and bursts >= BURST_REQUEST_SHARE * len(rows):
        reasons.append(f"{bursts} of {len(rows)} requests received every token after the first in one burst")
    if reasons:
        return [Finding("coalesced-stream", arm, point, round, "unreliable",
                        f"{_rep(round)}coalesced stream: {'; '.join(reasons)} (TTFT, TPOT and ITL unusable)",
                        metrics=TOKEN_TIMING)]
    if bursts:
        return [Finding("coalesced-stream", arm, point, round, "warning",
                        f"{_rep(round)}{bursts} of {len(rows)} requests received every token after the first "
                        "in one burst", metrics=TOKEN_TIMING)]
    return []


def check_chunked(raw: Mapping[str, Any], *, arm: str, point: str | None, round: int | None) -> list[Finding]:
    """Chunked stream: the server sent several tokens per streamed chunk (vLLM's `--stream-interval N`, or an
    API server that merged a request's pending outputs), so `vllm bench serve` timed gaps between chunks,
    not tokens: ITL is the chunk interval, while TTFT (first chunk), TPOT ((latency − TTFT) / (tokens − 1))
    and E2E latency stay right. A request is chunked when its gaps after the first token (the detailed
    ``itls`` list) number fewer than ``CHUNK_SHARE`` of its tokens after the first; ≥ ``BURST_REQUEST_SHARE``
    of the requests chunked makes the ITL numbers unreliable."""
    itls, outs = raw.get("itls"), raw.get("output_lens")
    if not (isinstance(itls, list) and isinstance(outs, list) and len(itls) == len(outs)):
        return []
    rows = [(len(gaps), int(n) - 1) for gaps, n in zip(itls, outs, strict=True)
            if isinstance(gaps, list) and isinstance(n, int | float) and n > 2]
    chunked = [(g, n) for g, n in rows if g < CHUNK_SHARE * n]
    if not rows or len(chunked) < BURST_REQUEST_SHARE * len(rows):
        return []
    gaps = statistics.median(g for g, _ in chunked)
    tokens = statistics.median(n for _, n in chunked)
    return [Finding("chunked-stream", arm, point, round, "unreliable",
                    f"{_rep(round)}chunked stream: {len(chunked)} of {len(rows)} requests got their {tokens:g} tokens "
                    f"after the first in {gaps:g} chunk(s) (median): ITL times chunks, not tokens (TTFT, TPOT and "
                    "E2E latency are unaffected)", metrics=("itl",))]


def check_concurrency(raw: Mapping[str, Any], params: ServeParams | None, *, arm: str, point: str | None,
                      round: int | None) -> list[Finding]:
    """Achieved concurrency below target. The mean number of requests in flight is Σ latencies / duration
    (Little's law over the run); the target is min(concurrency, prompts). Below ``MIN_CONCURRENCY_SHARE`` =
    70 % the server saw a lighter load than the point names (a slow client, requests that end at once, a
    long ramp-down), so the cell does not measure that point. The ramp-down alone costs little: with
    prompts ≥ 2 × concurrency the demo's clean repeats reach 92–100 %. Only for closed-loop points
    (request rate inf / unset): an open-loop rate sets its own load."""
    rate = params.request_rate if params is not None else raw.get("request_rate")
    if _num(rate) is not None:  # a finite request rate ("inf" and inf read as None)
        return []
    conc = params.concurrency if params is not None else raw.get("max_concurrency")
    lat, dur = raw.get("latencies"), _num(raw.get("duration"))
    n = _expected_prompts(raw, params)
    if not isinstance(conc, int) or not isinstance(lat, list) or not lat or not dur or dur <= 0:
        return []
    target = min(conc, n) if n else conc
    achieved = sum(x for x in lat if _num(x) is not None) / dur
    if target <= 0 or achieved >= MIN_CONCURRENCY_SHARE * target:
        return []
    return [Finding("low-concurrency", arm, point, round, "unreliable",
                    f"{_rep(round)}mean in-flight requests {achieved:.2f} of the {target} asked for "
                    f"({achieved / target:.0%}, threshold {MIN_CONCURRENCY_SHARE:.0%})")]


def client_cpu_share(client: Mapping[str, Any] | None) -> float | None:
    """The client's CPU use over the measurement, as a share of one core.

    ``bench_cpu_s / bench_wall_s`` (the persistent client's benchmark call alone) when present, else
    ``client_cpu_util`` — except for the CLI (``mode == "cli"``), whose figure includes Python's start-up
    (CPU-bound seconds that say nothing about the measurement): None there.
    """
    if not client:
        return None
    cpu, wall = _num(client.get("bench_cpu_s")), _num(client.get("bench_wall_s"))
    if cpu is not None and wall:
        return cpu / wall
    if client.get("mode") == "cli":
        return None
    return _num(client.get("client_cpu_util"))


def check_client(client: Mapping[str, Any] | None, *, arm: str, point: str | None,
                 round: int | None) -> list[Finding]:
    """Client-bound run: `vllm bench serve` is one asyncio process, so it can use one core at most. At
    ≥ ``CLIENT_CPU_MAX`` = 90 % of a core it is saturated: requests wait in the client's event loop,
    timestamps are taken late, and the numbers measure the client, not the server."""
    share = client_cpu_share(client)
    if share is None or share < CLIENT_CPU_MAX:
        return []
    return [Finding("client-bound", arm, point, round, "unreliable",
                    f"{_rep(round)}the benchmark client used {share:.0%} of a core (threshold "
                    f"{CLIENT_CPU_MAX:.0%}): the client, not the server, set the pace")]


def check_repeat(raw: Mapping[str, Any], params: ServeParams | None, *, arm: str, point: str | None,
                 round: int | None, client: Mapping[str, Any] | None = None) -> list[Finding]:
    """Every per-repeat check on one raw result: failed requests, coalesced stream, achieved concurrency,
    client-bound."""
    return [*check_failed(raw, params, arm=arm, point=point, round=round),
            *check_coalesced(raw, arm=arm, point=point, round=round),
            *check_chunked(raw, arm=arm, point=point, round=round),
            *check_concurrency(raw, params, arm=arm, point=point, round=round),
            *check_client(client, arm=arm, point=point, round=round)]


# ------------------------------------------------------------------------------ per session


def check_warmup(repeats: Sequence[RepeatResult]) -> list[Finding]:
    """Warm-up outlier: the first measurement of a shape in a server session far from the other repeats of
    the same arm and point.

    Candidates are the repeats that ran first at their point in their session (lowest ``order``); the
    session's very first measured point is one of them. A new shape meets a server that has not yet
    allocated, compiled or cached for it, so a cold effect shows there. A candidate is an outlier when its
    mean TTFT is more than ``WARMUP_FACTOR`` = 3× the median of the other repeats of that arm and point, or
    its output throughput less than a third of theirs (≥ ``WARMUP_MIN_OTHERS`` = 2 others). Warm repeats on
    the demo's 2-core box spread up to 2.4× (output throughput) and 1.7× (TTFT) between themselves; a cold
    first point was 6× (TTFT 122 ms against 19.7 ms). Unreliable for every metric of the cell.
    """
    first: dict[tuple[str, int, str], RepeatResult] = {}
    session_first: dict[tuple[str, int], int] = {}
    for r in repeats:
        if r.session is None or r.order is None:
            continue
        key = (r.arm, r.session, r.point)
        if key not in first or r.order < (first[key].order or 0):
            first[key] = r
        session_first[(r.arm, r.session)] = min(r.order, session_first.get((r.arm, r.session), r.order))
    by_cell: dict[tuple[str, str], list[RepeatResult]] = defaultdict(list)
    for r in repeats:
        by_cell[(r.arm, r.point)].append(r)
    findings = []
    for (arm, session, point), cand in sorted(first.items()):
        others = [r for r in by_cell[(arm, point)] if r is not cand]
        if len(others) < WARMUP_MIN_OTHERS:
            continue
        where = (f"the first measured point of session {session}" if cand.order == session_first[(arm, session)]
                 else f"the first {point} measurement of session {session}")
        parts = []
        ttft = _num(cand.raw.get("mean_ttft_ms"))
        other_ttft = [v for r in others if (v := _num(r.raw.get("mean_ttft_ms"))) is not None]
        if ttft is not None and len(other_ttft) >= WARMUP_MIN_OTHERS:
            mid = statistics.median(other_ttft)
            if mid > 0 and ttft > WARMUP_FACTOR * mid:
                parts.append(f"mean TTFT {_fmt(ttft)} ms is {ttft / mid:.1f}× the median {_fmt(mid)} ms")
        tput = _num(cand.raw.get("output_throughput"))
        other_tput = [v for r in others if (v := _num(r.raw.get("output_throughput"))) is not None]
        if tput is not None and len(other_tput) >= WARMUP_MIN_OTHERS:
            mid = statistics.median(other_tput)
            if mid > 0 and tput * WARMUP_FACTOR < mid:
                parts.append(f"output throughput {_fmt(tput)} tok/s is {mid / max(tput, 1e-12):.1f}× below the "
                             f"median {_fmt(mid)} tok/s")
        if parts:
            findings.append(Finding(
                "warmup-outlier", arm, point, cand.round, "unreliable",
                f"{_rep(cand.round)}{where} is a cold-start outlier: {' and '.join(parts)} of the other "
                f"{len(others)} repeats", session=session))
    return findings


SHUTDOWN_MARK = "[shutdown]"  # vLLM logs its teardown with this tag once it got SIGTERM
SERVER_START_MARK = "--- suite: vllm serve started "  # the local runtime's line before each server start


def count_log_errors(text: str) -> tuple[int, str | None]:
    """Lines of a server log that report an error while it served: the word ERROR (vLLM's log level) or a
    Python traceback header. Errors logged during a shutdown the suite asked for (SIGTERM at the end of a
    session: vLLM tears the engine down and its API server reports the engine dead) do not count; a new
    server start in the same log counts again. Returns the count and the first such line (trimmed)."""
    count, first = 0, None
    stopping = False
    for line in text.splitlines():
        if line.startswith(SERVER_START_MARK):
            stopping = False
        elif SHUTDOWN_MARK in line:
            stopping = True
        if not stopping and _LOG_ERROR.search(line):
            count += 1
            if first is None:
                first = line.strip()[:160]
    return count, first


def check_server_health(sessions: Iterable[Mapping[str, Any]],
                        logs: Mapping[tuple[str, int], str] | None = None) -> list[Finding]:
    """Server health per session, from the server records (one per start attempt: ``arm``, ``session``,
    ``attempt``, ``healthy_after_s``, as written next to each server log) and the log texts (keyed by
    (arm, session), every attempt's log together). Warnings:

    - a restart (an attempt > 0): the server died during the session, so its later points ran on a fresh,
      cold server;
    - time to healthy (first attempt) more than ``START_SLOW_FACTOR`` = 3× the median of the other sessions
      of the run (≥ ``START_MIN_OTHERS`` = 2): the machine was busy or the server struggled; starts on the
      demo's 2-core box spread 30–74 s (2.5×), so 3× is beyond their normal spread;
    - ERROR or Traceback lines in the log (`count_log_errors`).
    """
    per: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for rec in sessions:
        if isinstance(rec.get("arm"), str) and isinstance(rec.get("session"), int):
            per[(rec["arm"], rec["session"])].append(rec)
    start: dict[tuple[str, int], float] = {}
    for key, recs in per.items():
        first = min(recs, key=lambda r: r.get("attempt") or 0)
        value = _num(first.get("healthy_after_s"))
        if value is not None:
            start[key] = value
    findings = []
    for arm, session in sorted(set(per) | set(logs or {})):
        recs = per.get((arm, session), [])
        parts = []
        attempts = max((int(r.get("attempt") or 0) for r in recs), default=0)
        if attempts > 0:
            parts.append(f"{attempts} restart{'s' if attempts > 1 else ''} (the server died during the "
                         "session; later points ran on a fresh server)")
        if (arm, session) in start:
            others = [v for k, v in start.items() if k != (arm, session)]
            value = start[(arm, session)]
            if len(others) >= START_MIN_OTHERS:
                mid = statistics.median(others)
                if mid > 0 and value > START_SLOW_FACTOR * mid:
                    parts.append(f"healthy after {value:.0f} s, {value / mid:.1f}× the median {mid:.0f} s of the "
                                 "other sessions")
        text = (logs or {}).get((arm, session))
        if text:
            count, line = count_log_errors(text)
            if count:
                parts.append(f"{count} error line{'s' if count > 1 else ''} in the server log (first: \"{line}\")")
        if parts:
            findings.append(Finding("server-health", arm, None, None, "warning",
                                    f"session {session}: {'; '.join(parts)}", session=session))
    return findings


# ------------------------------------------------------------------------------ across rounds


@lru_cache(maxsize=64)
def _inversions_pmf(n: int) -> tuple[float, ...]:
    """P(a random permutation of n items has k inversions), k = 0 .. n(n-1)/2 (Mahonian numbers)."""
    counts = [1]
    for m in range(2, n + 1):  # insert item m: it adds 0 .. m-1 inversions
        new = [0] * (len(counts) + m - 1)
        for k, c in enumerate(counts):
            for j in range(m):
                new[k + j] += c
        counts = new
    total = math.factorial(n)
    return tuple(c / total for c in counts)


def _kendall_s(y: Sequence[float]) -> int:
    return sum((y[j] > y[i]) - (y[j] < y[i]) for i in range(len(y)) for j in range(i + 1, len(y)))


def mann_kendall(series: Sequence[Sequence[float]]) -> tuple[int, float]:
    """Mann–Kendall trend test, stratified over several series (the seasonal Kendall test of Hirsch et al.:
    S is summed over the series, each ordered in time). Returns (S, two-sided p).

    Without ties the p-value is exact (the null distribution of each series' S is that of the inversions of
    a random permutation; the series' distributions are convolved). With ties it is the normal
    approximation with the tie-corrected variance and a continuity correction. One series of 4 values can
    never reach p < 0.05 (its smallest p is 1/12); 5 can (1/60); three series of 3 can (1/108).
    """
    series = [[float(v) for v in s] for s in series if len(s) >= 2]
    if not series:
        return 0, 1.0
    s_obs = sum(_kendall_s(s) for s in series)
    if any(len(set(s)) < len(s) for s in series):
        var = 0.0
        for s in series:
            n = len(s)
            ties = [s.count(v) for v in set(s)]
            var += (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18
        if var <= 0 or s_obs == 0:
            return s_obs, 1.0
        z = (abs(s_obs) - 1) / math.sqrt(var)
        return s_obs, float(min(1.0, 2 * norm.sf(z)))
    pmf = np.array([1.0])
    pairs = 0
    for s in series:
        pmf = np.convolve(pmf, _inversions_pmf(len(s)))
        pairs += len(s) * (len(s) - 1) // 2
    s_values = pairs - 2 * np.arange(len(pmf))  # S = concordant − discordant = pairs − 2 · inversions
    p = float(pmf[np.abs(s_values) >= abs(s_obs) - 1e-9].sum())
    return s_obs, min(1.0, p)


def sen_slope_pct(series: Sequence[Sequence[tuple[int, float]]]) -> float:
    """Median of the pairwise slopes of log value against round (pooled over the series), as % per round."""
    slopes = [(math.log(y2) - math.log(y1)) / (x2 - x1)
              for s in series for i, (x1, y1) in enumerate(s) for x2, y2 in s[i + 1:] if x2 != x1]
    return math.expm1(statistics.median(slopes)) * 100 if slopes else 0.0


def _round_series(repeats: Sequence[RepeatResult], metric: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(arm, point) -> [(round, value)] in round order; repeats of one round are merged by geometric mean."""
    acc: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in repeats:
        value = _num(r.raw.get(metric))
        if value is not None and value > 0:
            acc[(r.arm, r.point)][r.round].append(value)
    return {cell: [(rnd, math.exp(statistics.fmean(map(math.log, vals)))) for rnd, vals in sorted(rounds.items())]
            for cell, rounds in acc.items()}


def check_drift(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> list[Finding]:
    """Drift across rounds: a monotone trend of ``metric`` (output throughput) against the round index.

    Per (arm, point): the exact Mann–Kendall test (rank-based, so one wild repeat cannot make a trend), p <
    ``DRIFT_ALPHA`` = 0.05, ≥ ``DRIFT_MIN_ROUNDS`` rounds (a single point needs ≥ 5 rounds to reach 0.05).
    Per arm: the same test stratified over the arm's points (each point its own series), which finds the
    common drift of a short run (three rounds over three points suffice). The size is Sen's slope of the log
    values, in % per round. A warning: pairing by round under ABBA cancels a drift shared by the arms, but a
    trend says the machine (or one arm's server) was not steady while it was measured.
    """
    series = _round_series(repeats, metric)
    findings = []
    per_arm: dict[str, list[list[tuple[int, float]]]] = defaultdict(list)
    for (arm, point), s in sorted(series.items()):
        if len(s) < DRIFT_MIN_ROUNDS:
            continue
        per_arm[arm].append(s)
        _, p = mann_kendall([[v for _, v in s]])
        if p < DRIFT_ALPHA:
            slope = sen_slope_pct([s])
            findings.append(Finding(
                "drift", arm, point, None, "warning",
                f"{metric.replace('_', ' ')} {'rises' if slope > 0 else 'falls'} by {abs(slope):.1f} % per round "
                f"over {len(s)} rounds ({_fmt(s[0][1])} → {_fmt(s[-1][1])}; Mann–Kendall p = {p:.3f})"))
    for arm, group in sorted(per_arm.items()):
        if len(group) < 2:
            continue
        _, p = mann_kendall([[v for _, v in s] for s in group])
        if p < DRIFT_ALPHA:
            slope = sen_slope_pct(group)
            rounds = len({rnd for s in group for rnd, _ in s})
            findings.append(Finding(
                "drift", arm, None, None, "warning",
                f"{metric.replace('_', ' ')} {'rises' if slope > 0 else 'falls'} by {abs(slope):.1f} % per round "
                f"across {len(group)} points and {rounds} rounds (seasonal Mann–Kendall p = {p:.3f})"))
    return findings


def check_session_drift(repeats: Sequence[RepeatResult], metric: str = "mean_tpot_ms") -> list[Finding]:
    """Within one server session: a repeat against the same point measured again at the session's end
    (``drift_check``). A change under test is the same all through a server's life, so a difference here is
    the server or the machine changing state while it was measured (on the H200: a server whose first
    request came within a second of /health decoded ~7 % slower for 20-60 s). A warning when the two differ
    by more than ``SESSION_DRIFT_MIN_PCT`` and ``SESSION_DRIFT_FACTOR`` times the run's median difference."""
    pairs = []
    for r in repeats:
        start, end = _num(r.raw.get(metric)), _num((r.end or {}).get(metric))
        if start and end and start > 0 and end > 0:
            pairs.append((r, start, end, math.log(end / start)))
    if not pairs:
        return []
    floor = math.log1p(SESSION_DRIFT_MIN_PCT / 100)
    if len(pairs) >= SESSION_DRIFT_MIN_PAIRS:
        floor = max(floor, SESSION_DRIFT_FACTOR * statistics.median(abs(d) for *_, d in pairs))
    m = METRICS[metric]
    return [Finding("session-drift", r.arm, r.point, r.round, "warning",
                    f"round {r.round}: {m.label} {_fmt(start)} {m.unit} at the point's first measurement, {_fmt(end)} "
                    f"{m.unit} when it was measured again at the session's end ({math.expm1(d) * 100:+.1f} %; this "
                    f"run's threshold {math.expm1(floor) * 100:.1f} %): the server was not steady", session=r.session)
            for r, start, end, d in pairs if abs(d) > floor]


@lru_cache(maxsize=64)
def _best_split_null_r2(n: int) -> float:
    """95th percentile (1 − ``BIMODAL_ALPHA``) of the best-split R² of n draws from one normal distribution
    (a fixed seed: the same answer every call)."""
    draws = np.random.default_rng(20261130).standard_normal((BIMODAL_NULL_DRAWS, n))
    return float(np.quantile(_best_split_r2(draws)[0], 1 - BIMODAL_ALPHA))


def _best_split_r2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the largest share of variance explained by cutting the sorted row in two groups of at least
    ``BIMODAL_MIN_CLUSTER`` (the optimal 2-means split of one dimension is such a cut), and the cut index."""
    x = np.sort(x, axis=1)
    n = x.shape[1]
    total = ((x - x.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    cs, cs2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    best = np.full(x.shape[0], -np.inf)
    cut = np.zeros(x.shape[0], dtype=int)
    for k in range(BIMODAL_MIN_CLUSTER, n - BIMODAL_MIN_CLUSTER + 1):
        sa, sa2 = cs[:, k - 1], cs2[:, k - 1]
        sb, sb2 = cs[:, -1] - sa, cs2[:, -1] - sa2
        within = (sa2 - sa * sa / k) + (sb2 - sb * sb / (n - k))
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(total > 0, 1 - within / total, 0.0)
        better = r2 > best
        best = np.where(better, r2, best)
        cut = np.where(better, k, cut)
    return best, cut


def session_levels(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> dict[str, dict[int, float]]:
    """arm -> session -> the session's level of ``metric``: the geometric mean over its points (and repeats)
    of the value relative to that point's median over the arm's sessions, scaled back by the geometric mean
    of those medians (so a session with every point measured reads as its geometric mean over points)."""
    values: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in repeats:
        value = _num(r.raw.get(metric))
        if r.session is not None and value is not None and value > 0:
            values[r.arm][r.point][r.session].append(math.log(value))
    levels: dict[str, dict[int, float]] = {}
    for arm, points in values.items():
        rel: dict[int, list[float]] = defaultdict(list)
        centres = []
        for sessions in points.values():
            per_session = {s: statistics.fmean(v) for s, v in sessions.items()}
            centre = statistics.median(per_session.values())
            centres.append(centre)
            for s, v in per_session.items():
                rel[s].append(v - centre)
        scale = statistics.fmean(centres)
        levels[arm] = {s: math.exp(scale + statistics.fmean(v)) for s, v in sorted(rel.items())}
    return levels


def _cluster(group: list[int], levels: Mapping[int, float]) -> str:
    """"5 at 426–478 (sessions 0, 2, 3, 5, 7)" for sessions sorted by level."""
    return (f"{len(group)} at {_fmt(levels[group[0]])}–{_fmt(levels[group[-1]])} "
            f"(sessions {', '.join(map(str, sorted(group)))})")


def check_bimodal_sessions(repeats: Sequence[RepeatResult], metric: str = "output_throughput") -> list[Finding]:
    """Bimodal sessions: an arm's server sessions fall into two clusters of throughput.

    Per arm, each session's level (`session_levels`, geometric mean over points) on a log scale; the best
    cut of the sorted levels into two clusters of ≥ ``BIMODAL_MIN_CLUSTER`` = 2 sessions (the 1-D 2-means
    optimum) explains a share R² of their variance. Two clusters when R² ≥ ``BIMODAL_MIN_R2`` = 0.8 and R²
    exceeds its 95th percentile for that many sessions drawn from one normal distribution (0.97 for 4
    sessions, 0.89 for 8: a fixed rule such as "R² ≥ 0.8 and 3 SD apart" fires in ~30 % of unimodal 4–6
    session arms), and the clusters' levels are ≥ ``BIMODAL_MIN_GAP`` = 5 % apart (a smaller offset cannot
    drive a verdict). Needs ≥ 4 sessions. A warning at arm level: per-round pairing cannot remove a
    session-level effect, so a verdict may reflect which cluster each round's session fell in, not the
    change; the A/A floor misses it when both A arms share it.
    """
    findings = []
    for arm, levels in sorted(session_levels(repeats, metric).items()):
        if len(levels) < 2 * BIMODAL_MIN_CLUSTER:
            continue
        sessions = sorted(levels, key=levels.__getitem__)
        logs = np.array([[math.log(levels[s]) for s in sessions]])
        r2, cut = _best_split_r2(logs)
        r2_v, k = float(r2[0]), int(cut[0])
        low, high = sessions[:k], sessions[k:]
        gap = math.exp(float(logs[0, k:].mean() - logs[0, :k].mean())) - 1
        if r2_v < max(BIMODAL_MIN_R2, _best_split_null_r2(len(sessions))) or gap < BIMODAL_MIN_GAP:
            continue

        findings.append(Finding(
            "bimodal-sessions", arm, None, None, "warning",
            f"{arm}'s sessions fall into two clusters of {metric.replace('_', ' ')}: {_cluster(low, levels)} and "
            f"{_cluster(high, levels)}, {gap:.0%} apart (R² {r2_v:.2f}); a verdict may be driven by this session-level "
            "effect rather than by the change"))
    return findings


# ------------------------------------------------------------------------------ all together


def run_checks(repeats: Sequence[RepeatResult], *, servers: Iterable[Mapping[str, Any]] = (),
               logs: Mapping[tuple[str, int], str] | None = None) -> list[Finding]:
    """Every check over a run's repeats (plus server records and logs), in `order_findings` order."""
    findings: list[Finding] = []
    for r in repeats:
        findings += check_repeat(r.raw, r.params, arm=r.arm, point=r.point, round=r.round, client=r.client)
    findings += check_warmup(repeats)
    findings += check_server_health(servers, logs)
    findings += check_session_drift(repeats)
    findings += check_drift(repeats)
    findings += check_bimodal_sessions(repeats)
    return order_findings(findings)


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


# ------------------------------------------------------------------------------ fast path (server log)

# AITER, on a tuned-config lookup miss (it then runs its default kernel for that shape): aiter/tuned_gemm.py
# (bf16 a16w16: "shape is M:1, N:256, K:6144 dtype='torch.bfloat16' otype='torch.float32' ..., not found tuned
# config in /tmp/aiter_configs/bf16_tuned_gemm.csv, will use default config! using skinny solution:2"),
# aiter/ops/gemm_op_a8w8.py, gemm_op_a4w4.py, batched_gemm_op_{a8w8,bf16}.py ("not found tuned/padded config").
_AITER_MISS = re.compile(r"shape is (?:B:\d+, )?M:(\d+), N:(\d+), K:(\d+)(?P<rest>[^\n]*?)"
                         r"not found tuned(?:/padded)? config in (?P<where>[^\n]+?)(?:,| will|!|$)", re.M)
_BF16_OP = re.compile(r"dtype='?torch\.bfloat16|dtype is bf16|bf16_tuned_gemm")
# Other messages that say a kernel a router-gate fast path relies on was switched off or left untuned:
# (check name, pattern, what it means). Sources: aiter/fused_moe.py, aiter/ops/triton/utils/tuned_config_utils.py,
# vllm/_aiter_ops.py, vllm/model_executor/kernels/linear/cute_dsl/_ll_router_common.py,
# vllm/model_executor/layers/fused_moe/router/gate_linear.py (0.33.0).
_FAST_PATH_OFF = (
    (re.compile(r"cuteDSL \(CUTLASS Python\) not available, (?P<what>[^\n]+?) disabled"),
     "cuteDSL is not importable, so {what} is disabled (vLLM)"),
    (re.compile(r"Disabling ROCm BF16x3 router GEMM for (?P<what>\S+?):"),
     "the ROCm BF16x3 router GEMM was disabled for {what} (vLLM)"),
    (re.compile(r"ROCm BF16x3 router GEMM is enabled for (?P<what>\S+) but its weight split is missing"),
     "the ROCm BF16x3 router GEMM of {what} fell back to fp32 (vLLM)"),
    (re.compile(r"Could not read aiter CK GEMM configs from AITER_CONFIGS\.(?P<what>\w+)"),
     "vLLM could not read AITER's {what} tuned configs and treats every shape as untuned"),
    (re.compile(r"No tuned Triton config for kernel '(?P<what>[^']+)'"),
     "AITER has no tuned Triton config for kernel {what} and uses its fallback"),
    (re.compile(r"no tuned FlyDSL config for (?P<what>[^\n]+?), using untuned"),
     "AITER's fused MoE has no tuned FlyDSL config for {what}"),
)
FAST_PATH_EXAMPLES = 4  # shapes / messages named in one finding


def _patch_names(patches: Iterable[Any]) -> list[str]:
    """Patch set names from the manifest's records ({"name", "reverse", ...}) or plain names."""
    names = []
    for p in patches:
        name = p.get("name") if isinstance(p, Mapping) else str(p)
        reverse = bool(p.get("reverse")) if isinstance(p, Mapping) else False
        if name:
            names.append(("-" if reverse else "") + str(name))
    return names


def aiter_untuned_shapes(log_text: str) -> dict[tuple[int, int], dict[str, Any]]:
    """(N, K) -> {"m": sorted M values, "bf16": a bf16 GEMM?, "where": config files named, "lines": count} for
    every AITER tuned-config miss in a server log (repeated per worker process: counted once per M)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for m in _AITER_MISS.finditer(log_text):
        key = (int(m.group(2)), int(m.group(3)))
        entry = out.setdefault(key, {"m": set(), "bf16": False, "where": set(), "lines": 0})
        entry["m"].add(int(m.group(1)))
        entry["bf16"] = entry["bf16"] or bool(_BF16_OP.search(m.group(0)))
        entry["where"].add(m.group("where").strip().rsplit("/", 1)[-1])
        entry["lines"] += 1
    return {k: {**v, "m": sorted(v["m"]), "where": sorted(v["where"])} for k, v in out.items()}


def gate_shapes_from_config(config: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The router gate GEMM shapes (N, K) = (experts, hidden) a model's config.json implies, plus (experts +
    shared experts, hidden) for a fused router+shared gate; [] when it names no experts."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    hidden = cfg.get("hidden_size")
    experts = next((cfg[k] for k in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
                    if isinstance(cfg.get(k), int)), None)
    if not isinstance(hidden, int) or not experts:
        return []
    shapes = [(experts, hidden)]
    shared = next((cfg[k] for k in ("n_shared_experts", "num_shared_experts") if isinstance(cfg.get(k), int)), 0)
    if shared:
        shapes.append((experts + shared, hidden))
    return shapes


def _ms(values: Sequence[int]) -> str:
    shown = ", ".join(map(str, values[:8]))
    return shown + (f" … ({len(values)} sizes)" if len(values) > 8 else "")


def check_fast_path(arm: str, patches: Iterable[Any], log_text: str, *,
                    gate_shapes: Iterable[tuple[int, int]] = ()) -> list[Finding]:
    """Fast path not taken: a patched arm's server log shows that a kernel its patch sets route the router gate
    to ran untuned or was switched off, so the arm may have measured the old path (and equal the baseline
    for a reason that has nothing to do with the change).

    - AITER's "not found tuned config" (it then runs its default kernel for that GEMM shape): with
      ``gate_shapes`` ((N, K) = (experts, hidden), see `gate_shapes_from_config`), misses of those shapes;
      without, misses of bf16 GEMMs (router gates are bf16 GEMMs; the quantized linear layers' misses are
      left out: they are the model's, not the gate's, and would be named in every run of an untuned model);
    - vLLM switching a router kernel off (cuteDSL missing: the ll-bf16 kernels are disabled; the ROCm BF16x3
      router GEMM disabled or falling back to fp32), vLLM unable to read AITER's tuned configs, AITER's
      Triton / fused-MoE kernels without a tuned config.

    Nothing for an arm without patch sets: an unpatched arm has no fast path of ours to miss. One warning per
    cause; it never makes a cell unreliable (the numbers are what the arm measured)."""
    names = _patch_names(patches)
    if not names or not log_text:
        return []
    sets = ", ".join(names)
    findings = []
    wanted = {tuple(s) for s in gate_shapes}
    misses = aiter_untuned_shapes(log_text)
    picked = {k: v for k, v in misses.items() if (k in wanted if wanted else v["bf16"])}
    if picked:
        shapes = sorted(picked, key=lambda k: (-len(picked[k]["m"]), k))
        shown = "; ".join(f"N:{n} K:{k} at M {_ms(picked[(n, k)]['m'])}" for n, k in shapes[:FAST_PATH_EXAMPLES])
        more = f"; and {len(shapes) - FAST_PATH_EXAMPLES} more shapes" if len(shapes) > FAST_PATH_EXAMPLES else ""
        what = "the router gate's GEMM" if wanted else f"{len(shapes)} bf16 GEMM shape{'s' if len(shapes) > 1 else ''}"
        files = sorted({f for k in shapes for f in picked[k]["where"]})
        findings.append(Finding(
            "fast-path-not-taken", arm, None, None, "warning",
            f"AITER found no tuned config for {what} ({shown}{more}; {', '.join(files)}) and ran its default "
            f"kernel there: {arm}'s patch sets ({sets}) may not have reached their tuned path, so {arm} may "
            "have measured the old one (tune the shapes, e.g. AITER_TUNE_GEMM=1 and AITER's gemm tuner)"))
    for pattern, meaning in _FAST_PATH_OFF:
        hits = list(dict.fromkeys(m.group("what").strip() for m in pattern.finditer(log_text)))
        if hits:
            shown = ", ".join(hits[:FAST_PATH_EXAMPLES]) + (
                f" and {len(hits) - FAST_PATH_EXAMPLES} more" if len(hits) > FAST_PATH_EXAMPLES else "")
            findings.append(Finding(
                "fast-path-not-taken", arm, None, None, "warning",
                f"{meaning.format(what=shown)}: {arm}'s patch sets ({sets}) may not have taken their fast path"))
    return findings
