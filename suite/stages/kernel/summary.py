"""The router-gate kernel microbenchmark's section (format neutral), from stored results only.

Input: the JSON objects written by ``suite.stages.kernel.bench`` (one per arm), keyed by arm name. Also the
plain-text table and the markdown file of the `suite kernel` command, drawn from the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from suite.analysis import RunData
from suite.document import BulletList, Cell, Paragraph, Section, Table, code, literal
from suite.render import markdown
from suite.stages.kernel.read import load_kernel_runs
from suite.stats import compare, fmt_interval, fmt_pct

STYLE = {"better": "better", "worse": "worse", "not significant": "not-significant", "unreliable": "unreliable"}


def _fmt_us(r: Mapping[str, Any]) -> str:
    return f"{r['median_us']:.2f} [{r['p10_us']:.2f}–{r['p90_us']:.2f}]"


def speedup(base: Mapping[str, Any], other: Mapping[str, Any]) -> float | None:
    """Baseline median over the arm's median (> 1: the arm is faster)."""
    if not other.get("median_us"):
        return None
    return float(base["median_us"]) / float(other["median_us"])


def _by_m(result: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r["m"]): r for r in result.get("results", [])}


def _path_cell(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return "–"
    cell = code(r["path"])
    if r.get("frozen_branch"):
        cell += f" **frozen branch** (eager: {code(r['eager_path'])})"
    if r.get("recompiled"):
        cell += " (recompiled at this M)"
    return cell


def comparison_rows(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """One row per M: per-arm stats and speedup against the baseline arm (shared by table and CLI)."""
    if baseline not in results_by_arm:
        raise KeyError(f"baseline arm {baseline!r} not among {sorted(results_by_arm)}")
    per_arm = {arm: _by_m(res) for arm, res in results_by_arm.items()}
    ms = sorted({m for rows in per_arm.values() for m in rows})
    rows = []
    for m in ms:
        base = per_arm[baseline].get(m)
        row: dict[str, Any] = {"m": m, "arms": {}}
        for arm, by_m in per_arm.items():
            r = by_m.get(m)
            row["arms"][arm] = {
                "result": r,
                "speedup": speedup(base, r)
                if (base is not None and r is not None and arm != baseline)
                else None,
            }
        rows.append(row)
    return rows


def kernel_blocks(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str) -> list[Any]:
    """The section's content: µs per M per arm (median [p10–p90]), speedup vs ``baseline``, path per M."""
    rows = comparison_rows(results_by_arm, baseline)
    arms = [baseline] + [a for a in results_by_arm if a != baseline]
    first = results_by_arm[baseline]
    shape = first.get("shape", {})
    comp = first.get("compile", {})
    timing = first.get("timing", {})
    device = first.get("device", {})
    blocks: list[Any] = [Paragraph(
        f"Gate {shape.get('hidden')}×{shape.get('experts')} ({shape.get('dtype')} in, {shape.get('out_dtype')} out, "
        f"bias={shape.get('bias')}), guard-free `torch.compile` (fullgraph, dynamic, backend "
        f"{code(comp.get('backend'))}) traced first at M={comp.get('trace_m')}; "
        f"{literal(timing.get('method', '?').replace('_', ' '))} of {timing.get('calls_per_sample')} calls per "
        f"sample, {timing.get('samples')} samples per M; µs per call, median [p10–p90]. "
        f"Device: {literal(device.get('name'))}.")]
    timing_rows = []
    for row in rows:
        cells = [Cell(str(row["m"]))]
        cells += [Cell(_fmt_us(r) if (r := row["arms"][a]["result"]) else "–") for a in arms]
        cells += [Cell(f"{s:.2f}×" if (s := row["arms"][a]["speedup"]) else "–") for a in arms[1:]]
        timing_rows.append(cells)
    blocks.append(Table(["M", *(f"{literal(a)} µs" for a in arms), *(f"speedup {literal(a)}" for a in arms[1:])],
                        timing_rows, name="kernel"))
    blocks.append(Table(["M", *(literal(a) for a in arms)],
                        [[Cell(str(row["m"])), *(Cell(_path_cell(row["arms"][a]["result"])) for a in arms)]
                         for row in rows], caption="Path that ran (recorded per M in an untimed pass of the "
                        "compiled gate):", align=["left"] * (1 + len(arms)), name="kernel-paths"))
    frozen = {a: res.get("frozen_branch_ms") or [] for a, res in results_by_arm.items()}
    notes = [f"**{literal(a)}: frozen branch at M = {', '.join(map(str, frozen[a]))}**: the compiled gate ran the "
             f"trace-M path ({code(results_by_arm[a].get('compile', {}).get('trace_path'))}) although the same "
             "tree takes another path there in eager mode." for a in arms if frozen[a]]
    if notes:
        blocks.append(BulletList(notes))
    env_rows = []
    for a in arms:
        res = results_by_arm[a]
        gate = res.get("gate", {})
        gate_desc = gate.get("class") or gate.get("source") or "?"
        if gate.get("forced"):
            gate_desc += f" ({gate['forced']})"
        env_rows.append([Cell(literal(a)), Cell(literal(res.get("device", {}).get("name"))),
                         Cell(literal(res.get("torch_version"))), Cell(literal(res.get("vllm_version"))),
                         Cell(literal(gate_desc)), Cell(code(res.get("compile", {}).get("trace_path")))])
    blocks.append(Table(["arm", "device", "torch", "vLLM", "gate", "trace path"], env_rows, align=["left"] * 6,
                        name="kernel-env"))
    return blocks


def _gm(values: list[float]) -> float:
    return math.exp(math.fsum(map(math.log, values)) / len(values))


def across_processes(runs: Mapping[str, Mapping[int, Mapping[str, Any]]], baseline: str) -> Table | None:
    """With 2 or more processes per arm (``offline_repeats``): per M, the geometric mean of the processes'
    medians and each candidate's Δ% with a 95 % paired t interval across the processes, paired by round:
    what one process's samples cannot show (what changes from one process start to the next)."""
    if baseline not in runs or min(len(r) for r in runs.values()) < 2:
        return None
    medians = {arm: {rnd: _by_m(res) for rnd, res in rounds.items()} for arm, rounds in runs.items()}
    arms = [baseline] + [a for a in runs if a != baseline]
    ms = sorted({m for rounds in medians.values() for by_m in rounds.values() for m in by_m})

    def series(arm: str, m: int, rounds: list[int]) -> list[float]:
        return [float(medians[arm][r][m]["median_us"]) for r in rounds]

    rows = []
    for m in ms:
        have = {a: [r for r, by_m in medians[a].items() if m in by_m and by_m[m].get("median_us")] for a in arms}
        cells = [Cell(str(m))]
        cells += [Cell(f"{_gm(series(a, m, have[a])):.2f} ({len(have[a])})" if have[a] else "–") for a in arms]
        for a in arms[1:]:
            paired = sorted(set(have[baseline]) & set(have[a]))
            if len(paired) < 2:
                cells += [Cell("–"), Cell(f"{len(paired)} paired process(es)", style="missing")]
                continue
            c = compare(series(baseline, m, paired), series(a, m, paired), higher_is_better=False, paired=True)
            delta = (f"{fmt_pct(c.delta_pct)} {fmt_interval(c.ci_low_pct, c.ci_high_pct)}"
                     if c.ci_low_pct is not None else fmt_pct(c.delta_pct))
            cells += [Cell(delta), Cell(f"{c.verdict.value}: {literal(c.reason)}", style=STYLE[c.verdict.value])]
        rows.append(cells)
    return Table(["M", *(f"{literal(a)} µs (processes)" for a in arms),
                  *(h for a in arms[1:] for h in (f"Δ% {literal(a)} [95% interval]", f"verdict {literal(a)}"))],
                 rows, name="kernel-processes",
                 caption="Across processes (`offline_repeats`): per M the geometric mean of each process's median "
                         "µs per call (how many processes in brackets); Δ% of the candidate with a 95 % paired t "
                         "interval across the processes, paired by round (positive: slower).")


def kernel_section(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str,
                   title: str = "Router-gate kernel (guard-free torch.compile, per arm)",
                   runs: Mapping[str, Mapping[int, Mapping[str, Any]]] | None = None) -> Section:
    """The section: the first process's tables per arm; with ``runs`` of 2 or more processes per arm, the
    table across them first."""
    blocks = kernel_blocks(results_by_arm, baseline)
    table = across_processes(runs, baseline) if runs else None
    if table is not None:
        blocks[1:1] = [table, Paragraph("The tables below are from each arm's first process.")]
    return Section(title, 2, blocks, anchor="kernel")


def render_kernel_md(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    """kernel.md of `suite kernel`: the same content as the report's section, as markdown."""
    return markdown.section(kernel_section(results_by_arm, baseline, "Router gate kernel")) + "\n"


def render_kernel_text(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    """Plain-text table for the terminal: before → after per M, speedup and path."""
    rows = comparison_rows(results_by_arm, baseline)
    others = [a for a in results_by_arm if a != baseline]
    lines = []
    for row in rows:
        base = row["arms"][baseline]["result"]
        b = f"{base['median_us']:8.2f} us [{base['p10_us']:.2f}-{base['p90_us']:.2f}]" if base else "-"
        parts = [f"M={row['m']:<5d} {baseline} {b}"]
        for a in others:
            r = row["arms"][a]["result"]
            s = row["arms"][a]["speedup"]
            if r is None:
                parts.append(f"-> {a} -")
                continue
            parts.append(
                f"-> {a} {r['median_us']:8.2f} us [{r['p10_us']:.2f}-{r['p90_us']:.2f}]"
                + (f"  {s:5.2f}x" if s else "")
            )
        paths = "; ".join(
            f"{a}: {row['arms'][a]['result']['path']}"
            + (" FROZEN" if row["arms"][a]["result"].get("frozen_branch") else "")
            for a in [baseline, *others]
            if row["arms"][a]["result"]
        )
        lines.append("  ".join(parts) + f"   | {paths}")
    return "\n".join(lines)


def section(run: RunData) -> Section | None:
    runs = load_kernel_runs(run.store, run.records)
    if run.baseline not in runs:
        return None
    first = {arm: next(iter(rounds.values())) for arm, rounds in runs.items()}
    return kernel_section(first, run.baseline, runs=runs)


