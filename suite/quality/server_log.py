"""Server health per session: restarts, slow starts, and error lines in the server log."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping

from suite.quality.finding import Finding
from suite.stages.serve.read import ServerStart, finite_number
from suite.store import SERVER_START_MARK

START_SLOW_FACTOR = 3.0
START_MIN_OTHERS = 2
_LOG_ERROR = re.compile(r"\bERROR\b|^\s*Traceback \(most recent call last\)")
SHUTDOWN_MARK = "[shutdown]"  # vLLM logs its teardown with this tag once it got SIGTERM


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


def check_server_health(sessions: Iterable[ServerStart],
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
    per: dict[tuple[str, int], list[ServerStart]] = defaultdict(list)
    for rec in sessions:
        per[(rec.arm, rec.session)].append(rec)
    start: dict[tuple[str, int], float] = {}
    for key, recs in per.items():
        first = min(recs, key=lambda r: r.attempt)
        value = finite_number(first.healthy_after_s)
        if value is not None:
            start[key] = value
    findings = []
    for arm, session in sorted(set(per) | set(logs or {})):
        recs = per.get((arm, session), [])
        parts = []
        attempts = max((r.attempt for r in recs), default=0)
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
