"""Markdown section for the router-gate kernel microbenchmark, rendered from stored results only.

Input: the JSON objects written by ``suite.stages.kernel.bench`` (one per arm), keyed by arm name. Standard
library only, so it renders on any machine that holds the result files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from suite.store import read_json


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
    cell = f"`{r['path']}`"
    if r.get("frozen_branch"):
        cell += f" **frozen branch** (eager: `{r['eager_path']}`)"
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


def render_kernel_md(results_by_arm: Mapping[str, Mapping[str, Any]], baseline: str) -> str:
    """The report section: µs per M per arm (median [p10–p90]), speedup vs ``baseline``, path per M."""
    rows = comparison_rows(results_by_arm, baseline)
    arms = [baseline] + [a for a in results_by_arm if a != baseline]
    first = results_by_arm[baseline]
    shape = first.get("shape", {})
    comp = first.get("compile", {})
    timing = first.get("timing", {})
    device = first.get("device", {})
    out: list[str] = []
    out.append("## Router gate kernel")
    out.append("")
    out.append(
        f"Gate {shape.get('hidden')}×{shape.get('experts')} ({shape.get('dtype')} in, {shape.get('out_dtype')} out, "
        f"bias={shape.get('bias')}), guard-free `torch.compile` (fullgraph, dynamic, backend "
        f"`{comp.get('backend')}`) traced first at M={comp.get('trace_m')}; "
        f"{timing.get('method', '?').replace('_', ' ')} of {timing.get('calls_per_sample')} calls per sample, "
        f"{timing.get('samples')} samples per M; µs per call, median [p10–p90]. "
        f"Device: {device.get('name')}."
    )
    out.append("")
    header = ["M"] + [f"{a} µs" for a in arms] + [f"speedup {a}" for a in arms[1:]]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for row in rows:
        cells = [str(row["m"])]
        for a in arms:
            r = row["arms"][a]["result"]
            cells.append(_fmt_us(r) if r else "–")
        for a in arms[1:]:
            s = row["arms"][a]["speedup"]
            cells.append(f"{s:.2f}×" if s else "–")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Path that ran (recorded per M in an untimed pass of the compiled gate):")
    out.append("")
    header = ["M"] + arms
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for row in rows:
        out.append(
            "| " + " | ".join([str(row["m"])] + [_path_cell(row["arms"][a]["result"]) for a in arms]) + " |"
        )
    out.append("")
    frozen = {a: res.get("frozen_branch_ms") or [] for a, res in results_by_arm.items()}
    for a in arms:
        if frozen[a]:
            out.append(
                f"- **{a}: frozen branch at M = {', '.join(map(str, frozen[a]))}**: the compiled gate ran the "
                f"trace-M path (`{results_by_arm[a].get('compile', {}).get('trace_path')}`) although the same "
                "tree takes another path there in eager mode."
            )
    out.append("")
    out.append("| arm | device | torch | vLLM | gate | trace path |")
    out.append("|---|---|---|---|---|---|")
    for a in arms:
        res = results_by_arm[a]
        gate = res.get("gate", {})
        gate_desc = gate.get("class") or gate.get("source") or "?"
        if gate.get("forced"):
            gate_desc += f" ({gate['forced']})"
        out.append(
            f"| {a} | {res.get('device', {}).get('name')} | {res.get('torch_version')} | "
            f"{res.get('vllm_version')} | {gate_desc} | `{res.get('compile', {}).get('trace_path')}` |"
        )
    out.append("")
    return "\n".join(out)


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


def report_section(run: Any) -> str:
    results: dict[str, Any] = {}
    for rec in run.records:
        job = rec["job"]
        if job["kind"] != "kernel" or rec.get("status") != "ok":
            continue
        path = run.root / job["arm"] / "kernel" / job["point"] / f"rep-{job['repeat']}.json"
        if path.is_file():
            results[job["arm"]] = read_json(path)
    if not results or run.baseline not in results:
        return ""
    return "## Router-gate kernel (guard-free torch.compile, per arm)\n\n" + render_kernel_md(results, run.baseline)
