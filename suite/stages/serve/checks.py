"""Data-quality checks of the serve stage: one measured repeat (its raw `vllm bench serve` result, its
planned point, its client record), and a session's first measurements (warm-up outliers).

Pure functions over the results read as `ServeResult` (``--save-result --save-detailed``); thresholds beside
the checks (each docstring says why). A message names no repeat: `suite.quality.run.run_checks` puts where the
repeat ran in front of it ("round 2: ...", under together: all "round 1, block 3: ...").
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from suite.quality.finding import Finding, RepeatResult, fmt_value
from suite.records import ClientRecord
from suite.stages.serve.read import ServeResult, finite_number
from suite.stages.serve.spec import ServeParams

TOKEN_TIMING = ("ttft", "tpot", "itl")  # the metric families a stream's token timing spoils (suite.stats.FAMILIES)
BURST_S_PER_TOKEN = 50e-6  # faster than any decode step: tokens that close together came in one read
BURST_REQUEST_SHARE = 0.10  # this share of burst requests (or more) makes the token timings unreliable
ITL_MEDIAN_FLOOR_MS = BURST_S_PER_TOKEN * 1000
ITL_MEDIAN_REL = 0.10  # median ITL below this share of the mean decode time per token: bursts with gaps
CHUNK_SHARE = 0.5  # a request whose chunks after the first are fewer than this share of its tokens is chunked
MIN_CONCURRENCY_SHARE = 0.70
CLIENT_CPU_MAX = 0.90
WARMUP_FACTOR = 3.0
WARMUP_MIN_OTHERS = 2
SLOW_REQUEST_FACTOR = 4.0  # a request whose TTFT is this many times the repeat's median TTFT (or more) is slow
SLOW_REQUEST_MIN_N = 8  # below this many requests a median is no reference


def _expected_prompts(raw: ServeResult, params: ServeParams | None) -> int | None:
    n = params.num_prompts if params is not None else raw.num_prompts  # else: what the client sent
    return int(n) if isinstance(n, int | float) and not isinstance(n, bool) else None


def _per_request(raw: ServeResult) -> list[tuple[float, float, int]]:
    """(latency s, ttft s, output tokens) of the successful requests with more than one output token."""
    lat, ttft, outs = raw.latencies, raw.ttfts, raw.output_lens
    if lat is None or ttft is None or outs is None or not len(lat) == len(ttft) == len(outs):
        return []
    errors = raw.errors if raw.errors is not None and len(raw.errors) == len(lat) else [""] * len(lat)
    rows = []
    for la, tt, n, err in zip(lat, ttft, outs, errors, strict=True):
        if err or n < 2 or finite_number(la) is None or finite_number(tt) is None:
            continue
        rows.append((la, tt, n))
    return rows


def _mean_decode_ms(raw: ServeResult, rows: list[tuple[float, float, int]]) -> float | None:
    """Mean time per token after the first: Σ(latency − TTFT) / Σ(output tokens − 1), in ms."""
    if rows:
        tokens = sum(n - 1 for _, _, n in rows)
        return 1000 * sum(la - tt for la, tt, _ in rows) / tokens
    e2el, ttft = raw.metric("mean_e2el_ms"), raw.metric("mean_ttft_ms")
    total, completed = raw.metric("total_output_tokens"), raw.metric("completed")
    if e2el is None or ttft is None or not total or not completed or total / completed <= 1:
        return None
    return (e2el - ttft) / (total / completed - 1)


def _median_itl_ms(raw: ServeResult) -> float | None:
    value = raw.metric("median_itl_ms")
    if value is not None:
        return value
    if raw.itls is not None:
        flat = [x for per in raw.itls for x in per if finite_number(x) is not None]
        return 1000 * statistics.median(flat) if flat else None
    return None


def check_failed(raw: ServeResult, params: ServeParams | None, *, arm: str, point: str | None,
                 round: int | None) -> list[Finding]:
    """Failed or incomplete requests: ``failed > 0``, a non-empty error string, or ``completed`` below the
    prompts asked for. Any of them: the repeat measured a different workload than its neighbours (fewer
    requests, early exits), so the cell is unreliable for every metric. No tolerance: a healthy server
    answers every request of a benchmark."""
    failed = int(raw.metric("failed") or 0)
    completed = raw.metric("completed")
    expected = _expected_prompts(raw, params)
    errors = [e for e in raw.errors or [] if e]
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
    return [Finding("failed-requests", arm, point, round, "unreliable", "; ".join(parts))]


def check_coalesced(raw: ServeResult, *, arm: str, point: str | None,
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
                        f"coalesced stream: {'; '.join(reasons)} (TTFT, TPOT and ITL unusable)",
                        metrics=TOKEN_TIMING)]
    if bursts:
        return [Finding("coalesced-stream", arm, point, round, "warning",
                        f"{bursts} of {len(rows)} requests received every token after the first "
                        "in one burst", metrics=TOKEN_TIMING)]
    return []


def check_chunked(raw: ServeResult, *, arm: str, point: str | None, round: int | None) -> list[Finding]:
    """Chunked stream: the server sent several tokens per streamed chunk (vLLM's `--stream-interval N`, or an
    API server that merged a request's pending outputs), so `vllm bench serve` timed gaps between chunks,
    not tokens: ITL is the chunk interval, while TTFT (first chunk), TPOT ((latency − TTFT) / (tokens − 1))
    and E2E latency stay right. A request is chunked when its gaps after the first token (the detailed
    ``itls`` list) number fewer than ``CHUNK_SHARE`` of its tokens after the first; ≥ ``BURST_REQUEST_SHARE``
    of the requests chunked makes the ITL numbers unreliable."""
    itls, outs = raw.itls, raw.output_lens
    if itls is None or outs is None or len(itls) != len(outs):
        return []
    rows = [(len(gaps), n - 1) for gaps, n in zip(itls, outs, strict=True) if n > 2]
    chunked = [(g, n) for g, n in rows if g < CHUNK_SHARE * n]
    if not rows or len(chunked) < BURST_REQUEST_SHARE * len(rows):
        return []
    gaps = statistics.median(g for g, _ in chunked)
    tokens = statistics.median(n for _, n in chunked)
    return [Finding("chunked-stream", arm, point, round, "unreliable",
                    f"chunked stream: {len(chunked)} of {len(rows)} requests got their {tokens:g} tokens "
                    f"after the first in {gaps:g} chunk(s) (median): ITL times chunks, not tokens (TTFT, TPOT and "
                    "E2E latency are unaffected)", metrics=("itl",))]


def check_concurrency(raw: ServeResult, params: ServeParams | None, *, arm: str, point: str | None,
                      round: int | None) -> list[Finding]:
    """Achieved concurrency below target. The mean number of requests in flight is Σ latencies / duration
    (Little's law over the run); the target is min(concurrency, prompts). Below ``MIN_CONCURRENCY_SHARE`` =
    70 % the server saw a lighter load than the point names (a slow client, requests that end at once, a
    long ramp-down), so the cell does not measure that point. The ramp-down alone costs little: with
    prompts ≥ 2 × concurrency the demo's clean repeats reach 92–100 %. Only for closed-loop points
    (request rate inf / unset): an open-loop rate sets its own load."""
    rate = params.request_rate if params is not None else raw.request_rate
    if finite_number(rate) is not None:  # a finite request rate ("inf" and inf read as None)
        return []
    conc = params.concurrency if params is not None else raw.max_concurrency
    lat, dur = raw.latencies, raw.metric("duration")
    n = _expected_prompts(raw, params)
    if not isinstance(conc, int) or not lat or not dur or dur <= 0:
        return []
    target = min(conc, n) if n else conc
    achieved = sum(x for x in lat if finite_number(x) is not None) / dur
    if target <= 0 or achieved >= MIN_CONCURRENCY_SHARE * target:
        return []
    return [Finding("low-concurrency", arm, point, round, "unreliable",
                    f"mean in-flight requests {achieved:.2f} of the {target} asked for "
                    f"({achieved / target:.0%}, threshold {MIN_CONCURRENCY_SHARE:.0%})")]


def client_cpu_share(client: ClientRecord | None) -> float | None:
    """The client's CPU use over the measurement, as a share of one core.

    ``bench_cpu_s / bench_wall_s`` (the persistent client's benchmark call alone) when present, else
    ``client_cpu_util`` — except for the CLI (``mode == "cli"``), whose figure includes Python's start-up
    (CPU-bound seconds that say nothing about the measurement): None there.
    """
    if client is None:
        return None
    cpu, wall = finite_number(client.bench_cpu_s), finite_number(client.bench_wall_s)
    if cpu is not None and wall:
        return cpu / wall
    if client.mode == "cli":
        return None
    return finite_number(client.client_cpu_util)


def check_client(client: ClientRecord | None, *, arm: str, point: str | None,
                 round: int | None) -> list[Finding]:
    """Client-bound run: `vllm bench serve` is one asyncio process, so it can use one core at most. At
    ≥ ``CLIENT_CPU_MAX`` = 90 % of a core it is saturated: requests wait in the client's event loop,
    timestamps are taken late, and the numbers measure the client, not the server."""
    share = client_cpu_share(client)
    if share is None or share < CLIENT_CPU_MAX:
        return []
    return [Finding("client-bound", arm, point, round, "unreliable",
                    f"the benchmark client used {share:.0%} of a core (threshold "
                    f"{CLIENT_CPU_MAX:.0%}): the client, not the server, set the pace")]


def check_slow_requests(raw: ServeResult, params: ServeParams | None, *, arm: str, point: str | None,
                        round: int | None) -> list[Finding]:
    """Slow requests: some requests of a repeat waited far longer than the others for their first token, so
    that repeat's mean and P99 TTFT, its E2E latency and its output throughput (the run lasted longer) carry
    them rather than the server's steady speed. TPOT is not moved.

    A request is slow when its TTFT is ≥ ``SLOW_REQUEST_FACTOR`` = 4× the median TTFT of its repeat (≥
    ``SLOW_REQUEST_MIN_N`` = 8 requests). On the H200 (Gemma 4, c1–c32, the 408 repeats of the eight stored
    runs) the slowest request of a repeat was at most 2.3× its median in all but seven repeats: in six of
    those 8 or 16 requests, a whole wave at concurrency 8 or 16 (most often the first), waited 5.0–6.9× the
    median (677–1,023 ms against 127–160 ms), in both arms of an A/A alike, after the session's own warm-up; in
    the seventh one request of 256 waited 8.2×. On the demo's 2-core box the slowest request reached 3.3×. The
    message says when the slow requests are the first wave. A warning: it names the repeat behind a wide TTFT
    or throughput interval; a candidate that stalls more would be hidden if such repeats were left out, and the
    primary test (TPOT by default) is not touched."""
    ttfts = [t for t in raw.ttfts or [] if finite_number(t) is not None and t > 0]
    if len(ttfts) < SLOW_REQUEST_MIN_N:
        return []
    median = statistics.median(ttfts)
    slow = [i for i, t in enumerate(ttfts) if t >= SLOW_REQUEST_FACTOR * median]
    if not slow:
        return []
    mean = statistics.fmean(ttfts)
    rest = statistics.fmean([t for t in ttfts if t < SLOW_REQUEST_FACTOR * median])
    conc = params.concurrency if params is not None else None
    who = (f"the first {len(slow)} of {len(ttfts)} requests"
           + (f" (the first wave at concurrency {conc})" if conc == len(slow) else "")
           if slow == list(range(len(slow))) else f"{len(slow)} of {len(ttfts)} requests")
    return [Finding("slow-request", arm, point, round, "warning",
                    f"{who} waited ≥ {SLOW_REQUEST_FACTOR:g}× the median for their first token "
                    f"(slowest {1000 * max(ttfts[i] for i in slow):,.0f} ms, median {1000 * median:,.0f} ms): mean "
                    f"TTFT {100 * (mean / rest - 1):+.1f} % from them; P99 TTFT, E2E latency and output throughput "
                    "carry them too")]


def check_repeat(raw: ServeResult, params: ServeParams | None, *, arm: str, point: str | None,
                 round: int | None, client: ClientRecord | None = None) -> list[Finding]:
    """Every per-repeat check on one raw result: failed requests, coalesced stream, chunked stream, achieved
    concurrency, client-bound, slow requests."""
    return [*check_failed(raw, params, arm=arm, point=point, round=round),
            *check_coalesced(raw, arm=arm, point=point, round=round),
            *check_chunked(raw, arm=arm, point=point, round=round),
            *check_concurrency(raw, params, arm=arm, point=point, round=round),
            *check_client(client, arm=arm, point=point, round=round),
            *check_slow_requests(raw, params, arm=arm, point=point, round=round)]


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
        ttft = cand.raw.metric("mean_ttft_ms")
        other_ttft = [v for r in others if (v := r.raw.metric("mean_ttft_ms")) is not None]
        if ttft is not None and len(other_ttft) >= WARMUP_MIN_OTHERS:
            mid = statistics.median(other_ttft)
            if mid > 0 and ttft > WARMUP_FACTOR * mid:
                parts.append(f"mean TTFT {fmt_value(ttft)} ms is {ttft / mid:.1f}× the median {fmt_value(mid)} ms")
        tput = cand.raw.metric("output_throughput")
        other_tput = [v for r in others if (v := r.raw.metric("output_throughput")) is not None]
        if tput is not None and len(other_tput) >= WARMUP_MIN_OTHERS:
            mid = statistics.median(other_tput)
            if mid > 0 and tput * WARMUP_FACTOR < mid:
                parts.append(f"output throughput {fmt_value(tput)} tok/s is {mid / max(tput, 1e-12):.1f}× below the "
                             f"median {fmt_value(mid)} tok/s")
        if parts:
            findings.append(Finding(
                "warmup-outlier", arm, point, cand.round, "unreliable",
                f"{where} is a cold-start outlier: {' and '.join(parts)} of the other "
                f"{len(others)} repeats", session=session))
    return findings
