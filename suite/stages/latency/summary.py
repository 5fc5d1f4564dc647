"""The latency section: seed 000's end-to-end table (median latency per batch size, before -> after)."""

from __future__ import annotations

import statistics
from typing import Any

from suite.stages.latency.read import load_latency, quantile


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _spread(values: list[float]) -> str:
    return f"{_ms(statistics.median(values))} ({_ms(quantile(values, 0.1))}–{_ms(quantile(values, 0.9))})"


def report_section(run: Any) -> str:
    from suite.stats import compare

    data = load_latency(run)
    if not data:
        return ""
    out = ["## End-to-end latency (`vllm bench latency`)", "",
           "One batch of `batch size` prompts generated to `output len` tokens per iteration; cells are the median "
           "latency of the iterations with their p10–p90 in brackets. Δ = median after − median before; speedup = "
           "before / after − 1 (positive: faster). Verdict: 95% Welch interval on the log ratio of the "
           "per-iteration latencies (suite.stats). All iterations of an arm come from one process, so the "
           "interval covers iteration-to-iteration noise inside that process only, not run-to-run or "
           "machine drift; repeat runs before trusting a small Δ.", ""]
    for cand in run.candidates:
        out += [f"### {run.baseline} → {cand}", "",
                f"| Batch size | In / out | {run.baseline} latency (ms) | {cand} latency (ms) | Δ (ms) | Speedup | "
                "Δ% [95% interval] | Iters | Verdict |",
                "|---|---|---|---|---|---|---|---|---|"]
        for (isl, osl, bs), arms in data.items():
            base, new = arms.get(run.baseline), arms.get(cand)
            if not base or not new:
                out.append(f"| {bs} | {isl} / {osl} | {_spread(base) if base else 'missing'} | "
                           f"{_spread(new) if new else 'missing'} | | | | | missing |")
                continue
            mb, mc = statistics.median(base), statistics.median(new)
            c = compare(base, new, higher_is_better=False)
            ci = (f"{c.delta_pct:+.1f}% [{c.ci_low_pct:+.1f}%, {c.ci_high_pct:+.1f}%]"
                  if c.ci_low_pct is not None and c.delta_pct is not None
                  else (f"{c.delta_pct:+.1f}%" if c.delta_pct is not None else "n/a"))
            out.append(f"| {bs} | {isl} / {osl} | {_spread(base)} | {_spread(new)} | {mc - mb:+,.2f} | "
                       f"{(mb / mc - 1) * 100:+.2f}% | {ci} | {len(base)}/{len(new)} | "
                       f"{c.verdict.value}: {c.reason} |")
        out.append("")
    return "\n".join(out)
