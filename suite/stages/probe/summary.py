"""The probe section: which router-gate path each batch-size bucket took, per arm (format neutral)."""

from __future__ import annotations

from suite.analysis import RunData, with_left_out
from suite.document import BulletList, Cell, Paragraph, Section, Table, code, literal
from suite.stages.probe.plugin import BUCKET_LABELS, SEP
from suite.stages.probe.read import FROZEN, REPLAYED, ProbeBucket, ProbeResult, load_probe_results


def startup_paths(result: ProbeResult, label: str) -> dict[str, int]:
    """Gate paths that ran in Python while the server started (graph capture, warm-up), in one bucket."""
    return {c.path: c.count for c in result.startup_counts if c.kind in ("gate", "outside") and c.bucket == label}


def replayed(result: ProbeResult, label: str) -> dict[str, int]:
    """For a bucket whose steps made no Python gate call at run time, not even a custom op called from a
    compiled graph: what its captured graph holds (empty: nothing ran in Python at capture either, so the
    compiled graph holds the GEMM itself, frozen)."""
    b = result.buckets[label]
    return startup_paths(result, label) if b.verdict == FROZEN and not b.outside else {}


def frozen(b: ProbeBucket, captured: dict[str, int]) -> bool:
    """Steps ran, and no gate code was seen in Python for them: not at run time, not at capture."""
    return b.verdict == FROZEN and not b.outside and not captured


def _cell(b: ProbeBucket, captured: dict[str, int]) -> str:
    parts = [f"{code(p)} ×{n}" for p, n in sorted(b.paths.items(), key=lambda kv: -kv[1])]
    if captured:
        parts.append(literal(REPLAYED) + " " + ", ".join(
            f"{code(p)} ×{n}" for p, n in sorted(captured.items(), key=lambda kv: -kv[1])))
    elif frozen(b, captured):
        parts.append(literal(FROZEN))
    parts += [f"{code(p)} ×{n} (no GateLinear.forward: from a compiled graph)" for p, n in b.outside.items()]
    if not parts:
        return "—"
    steps = b.steps
    return "\n".join(parts) + (f" ({steps} step{'s' if steps != 1 else ''})" if steps else "")


def _op_calls(result: ProbeResult, op: str) -> int:
    label = f"torch.ops.vllm.{op}"
    return sum(c.count for c in result.counts if c.kind in ("gate", "outside") and label in c.path.split(SEP))


def _eligibility(result: ProbeResult) -> str:
    gates = [g for p in result.processes for g in p.gates]
    if not gates:
        return "no GateLinear seen"
    flags = sorted({k for g in gates for k in g.flags()})
    on = [f"{k} on {sum(g.flags().get(k) == 'True' for g in gates)}/{len(gates)}" for k in flags
          if any(g.flags().get(k) == "True" for g in gates)]
    platform = next((p.platform for p in result.processes if p.platform), "?")
    dtypes = sorted({f"{g.weight_dtype}→{g.out_dtype}" for g in gates})
    return (f"{len(gates)} gates on {literal(platform)}, weight→out {literal(', '.join(dtypes))}; "
            + ("eligible: " + ", ".join(code(x) for x in on) if on
               else "no specialized tier eligible (every `allow_*` is False)"))


def _findings(results: dict[str, ProbeResult], base: str) -> list[str]:
    arms = list(results)
    lines = []
    for arm in arms:
        r = results[arm]
        ops = ", ".join(code(o) for o in r.present_ops) or "none"
        lines.append(f"{code(arm)}: {_eligibility(r)}; gate custom ops registered: {ops}.")
    for arm in arms:
        if arm == base:
            continue
        differ = [b for b in BUCKET_LABELS
                  if set(results[arm].buckets[b].paths) != set(results[base].buckets[b].paths)
                  or set(results[arm].buckets[b].outside) != set(results[base].buckets[b].outside)
                  or set(replayed(results[arm], b)) != set(replayed(results[base], b))]
        if differ:
            lines.append(f"**Gate paths differ** between {code(base)} and {code(arm)} in buckets {', '.join(differ)}.")
        else:
            lines.append(f"Gate paths are the same in {code(base)} and {code(arm)} in every bucket.")
        new_ops = [o for o in results[arm].present_ops if o not in results[base].present_ops]
        for op in new_ops:
            n = _op_calls(results[arm], op)
            label = f"torch.ops.vllm.{op}"
            in_graphs = [b for b in BUCKET_LABELS if any(label in p.split(SEP) for p in replayed(results[arm], b))]
            if in_graphs:
                lines.append(f"{code(arm)}: {code(label)} is inside the CUDA graphs its decode steps replayed "
                             f"(captured at startup; buckets {', '.join(in_graphs)})"
                             + (f", and ran {n} times outside them." if n else "."))
            elif n == 0:
                lines.append(f"**⚠ {code(arm)}: its fast path never ran**: {code(f'torch.ops.vllm.{op}')} is "
                             f"registered in that arm but was called 0 times ({_eligibility(results[arm])}).")
            else:
                where = [b for b in BUCKET_LABELS if any(
                    f"torch.ops.vllm.{op}" in p.split(SEP) for p in (*results[arm].buckets[b].paths,
                                                                    *results[arm].buckets[b].outside))]
                lines.append(f"{code(arm)}: {code(f'torch.ops.vllm.{op}')} ran {n} times (buckets "
                             f"{', '.join(where)}).")
        if not new_ops and results[arm].present_ops == results[base].present_ops and not differ:
            lines.append(f"{code(arm)}: no gate path of its own was observed.")
    for arm in arms:
        stuck = [b for b in BUCKET_LABELS if frozen(results[arm].buckets[b], replayed(results[arm], b))]
        if stuck:
            lines.append(f"{code(arm)}: buckets {', '.join(stuck)} ran as a {literal(FROZEN)}: steps were "
                         "processed but no `GateLinear.forward` call happened at run time, nor any gate kernel "
                         "in Python when the server captured its graphs.")
        graphs = {b: replayed(results[arm], b) for b in BUCKET_LABELS if replayed(results[arm], b)}
        for path in dict.fromkeys(p for found in graphs.values() for p in found):
            where = [b for b, found in graphs.items() if path in found]
            lines.append(f"{code(arm)}: buckets {', '.join(where)} replayed CUDA graphs captured with "
                         f"{code(path)}: a replayed graph calls no Python, so its kernels are the ones its "
                         "capture ran.")
        errors = sorted({e for p in results[arm].processes for e in p.errors})
        if errors:
            lines.append(f"{code(arm)}: probe errors: " + "; ".join(literal(e) for e in errors))
    return lines


TITLE = "Gate paths (probe)"


def section(run: RunData) -> Section | None:
    results, unreadable = load_probe_results(run.store, run.records, run.arms)
    if not results:
        return with_left_out(None, unreadable, TITLE, "probe")
    arms = list(results)
    rows = []
    for label in BUCKET_LABELS:
        cells = [_cell(results[a].buckets[label], replayed(results[a], label)) for a in arms]
        if all(c == "—" for c in cells):
            continue
        rows.append([Cell(label), *(Cell(c) for c in cells)])
    base = run.baseline if run.baseline in results else arms[0]
    return with_left_out(Section(TITLE, 2, [
        Paragraph("Which router-gate implementation ran per batch-size bucket (M = tokens in the step), counted "
                  "inside each vLLM process while the probe's fixed requests ran. A path lists the instrumented "
                  "implementations inside one `GateLinear.forward` call, outermost first. Steps that replayed a CUDA "
                  "graph call no Python: for them the cell shows what the gate ran while the server captured "
                  "its graphs at startup."),
        Table(["M", *(literal(a) for a in arms)], rows, align=["left"] * (1 + len(arms)), name="probe"),
        BulletList(_findings(results, base)),
    ], anchor="probe"), unreadable, TITLE, "probe")


