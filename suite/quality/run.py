"""Every data-quality check over a run, in the Data quality box's order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from suite.quality.finding import Finding, RepeatResult, order_findings, repeat_name
from suite.quality.hosts import check_hosts
from suite.quality.series import (
    check_bimodal_sessions,
    check_block_outlier,
    check_drift,
    check_round_outlier,
    check_session_drift,
)
from suite.quality.server_log import check_server_health
from suite.stages.serve.checks import check_repeat, check_warmup
from suite.stages.serve.read import ServerStart

# the checks that see rounds: under together: all their findings' round is a round, every other
# check's a job repeat (a block)
ACROSS_ROUNDS = ("round-outlier", "drift", "bimodal-sessions")


def run_checks(repeats: Sequence[RepeatResult], *, servers: Iterable[ServerStart] = (),
               logs: Mapping[tuple[str, int], str] | None = None,
               blocks: int = 1, baseline: str | None = None) -> list[Finding]:
    """Every check over a run's repeats (plus server records and logs), in `order_findings` order. ``blocks``:
    job repeats per round (together: all: a round's blocks): the checks across rounds (drift,
    round-outlier, bimodal sessions) see rounds, the verdict's unit, and block-outlier compares one
    block with its round's others. ``baseline``: the arm whose repeats the others pair with (`check_hosts`)."""
    across = [replace(r, round=r.round // blocks) for r in repeats] if blocks > 1 else repeats
    per_repeat: list[Finding] = []
    for r in repeats:
        per_repeat += check_repeat(r.raw, r.params, arm=r.arm, point=r.point, round=r.round, client=r.client)
    per_repeat += check_warmup(repeats)
    per_repeat += check_session_drift(repeats)
    per_repeat += check_hosts(repeats, baseline, blocks)
    # a repeat's finding is named where it ran, as everywhere in the report: "round 2", or under together: all
    # "round 1, block 3" (the checks themselves name no repeat)
    findings = [f if f.round is None else replace(f, message=f"{repeat_name(f.round, blocks)}: {f.message}")
                for f in per_repeat]
    findings += check_server_health(servers, logs)
    findings += check_round_outlier(across)
    findings += check_block_outlier(repeats, blocks)
    findings += check_drift(across)
    findings += check_bimodal_sessions(across)
    return order_findings(findings)
