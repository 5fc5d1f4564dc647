"""The decoder-layer subgraph's section (format neutral), from stored results only: seed 000's first table (µs
per layer per T, baseline → candidate, Δ per layer, Δ per decode step over the model's layers, speedup), the
table across processes when there are several, and the path the router gate took inside the compiled layer.

Input: the results ``suite.stages.layer.bench`` wrote (one per arm and round), read back as ``LayerRun``.
"""

from __future__ import annotations

from collections.abc import Mapping

from suite.analysis import RunData, geometric_mean, with_left_out
from suite.document import BulletList, Cell, Paragraph, Section, Table, code, literal
from suite.stages.kernel.summary import across_processes, path_cell, process_medians
from suite.stages.layer.read import LayerRun, load_layer_runs

TITLE = "Decoder-layer subgraph (per arm)"
Spread = tuple[float, int, float, float]  # geometric mean, processes, lowest, highest


def _spread(values_by_arm: Mapping[str, Mapping[int, list[float]]]) -> dict[str, dict[int, Spread]]:
    """arm -> T -> (geometric mean, how many processes, lowest, highest)."""
    return {arm: {t: (geometric_mean(v), len(v), min(v), max(v)) for t, v in sorted(by_t.items())}
            for arm, by_t in values_by_arm.items()}


def _by_t(medians: Mapping[str, Mapping[int, Mapping[int, float]]]) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {}
    for arm, rounds in medians.items():
        for by_m in rounds.values():
            for t, us in by_m.items():
                out.setdefault(arm, {}).setdefault(t, []).append(us)
    return out


def _cell(v: Spread | None) -> Cell:
    if v is None:
        return Cell("–")
    gm, n, lo, hi = v
    return Cell(f"{gm:.2f}" + (f" [{lo:.2f}–{hi:.2f}]" if n > 1 else ""))


def layer_table(runs: Mapping[str, Mapping[int, LayerRun]], baseline: str, num_layers: int) -> Table:
    """Seed 000's table: per T, µs per layer of each arm, and per candidate Δ per layer, Δ per step, speedup."""
    means = _spread(_by_t(process_medians(runs)))
    arms = [baseline] + [a for a in runs if a != baseline]
    ts = sorted({t for by_t in means.values() for t in by_t})
    rows = []
    for t in ts:
        base = means[baseline].get(t)
        cells = [Cell(str(t))] + [_cell(means[a].get(t)) for a in arms]
        for a in arms[1:]:
            other = means[a].get(t)
            if base is None or other is None:
                cells += [Cell("–")] * 3
                continue
            delta = other[0] - base[0]
            cells += [Cell(f"{delta:+.2f}"), Cell(f"{delta * num_layers:+.1f}" if num_layers else "–"),
                      Cell(f"{(base[0] / other[0] - 1) * 100:+.2f}%")]
        rows.append(cells)
    step = f"Δ µs per step ({num_layers} layers)" if num_layers else "Δ µs per step"
    several = min(len(r) for r in runs.values()) > 1
    return Table(["T", *(f"{literal(a)} µs / layer" for a in arms),
                  *(h for a in arms[1:] for h in (f"Δ µs / layer {literal(a)}", f"{step} {literal(a)}",
                                                  f"speedup {literal(a)}"))],
                 rows, name="layer",
                 caption="µs per layer call: the geometric mean over processes of each process's median"
                         + (" [the lowest and highest process]" if several else "")
                         + "; Δ and speedup as the change's pull request writes them (speedup = baseline / candidate − 1; positive: "
                           "faster), point estimates from these means"
                         + ("; whether a Δ exceeds what changes from one process start to the next: the table "
                            "across processes below." if several else
                            " from one process per arm: no interval (repeats: 2 or more gives one)."))


def reference_table(runs: Mapping[str, Mapping[int, LayerRun]]) -> Table | None:
    """The reference GEMM per T and arm over the processes: what the GPU did in each process with work that
    is the same everywhere."""
    medians = {arm: {rnd: {r.m: r.median_us for r in res.reference.results}
                     for rnd, res in rounds.items() if res.reference is not None}
               for arm, rounds in runs.items()}
    if not all(medians.values()):
        return None
    spread = _spread(_by_t(medians))
    arms = list(runs)
    what = next(res.reference.what for rounds in runs.values() for res in rounds.values() if res.reference)
    ts = sorted({t for by_t in spread.values() for t in by_t})
    return Table(["T", *(f"{literal(a)} µs" for a in arms)],
                 [[Cell(str(t)), *(_cell(spread[a].get(t)) for a in arms)] for t in ts], name="layer-reference",
                 caption=f"Reference GEMM, {literal(what)}: the same work in every arm and process, so its spread "
                         "across processes is the device's own; a layer whose processes spread far beyond it varies "
                         "with the layer as built in each process.")


def layer_section(runs: Mapping[str, Mapping[int, LayerRun]], baseline: str) -> Section:
    first = {arm: next(iter(rounds.values())) for arm, rounds in runs.items()}
    arms = [baseline] + [a for a in runs if a != baseline]
    ref = first[baseline]
    info, comp, timing = ref.layer, ref.compile, ref.timing
    processes = min(len(r) for r in runs.values())
    blocks: list[object] = [Paragraph(
        f"{code(info.class_)}, layer {info.layer_index}{f' ({literal(info.layer_type)})' if info.layer_type else ''} "
        "of the model, built by each "
        f"arm's vLLM in its own process: {literal(info.subgraph)}. Hidden {info.hidden}, {info.experts} experts, "
        f"top-{info.top_k}, {literal(info.dtype)}; weights {literal(info.load_format)} (vLLM's own loader). "
        + ("Compiled by vLLM's own `support_torch_compile` in the engine's config" if comp.backend == "vllm" else
           f"Guard-free `torch.compile` (backend {code(comp.backend)}), not vLLM's compile backend,")
        + f" traced first at T={comp.trace_m}; "
        f"{literal(timing.method.replace('_', ' '))} of {timing.calls_per_sample} layer calls per sample, "
        f"{timing.samples} samples per T; {processes} process(es) per arm. Device: {literal(ref.device.name)}.")]
    clocks = [r.sm_clock_mhz for rounds in runs.values() for res in rounds.values() for r in res.results
              if r.sm_clock_mhz is not None]
    if clocks:
        warm = f", each T's graph replayed for {timing.warm_s:g} s first" if timing.warm_s else ""
        blocks.append(Paragraph(f"SM clock right after each T's timed replays, over every process: "
                                f"{min(clocks)}–{max(clocks)} MHz{warm}."))
    blocks.append(layer_table(runs, baseline, info.num_layers))
    for table in (across_processes(runs, baseline, label="T", unit="µs per layer call", name="layer-processes"),
                  reference_table(runs)):
        if table is not None:
            blocks.append(table)
    by_t = {a: first[a].by_m() for a in arms}
    ts = sorted({t for rows in by_t.values() for t in rows})
    blocks.append(Table(["T", *(literal(a) for a in arms)],
                        [[Cell(str(t)), *(Cell(path_cell(by_t[a].get(t))) for a in arms)] for t in ts],
                        caption="The router gate's path inside the compiled layer (recorded per T in an untimed "
                                "pass of each arm's first process):", align=["left"] * (1 + len(arms)),
                        name="layer-paths"))
    notes = [f"**{literal(a)}: frozen branch at T = {', '.join(map(str, first[a].frozen_branch_ms))}**: inside the "
             f"compiled layer the gate ran the trace-T path ({code(first[a].compile.trace_path)}) although the same "
             "tree takes another path there in eager mode." for a in arms if first[a].frozen_branch_ms]
    if notes:
        blocks.append(BulletList(notes))
    blocks.append(Table(["arm", "device", "torch", "vLLM", "gate"],
                        [[Cell(literal(a)), Cell(literal(first[a].device.name)), Cell(literal(first[a].torch_version)),
                          Cell(literal(first[a].vllm_version)), Cell(literal(first[a].layer.gate))] for a in arms],
                        align=["left"] * 5, name="layer-env"))
    return Section(TITLE, 2, blocks, anchor="layer")


def section(run: RunData) -> Section | None:
    runs, unreadable = load_layer_runs(run.store, run.records)
    if run.baseline not in runs:
        return with_left_out(None, unreadable, TITLE, "layer")
    return with_left_out(layer_section(runs, run.baseline), unreadable, TITLE, "layer")
