"""Paired accuracy / equivalence arithmetic on hand-made lm-eval-format files (no server)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy.special import ndtr

from suite.errors import SuiteError
from suite.stages.accuracy.read import (
    first_divergence,
    mean_stderr,
    summarize_accuracy,
    summarize_equivalence,
)
from suite.stages.accuracy.spec import AccuracyParams
from suite.stages.accuracy.summary import render_accuracy_md, section

STAMP = "2026-11-29T10-00-00.000000"


def write_arm(
    d: Path,
    flex: list[int],
    strict: list[int] | None = None,
    *,
    stamp: str = STAMP,
    sidecar: bool = True,
    synthetic: bool = True,
    doc_hash: dict[int, str] | None = None,
    responses: dict[int, str] | None = None,
) -> Path:
    """An accuracy dir shaped like run_accuracy's: lm-eval samples + results, and the sidecar."""
    strict = strict if strict is not None else [0] * len(flex)
    text = {i: (responses or {}).get(i, f"so the answer is {1 if v else 0}") for i, v in enumerate(flex)}
    sub = d / "tiny-moe"
    sub.mkdir(parents=True, exist_ok=True)
    lines = []
    for filt, vals in (("strict-match", strict), ("flexible-extract", flex)):
        for doc_id, v in enumerate(vals):
            row = {
                "doc_id": doc_id,
                "filter": filt,
                "exact_match": float(v),
                "doc_hash": (doc_hash or {}).get(doc_id, f"d{doc_id}"),
                "prompt_hash": f"p{doc_id}",
                # the generated text (one per question: it ends in the flexible answer), and what each filter
                # extracted from it: a right answer is "1"; strict-match finds nothing in a wrong one
                "resps": [[text[doc_id]]],
                "filtered_resps": [("1" if v else "[invalid]") if filt == "strict-match" else text[doc_id].split()[-1]],
            }
            lines.append(json.dumps(row))
    samples = sub / f"samples_suite_local_gsm8k_{stamp}.jsonl"
    samples.write_text("\n".join(lines) + "\n")
    results = sub / f"results_{stamp}.json"
    entry = {}
    for filt, vals in (("strict-match", strict), ("flexible-extract", flex)):
        entry[f"exact_match,{filt}"] = sum(vals) / len(vals)
        entry[f"exact_match_stderr,{filt}"] = mean_stderr([float(v) for v in vals])
    results.write_text(json.dumps({"results": {"suite_local_gsm8k": entry}}))
    if sidecar:
        side = {
            "task": "gsm8k",
            "lm_eval_task": "suite_local_gsm8k",
            "spec": {"num_fewshot": 5, "limit": len(flex), "max_gen_toks": 32},
            "dataset": {"source": "local", "path": "data", "synthetic": synthetic},
            "results_files": [str(results.relative_to(d))],
            "samples_files": [str(samples.relative_to(d))],
            "duration_s": 12.5,
        }
        (d / "suite-accuracy.json").write_text(json.dumps(side))
    return d


# 20 questions. flexible-extract: base right on 0-11 (12/20); candidate right on 0-7 and 12-13 (10/20)
# -> lost (right -> wrong) 8, 9, 10, 11; gained (wrong -> right) 12, 13; both right 8; both wrong 6.
BASE_FLEX = [1] * 12 + [0] * 8
CAND_FLEX = [1] * 8 + [0] * 4 + [1] * 2 + [0] * 6


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return write_arm(tmp_path / "base", BASE_FLEX), write_arm(tmp_path / "cand", CAND_FLEX)


def test_stderr_matches_lm_eval_formula() -> None:
    # sample stdev (n-1) / sqrt(n): p = 0.6, n = 20 -> sqrt(0.24 * 20 / 19) / sqrt(20)
    assert mean_stderr([1.0] * 12 + [0.0] * 8) == pytest.approx((0.24 * 20 / 19) ** 0.5 / 20**0.5)
    assert mean_stderr([1.0] * 5) == 0.0


def test_paired_numbers(pair: tuple[Path, Path]) -> None:
    s = summarize_accuracy(*pair, AccuracyParams(min_accuracy=0.45, max_drop=0.1))
    flex = s.by_filter("flexible-extract")
    assert (flex.n_paired, flex.both_correct, flex.both_wrong, flex.lost, flex.gained) == (20, 8, 6, 4, 2)
    assert flex.lost_doc_ids == (8, 9, 10, 11) and flex.gained_doc_ids == (12, 13)
    assert (flex.base.acc, flex.cand.acc) == (0.6, 0.5)
    assert flex.delta == pytest.approx(-0.1)
    assert flex.mcnemar_p == pytest.approx(2 * ndtr(-2 / math.sqrt(6)))  # score form: (2 - 4) / sqrt(6)
    assert flex.paired.p_exact == pytest.approx(0.6875)  # the exact binomial, kept beside it
    assert flex.base.stderr == pytest.approx(flex.base.reported_stderr)
    assert flex.cand.acc == flex.cand.reported_acc
    strict = s.by_filter("strict-match")
    assert (strict.base.acc, strict.cand.acc, strict.lost, strict.gained, strict.mcnemar_p) == (
        0,
        0,
        0,
        0,
        1.0,
    )
    assert [f.filter for f in s.filters] == ["strict-match", "flexible-extract"]
    assert s.n_questions == 20 and s.task == "gsm8k" and s.synthetic
    # the paired interval (Tango) holds the estimate; 20 questions cannot decide a 10 pp gate either way
    assert flex.paired.delta_ci_low < -0.1 < flex.paired.delta_ci_high < 0.2
    assert {g.name: g.status for g in s.gates} == {"min_accuracy": "INCONCLUSIVE", "max_drop": "INCONCLUSIVE"}
    assert s.verdict == "INCONCLUSIVE"


# 200 questions: enough to decide the gates below
BASE_200 = [1] * 120 + [0] * 80  # 60 %
WORSE_200 = [1] * 60 + [0] * 140  # 30 %: lost 60, gained 0


@pytest.mark.parametrize(
    ("cand", "min_accuracy", "max_drop", "verdict", "outcomes"),
    [
        (BASE_200, None, None, "NO GATES", {}),
        (BASE_200, None, 0.05, "PASS", {"max_drop": "PASS"}),  # nothing flipped: a 5 pp drop is excluded
        (WORSE_200, None, 0.05, "FAIL", {"max_drop": "FAIL"}),  # −30 pp, interval far below −5 pp
        (BASE_200, 0.45, None, "PASS", {"min_accuracy": "PASS"}),  # Wilson interval of 60 % above 45 %
        (BASE_200, 0.75, None, "FAIL", {"min_accuracy": "FAIL"}),  # ... and below 75 %
        (BASE_200, 0.6, None, "INCONCLUSIVE", {"min_accuracy": "INCONCLUSIVE"}),  # straddles 60 %
        (WORSE_200, 0.45, 0.5, "FAIL", {"min_accuracy": "FAIL", "max_drop": "PASS"}),  # the worst gate wins
    ],
)
def test_gates_judge_intervals(tmp_path: Path, cand, min_accuracy, max_drop, verdict: str, outcomes) -> None:
    s = summarize_accuracy(write_arm(tmp_path / "b", BASE_200), write_arm(tmp_path / "c", cand),
                           AccuracyParams(min_accuracy=min_accuracy, max_drop=max_drop))
    assert s.verdict == verdict
    assert {g.name: g.status for g in s.gates} == outcomes
    assert all(g.reason for g in s.gates)


def test_no_arm_right_is_uninformative(tmp_path: Path) -> None:
    """0 % everywhere must not read as "+0.0 pp, p = 1" (accuracy unchanged)."""
    s = summarize_accuracy(write_arm(tmp_path / "b", [0] * 20), write_arm(tmp_path / "c", [0] * 20),
                           AccuracyParams(max_drop=0.01))
    flex = s.by_filter("flexible-extract")
    assert flex.uninformative and s.verdict == "UNINFORMATIVE"
    md = render_accuracy_md(s)
    assert "uninformative: no arm answers any question right" in md and "| +0.0 [" not in md.split("flexible")[1]


def test_changed_responses_show_a_changed_model_even_when_no_arm_scores(tmp_path: Path) -> None:
    """A random-weight model scores 0 in both arms; a candidate that changes the tokens still shows."""
    same = summarize_accuracy(write_arm(tmp_path / "a", [0] * 20), write_arm(tmp_path / "b", [0] * 20))
    assert same.responses_changed == 0 and [f.answers_changed for f in same.filters] == [0, 0]
    changed = {0: "x 7", 1: "y 7", 2: "z 0", 3: "w 9"}  # doc 2: other text, the same extracted answer "0"
    s = summarize_accuracy(write_arm(tmp_path / "c", [0] * 20), write_arm(tmp_path / "d", [0] * 20,
                                                                         responses=changed))
    assert s.responses_changed == 4
    assert s.by_filter("strict-match").answers_changed == 0  # wrong in both arms: nothing extracted
    assert s.by_filter("flexible-extract").answers_changed == 3  # docs 0, 1, 3: "7", "7", "9" against "0"
    md = render_accuracy_md(s)
    assert "**Responses changed on 4 of 20 questions**" in md
    assert "| flexible-extract | 0.0 ± 0.0 % (0/20) | 0.0 ± 0.0 % (0/20) | uninformative: no arm answers any " \
           "question right | 0 | 0 | 3 | 1 | 20 |" in md


def test_gain_never_fails_max_drop(tmp_path: Path) -> None:
    s = summarize_accuracy(
        write_arm(tmp_path / "b", CAND_FLEX), write_arm(tmp_path / "c", BASE_FLEX), AccuracyParams(max_drop=0.0)
    )
    assert s.verdict != "FAIL" and s.by_filter("flexible-extract").delta == pytest.approx(0.1)


def test_without_sidecar_takes_the_newest_run(tmp_path: Path) -> None:
    base = write_arm(tmp_path / "b", [0] * 20, sidecar=False, stamp="2026-01-01T00-00-00.000000")
    write_arm(tmp_path / "b", BASE_FLEX, sidecar=False, stamp="2026-02-01T00-00-00.000000")
    cand = write_arm(tmp_path / "c", CAND_FLEX, sidecar=False)
    s = summarize_accuracy(base, cand, None)
    assert s.by_filter("flexible-extract").base.acc == 0.6
    assert s.verdict == "NO GATES" and not s.synthetic


def test_different_questions_are_an_error(tmp_path: Path) -> None:
    base = write_arm(tmp_path / "b", BASE_FLEX)
    with pytest.raises(SuiteError, match="different questions"):
        summarize_accuracy(base, write_arm(tmp_path / "c", CAND_FLEX[:15]), None)
    with pytest.raises(SuiteError, match="doc_hash differs"):
        summarize_accuracy(base, write_arm(tmp_path / "h", CAND_FLEX, doc_hash={3: "other"}), None)
    with pytest.raises(SuiteError, match="does not exist"):
        summarize_accuracy(base, tmp_path / "missing", None)


def test_bad_samples_are_an_error(tmp_path: Path) -> None:
    base = write_arm(tmp_path / "b", BASE_FLEX)
    cand = write_arm(tmp_path / "c", CAND_FLEX)
    samples = next((cand / "tiny-moe").glob("samples_*.jsonl"))
    first = samples.read_text().splitlines()[0]
    samples.write_text(samples.read_text() + first + "\n")
    with pytest.raises(SuiteError, match="duplicate sample"):
        summarize_accuracy(base, cand, None)
    samples.write_text('{"doc_id": 0}\n')
    with pytest.raises(SuiteError, match=r"samples_.*:1: not an lm-eval sample"):
        summarize_accuracy(base, cand, None)


# ---------------------------------------------------------------- equivalence


def write_eq(
    path: Path, outputs: list[list[int] | None], texts: list[str] | None = None, sha: str = "s"
) -> Path:
    rows = [
        {"index": i, "prompt": f"prompt {i}", "token_ids": ids, "text": (texts or [""] * len(outputs))[i]}
        for i, ids in enumerate(outputs)
    ]
    path.write_text(json.dumps({"prompt_set_sha256": sha, "max_tokens": 8, "results": rows}))
    return path


def test_first_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([5], [6]) == 0
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # one stops early: diverges where it stops
    assert first_divergence("abc", "abd") == 2


def test_equivalence_summary(tmp_path: Path) -> None:
    base = write_eq(tmp_path / "a.json", [[1, 2, 3, 4], [1, 2, 3, 4], [7, 7], [1, 2, 3, 4], [9]])
    cand = write_eq(tmp_path / "b.json", [[1, 2, 3, 4], [1, 2, 0, 4], [7, 7, 7], [0, 2, 3, 4], [9]])
    e = summarize_equivalence(base, cand)
    assert (e.n, e.n_identical, e.unit) == (5, 2, "tokens")
    assert e.share_identical == pytest.approx(0.4)
    assert e.first_divergence == (None, 2, 2, 0, None)
    assert e.median_first_divergence == 2.0
    same = summarize_equivalence(base, base)
    assert (same.share_identical, same.median_first_divergence) == (1.0, None)
    # two differing completions, at tokens 0 and 1: the lower median, a position that exists, never "token 0.5"
    two = summarize_equivalence(base, write_eq(tmp_path / "c.json", [[9, 2, 3, 4], [1, 0, 3, 4], [7, 7],
                                                                     [1, 2, 3, 4], [9]]))
    assert (two.first_divergence, two.median_first_divergence) == ((0, 1, None, None, None), 0.0)


def test_equivalence_text_fallback_and_mismatch(tmp_path: Path) -> None:
    a = write_eq(tmp_path / "a.json", [None, None], texts=["hello world", "same"])
    b = write_eq(tmp_path / "b.json", [None, None], texts=["hello there", "same"])
    e = summarize_equivalence(a, b)
    assert (e.unit, e.n_identical, e.first_divergence) == ("chars", 1, (6, None))
    other = write_eq(tmp_path / "c.json", [None, None], texts=["x", "y"], sha="different")
    with pytest.raises(SuiteError, match="prompt_set_sha256"):
        summarize_equivalence(a, other)


# ---------------------------------------------------------------- markdown (golden)

GOLDEN = """\
## Accuracy: gsm8k, baseline vs patched (5-shot, 20 questions, max_gen_toks 32) — SYNTHETIC data

> **SYNTHETIC data**: template-generated problems in GSM8K's format (suite.fixtures.gsm8k), not GSM8K. These numbers only show the pipeline works; they say nothing about GSM8K accuracy.

Gates: **INCONCLUSIVE**

- min_accuracy (flexible-extract): **INCONCLUSIVE** — 50.0 % (95% [29.9, 70.1] %) straddles floor 45.0 %
- max_drop (flexible-extract): **INCONCLUSIVE** — -10.0 pp (95% [-35.0, +15.9] pp, 4 lost, 2 gained of 20): interval reaches past -5 pp; more questions needed

| filter | baseline | patched | Δ (pp) [95% interval] | right→wrong | wrong→right | answer changed | McNemar p | n |
|---|--:|--:|--:|--:|--:|--:|--:|--:|
| strict-match | 0.0 ± 0.0 % (0/20) | 0.0 ± 0.0 % (0/20) | uninformative: no arm answers any question right | 0 | 0 | 0 | 1 | 20 |
| flexible-extract | 60.0 ± 11.2 % (12/20) | 50.0 ± 11.5 % (10/20) | -10.0 [-35.0, +15.9] | 4 | 2 | 6 | 0.414 | 20 |

Accuracy ± standard error, recomputed from lm-eval's per-question samples; pairs matched on (doc_id, filter); interval: Tango's score interval on the paired difference; McNemar p: the score test on the questions that flipped (the statistic the interval inverts, so p < 0.05 exactly when it excludes 0); answer changed: questions whose extracted answer differs, right or wrong. **Responses changed on 6 of 20 questions** (the whole generated text; lm-eval generates greedily, so a change means other tokens, whatever the score).

- flexible-extract: right→wrong doc_ids 8, 9, 10, 11; wrong→right 12, 13
- lm-eval wall time: baseline 12.5 s, patched 12.5 s

### Greedy equivalence

5 fixed prompts at temperature 0, up to 8 tokens each: **2/5 identical (40.0 %)**. Median first divergence among the 3 differing completions: token 2 (0 = the first generated token).
"""


def test_render_golden(pair: tuple[Path, Path], tmp_path: Path) -> None:
    s = summarize_accuracy(*pair, AccuracyParams(min_accuracy=0.45, max_drop=0.05))
    base = write_eq(tmp_path / "a.json", [[1, 2, 3, 4], [1, 2, 3, 4], [7, 7], [1, 2, 3, 4], [9]])
    cand = write_eq(tmp_path / "b.json", [[1, 2, 3, 4], [1, 2, 0, 4], [7, 7, 7], [0, 2, 3, 4], [9]])
    assert render_accuracy_md(s, summarize_equivalence(base, cand)) == GOLDEN
    assert render_accuracy_md(None, None) == ""


def test_report_section_from_run_records(tmp_path: Path) -> None:
    """The section of a run: each arm's raw files found from the job records, through the store."""
    from suite.analysis import load_run
    from suite.plan import Job
    from suite.records import SCHEMA_VERSION, Manifest
    from suite.render.markdown import section as markdown_section
    from suite.store import RunStore

    store = RunStore(tmp_path)
    store.write_manifest(Manifest.model_validate({"schema_version": SCHEMA_VERSION,
                          "plan": {"arms": ["baseline", "patched"], "baseline": "baseline"}}))
    params = AccuracyParams(max_drop=0.2).model_dump(mode="json")
    jobs = {(arm, kind): Job(kind=kind, arm=arm, session=0, point=point, params=params, hash="h")
            for arm in ("baseline", "patched") for kind, point in (("accuracy", "gsm8k"), ("equivalence", "greedy"))}
    write_arm(store.result_path(jobs[("baseline", "accuracy")]), BASE_FLEX)
    write_arm(store.result_path(jobs[("patched", "accuracy")]), CAND_FLEX)
    for arm, out in (("baseline", [[1, 2], [3]]), ("patched", [[1, 2], [4]])):
        path = store.result_path(jobs[(arm, "equivalence")])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_eq(path, out)
    for job in jobs.values():
        store.write_record(job, "ok")
    found = section(load_run(tmp_path))
    assert found is not None
    text = markdown_section(found)
    assert "### Accuracy: gsm8k, baseline vs patched" in text and "Gates: **INCONCLUSIVE**" in text
    assert "**1/2 identical (50.0 %)**" in text
    # the verdict card carries the same correctness
    from suite.report_verdict import correctness_lines

    (summary,) = load_run(tmp_path).summaries
    lines = correctness_lines(summary.correctness)
    assert lines[0].startswith("greedy equivalence: 1/2 completions identical (50.0 %)")
    assert "gate **INCONCLUSIVE**" in lines[1] and "flexible-extract -10.0 pp [-35.0, +15.9]" in lines[1]
    # a failed job is named, not skipped
    store.write_record(jobs[("patched", "accuracy")], "failed", error="boom")
    text = markdown_section(section(load_run(tmp_path)))
    assert "no result for patched (failed)" in text and "Greedy equivalence" in text
