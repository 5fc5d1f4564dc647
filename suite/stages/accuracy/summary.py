"""Paired accuracy and greedy equivalence between two arms, recomputed from the raw tool outputs.

Accuracy: each arm's directory is the ``out_dir`` of ``suite.stages.accuracy.run.run_accuracy`` (lm-eval's own
``results_*.json`` and ``samples_*.jsonl``). Samples are paired on ``(doc_id, filter)``; per filter we give
accuracy ± stderr per arm (recomputed from the samples, the way lm-eval computes them), the difference, the
questions that flipped each way and the exact McNemar p-value (two-sided binomial test on the discordant
pairs). Gates (an absolute floor and a largest drop) apply to the flexible-extract filter of the candidate.

Equivalence: two ``run_equivalence`` files -> share of identical greedy completions and the median position
of the first differing token among the completions that differ.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from suite.errors import SuiteError
from suite.stages.accuracy.read import (
    AccuracyComparison,
    ArmScore,
    EquivalenceSummary,
    GateResult,
    job_output,
    summarize_accuracy,
    summarize_equivalence,
)

MAX_LISTED_FLIPS = 20


# ---------------------------------------------------------------- values














# ---------------------------------------------------------------- statistics






# ---------------------------------------------------------------- reading lm-eval outputs














# ---------------------------------------------------------------- accuracy






# ---------------------------------------------------------------- equivalence






# ---------------------------------------------------------------- markdown


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def _score_cell(s: ArmScore) -> str:
    return f"{_pct(s.acc)} ± {_pct(s.stderr)} % ({s.correct}/{s.n})"


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 0.001 else f"{p:.1e}"


def _ids(ids: tuple[int, ...]) -> str:
    if not ids:
        return "none"
    shown = ", ".join(str(i) for i in ids[:MAX_LISTED_FLIPS])
    return shown + (f", … (+{len(ids) - MAX_LISTED_FLIPS} more)" if len(ids) > MAX_LISTED_FLIPS else "")


def _render_equivalence(eq: EquivalenceSummary) -> list[str]:
    out = ["### Greedy equivalence", ""]
    limit = f", up to {eq.max_tokens} tokens each" if eq.max_tokens else ""
    out.append(
        f"{eq.n} fixed prompts at temperature 0{limit}: **{eq.n_identical}/{eq.n} identical "
        f"({_pct(eq.share_identical)} %)**."
    )
    if eq.median_first_divergence is None:
        out.append("No completion differs.")
    else:
        out.append(
            f"Median first divergence among the {eq.n - eq.n_identical} differing completions: "
            f"{eq.unit[:-1]} {eq.median_first_divergence:g} (0 = the first generated {eq.unit[:-1]})."
        )
    if eq.unit != "tokens":
        out.append("The server returned no token ids; completions were compared as text.")
    return out + [""]


def render_accuracy_md(
    summary: AccuracyComparison | None, equivalence: EquivalenceSummary | None = None
) -> str:
    """The report's accuracy section (markdown) from ``summarize_accuracy`` / ``summarize_equivalence``."""
    out: list[str] = []
    if summary is not None:
        s = summary
        run = s.base_run
        bits = [
            f"{run.num_fewshot}-shot" if run.num_fewshot is not None else None,
            f"{s.n_questions} questions",
        ]
        if run.max_gen_toks is not None:
            bits.append(f"max_gen_toks {run.max_gen_toks}")
        title = f"## Accuracy: {s.task}, {s.base_label} vs {s.cand_label} ({', '.join(b for b in bits if b)})"
        out += [title + (" — SYNTHETIC data" if s.synthetic else ""), ""]
        if s.synthetic:
            out += [
                "> **SYNTHETIC data**: template-generated problems in GSM8K's format (suite.fixtures.gsm8k), not GSM8K. "
                "These numbers only show the pipeline works; they say nothing about GSM8K accuracy.",
                "",
            ]
        if s.gates:
            gate_text = "; ".join(_gate_text(g, s) for g in s.gates)
            out += [f"Verdict: **{s.verdict}** ({gate_text})", ""]
        else:
            out += ["Verdict: no gates configured (set accuracy.min_accuracy / accuracy.max_drop).", ""]
        out += [
            f"| filter | {s.base_label} | {s.cand_label} | Δ (pp) | right→wrong | wrong→right | McNemar p | n |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for f in s.filters:
            out.append(
                f"| {f.filter} | {_score_cell(f.base)} | {_score_cell(f.cand)} | {100 * f.delta:+.1f} | {f.lost} | "
                f"{f.gained} | {_p(f.mcnemar_p)} | {f.n_paired} |"
            )
        out.append("")
        out.append(
            "Accuracy ± standard error, recomputed from lm-eval's per-question samples; pairs matched on "
            "(doc_id, filter); McNemar: exact two-sided binomial test on the questions that flipped."
        )
        out.append("")
        for f in s.filters:
            if f.lost or f.gained:
                out.append(
                    f"- {f.filter}: right→wrong doc_ids {_ids(f.lost_doc_ids)}; wrong→right {_ids(f.gained_doc_ids)}"
                )
        durations = [(s.base_label, s.base_run.duration_s), (s.cand_label, s.cand_run.duration_s)]
        if all(d is not None for _, d in durations):
            out.append("- lm-eval wall time: " + ", ".join(f"{lbl} {d:.1f} s" for lbl, d in durations))
        for note in s.notes:
            out.append(f"- note: {note}")
        if out[-1] != "":
            out.append("")
    if equivalence is not None:
        out += _render_equivalence(equivalence)
    return "\n".join(out).rstrip() + "\n" if out else ""


def _gate_text(g: GateResult, s: AccuracyComparison) -> str:
    if g.name == "min_accuracy":
        return f"{s.cand_label} {g.filter} {_pct(g.value)} % ≥ floor {_pct(g.threshold)} %: {g.status}"
    if g.name == "max_drop":
        return f"drop {_pct(g.value)} pp ≤ {_pct(g.threshold)} pp: {g.status}"
    return f"{g.name}: {g.status}"


# ---------------------------------------------------------------- report hook (suite.report)




def report_section(run: Any) -> str:
    """The accuracy + equivalence section of a run's report (``suite.report`` calls this when present).

    ``run`` is ``suite.report.RunData`` (``root``, ``records``, ``baseline``, ``candidates``). Raw files are
    found from the job records; an arm whose job did not finish is named, never skipped silently.
    """
    found: dict[tuple[str, str], tuple[Path | None, dict[str, Any]]] = {}
    for rec in getattr(run, "records", []):
        job = rec.get("job", {})
        if job.get("kind") not in ("accuracy", "equivalence") or job.get("tag"):
            continue
        path = job_output(Path(run.root), job) if rec.get("status") == "ok" else None
        found[(job["kind"], job["arm"])] = (path if path is not None and path.exists() else None, rec)
    if not found:
        return ""
    out: list[str] = []
    base = run.baseline
    for cand in run.candidates:
        acc: AccuracyComparison | None = None
        eq: EquivalenceSummary | None = None
        problems: list[str] = []
        for kind in ("accuracy", "equivalence"):
            b, c = found.get((kind, base)), found.get((kind, cand))
            if b is None and c is None:
                continue
            missing = [arm for arm, got in ((base, b), (cand, c)) if got is None or got[0] is None]
            if missing:
                status = {
                    arm: (got[1].get("status") if got else "not run") for arm, got in ((base, b), (cand, c))
                }
                problems.append(f"{kind}: no result for {', '.join(f'{a} ({status[a]})' for a in missing)}")
                continue
            try:
                if kind == "accuracy":
                    params = b[1]["job"].get("params", {})
                    gates = SimpleNamespace(
                        min_accuracy=params.get("min_accuracy"), max_drop=params.get("max_drop")
                    )
                    acc = summarize_accuracy(b[0], c[0], gates, base_label=base, cand_label=cand)
                else:
                    eq = summarize_equivalence(b[0], c[0])
            except SuiteError as exc:
                problems.append(f"{kind}: cannot compare {base} and {cand}: {exc}")
        if acc is None and eq is not None:
            out += [f"## Greedy equivalence: {base} vs {cand}", ""]
        text = render_accuracy_md(acc, eq)
        if acc is None and eq is not None:
            text = text.replace("### Greedy equivalence\n\n", "", 1)
        if text:
            out.append(text.rstrip())
            out.append("")
        if problems:
            if acc is None and eq is None:
                out += [f"## Accuracy: {base} vs {cand}", ""]
            out += [f"- **missing**: {p}" for p in problems] + [""]
    return "\n".join(out).rstrip() + "\n" if out else ""
