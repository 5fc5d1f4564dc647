"""A block's bench_args, the bench tool's own flags read as its parser reads them (suite.bench_flags): a serving
point's and a latency row's, vLLM's own flags of `vllm bench serve` / `vllm bench latency`; the kernel and layer
blocks', the suite's own benches'. The blocks' old copies of them retired with the flag to write; the shipped
matrices, migrated, plan the very jobs they planned before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from suite.bench_flags import (
    KERNEL,
    LATENCY,
    LAYER,
    SERVE,
    KernelFlags,
    LatencyFlags,
    LayerFlags,
    ServeFlags,
    kernel_flags,
    latency_flags,
    layer_flags,
    serve_flags,
)
from suite.matrix_load import load_matrix, parse_matrix
from suite.plan import build_plan
from suite.stages.kernel.bench import build_parser as kernel_parser
from suite.stages.kernel.run import kernel_command
from suite.stages.kernel.spec import KernelParams
from suite.stages.latency.spec import LatencyParams
from suite.stages.layer.bench import build_parser as layer_parser
from suite.stages.layer.run import layer_command
from suite.stages.layer.spec import LayerParams
from suite.stages.serve.spec import ServeParams
from tests.conftest import REPO, load_script
from tests.conftest import matrix_error_of as error_of

DEFAULTS = ServeFlags(random_range_ratio=0.0, request_rate=None, num_warmups=1, seed=0)

BASE = """\
name: t
model: {id: some/model}
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x, bench_args: ARGS}
"""


# ---------------------------------------------------------------- the reading


def test_no_flags_are_the_suites_defaults():
    assert serve_flags([]) == DEFAULTS
    assert latency_flags([]) == LatencyFlags(num_iters_warmup=3, num_iters=10)


@pytest.mark.parametrize("args, want", [
    (["--num-warmups", "2"], {"num_warmups": 2}),
    (["--num-warmups=2"], {"num_warmups": 2}),
    (["--num_warmups", "2"], {"num_warmups": 2}),  # vLLM's parser: underscores are dashes
    (["--num_warmups=2"], {"num_warmups": 2}),
    (["--seed", "3", "--seed=5"], {"seed": 5}),  # the last copy wins
    (["--seed=5", "--seed", "-3"], {"seed": -3}),  # a negative number is a value, as argparse reads it
    (["--request-rate", "8"], {"request_rate": 8.0}),
    (["--request-rate", "0.5"], {"request_rate": 0.5}),
    (["--request-rate", "inf"], {}),  # inf: every request at once, held as None in the params
    (["--request-rate", "8", "--request-rate", "Infinity"], {}),
    (["--random-range-ratio", "0.25"], {"random_range_ratio": 0.25}),
    (["--random-range-ratio", "1", "--random-range-ratio", "0"], {}),  # only the copy vLLM keeps is held to range
])
def test_serve_flags_are_read_as_vllm_reads_them(args, want):
    flags = serve_flags(args)
    assert flags == ServeFlags(**{**DEFAULTS.__dict__, **want})


def test_latency_flags_are_read_as_vllm_reads_them():
    assert latency_flags(["--num_iters_warmup=0", "--num-iters", "5", "--num-iters=7"]) == LatencyFlags(0, 7)


@pytest.mark.parametrize("args, msg", [
    (["--num-warmups"], "--num-warmups needs a value after it"),
    (["--num-warmups", "--seed", "1"], "--num-warmups needs a value after it"),
    (["--num-warmups", "two"], "--num-warmups 'two': not an integer"),
    (["--seed", "x", "--seed", "1"], "--seed 'x': not an integer"),  # vLLM's parser converts every copy
    (["--num-warmups", "-1"], "--num-warmups -1: must be >= 0"),
    (["--num-warmups", "1000001"], "--num-warmups 1000001: 1,000,001 is beyond the limit 1,000,000"),
    (["--request-rate", "0"], "--request-rate 0: must be > 0 (or inf: every request at once)"),
    (["--request-rate", "-2"], "--request-rate -2: must be > 0"),
    (["--request-rate=-inf"], "--request-rate -inf: must be > 0"),
    (["--request-rate", "-inf"], "--request-rate needs a value after it"),  # argparse: -inf is an option
    (["--request-rate", "nan"], "--request-rate nan: must be > 0"),
    (["--random-range-ratio", "1"], "--random-range-ratio 1: must be >= 0 and < 1"),
    (["--random-range-ratio", "-0.1"], "--random-range-ratio -0.1: must be >= 0 and < 1"),
    (["--random-range-ratio", '{"input": 0.3}'], "--random-range-ratio '{\"input\": 0.3}': not a number"),
    (["--num-warmups", "2", "3"], "'3' follows no flag (bench_args are [--flag, value, ...] of "
     "--random-range-ratio, --request-rate, --num-warmups, --seed)"),
    (["8"], "'8' follows no flag"),
    # the flags the suite sets itself, with where they come from
    (["--max-concurrency", "8"], "--max-concurrency is set by the suite: from the point's concurrency"),
    (["--max_concurrency=8"], "--max-concurrency is set by the suite: from the point's concurrency"),
    (["--num-prompts", "10"], "--num-prompts is set by the suite: from the point's num_prompts (a count, a multiple of concurrency, or seconds)"),
    (["--random-input-len", "10"], "--random-input-len is set by the suite: from the point's isl"),
    (["--random-output-len", "10"], "--random-output-len is set by the suite: from the point's osl"),
    (["--model", "x"], "--model is set by the suite: the arm's served name"),
    (["--base-url", "http://x"], "--base-url is set by the suite: the URL of the arm's server"),
    (["--dataset-name", "sharegpt"], "--dataset-name is set by the suite: random, prompts of the point's isl"),
    (["--save-result"], "--save-result is set by the suite: the result goes into the run directory"),
    (["--ignore-eos"], "--ignore-eos is set by the suite: every request decodes the point's osl"),
    # any other flag of the tool: not passed through, the ones taken listed
    (["--goodput", "ttft:50"], "--goodput: bench_args take --random-range-ratio, --request-rate, --num-warmups, "
     "--seed here (vLLM's own flags of `vllm bench serve`)"),
    (["--num-warm", "2"], "--num-warm: bench_args take"),  # no abbreviations
    (["-n", "2"], "-n: bench_args take"),
])
def test_serve_flags_vllm_or_the_suite_would_refuse_are_refused(args, msg):
    with pytest.raises(ValueError) as exc:
        serve_flags(args)
    assert str(exc.value).startswith(msg), str(exc.value)


@pytest.mark.parametrize("args, msg", [
    (["--num-iters", "0"], "--num-iters 0: must be > 0"),
    (["--num-iters-warmup", "-1"], "--num-iters-warmup -1: must be >= 0"),
    (["--num-iters", "100001"], "--num-iters 100001: 100,001 is beyond the limit 100,000"),
    (["--batch-size", "4"], "--batch-size is set by the suite: from the row's batch_size"),
    (["--input-len", "4"], "--input-len is set by the suite: from the row's input_len"),
    (["--output-json", "x"], "--output-json is set by the suite"),
    (["--dtype", "half"], "--dtype: bench_args take --num-iters-warmup, --num-iters here (vLLM's own flags of "
     "`vllm bench latency`); vLLM's engine flags (--dtype, ...) go in serve_args"),
])
def test_latency_flags_the_suite_would_refuse_are_refused(args, msg):
    with pytest.raises(ValueError) as exc:
        latency_flags(args)
    assert str(exc.value).startswith(msg), str(exc.value)


def test_each_tool_reads_into_its_typed_flags_field_for_field():
    """A flag's destination is vLLM's (dashes as underscores): the typed flags' field and the job params' field."""
    assert [f.field for f in SERVE.flags] == list(ServeFlags.__dataclass_fields__)
    assert [f.field for f in LATENCY.flags] == list(LatencyFlags.__dataclass_fields__)
    assert set(ServeFlags.__dataclass_fields__) <= set(ServeParams.model_fields)
    assert set(LatencyFlags.__dataclass_fields__) <= set(LatencyParams.model_fields)
    # the benches' --calls fills iters, the name their params (and records) keep
    assert [f.field for f in KERNEL.flags] == list(KernelFlags.__dataclass_fields__) == ["trace_m", "iters", "trials"]
    assert [f.field for f in LAYER.flags] == list(LayerFlags.__dataclass_fields__)
    assert set(KernelFlags.__dataclass_fields__) <= set(KernelParams.model_fields)
    assert set(LayerFlags.__dataclass_fields__) <= set(LayerParams.model_fields)


# ---------------------------------------------------------------- in a matrix


def test_a_points_bench_args_reach_its_jobs_params_and_command():
    m = parse_matrix(BASE.replace("ARGS", '[--request-rate, "8", --num_warmups=3, --seed, "7", --seed, "9"]'))
    params = [j.params for j in build_plan(m).jobs if j.kind == "serve"]
    assert params and all(isinstance(p, ServeParams) for p in params)
    assert {(p.request_rate, p.num_warmups, p.seed, p.random_range_ratio) for p in params} == {(8.0, 3, 9, 0.0)}
    from suite.stages.serve.run import serve_command

    cmd = serve_command(vllm="vllm", base_url="http://h", served_name="s", tokenizer="t", params=params[0],
                        result_dir=Path("/r"), result_filename="f")
    assert cmd[cmd.index("--request-rate") + 1] == "8.0" and cmd[cmd.index("--seed") + 1] == "9"


def test_flags_that_say_the_defaults_plan_the_same_jobs_as_none():
    none = build_plan(parse_matrix(BASE.replace(", bench_args: ARGS", "")))
    said = build_plan(parse_matrix(BASE.replace("ARGS", '[--random-range-ratio, "0.0", --request-rate, inf, '
                                                        '--num-warmups, "1", --seed, "0"]')))
    assert [(j.key, j.hash) for j in said.jobs] == [(j.key, j.hash) for j in none.jobs]


def test_a_bad_flag_is_named_at_its_points_line(tmp_path):
    text = BASE.replace("ARGS", "[]") + "  - {isl: 64, osl: 8, concurrency: 2, bench_args: [--max-concurrency, \"2\"]}\n"
    assert error_of(tmp_path, text) == ("m.yaml:8: serve[1].bench_args: --max-concurrency is set by the suite: from "
                                        "the point's concurrency (a point per value)")
    text = BASE.replace("ARGS", '[--num-warmups, "2"]') + (
        "latency:\n  - {input_len: 8, output_len: 4, batch_size: 1, bench_args: [--num-iters, \"0\"]}\n")
    assert error_of(tmp_path, text) == "m.yaml:9: latency[0].bench_args: --num-iters 0: must be > 0"


def test_a_flag_value_is_text_as_on_the_command_line(tmp_path):
    assert "serve[0].bench_args[1]: Input should be a valid string" in error_of(
        tmp_path, BASE.replace("ARGS", "[--num-warmups, 2]"))


# ---------------------------------------------------------------- the retired fields

OLD = """\
name: t
model: {id: some/model}
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
  - {isl: 64, osl: 8, concurrency: 2, num_warmups: 2, seed: 7, request_rate: 4, random_range_ratio: 0.25}
  - {isl: 64, osl: 16, concurrency: 2, request_rate: null}
latency:
  - {input_len: 8, output_len: 4, batch_size: 1, num_iters_warmup: 1, num_iters: 5}
"""


def test_the_points_copies_of_the_bench_flags_are_retired_with_the_flag_to_write(tmp_path):
    """An old matrix gets each field's line and the flag to give in the point's (row's) bench_args, its value
    written as the tool's command line takes it (a request rate of null: inf)."""
    said = "retired: give vLLM's own flag in the point's bench_args: "
    row = "retired: give vLLM's own flag in the row's bench_args: "
    assert error_of(tmp_path, OLD).splitlines() == [
        f'm.yaml:8: serve[1].num_warmups: {said}[--num-warmups, "2"]',
        f'm.yaml:8: serve[1].seed: {said}[--seed, "7"]',
        f'm.yaml:8: serve[1].request_rate: {said}[--request-rate, "4"]',
        f'm.yaml:8: serve[1].random_range_ratio: {said}[--random-range-ratio, "0.25"]',
        f'm.yaml:9: serve[2].request_rate: {said}[--request-rate, "inf"]',
        f'm.yaml:11: latency[0].num_iters_warmup: {row}[--num-iters-warmup, "1"]',
        f'm.yaml:11: latency[0].num_iters: {row}[--num-iters, "5"]',
    ]
    # written as the messages say, it validates and plans what the old fields meant
    new = (OLD.replace('num_warmups: 2, seed: 7, request_rate: 4, random_range_ratio: 0.25',
                       'bench_args: [--num-warmups, "2", --seed, "7", --request-rate, "4", '
                       '--random-range-ratio, "0.25"]')
           .replace("request_rate: null", 'bench_args: [--request-rate, "inf"]')
           .replace("num_iters_warmup: 1, num_iters: 5", 'bench_args: [--num-iters-warmup, "1", --num-iters, "5"]'))
    jobs = build_plan(parse_matrix(new)).jobs
    serve = {j.point: j.params for j in jobs if j.kind == "serve"}
    assert serve["isl64-osl8-c2-n6"] == ServeParams(isl=64, osl=8, concurrency=2, num_prompts=6,
                                                    random_range_ratio=0.25, request_rate=4.0, num_warmups=2,
                                                    seed=7)
    assert serve["isl64-osl16-c2-n6"].request_rate is None
    assert {j.params for j in jobs if j.kind == "latency"} == {
        LatencyParams(input_len=8, output_len=4, batch_size=1, num_iters_warmup=1, num_iters=5)}


# ---------------------------------------------------------------- the shipped matrices, migrated

# The plan's jobs, (key, params) in order, of shipped matrices as main planned them before their points' bench knobs
# became bench_args: the same digest means the same jobs with the same params (a job's hash is made from its params,
# its arm and the model's resolved path, so the hash itself differs between checkouts and is not pinned here). Kernel
# jobs are left out: their params lost the gate's shape, which the bench now reads from the arm's model
# (tests/test_model_config.py). A deliberate change to one of these matrices records its digest anew.
BEFORE = {
    "gemma4-h200.yaml": ("6a9868936224b1a7", 84),  # serve: [--num-warmups, "2", --seed, "0"]
    "gemma4-below-serving.yaml": ("5421c4a8aa8a6899", 74),  # serve and latency rows
    # [--num-warmups, "8", --seed, "0"]; sized by time, num_prompts "3s" (was duration_s: 3 beside num_prompts 4x and
    # 16, the counts a first round with no measured request rate ran: that count is now the default 3x, so these
    # serving jobs' num_prompts went from 4, 16, 16 to 3, 12, 24 and their hashes with them; their keys, seconds and
    # every other param are the same; the digest before: 8ea53896eaef2c67)
    "smoke-cpu.yaml": ("289b365c2f29107a", 82),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_migrated_shipped_matrix_plans_the_jobs_it_planned_before(name):
    jobs = build_plan(load_matrix(REPO / "matrices" / name)).jobs
    digest = hashlib.sha256(json.dumps([(j.key, j.params.model_dump(mode="json")) for j in jobs if j.kind != "kernel"],
                                       sort_keys=True).encode()).hexdigest()[:16]
    assert (digest, len(jobs)) == BEFORE[name]
    for j in jobs:
        if j.kind == "serve":
            p = j.params
            assert (p.random_range_ratio, p.request_rate, p.seed) == (0.0, None, 0)
            assert p.num_warmups == (8 if name == "smoke-cpu.yaml" else 2)
            if name == "smoke-cpu.yaml":
                assert (p.duration_s, p.num_prompts, j.point.endswith("-t3s")) == (3.0, 3 * p.concurrency, True)
        if j.kind == "latency":
            assert (j.params.num_iters_warmup, j.params.num_iters) == (3, 10)


# ---------------------------------------------------------------- the kernel and layer benches' flags

OFFLINE = """\
name: t
model: {id: some/model}
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}
"""


def test_no_flags_are_the_suites_defaults_for_the_benches():
    """The defaults the blocks had: the kernel's 31 trials, not the bench's own 101."""
    assert kernel_flags([]) == KernelFlags(trace_m=2048, iters=50, trials=31)
    assert layer_flags([]) == LayerFlags(trace_m=2048, layer_index=0, iters=20, trials=51, compile="vllm")


def test_the_benches_flags_are_read_as_their_parser_reads_them():
    assert kernel_flags(["--trace-m", "64", "--calls=5", "--trials", "3", "--trials=7"]) == KernelFlags(64, 5, 7)
    assert layer_flags(["--compile", "inductor", "--layer-index=3", "--calls", "2"]) == LayerFlags(
        trace_m=2048, layer_index=3, iters=2, trials=51, compile="inductor")
    # each flag is the bench's own: its parser takes the same words and gives the same values
    args = ["--trace-m", "64", "--calls", "5", "--trials", "7"]
    parsed = kernel_parser().parse_args(["--json", "x", *args])
    assert (parsed.trace_m, parsed.calls, parsed.trials) == tuple(kernel_flags(args).__dict__.values())
    args = ["--trace-m", "64", "--layer-index", "3", "--calls", "5", "--trials", "7", "--compile", "inductor"]
    parsed = layer_parser().parse_args(["--json", "x", "--model", "m", *args])
    assert (parsed.trace_m, parsed.layer_index, parsed.calls, parsed.trials, parsed.compile) == tuple(
        layer_flags(args).__dict__.values())


@pytest.mark.parametrize("read, args, msg", [
    (kernel_flags, ["--calls", "0"], "--calls 0: must be > 0"),
    (kernel_flags, ["--trials", "100001"], "--trials 100001: 100,001 is beyond the limit 100,000"),
    (kernel_flags, ["--trace-m", "x"], "--trace-m 'x': not an integer"),
    (kernel_flags, ["--trace-m"], "--trace-m needs a value after it"),
    (kernel_flags, ["--trace-m", "1048577"], "--trace-m 1048577: 1,048,577 is beyond the limit 1,048,576"),
    (layer_flags, ["--layer-index", "-1"], "--layer-index -1: must be >= 0"),
    (layer_flags, ["--compile", "eager"], "--compile 'eager': not vllm or inductor"),
    (layer_flags, ["--compile", "eager", "--compile", "vllm"], "--compile 'eager': not vllm or inductor"),
    # plain argparse: the dashes only, no abbreviation
    (kernel_flags, ["--trace_m", "8"], "--trace_m: `python -m suite.stages.kernel.bench` spells its flags with "
     "dashes (--trace-m)"),
    (layer_flags, ["--layer_index=1"], "--layer_index: `python -m suite.stages.layer.bench` spells its flags"),
    (kernel_flags, ["--trace", "8"], "--trace: bench_args take"),
    # the flags the stage sets itself, with where they come from
    (kernel_flags, ["--model", "x"], "--model is set by the suite: the arm's model (model.id), whose config "
     "gives the gate's shape"),
    (kernel_flags, ["--m", "1,2"], "--m is set by the suite: from kernel.m (a row per value)"),
    (kernel_flags, ["--hidden", "16"], "--hidden is set by the suite: the gate's shape comes from the arm's model's"),
    (kernel_flags, ["--json", "x"], "--json is set by the suite: the result goes into the run directory"),
    (kernel_flags, ["--arm", "x"], "--arm is set by the suite: the job's arm"),
    (kernel_flags, ["--device", "cpu"], "--device is set by the suite: auto: the GPU where the arm's job runs"),
    (layer_flags, ["--tokens", "1"], "--tokens is set by the suite: from layer.tokens (a row per value)"),
    (layer_flags, ["--load-format", "dummy"], "--load-format is set by the suite: from serve_args (--load-format)"),
    (layer_flags, ["--hf-overrides", "{}"], "--hf-overrides is set by the suite: the arm's model's"),
    # any other flag of the bench: not passed through, the ones taken listed
    (kernel_flags, ["--warmup", "3"], "--warmup: bench_args take --trace-m, --calls, --trials here (the kernel "
     "bench's own flags of `python -m suite.stages.kernel.bench`)"),
    (layer_flags, ["--backend", "eager"], "--backend: bench_args take --trace-m, --layer-index, --calls, --trials, "
     "--compile here (the layer bench's own flags of `python -m suite.stages.layer.bench`)"),
    (layer_flags, ["--iters", "5"], "--iters: bench_args take"),  # the field's old name is no flag of the bench
    (layer_flags, ["inductor"], "'inductor' follows no flag"),
])
def test_flags_the_benches_or_the_suite_would_refuse_are_refused(read, args, msg):
    with pytest.raises(ValueError) as exc:
        read(args)
    assert str(exc.value).startswith(msg), str(exc.value)


def test_the_blocks_bench_args_reach_the_jobs_params_and_command():
    m = parse_matrix(OFFLINE + 'kernel: {m: [1, 4], bench_args: [--trace-m, "64", --calls, "5", --trials, "7"]}\n'
                     'layer: {tokens: [1, 2], bench_args: [--compile, inductor, --layer-index, "3", --calls, "4"]}\n')
    jobs = {j.kind: j for j in build_plan(m).jobs if j.arm == "baseline"}
    kernel, layer = jobs["kernel"], jobs["layer"]
    assert kernel.params == KernelParams(m=[1, 4], trace_m=64, iters=5, trials=7)
    assert layer.params == LayerParams(tokens=[1, 2], trace_m=2048, compile="inductor", layer_index=3, iters=4,
                                       trials=51)
    assert layer.point == "layer3"
    model = m.model_of()
    cmd = kernel_command(kernel.params, model, "o.json", "baseline")
    assert [cmd[cmd.index(f) + 1] for f in ("--m", "--trace-m", "--calls", "--trials")] == ["1,4", "64", "5", "7"]
    cmd = layer_command(layer.params, model, "o.json", "baseline")
    assert [cmd[cmd.index(f) + 1] for f in ("--tokens", "--trace-m", "--layer-index", "--calls", "--trials",
                                            "--compile")] == ["1,2", "2048", "3", "4", "51", "inductor"]


def test_bench_flags_that_say_the_defaults_plan_the_same_jobs_as_none():
    none = build_plan(parse_matrix(OFFLINE + "kernel: {m: [1]}\nlayer: {tokens: [1]}\n"))
    said = build_plan(parse_matrix(
        OFFLINE + 'kernel: {m: [1], bench_args: [--trace-m, "2048", --calls, "50", --trials, "31"]}\n'
        'layer: {tokens: [1], bench_args: [--trace-m, "2048", --layer-index, "0", --calls, "20", --trials, "51", '
        '--compile, vllm]}\n'))
    assert [(j.key, j.hash) for j in said.jobs] == [(j.key, j.hash) for j in none.jobs]


def test_a_bad_bench_flag_is_named_at_its_blocks_line(tmp_path):
    text = OFFLINE + "kernel: {m: [1]}\nlayer: {tokens: [1], bench_args: [--model, x]}\n"
    assert error_of(tmp_path, text) == "m.yaml:7: layer.bench_args: --model is set by the suite: the arm's model " \
                                       "(model.id)"
    text = OFFLINE + 'kernel: {m: [1], bench_args: [--trials, "0"]}\n'
    assert error_of(tmp_path, text) == "m.yaml:6: kernel.bench_args: --trials 0: must be > 0"


OLD_OFFLINE = OFFLINE + """\
kernel: {m: [1, 4], trace_m: 64, iters: 5, trials: 7}
layer: {tokens: [1, 2], trace_m: 2048, compile: inductor, layer_index: 3, iters: 4, trials: 51}
"""


def test_the_blocks_copies_of_the_benches_flags_are_retired_with_the_flag_to_write(tmp_path):
    """An old kernel or layer block gets each field's line and the bench's own flag to give in its bench_args (the
    calls per sample: the benches' --calls); written so, it plans the very jobs the old block planned."""
    kernel = "retired: give the kernel bench's own flag in kernel.bench_args: "
    layer = "retired: give the layer bench's own flag in layer.bench_args: "
    assert error_of(tmp_path, OLD_OFFLINE).splitlines() == [
        f'm.yaml:6: kernel.trace_m: {kernel}[--trace-m, "64"]',
        f'm.yaml:6: kernel.iters: {kernel}[--calls, "5"]',
        f'm.yaml:6: kernel.trials: {kernel}[--trials, "7"]',
        f'm.yaml:7: layer.trace_m: {layer}[--trace-m, "2048"]',
        f'm.yaml:7: layer.compile: {layer}[--compile, "inductor"]',
        f'm.yaml:7: layer.layer_index: {layer}[--layer-index, "3"]',
        f'm.yaml:7: layer.iters: {layer}[--calls, "4"]',
        f'm.yaml:7: layer.trials: {layer}[--trials, "51"]',
    ]
    new = (OLD_OFFLINE.replace("trace_m: 64, iters: 5, trials: 7", 'bench_args: [--trace-m, "64", --calls, "5", '
                                                                    '--trials, "7"]')
           .replace("trace_m: 2048, compile: inductor, layer_index: 3, iters: 4, trials: 51",
                    'bench_args: [--trace-m, "2048", --compile, "inductor", --layer-index, "3", --calls, "4", '
                    '--trials, "51"]'))
    params = {j.kind: j.params.model_dump() for j in build_plan(parse_matrix(new)).jobs}
    assert params == {"kernel": {"m": [1, 4], "trace_m": 64, "iters": 5, "trials": 7, "hidden": None,
                                 "experts": None},
                      "layer": {"tokens": [1, 2], "trace_m": 2048, "compile": "inductor", "layer_index": 3,
                                "iters": 4, "trials": 51}}


# What the plan hashed of each kernel and layer job of the shipped matrices before their blocks' flags became
# bench_args: the old blocks' fields, dumped (the kernel's without the gate's shape, which it no longer had). A job's
# hash is made from these, its arm and the model, none of which the change touched, so the same content is the same
# hash: runs of these matrices resume across the change.
OLD_KERNEL = {"m": [1, 2, 4, 8, 16, 32], "trace_m": 2048, "iters": 50, "trials": 31}
OLD_LAYER = {"tokens": [1, 2, 4, 8], "trace_m": 2048, "compile": "vllm", "layer_index": 0, "iters": 20, "trials": 51}
OFFLINE_BEFORE = {
    "gemma4-below-serving.yaml": {"kernel/gate": OLD_KERNEL, "layer/layer0": OLD_LAYER},
    "gemma4-h200-layer.yaml": {"kernel/gate": OLD_KERNEL, "layer/layer0": OLD_LAYER},
    "gemma4-h200-layer-decide.yaml": {"layer/layer0": OLD_LAYER},
    "gemma4-h200-stages.yaml": {"kernel/gate": OLD_KERNEL},
}


@pytest.mark.parametrize("name", sorted(OFFLINE_BEFORE))
def test_a_migrated_shipped_matrix_hashes_its_kernel_and_layer_jobs_as_before(name):
    jobs = [j for j in build_plan(load_matrix(REPO / "matrices" / name)).jobs if j.kind in ("kernel", "layer")]
    assert jobs
    for j in jobs:
        hashed = j.params.hashed() if hasattr(j.params, "hashed") else j.params.model_dump(mode="json")
        assert hashed == OFFLINE_BEFORE[name][j.key.rsplit("/", 1)[0]], j.key


STORED = REPO / "docs" / "evidence"


@pytest.mark.parametrize("run, fields, unwritten", [
    ("h200-layer-vllm-20261202", {"kernel": {"hidden": 2816, "experts": 128, **OLD_KERNEL}, "layer": OLD_LAYER}, set()),
    ("h200-layer-20261202", {"layer": OLD_LAYER}, {"compile"}),  # recorded before the layer bench took --compile
    ("h100-layer-decide-20261205", {"layer": OLD_LAYER}, set()),
])
def test_stored_kernel_and_layer_records_load_as_they_were_written(tmp_path, run, fields, unwritten):
    """The job records of stored runs load into the params types with the fields they were written with (a field
    a record lacks at the default it was read with before), and their hashes are what the records say."""
    unpack = load_script(REPO / "scripts" / "evidence_reports.py", "evidence_reports").unpack
    from suite.analysis import load_run

    run_dir = unpack(STORED / run, tmp_path / run)
    records = [r for r in load_run(run_dir).store.records() if r.job.kind in ("kernel", "layer")]
    assert {r.job.kind for r in records} == set(fields)
    for r in records:
        assert isinstance(r.job.params, KernelParams if r.job.kind == "kernel" else LayerParams)
        written = json.loads(next(run_dir.glob(f"{r.job.arm}/{r.job.key}.job.json")).read_text())["job"]
        loaded = r.job.params.model_dump(exclude_none=True)
        assert loaded == fields[r.job.kind]
        assert written["params"] == {k: v for k, v in loaded.items() if k not in unwritten}
        assert r.job.hash == written["hash"]
