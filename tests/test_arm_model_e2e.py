"""End to end through the CLI: an arm that serves its own model (seed 002's reference row: another checkpoint
beside the one the other arms serve), judged on correctness alone.

The baseline serves the tiny MoE; the arm `ckpt` serves a copy of it under another directory and served
name (hard links: the same weights), with `serving: false`: one server, its greedy-equivalence and GSM8K
jobs (real lm-eval on synthetic GSM8K-format data). The copy holds the same weights, so greedy outputs and
the per-question scores must come out identical: a real check that each arm's clients talked to its own
server, with its own served name and tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import run_matrix_once, tiny_cpu_matrix

pytestmark = pytest.mark.e2e

BODY = """\
arms:
  baseline: {{vllm: "0.32.0"}}
  ckpt:
    vllm: "0.32.0"
    serving: false
    model: {{id: {copy}}}
    serve_args: [--served-model-name, tiny-moe-copy]
serve:
  - {{isl: 32, osl: 8, concurrency: [1], num_prompts: 2}}
accuracy: {{dataset: synthetic, lm_eval_args: [--tasks, gsm8k, --limit, "6", --num_fewshot, "1", --gen_kwargs,
           "max_gen_toks=16", --model_args, "num_concurrent=2"], equivalence_prompts: 4, equivalence_max_tokens: 16}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model):
    base = tmp_path_factory.mktemp("armmodel")
    copy = base / "tiny-moe-copy"
    shutil.copytree(tiny_model, copy, copy_function=os.link)
    _, run_dir, proc = run_matrix_once(base, tiny_cpu_matrix("arm-model", tiny_model, BODY.format(copy=copy)))
    return run_dir, proc, copy


def test_each_arm_serves_its_own_model_and_its_clients_ask_for_it(run):
    run_dir, proc, copy = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["arms"]["ckpt"]["model"] == str(copy) and "model" not in manifest["arms"]["baseline"]
    logs = {arm: "".join(p.read_text(errors="replace") for p in (run_dir / arm).glob("server-*.log"))
            for arm in ("baseline", "ckpt")}
    assert logs["ckpt"] and logs["baseline"]
    assert str(copy) in logs["ckpt"] and str(copy) not in logs["baseline"]
    # lm-eval of each arm asked its own server for its own served name, with its own tokenizer
    for arm, served, tok in (("baseline", "tiny-moe", None), ("ckpt", "tiny-moe-copy", str(copy))):
        [sidecar] = list((run_dir / arm / "accuracy").glob("*/*/suite-accuracy.json"))
        side = json.loads(sidecar.read_text())
        assert side["served_name"] == served
        model_args = side["command"][side["command"].index("--model_args") + 1]
        assert f"model={served}," in model_args
        if tok:
            assert f"tokenizer={tok}" in model_args
    # the correctness-only arm ran no serving rounds
    assert not (run_dir / "ckpt" / "serve").exists() and (run_dir / "baseline" / "serve").is_dir()


def test_the_same_weights_under_another_name_read_identical(run):
    run_dir, _, copy = run
    report = (run_dir / "report.md").read_text()
    assert "**ckpt vs baseline: OUTPUT IDENTICAL**" in report, report[:3000]
    assert f"(ckpt: its own, `{copy}`)" in report  # the intro names the arm's own model
    assert f'"model": "{copy}"' in report or str(copy) in report.split("## Provenance")[1]


def test_the_report_says_what_a_comparison_across_checkpoints_means(run):
    """The accuracy section of an arm on another checkpoint says so where its comparison is shown: paired per
    question, and its response-level differences the checkpoint's, not a defect."""
    run_dir, _, copy = run
    text = (run_dir / "report.md").read_text()
    section = text.split("## Accuracy and greedy equivalence")[1].split("\n## ")[0]
    note = next(line for line in section.splitlines() if "serves another checkpoint" in line)
    assert f"ckpt serves another checkpoint (`{copy}`) with its own tokenizer (`{copy}`;" in note
    assert "paired per question (doc_id)" in note and "not a defect of the change" in note
