"""The accuracy + greedy-equivalence section (format neutral), from the paired comparisons of
`suite.stages.accuracy.read` (found through the run's job records and the store).

Per filter: accuracy ± standard error per arm, the paired difference with its 95 % interval (Tango's score
interval), the questions that flipped each way and McNemar's p (its score form: the interval's statistic). A
filter where no arm answers any question right says "uninformative" instead of "+0.0 pp". Gates (floor, largest drop) are judged on
intervals: PASS / FAIL / INCONCLUSIVE / UNINFORMATIVE, each with its reason.
"""

from __future__ import annotations

import math
from typing import Any

from suite.analysis import RunData
from suite.document import BulletList, Cell, Note, Paragraph, Section, Table, code, fmt_p, literal
from suite.render import markdown
from suite.stages.accuracy.read import AccuracyComparison, ArmScore, EquivalenceSummary, FilterComparison
from suite.stats import fmt_interval

MAX_LISTED_FLIPS = 20
GATE_STYLE = {"PASS": "better", "FAIL": "worse", "INCONCLUSIVE": "unreliable", "UNINFORMATIVE": "unreliable"}


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}"


def _score_cell(s: ArmScore) -> str:
    return f"{_pct(s.acc)} ± {_pct(s.stderr)} % ({s.correct}/{s.n})"


def _ids(ids: tuple[int, ...]) -> str:
    if not ids:
        return "none"
    shown = ", ".join(str(i) for i in ids[:MAX_LISTED_FLIPS])
    return shown + (f", … (+{len(ids) - MAX_LISTED_FLIPS} more)" if len(ids) > MAX_LISTED_FLIPS else "")


def _delta_cell(f: FilterComparison) -> Cell:
    if f.uninformative:
        return Cell("uninformative: no arm answers any question right", style="unreliable")
    p = f.paired
    return Cell(f"{100 * f.delta:+.1f} {fmt_interval(100 * p.delta_ci_low, 100 * p.delta_ci_high)}",
                tip=f"{100 * p.confidence:g} % Tango score interval on the paired difference, in pp")


def equivalence_blocks(eq: EquivalenceSummary) -> list[Any]:
    limit = f", up to {eq.max_tokens} tokens each" if eq.max_tokens else ""
    lines = [f"{eq.n} fixed prompts at temperature 0{limit}: **{eq.n_identical}/{eq.n} identical "
             f"({_pct(eq.share_identical)} %)**."]
    if eq.median_first_divergence is None:
        lines.append("No completion differs.")
    else:
        lines.append(f"Median first divergence among the {eq.n - eq.n_identical} differing completions: "
                     f"{eq.unit[:-1]} {eq.median_first_divergence:g} (0 = the first generated {eq.unit[:-1]}).")
    if eq.unit != "tokens":
        lines.append("The server returned no token ids; completions were compared as text.")
    return [Paragraph(" ".join(lines))]


def accuracy_blocks(s: AccuracyComparison) -> list[Any]:
    blocks: list[Any] = []
    if s.synthetic:
        blocks.append(Note(
            "**SYNTHETIC data**: template-generated problems in GSM8K's format (suite.fixtures.gsm8k), not GSM8K. "
            "These numbers only show the pipeline works; they say nothing about GSM8K accuracy.", "warning"))
    if s.gates:
        blocks.append(Paragraph(f"Gates: **{s.verdict}**"))
        blocks.append(BulletList([f"{literal(g.name)} ({literal(g.filter)}): **{g.status}** — {literal(g.reason)}"
                                  for g in s.gates]))
    else:
        blocks.append(Paragraph("Gates: none configured (set accuracy.min_accuracy / accuracy.max_drop)."))
    rows = [[Cell(literal(f.filter)), Cell(_score_cell(f.base)), Cell(_score_cell(f.cand)), _delta_cell(f),
             Cell(str(f.lost)), Cell(str(f.gained)),
             Cell("n/a" if f.answers_changed is None else str(f.answers_changed),
                  style="worse" if f.answers_changed else None),
             Cell(fmt_p(f.mcnemar_p)), Cell(str(f.n_paired))]
            for f in s.filters]
    blocks.append(Table(["filter", literal(s.base_label), literal(s.cand_label), "Δ (pp) [95% interval]",
                         "right→wrong", "wrong→right", "answer changed", "McNemar p", "n"], rows, name="accuracy"))
    text = ("Accuracy ± standard error, recomputed from lm-eval's per-question samples; pairs matched on (doc_id, "
            "filter); interval: Tango's score interval on the paired difference; McNemar p: the score test on the "
            "questions that flipped (the statistic the interval inverts, so p < 0.05 exactly when it excludes 0); "
            "answer changed: questions whose extracted answer differs, right or wrong.")
    if s.responses_changed is not None:
        text += (f" **Responses changed on {s.responses_changed} of {s.n_questions} questions** (the whole "
                 "generated text; lm-eval generates greedily, so a change means other tokens, whatever the score).")
    blocks.append(Paragraph(text))
    items = [f"{literal(f.filter)}: right→wrong doc_ids {_ids(f.lost_doc_ids)}; wrong→right {_ids(f.gained_doc_ids)}"
             for f in s.filters if f.lost or f.gained]
    durations = [(s.base_label, s.base_run.duration_s), (s.cand_label, s.cand_run.duration_s)]
    if all(d is not None for _, d in durations):
        items.append("lm-eval wall time: " + ", ".join(f"{literal(lbl)} {d:.1f} s" for lbl, d in durations))
    items += [f"note: {literal(n)}" for n in s.notes]
    if items:
        blocks.append(BulletList(items))
    return blocks


def accuracy_title(s: AccuracyComparison) -> str:
    run = s.base_run
    bits = [f"{run.num_fewshot}-shot" if run.num_fewshot is not None else None, f"{s.n_questions} questions"]
    if run.max_gen_toks is not None:
        bits.append(f"max_gen_toks {run.max_gen_toks}")
    return (f"Accuracy: {literal(s.task)}, {literal(s.base_label)} vs {literal(s.cand_label)} "
            f"({', '.join(b for b in bits if b)})" + (" — SYNTHETIC data" if s.synthetic else ""))


def accuracy_section(s: AccuracyComparison | None, eq: EquivalenceSummary | None = None) -> Section | None:
    """One candidate's accuracy section; the equivalence as its subsection."""
    if s is None and eq is None:
        return None
    if s is None:
        assert eq is not None
        return Section("Greedy equivalence", 2, equivalence_blocks(eq))
    blocks = accuracy_blocks(s)
    if eq is not None:
        blocks.append(Section("Greedy equivalence", 3, equivalence_blocks(eq)))
    return Section(accuracy_title(s), 2, blocks)


def render_accuracy_md(s: AccuracyComparison | None, eq: EquivalenceSummary | None = None) -> str:
    """The section as markdown (for callers outside a run's report)."""
    sec = accuracy_section(s, eq)
    return markdown.section(sec) + "\n" if sec is not None else ""




def other_model_note(run: RunData, cand: str) -> Note | None:
    """What the comparison of two arms on different checkpoints means, said where it is shown: the questions
    pair across checkpoints (an exact-match score is the same question's, whatever produced it); the texts
    (responses changed, greedy equivalence) are two models' outputs, and with another tokenizer two
    tokenizations of the prompts, so a difference there is the checkpoint's, not a defect."""
    base, new = run.matrix.model_of(run.baseline), run.matrix.model_of(cand)
    if (base.id, base.tokenizer) == (new.id, new.tokenizer):
        return None
    tok = ("the same tokenizer" if base.tokenizer == new.tokenizer else
           f"its own tokenizer ({code(new.tokenizer or '?')}; the baseline's: {code(base.tokenizer or '?')}), "
           "so the prompts are other tokens")
    return Note(f"{literal(cand)} serves another checkpoint ({code(new.id or '?')}) with {tok}. The accuracy is "
                "still paired per question (doc_id): a question's exact match does not depend on which model or "
                "tokenizer answered it. The response-level comparisons (responses changed, greedy equivalence) "
                "compare two models' texts: a difference there is the checkpoint's, not a defect of the change.",
                "info")


def section(run: RunData) -> Section | None:
    """Per candidate: accuracy, greedy equivalence, and what is missing (a side without a result)."""
    blocks: list[Any] = []
    for s in run.summaries:
        c = s.correctness
        head = f"{literal(run.baseline)} vs {literal(s.candidate)}"
        if (c.accuracy is not None or c.equivalence is not None) and (note := other_model_note(run, s.candidate)):
            blocks.append(note)
        if c.accuracy is not None:
            blocks.append(Section(accuracy_title(c.accuracy), 3, accuracy_blocks(c.accuracy)))
        if c.equivalence is not None:
            blocks.append(Section(f"Greedy equivalence: {head}", 3, equivalence_blocks(c.equivalence)))
        blocks += [Note(f"**missing** ({head}): {literal(p)}", "error") for p in c.problems]
    if not blocks:
        return None
    return Section("Accuracy and greedy equivalence", 2, blocks, anchor="accuracy")


