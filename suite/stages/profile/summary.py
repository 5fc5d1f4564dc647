"""The profile section: per kernel family, ms per 100 decode steps for every arm (format neutral)."""

from __future__ import annotations

from suite.analysis import RunData, with_left_out
from suite.document import BulletList, Cell, Note, Paragraph, Section, Table, code, literal
from suite.stages.profile.read import OTHER, ProfileSummary, load_profiles

# a share of a rank's GPU kernel time that no step holds (its launch not tied to a step) above this is named:
# the family columns leave it out (HIP-graph replays on ROCm are not verified to carry their launch's correlation)
UNATTRIBUTED_WARN = 0.25


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def unattributed_lines(profiles: dict[str, ProfileSummary], arms: list[str]) -> list[str]:
    """Per arm and rank whose GPU kernel time lies more than UNATTRIBUTED_WARN outside every step: what the
    family columns miss, in the reader's words."""
    out = []
    for arm in arms:
        for i, rank in enumerate(profiles[arm].per_rank):
            total, lost = rank.kernel_ms, rank.unattributed_kernel_ms
            if total and lost is not None and lost / total > UNATTRIBUTED_WARN:
                out.append(f"{arm}, rank {i}: {lost:,.1f} of {total:,.1f} ms of GPU kernel time ({lost / total:.0%}) "
                           "is tied to no step (no launch with its correlation id inside a step annotation: a graph "
                           "replay whose launch the trace does not name, as HIP graphs on ROCm may be): the families "
                           "above leave it out")
    return out


TITLE = "Profile: time per 100 decode steps by kernel family"


def section(run: RunData) -> Section | None:
    profiles, unreadable = load_profiles(run.store, run.records)
    arms = [a for a in run.arms if a in profiles]
    if not arms:
        return with_left_out(None, unreadable, TITLE, "profile")
    first = profiles[arms[0]]
    labels = list(first.families)
    shown = [k for k in labels if k == OTHER or any((profiles[a].per_100_decode_steps_ms.get(k) or 0) > 0
                                                     for a in arms)]
    idle = [k for k in labels if k not in shown]
    modes = {profiles[a].mode for a in arms}
    basis = []
    for mode in sorted(modes):
        text = next(profiles[a].basis for a in arms if profiles[a].mode == mode)
        basis.append(f"basis ({literal(mode)}): {literal(text)}.")
    blocks: list = [BulletList(basis + [
        "decode step: one `execute_context_0(0)_generation_<m>(<m>)` annotation of the worker (no prefill request "
        "in the step); prefill/mixed and empty steps are excluded; ms per 100 decode steps = family time inside "
        "decode steps / decode steps × 100. Total = sum of the families; step wall = wall time of the decode "
        "steps.",
        "one profiled window per arm: no repeats, no interval; a single window is evidence of *which* kernels/ops "
        "changed, not a latency measurement."])]
    if "cpu" in modes:
        blocks.append(Paragraph(
            "On CPU there is no device: the columns are host time of torch ops, so a family can only show work the "
            "host did itself (oneDNN GEMM, the fused MoE op, a host-side delay) — read it as where host time went, "
            "not as GPU kernel time."))
    base_total = profiles[run.baseline].total_per_100_decode_steps_ms if run.baseline in profiles else None
    rows = []
    for a in arms:
        p = profiles[a]
        total = p.total_per_100_decode_steps_ms
        delta = (f"{total - base_total:+,.1f} ({(total / base_total - 1) * 100:+.1f}%)"
                 if a != run.baseline and total is not None and base_total else "—")
        rows.append([Cell(literal(a)), Cell(str(p.decode_steps)), Cell(_ms(total)),
                     *(Cell(_ms(p.per_100_decode_steps_ms.get(k))) for k in shown),
                     Cell(_ms(p.decode_step_wall_per_100_ms)), Cell(delta)])
    blocks.append(Table(["Arm", "Decode steps", "Total", *(literal(k) for k in shown), "Step wall",
                         f"Δ total vs {literal(run.baseline)}"], rows, name="profile"))
    blocks += [Note(line, "warning") for line in unattributed_lines(profiles, arms)]
    if idle:
        blocks.append(Paragraph("Families with no time in any arm: "
                                + ", ".join(f"{literal(k)} ({code(first.patterns[k])})" for k in idle)))
    blocks.append(Paragraph("Patterns (first match wins, else other): "
                            + ", ".join(f"{literal(k)} {code(v)}" for k, v in first.patterns.items())))
    tops = []
    for a in arms:
        top = profiles[a].per_rank[0].top[:6] if profiles[a].per_rank else []
        if top:
            n = profiles[a].decode_steps
            tops.append(f"top ops/kernels, {literal(a)} (ms per 100 decode steps): "
                        + "; ".join(f"{code(t.name[:80])} {t.ms / n * 100:,.1f} ({literal(t.family)}, "
                                    f"{t.calls_per_decode_step or 0:g} calls/step)" for t in top))
    if tops:
        blocks.append(BulletList(tops))
    return with_left_out(Section(TITLE, 2, blocks, anchor="profile"), unreadable, TITLE, "profile")


