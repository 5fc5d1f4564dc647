"""The latency section: seed 000's end-to-end table (latency per batch size, before -> after), format neutral.

Each `vllm bench latency` job is one process: one engine start, then its iterations. What varies from one
engine start to the next (placement, clocks, what the compile chose) is not in the spread of one start's
iterations, so with 2 or more starts per arm (``repeats``) the comparison is across starts: each
start's geometric mean, paired by round, a t interval on their log ratios. With one start per arm the
interval is the iterations' (Welch) and the row gives no verdict. Cells are the geometric mean of the
starts' geometric means (p10–p90 of all iterations in brackets): the statistic Δ% is computed from, so a cell
pair and its Δ% never disagree. Speedup = before / after − 1 of the same means.
"""

from __future__ import annotations

from suite.analysis import RunData, geometric_mean, with_left_out
from suite.document import Cell, Paragraph, Section, Table, delta_text, literal, verdict_cell
from suite.stages.latency.read import load_latency, quantile
from suite.stats import compare


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _gm(values: list[float]) -> float:
    gm = geometric_mean(values)
    assert gm is not None, values  # the reader keeps positive latencies only
    return gm


def _cell(starts: list[list[float]]) -> str:
    """Geometric mean of the starts' geometric means, p10–p90 of all their iterations."""
    every = [x for s in starts for x in s]
    return f"{_ms(_gm([_gm(s) for s in starts]))} ({_ms(quantile(every, 0.1))}–{_ms(quantile(every, 0.9))})"


def _row(bs: int, shape: str, base: dict[int, list[float]], cand: dict[int, list[float]]) -> list[Cell]:
    paired = sorted(set(base) & set(cand))
    if len(paired) >= 2:  # across engine starts, paired by round
        b, c = [base[r] for r in paired], [cand[r] for r in paired]
        cmp = compare([_gm(x) for x in b], [_gm(x) for x in c], higher_is_better=False, paired=True)
        verdict = verdict_cell(cmp)
        starts = f"{len(paired)}"
    else:  # one start each (or starts of different rounds): the iterations are all there is
        b, c = list(base.values()), list(cand.values())
        cmp = compare([x for s in b for x in s], [x for s in c for x in s], higher_is_better=False)
        within = f"{cmp.verdict.value}, p={cmp.p_value:.3g}" if cmp.p_value is not None else cmp.verdict.value
        verdict = Cell(f"no verdict: {len(b)}/{len(c)} engine start(s), interval of the iterations only "
                       f"(within: {within})", style="unreliable")
        starts = f"{len(b)}/{len(c)}"
    gb, gc = _gm([_gm(x) for x in b]), _gm([_gm(x) for x in c])
    iters = f"{sum(map(len, b))}/{sum(map(len, c))}"
    return [Cell(str(bs)), Cell(shape), Cell(_cell(b)), Cell(_cell(c)), Cell(f"{gc - gb:+,.2f}"),
            Cell(f"{(gb / gc - 1) * 100:+.2f}%"), Cell(delta_text(cmp)), Cell(starts), Cell(iters), verdict]


TITLE = "End-to-end latency (`vllm bench latency`)"


def section(run: RunData) -> Section | None:
    stored = load_latency(run.store, run.records)
    data = stored.shapes
    if not data:
        return with_left_out(None, stored.unreadable, TITLE, "latency")
    blocks: list = [Paragraph(
        "One batch of `batch size` prompts generated to `output len` tokens per iteration; every job is one "
        "process (one engine start). Cells are the geometric mean latency over the engine starts (each start's "
        "geometric mean of its iterations) with the p10–p90 of all iterations in brackets. Δ (ms) = after − "
        "before and speedup = before / after − 1 (positive: faster), of those means. With 2 or more starts per "
        "arm (`repeats`), Δ% has a 95 % paired t interval across the starts, paired by round, and the "
        "verdict is from it; with one start the interval covers iteration-to-iteration noise inside that "
        "process only, not what changes between engine starts, and the row gives no verdict.")]
    for cand in run.candidates:
        rows = []
        for (isl, osl, bs), arms in data.items():
            base, new = arms.get(run.baseline), arms.get(cand)
            if not base or not new:
                rows.append([Cell(str(bs)), Cell(f"{isl} / {osl}"),
                             Cell(_cell(list(base.values())) if base else "missing"),
                             Cell(_cell(list(new.values())) if new else "missing"), *(Cell("") for _ in range(5)),
                             Cell("missing", style="missing")])
                continue
            rows.append(_row(bs, f"{isl} / {osl}", base, new))
        blocks.append(Section(f"{literal(run.baseline)} → {literal(cand)}", 3, [Table(
            ["Batch size", "In / out", f"{literal(run.baseline)} latency (ms)", f"{literal(cand)} latency (ms)",
             "Δ (ms)", "Speedup", "Δ% [95% interval]", "Starts", "Iters", "Verdict"], rows, name="latency")]))
    return with_left_out(Section(TITLE, 2, blocks, anchor="latency"), stored.unreadable, TITLE, "latency")
