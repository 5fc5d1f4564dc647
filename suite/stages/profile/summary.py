"""The profile section: per kernel family, ms per 100 decode steps for every arm."""

from __future__ import annotations

from typing import Any

from suite.stages.profile.read import OTHER, load_profiles


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def report_section(run: Any) -> str:
    profiles = load_profiles(run)
    if not profiles:
        return ""
    arms = [a for a in run.arms if a in profiles]
    first = profiles[arms[0]]
    labels = list(first["families"])
    shown = [k for k in labels if k == OTHER or any((profiles[a]["per_100_decode_steps_ms"].get(k) or 0) > 0
                                                     for a in arms)]
    idle = [k for k in labels if k not in shown]
    modes = {profiles[a]["mode"] for a in arms}
    out = ["## Profile: time per 100 decode steps by kernel family", ""]
    for mode in sorted(modes):
        basis = next(profiles[a]["basis"] for a in arms if profiles[a]["mode"] == mode)
        out.append(f"- basis ({mode}): {basis}.")
    out += ["- decode step: one `execute_context_0(0)_generation_<m>(<m>)` annotation of the worker (no prefill "
            "request in the step); prefill/mixed and empty steps are excluded; ms per 100 decode steps = family "
            "time inside decode steps / decode steps × 100. Total = sum of the families; step wall = wall time "
            "of the decode steps.",
            "- one profiled window per arm: no repeats, no interval; a single window is evidence of *which* "
            "kernels/ops changed, not a latency measurement.", ""]
    if "cpu" in modes:
        out += ["On CPU there is no device: the columns are host time of torch ops, so a family can only show "
                "work the host did itself (oneDNN GEMM, the fused MoE op, a host-side delay) — read it as where "
                "host time went, not as GPU kernel time.", ""]
    base_total = profiles.get(run.baseline, {}).get("total_per_100_decode_steps_ms")
    head = ["Arm", "Decode steps", "Total"] + shown + ["Step wall", "Δ total vs " + run.baseline]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in arms:
        p = profiles[a]
        total = p["total_per_100_decode_steps_ms"]
        delta = (f"{total - base_total:+,.1f} ({(total / base_total - 1) * 100:+.1f}%)"
                 if a != run.baseline and total is not None and base_total else "—")
        cells = [a, str(p["decode_steps"]), _ms(total)]
        cells += [_ms(p["per_100_decode_steps_ms"].get(k)) for k in shown]
        cells += [_ms(p.get("decode_step_wall_per_100_ms")), delta]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if idle:
        out += ["Families with no time in any arm: " + ", ".join(f"{k} (`{first['patterns'][k]}`)" for k in idle),
                ""]
    out += ["Patterns (first match wins, else other): "
            + ", ".join(f"{k} `{v}`" for k, v in first["patterns"].items()), ""]
    for a in arms:
        top = (profiles[a].get("per_rank") or [{}])[0].get("top", [])[:6]
        if top:
            n = profiles[a]["decode_steps"]
            out.append(f"- top ops/kernels, {a} (ms per 100 decode steps): "
                       + "; ".join(f"`{t['name'][:80]}` {t['ms'] / n * 100:,.1f} ({t['family']}, "
                                   f"{t.get('calls_per_decode_step', 0) or 0:g} calls/step)" for t in top))
    return "\n".join(out + [""])
