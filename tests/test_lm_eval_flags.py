"""The accuracy block's lm_eval_args: lm-eval's own flags of `lm-eval run`, read as lm-eval's parser reads them
(suite.lm_eval_flags, with suite.bench_flags' reader); the block's old copies of lm-eval's settings retired with the
flag to write; the shipped matrices, migrated, plan the very accuracy jobs they planned before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from suite.lm_eval_flags import LM_EVAL, OLD_FIELDS, LmEvalFlags, lm_eval_flags
from suite.matrix_load import load_matrix, parse_matrix
from suite.plan import Job, build_plan
from suite.stages.accuracy.run import lm_eval_command
from suite.stages.accuracy.spec import AccuracyParams
from tests.conftest import REPO
from tests.conftest import matrix_error_of as error_of

DEFAULTS = LmEvalFlags(task="gsm8k", num_fewshot=5, limit=None, endpoint="completions", max_gen_toks=256,
                       concurrency=8, seed=1234)

BASE = """\
name: t
model: {id: some/model}
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}
serve:
  - {isl: 128, osl: 32, concurrency: 1}
accuracy: {lm_eval_args: ARGS, max_drop: 0.01}
"""


# ---------------------------------------------------------------- the reading


def test_no_flags_are_the_suites_defaults():
    assert lm_eval_flags([]) == DEFAULTS


@pytest.mark.parametrize("args, want", [
    (["--tasks", "gsm8k"], {}),
    (["--tasks=arc_easy"], {"task": "arc_easy"}),
    (["-t", "arc_easy"], {"task": "arc_easy"}),  # lm-eval's short names
    (["--num_fewshot", "8"], {"num_fewshot": 8}),
    (["--num_fewshot=8"], {"num_fewshot": 8}),
    (["-f", "0"], {"num_fewshot": 0}),
    (["-f=3", "--num_fewshot", "4"], {"num_fewshot": 4}),  # the last copy wins
    (["--limit", "50"], {"limit": 50}),
    (["-L", "50.0"], {"limit": 50}),  # lm-eval reads a number; a whole one is a count
    (["--seed", "7"], {"seed": 7}),
    (["--seed", "-3"], {"seed": -3}),  # a negative number is a value, as argparse reads it
    (["--seed", "7,7,7,7"], {"seed": 7}),  # lm-eval's four seeds, all the one the suite records
    (["--seed", "1234,1234,1234"], {}),  # a missing fourth is lm-eval's default, 1234
    (["--gen_kwargs", "max_gen_toks=512"], {"max_gen_toks": 512}),
    (["--gen_kwargs", '{"max_gen_toks": 64}'], {"max_gen_toks": 64}),  # or one JSON object
    (["--model", "local-chat-completions"], {"endpoint": "chat"}),
    (["-M", "local-chat-completions", "--model", "local-completions"], {}),
    (["--model_args", "num_concurrent=16"], {"concurrency": 16}),
    (["-a", "num_concurrent=16"], {"concurrency": 16}),
    (["--model_args", "num_concurrent=16", "--model_args", '{"num_concurrent": 4}'], {"concurrency": 4}),  # merged
    (["--model_args", "num_concurrent=16", "num_concurrent=2"], {"concurrency": 2}),  # nargs='+', merged in order
    (["--tasks", "gsm8k", "--num_fewshot", "8", "--limit", "20", "--seed", "4321", "--gen_kwargs", "max_gen_toks=32",
      "--model", "local-chat-completions", "--model_args", "num_concurrent=4"],
     {"num_fewshot": 8, "limit": 20, "seed": 4321, "max_gen_toks": 32, "endpoint": "chat", "concurrency": 4}),
])
def test_lm_eval_args_are_read_as_lm_eval_reads_them(args, want):
    assert lm_eval_flags(args) == LmEvalFlags(**{**DEFAULTS.__dict__, **want})


@pytest.mark.parametrize("args, msg", [
    (["--num_fewshot"], "--num_fewshot needs a value after it"),
    (["--num_fewshot", "--limit", "3"], "--num_fewshot needs a value after it"),
    (["--num_fewshot", "five"], "--num_fewshot 'five': not an integer"),
    (["--num_fewshot", "x", "--num_fewshot", "1"], "--num_fewshot 'x': not an integer"),  # every copy converted
    (["--num_fewshot", "-1"], "--num_fewshot -1: must be >= 0"),
    (["--num_fewshot", "1001"], "--num_fewshot 1001: 1,001 is beyond the limit 1,000"),
    (["--limit", "0.5"], "--limit 0.5: a count of questions, a whole number"),  # lm-eval's fraction: not taken
    (["--limit", "0"], "--limit 0: must be > 0"),
    (["--limit", "2000000"], "--limit 2000000: 2,000,000 is beyond the limit 1,000,000"),
    (["--seed", "1,2,3,4"], "--seed 1,2,3,4: the suite gives one seed to all four of lm-eval's seeds"),
    (["--seed", "5,5,5"], "--seed 5,5,5: the suite gives one seed"),  # the fourth: lm-eval's 1234
    (["--seed", "None"], "--seed None: the suite gives one seed"),
    (["--seed", "1,2"], "--seed '1,2': not an integer (or lm-eval's comma list of seeds)"),
    (["--tasks", "gsm8k,arc_easy"], "--tasks gsm8k,arc_easy: one task"),
    (["--tasks", "gsm8k", "arc_easy"], "--tasks gsm8k arc_easy: one task"),
    (["--tasks", "gsm8k", "--tasks", "gsm8k"], "--tasks gsm8k gsm8k: one task"),  # lm-eval gathers the copies
    (["--model", "hf"], "--model hf: the suite asks the arm's server: local-completions"),
    (["--gen_kwargs", "max_gen_toks=0"], "--gen_kwargs max_gen_toks=0: max_gen_toks must be > 0"),
    (["--gen_kwargs", "max_gen_toks=1.5"], "--gen_kwargs max_gen_toks=1.5: max_gen_toks must be an integer"),
    (["--gen_kwargs", "temperature=0.5"], "--gen_kwargs temperature=0.5: temperature: gen_kwargs take max_gen_toks"),
    (["--gen_kwargs", "max_gen_toks"], "--gen_kwargs 'max_gen_toks': not key=value pairs"),
    (["--model_args", "num_concurrent=70000"], "--model_args num_concurrent=70000: num_concurrent 70,000 is beyond "
     "the limit 65,536"),
    (["--model_args", '{"num_concurrent": 4}', "x=1"], "--model_args '{\"num_concurrent\": 4} x=1': not key=value"),
    (["--model_args", "{num_concurrent: 4}"], "--model_args '{num_concurrent: 4}': not key=value pairs"),
    # model_args keys the suite sets, with where they come from; any other with the keys taken
    (["--model_args", "base_url=http://x"], "--model_args base_url=http://x: base_url is set by the suite: the URL "
     "of the arm's server"),
    (["--model_args", "num_concurrent=4,tokenizer=t"], "--model_args num_concurrent=4,tokenizer=t: tokenizer is set "
     "by the suite: the arm's tokenizer"),
    (["-a", "model=m"], "--model_args model=m: model is set by the suite: the arm's served name"),
    (["--model_args", "seed=3"], "--model_args seed=3: seed is set by the suite: from --seed"),
    (["--model_args", "max_retries=9"], "--model_args max_retries=9: max_retries is set by the suite: 3"),
    (["--model_args", "timeout=60"], "--model_args timeout=60: timeout: model_args take num_concurrent here"),
    # the flags the suite sets itself, with where they come from
    (["--output_path", "x"], "--output_path is set by the suite: the results go into the run directory"),
    (["-o", "x"], "--output_path is set by the suite"),
    (["--log_samples"], "--log_samples is set by the suite"),
    (["-s"], "--log_samples is set by the suite"),
    (["--include_path", "x"], "--include_path is set by the suite: accuracy.dataset"),
    (["--apply_chat_template"], "--apply_chat_template is set by the suite: with --model local-chat-completions"),
    (["--trust_remote_code"], "--trust_remote_code is set by the suite: from serve_args (--trust-remote-code)"),
    # any other flag of lm-eval: not passed through, the ones taken listed
    (["--batch_size", "8"], "--batch_size: lm_eval_args take --tasks, --num_fewshot, --limit, --seed, --gen_kwargs, "
     "--model, --model_args here (lm-eval's own flags of `lm-eval run`)"),
    (["--system_instruction", "x"], "--system_instruction: lm_eval_args take"),
    (["--num-fewshot", "3"], "--num-fewshot: lm_eval_args take"),  # lm-eval's spelling only: underscores
    (["--num_few", "3"], "--num_few: lm_eval_args take"),  # no abbreviations
    (["-f5"], "-f5: lm_eval_args take"),  # a short name written apart from its value
    (["--limit", "3", "4"], "'4' follows no flag (lm_eval_args are [--flag, value, ...] of --tasks, "),
])
def test_lm_eval_args_lm_eval_or_the_suite_would_refuse_are_refused(args, msg):
    with pytest.raises(ValueError) as exc:
        lm_eval_flags(args)
    assert str(exc.value).startswith(msg), str(exc.value)


def test_the_flags_read_into_the_params_fields():
    """What lm_eval_args say are the job params' fields of the same names (the accuracy block's old fields)."""
    assert set(LmEvalFlags.__dataclass_fields__) <= set(AccuracyParams.model_fields)
    assert set(OLD_FIELDS) == set(LmEvalFlags.__dataclass_fields__)
    assert [f.flag for f in LM_EVAL.flags] == ["--tasks", "--num_fewshot", "--limit", "--seed", "--gen_kwargs",
                                              "--model", "--model_args"]


# ---------------------------------------------------------------- in a matrix


def test_lm_eval_args_reach_the_jobs_params_and_lm_evals_command():
    m = parse_matrix(BASE.replace("ARGS", '[--num_fewshot, "8", --model, local-chat-completions, --model_args, '
                                          '"num_concurrent=16", --gen_kwargs, "max_gen_toks=512", --seed, "7", '
                                          '--limit, "40"]'))
    jobs = [j for j in build_plan(m).jobs if j.kind in ("accuracy", "equivalence")]
    assert {j.kind for j in jobs} == {"accuracy", "equivalence"}
    want = AccuracyParams(task="gsm8k", num_fewshot=8, limit=40, endpoint="chat", max_gen_toks=512, concurrency=16,
                          seed=7, max_drop=0.01)
    assert {j.params for j in jobs} == {want}
    cmd = lm_eval_command(base_url="http://h:1", served_name="s", tokenizer="t", spec=want, out_dir=Path("/o"),
                          include_dir=None)
    flag = lambda name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert (flag("--model"), flag("--num_fewshot"), flag("--seed"), flag("--limit"), flag("--gen_kwargs")) == (
        "local-chat-completions", "8", "7", "40", "max_gen_toks=512")
    assert "num_concurrent=16" in flag("--model_args").split(",") and "--apply_chat_template" in cmd


def test_flags_that_say_the_defaults_plan_the_same_jobs_as_none():
    none = build_plan(parse_matrix(BASE.replace("lm_eval_args: ARGS, ", "")))
    said = build_plan(parse_matrix(BASE.replace("ARGS", '[--tasks, gsm8k, --num_fewshot, "5", --seed, "1234", '
                                                        '--gen_kwargs, "max_gen_toks=256", --model, local-completions, '
                                                        '--model_args, "num_concurrent=8"]')))
    assert [(j.key, j.hash) for j in said.jobs] == [(j.key, j.hash) for j in none.jobs]


def test_a_bad_flag_is_named_at_the_blocks_line(tmp_path):
    assert error_of(tmp_path, BASE.replace("ARGS", '[--output_path, /tmp/x]')) == (
        "m.yaml:8: accuracy.lm_eval_args: --output_path is set by the suite: the results go into the run directory")
    assert "accuracy.lm_eval_args[1]: Input should be a valid string" in error_of(
        tmp_path, BASE.replace("ARGS", "[--num_fewshot, 8]"))


# ---------------------------------------------------------------- the retired fields

OLD = BASE.replace("accuracy: {lm_eval_args: ARGS, max_drop: 0.01}",
                   "accuracy: {task: gsm8k, num_fewshot: 8, limit: 40, endpoint: chat, max_gen_toks: 512,\n"
                   "           concurrency: 16, seed: 4321, max_drop: 0.01}")


def test_the_blocks_copies_of_lm_evals_settings_are_retired_with_the_flag_to_write(tmp_path):
    said = "retired: give lm-eval's own flag in accuracy.lm_eval_args: "
    assert error_of(tmp_path, OLD).splitlines() == [
        f"m.yaml:8: accuracy.task: {said}[--tasks, gsm8k]",
        f'm.yaml:8: accuracy.num_fewshot: {said}[--num_fewshot, "8"]',
        f'm.yaml:8: accuracy.limit: {said}[--limit, "40"]',
        f"m.yaml:8: accuracy.endpoint: {said}[--model, local-chat-completions]",
        f'm.yaml:8: accuracy.max_gen_toks: {said}[--gen_kwargs, "max_gen_toks=512"]',
        f'm.yaml:9: accuracy.concurrency: {said}[--model_args, "num_concurrent=16"]',
        f'm.yaml:9: accuracy.seed: {said}[--seed, "4321"]',
    ]
    # written as the messages say, it validates and plans the params the old fields made
    new = BASE.replace("ARGS", '[--tasks, gsm8k, --num_fewshot, "8", --limit, "40", --model, local-chat-completions, '
                               '--gen_kwargs, "max_gen_toks=512", --model_args, "num_concurrent=16", --seed, "4321"]')
    assert {j.params for j in build_plan(parse_matrix(new)).jobs if j.kind == "accuracy"} == {AccuracyParams(
        task="gsm8k", num_fewshot=8, limit=40, endpoint="chat", max_gen_toks=512, concurrency=16, seed=4321,
        max_drop=0.01)}


def test_a_retired_limit_of_null_is_deleted_and_completions_is_local_completions(tmp_path):
    old = BASE.replace("lm_eval_args: ARGS", "limit: null, endpoint: completions")
    assert error_of(tmp_path, old).splitlines() == [
        "m.yaml:8: accuracy.limit: retired: lm-eval's own flags go in accuracy.lm_eval_args, and without a --limit "
        "the whole test set is asked: delete it",
        "m.yaml:8: accuracy.endpoint: retired: give lm-eval's own flag in accuracy.lm_eval_args: "
        "[--model, local-completions]",
    ]


@pytest.mark.parametrize("field, value", [("task", "arc_easy"), ("num_fewshot", 0), ("limit", 7), ("seed", -2),
                                          ("endpoint", "chat"), ("max_gen_toks", 9), ("concurrency", 3)])
def test_each_retired_fields_flags_say_what_it_said(field, value):
    assert getattr(lm_eval_flags(OLD_FIELDS[field](value)), field) == value


# ---------------------------------------------------------------- records and the shipped matrices


def test_a_record_written_while_the_block_held_the_fields_loads_as_it_was():
    """A job record's params as the old block dumped them (every field) load as the job's params, hashed the same."""
    old = {"task": "gsm8k", "num_fewshot": 5, "limit": 20, "endpoint": "completions", "max_gen_toks": 32,
           "concurrency": 4, "seed": 1234, "dataset": "synthetic", "min_accuracy": None, "max_drop": None,
           "equivalence_prompts": 16, "equivalence_max_tokens": 32}
    job = Job.model_validate({"kind": "accuracy", "arm": "baseline", "session": 1, "point": "gsm8k", "params": old,
                              "hash": "0" * 16})
    assert isinstance(job.params, AccuracyParams) and job.params.model_dump(mode="json") == old


# The accuracy and equivalence jobs, (key, params) in order, of the shipped matrices as main planned them before the
# block's lm-eval settings became lm_eval_args (the same digest: the same jobs with the same params; a job's hash
# also holds the model's resolved path, so it differs between checkouts and is not pinned here; main's and this
# plan's hashes were compared in one directory). A deliberate change to one of these matrices records its digest anew.
BEFORE = {
    "gemma4.yaml": ("6ebaf6727a9cf1d7", 6),
    "glm52-aiter-router-mi355x.yaml": ("3f2bcb6072549007", 6),
    "qwen38-fse-mi355x.yaml": ("18c12df2862ec95f", 10),
    "smoke-cpu.yaml": ("94867aaa25399768", 10),
    "smoke-slurm.yaml": ("228c4348ac859ca2", 6),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_migrated_shipped_matrix_plans_the_accuracy_jobs_it_planned_before(name):
    jobs = [(j.key, j.params.model_dump(mode="json")) for j in build_plan(load_matrix(REPO / "matrices" / name)).jobs
            if j.kind in ("accuracy", "equivalence")]
    digest = hashlib.sha256(json.dumps(jobs, sort_keys=True).encode()).hexdigest()[:16]
    assert (digest, len(jobs)) == BEFORE[name]
