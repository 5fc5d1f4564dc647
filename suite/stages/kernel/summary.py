"""The router-gate kernel microbenchmark's section (format neutral), from stored results only.

Input: the results ``suite.stages.kernel.bench`` wrote (one per arm and round), read back as ``KernelRun``. Also the
plain-text table and the markdown file of the `suite kernel` command, drawn from the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from suite.analysis import RunData, geometric_mean, with_left_out
from suite.document import (
    BulletList,
    Cell,
    Paragraph,
    Section,
    Table,
    code,
    delta_text,
    literal,
    verdict_cell,
)
from suite.render import markdown
from suite.stages.kernel.read import KernelRow, KernelRun, load_kernel_runs
from suite.stats import compare


def _fmt_us(r: KernelRow) -> str:
    return f"{r.median_us:.2f} [{r.p10_us:.2f}–{r.p90_us:.2f}]"


def speedup(base: KernelRow, other: KernelRow) -> float | None:
    """Baseline median over the arm's median (> 1: the arm is faster)."""
    if not other.median_us:
        return None
    return base.median_us / other.median_us


def path_cell(r: KernelRow | None) -> str:
    if r is None:
        return "–"
    cell = code(r.path)
    if r.frozen_branch:
        cell += f" **frozen branch** (eager: {code(r.eager_path)})"
    if r.recompiled:
        cell += " (recompiled at this M)"
    return cell


@dataclass(frozen=True)
class ArmCell:
    result: KernelRow | None  # None: the arm has no row at this M
    speedup: float | None  # against the baseline arm; None for the baseline itself


@dataclass(frozen=True)
class ComparisonRow:
    m: int
    arms: dict[str, ArmCell]


def comparison_rows(results_by_arm: Mapping[str, KernelRun], baseline: str) -> list[ComparisonRow]:
    """One row per M: per-arm stats and speedup against the baseline arm (shared by table and CLI)."""
    if baseline not in results_by_arm:
        raise KeyError(f"baseline arm {baseline!r} not among {sorted(results_by_arm)}")
    per_arm = {arm: res.by_m() for arm, res in results_by_arm.items()}
    ms = sorted({m for rows in per_arm.values() for m in rows})
    rows = []
    for m in ms:
        base = per_arm[baseline].get(m)
        rows.append(ComparisonRow(m, {
            arm: ArmCell(r, speedup(base, r) if (base is not None and r is not None and arm != baseline) else None)
            for arm, by_m in per_arm.items() for r in (by_m.get(m),)}))
    return rows


def kernel_blocks(results_by_arm: Mapping[str, KernelRun], baseline: str) -> list[Any]:
    """The section's content: µs per M per arm (median [p10–p90]), speedup vs ``baseline``, path per M."""
    rows = comparison_rows(results_by_arm, baseline)
    arms = [baseline] + [a for a in results_by_arm if a != baseline]
    first = results_by_arm[baseline]
    shape, comp, timing = first.shape, first.compile, first.timing
    blocks: list[Any] = [Paragraph(
        f"Gate {shape.hidden}×{shape.experts} ({shape.dtype} in, {shape.out_dtype} out, "
        f"bias={shape.bias}), guard-free `torch.compile` (fullgraph, dynamic, backend "
        f"{code(comp.backend)}) traced first at M={comp.trace_m}; "
        f"{literal(timing.method.replace('_', ' '))} of {timing.calls_per_sample} calls per "
        f"sample, {timing.samples} samples per M; µs per call, median [p10–p90]. "
        f"Device: {literal(first.device.name)}.")]
    timing_rows = []
    for row in rows:
        cells = [Cell(str(row.m))]
        cells += [Cell(_fmt_us(r) if (r := row.arms[a].result) else "–") for a in arms]
        cells += [Cell(f"{s:.2f}×" if (s := row.arms[a].speedup) else "–") for a in arms[1:]]
        timing_rows.append(cells)
    blocks.append(Table(["M", *(f"{literal(a)} µs" for a in arms), *(f"speedup {literal(a)}" for a in arms[1:])],
                        timing_rows, name="kernel"))
    blocks.append(Table(["M", *(literal(a) for a in arms)],
                        [[Cell(str(row.m)), *(Cell(path_cell(row.arms[a].result)) for a in arms)]
                         for row in rows], caption="Path that ran (recorded per M in an untimed pass of the "
                        "compiled gate):", align=["left"] * (1 + len(arms)), name="kernel-paths"))
    notes = [f"**{literal(a)}: frozen branch at M = {', '.join(map(str, results_by_arm[a].frozen_branch_ms))}**: "
             f"the compiled gate ran the trace-M path ({code(results_by_arm[a].compile.trace_path)}) although the "
             "same tree takes another path there in eager mode." for a in arms if results_by_arm[a].frozen_branch_ms]
    if notes:
        blocks.append(BulletList(notes))
    env_rows = []
    for a in arms:
        res = results_by_arm[a]
        gate_desc = res.gate.class_ or res.gate.source or "?"
        if res.gate.forced:
            gate_desc += f" ({res.gate.forced})"
        env_rows.append([Cell(literal(a)), Cell(literal(res.device.name)), Cell(literal(res.torch_version)),
                         Cell(literal(res.vllm_version)), Cell(literal(gate_desc)), Cell(code(res.compile.trace_path))])
    blocks.append(Table(["arm", "device", "torch", "vLLM", "gate", "trace path"], env_rows, align=["left"] * 6,
                        name="kernel-env"))
    return blocks


def process_medians(runs: Mapping[str, Mapping[int, KernelRun]]) -> dict[str, dict[int, dict[int, float]]]:
    """arm -> round -> M -> that process's median µs."""
    return {arm: {rnd: {r.m: r.median_us for r in res.results if r.median_us > 0} for rnd, res in rounds.items()}
            for arm, rounds in runs.items()}


def across_processes(runs: Mapping[str, Mapping[int, KernelRun]], baseline: str, *, label: str = "M",
                     unit: str = "µs per call", name: str = "kernel-processes") -> Table | None:
    """With 2 or more processes per arm (``repeats``): per M (or T), the geometric mean of the
    processes' medians and each candidate's Δ% with a 95 % paired t interval across the processes, paired by
    round: what one process's samples cannot show (what changes from one process start to the next)."""
    if baseline not in runs or min(len(r) for r in runs.values()) < 2:
        return None
    medians = process_medians(runs)
    arms = [baseline] + [a for a in runs if a != baseline]
    ms = sorted({m for rounds in medians.values() for by_m in rounds.values() for m in by_m})
    rows = []
    for m in ms:
        have = {a: {r: by_m[m] for r, by_m in medians[a].items() if m in by_m} for a in arms}
        cells = [Cell(str(m))]
        cells += [Cell(f"{geometric_mean(list(have[a].values())):.2f} ({len(have[a])})" if have[a] else "–")
                  for a in arms]
        for a in arms[1:]:
            paired = sorted(set(have[baseline]) & set(have[a]))
            if len(paired) < 2:
                cells += [Cell("–"), Cell(f"{len(paired)} paired process(es)", style="missing")]
                continue
            c = compare([have[baseline][r] for r in paired], [have[a][r] for r in paired], higher_is_better=False,
                        paired=True)
            cells += [Cell(delta_text(c)), verdict_cell(c)]
        rows.append(cells)
    return Table([label, *(f"{literal(a)} µs (processes)" for a in arms),
                  *(h for a in arms[1:] for h in (f"Δ% {literal(a)} [95% interval]", f"verdict {literal(a)}"))],
                 rows, name=name,
                 caption=f"Across processes (`repeats`): per {label} the geometric mean of each process's "
                         f"median {unit} (how many processes in brackets); Δ% of the candidate with a 95 % paired t "
                         "interval across the processes, paired by round (positive: slower).")


TITLE = "Router-gate kernel (guard-free torch.compile, per arm)"


def kernel_section(results_by_arm: Mapping[str, KernelRun], baseline: str,
                   title: str = TITLE,
                   runs: Mapping[str, Mapping[int, KernelRun]] | None = None) -> Section:
    """The section: the first process's tables per arm; with ``runs`` of 2 or more processes per arm, the
    table across them first."""
    blocks = kernel_blocks(results_by_arm, baseline)
    table = across_processes(runs, baseline) if runs else None
    if table is not None:
        blocks[1:1] = [table, Paragraph("The tables below are from each arm's first process.")]
    return Section(title, 2, blocks, anchor="kernel")


def render_kernel_md(results_by_arm: Mapping[str, KernelRun], baseline: str) -> str:
    """kernel.md of `suite kernel`: the same content as the report's section, as markdown."""
    return markdown.section(kernel_section(results_by_arm, baseline, "Router gate kernel")) + "\n"


def render_kernel_text(results_by_arm: Mapping[str, KernelRun], baseline: str) -> str:
    """Plain-text table for the terminal: before → after per M, speedup and path."""
    others = [a for a in results_by_arm if a != baseline]
    lines = []
    for row in comparison_rows(results_by_arm, baseline):
        base = row.arms[baseline].result
        b = f"{base.median_us:8.2f} us [{base.p10_us:.2f}-{base.p90_us:.2f}]" if base else "-"
        parts = [f"M={row.m:<5d} {baseline} {b}"]
        for a in others:
            cell = row.arms[a]
            if cell.result is None:
                parts.append(f"-> {a} -")
                continue
            r = cell.result
            parts.append(f"-> {a} {r.median_us:8.2f} us [{r.p10_us:.2f}-{r.p90_us:.2f}]"
                         + (f"  {cell.speedup:5.2f}x" if cell.speedup else ""))
        paths = "; ".join(f"{a}: {r.path}" + (" FROZEN" if r.frozen_branch else "")
                          for a in [baseline, *others] if (r := row.arms[a].result) is not None)
        lines.append("  ".join(parts) + f"   | {paths}")
    return "\n".join(lines)


def section(run: RunData) -> Section | None:
    runs, unreadable = load_kernel_runs(run.store, run.records)
    if run.baseline not in runs:
        return with_left_out(None, unreadable, TITLE, "kernel")
    first = {arm: next(iter(rounds.values())) for arm, rounds in runs.items()}
    return with_left_out(kernel_section(first, run.baseline, runs=runs), unreadable, TITLE, "kernel")


