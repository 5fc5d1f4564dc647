"""The latency section: seed 000's end-to-end table (latency per batch size, before -> after), format neutral.

Cells are the geometric mean of the iterations (p10–p90 in brackets): the statistic Δ% is computed from, so
a cell pair and its Δ% never disagree. Speedup = before / after − 1 of the same geometric means.
"""

from __future__ import annotations

import math

from suite.analysis import RunData
from suite.document import Cell, Paragraph, Section, Table, fmt_interval, fmt_pct, literal
from suite.stages.latency.read import load_latency, quantile
from suite.stats import compare

STYLE = {"better": "better", "worse": "worse", "not significant": "not-significant", "unreliable": "unreliable"}


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _gm(values: list[float]) -> float:
    return math.exp(math.fsum(map(math.log, values)) / len(values))


def _spread(values: list[float]) -> str:
    return f"{_ms(_gm(values))} ({_ms(quantile(values, 0.1))}–{_ms(quantile(values, 0.9))})"


def section(run: RunData) -> Section | None:
    data = load_latency(run.store, run.records)
    if not data:
        return None
    blocks: list = [Paragraph(
        "One batch of `batch size` prompts generated to `output len` tokens per iteration; cells are the geometric "
        "mean latency of the iterations with their p10–p90 in brackets. Δ (ms) = after − before and speedup = "
        "before / after − 1 (positive: faster), both of those geometric means; Δ% is their ratio with a 95 % Welch "
        "interval on the log ratio of the per-iteration latencies (suite.stats). All iterations of an arm come "
        "from one process, so the interval covers iteration-to-iteration noise inside that process only, not "
        "run-to-run or machine drift; repeat runs before trusting a small Δ.")]
    for cand in run.candidates:
        rows = []
        for (isl, osl, bs), arms in data.items():
            base, new = arms.get(run.baseline), arms.get(cand)
            if not base or not new:
                rows.append([Cell(str(bs)), Cell(f"{isl} / {osl}"), Cell(_spread(base) if base else "missing"),
                             Cell(_spread(new) if new else "missing"), Cell(""), Cell(""), Cell(""), Cell(""),
                             Cell("missing", style="missing")])
                continue
            gb, gc = _gm(base), _gm(new)
            c = compare(base, new, higher_is_better=False)
            delta = (f"{fmt_pct(c.delta_pct)} {fmt_interval(c.ci_low_pct, c.ci_high_pct)}"
                     if c.ci_low_pct is not None else fmt_pct(c.delta_pct))
            rows.append([Cell(str(bs)), Cell(f"{isl} / {osl}"), Cell(_spread(base)), Cell(_spread(new)),
                         Cell(f"{gc - gb:+,.2f}"), Cell(f"{(gb / gc - 1) * 100:+.2f}%"), Cell(delta),
                         Cell(f"{len(base)}/{len(new)}"),
                         Cell(f"{c.verdict.value}: {literal(c.reason)}", style=STYLE[c.verdict.value])])
        blocks.append(Section(f"{literal(run.baseline)} → {literal(cand)}", 3, [Table(
            ["Batch size", "In / out", f"{literal(run.baseline)} latency (ms)", f"{literal(cand)} latency (ms)",
             "Δ (ms)", "Speedup", "Δ% [95% interval]", "Iters", "Verdict"], rows, name="latency")]))
    return Section("End-to-end latency (`vllm bench latency`)", 2, blocks, anchor="latency")


