"""Where the repeats ran: a run whose jobs ran on more than one machine (a resume elsewhere, a Slurm job
requeued onto another node, a session moved to other GPUs) says so per arm, and a repeat that ran on another
machine than the baseline's same round at the same point is not paired with it.

Two machines differ by more than a router-gate change does (an H100 run resumed on a second H100 on 2026-12-05:
one machine showed the change's −2.6 % at c1, the other no gain), so a pair split across them measures the
machines. The machine is `HostIdentity.key` (host name, machine id, the accelerators' UUIDs), recorded on every
job record; repeats without one (runs before 2026-12-07) are not checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from suite.quality.finding import Finding, RepeatResult
from suite.records import HostIdentity


def machine_names(hosts: Sequence[HostIdentity]) -> dict[str, str]:
    """key -> a name a reader can tell apart: the label, with the machine id's first characters and the boot
    where two machines share a label (every device machine is "vm"; an H100's UUID is in its label already)."""
    labels: dict[str, str] = {}
    for h in hosts:
        labels.setdefault(h.key, h.label())
    taken = [lab for lab in labels.values()]
    out = {}
    for h in hosts:
        if h.key in out:
            continue
        lab = labels[h.key]
        out[h.key] = lab if taken.count(lab) == 1 else f"{lab} (machine {(h.machine_id or '?')[:8]})"
    return out


def _rounds(rs: Sequence[int]) -> str:
    rs = sorted(set(rs))
    return f"round{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"


def check_hosts(repeats: Sequence[RepeatResult], baseline: str | None, blocks: int = 1) -> list[Finding]:
    """``other-host`` (unreliable, per repeat): a repeat of another arm than ``baseline`` that ran on another
    machine than the baseline's repeat of the same round at the same point (its message says both; the report
    prefixes the round). ``hosts`` (warning, per arm): the arm's repeats ran on more than one machine, each
    machine with its rounds (``blocks``: job repeats per round, together: all)."""
    known = [r for r in repeats if r.host is not None]
    names = machine_names([r.host for r in known if r.host is not None])
    if len(names) <= 1:
        return []
    out: list[Finding] = []
    by_arm: dict[str, dict[str, list[int]]] = {}
    for r in known:
        by_arm.setdefault(r.arm, {}).setdefault(r.host.key, []).append(r.round // blocks)  # type: ignore[union-attr]
    for arm, machines in sorted(by_arm.items()):
        if len(machines) > 1:
            out.append(Finding("hosts", arm, None, None, "warning", f"ran on {len(machines)} machines: " + "; ".join(
                f"{names[k]} ({_rounds(rs)})" for k, rs in machines.items())))
    base = {(r.point, r.round): r.host.key for r in known if r.arm == baseline}  # type: ignore[union-attr]
    for r in known:
        theirs = base.get((r.point, r.round))
        if r.arm != baseline and theirs is not None and theirs != r.host.key:  # type: ignore[union-attr]
            out.append(Finding("other-host", r.arm, r.point, r.round, "unreliable",
                               f"ran on {names[r.host.key]}, the baseline's on {names[theirs]}: "  # type: ignore[union-attr]
                               "not paired (the machines' difference is not the change's)", session=r.session))
    return out
