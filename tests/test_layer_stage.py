"""The layer stage (seed 000's first table): the matrix block, its plan, the command each arm runs, the gate-path
bookkeeping inside a compiled layer, the section's numbers; and the bench itself on vLLM's real Gemma 4 layer
(a scaled-down config, CPU)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from suite.errors import MatrixError
from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.stages.layer.bench import GATE_BEGIN, GATE_END, gate_calls
from suite.stages.layer.read import LayerRun
from suite.stages.layer.run import layer_command
from suite.stages.layer.spec import layer_points
from suite.stages.layer.summary import layer_section, layer_table
from tests.conftest import REPO

MATRIX = """\
name: layer-only
model: {id: /models/g4, generate: gemma4-26b-a4b-6l}
serve_args: [--max-model-len, "4096", --load-format, dummy]
arms:
  baseline: {vllm: "0.26.0"}
  ll-bf16: {vllm: "0.26.0", patches: [ll-bf16-router-gemm-dispatch]}
layer: {tokens: [1, 2, 4, 8]}
repeats: 3
"""


def test_a_layer_only_matrix_plans_one_process_per_arm_and_round():
    matrix = parse_matrix(MATRIX, source="m.yaml")
    plan = build_plan(matrix)
    jobs = [j for s in plan.sessions for j in s.jobs]
    assert {j.kind for j in jobs} == {"layer"} and len(jobs) == 6
    assert sorted((j.arm, j.repeat) for j in jobs) == [(a, r) for a in ("baseline", "ll-bf16") for r in range(3)]
    assert {j.point for j in jobs} == {"layer0"}
    assert not any(s.needs_server for s in plan.sessions)


def test_nothing_to_measure_names_the_layer_block():
    with pytest.raises(MatrixError, match="give serve, latency, accuracy, kernel, layer or profile"):
        parse_matrix(MATRIX.replace("layer: {tokens: [1, 2, 4, 8]}\n", ""), source="m.yaml")


def test_each_arm_runs_the_bench_with_the_models_own_engine_flags():
    matrix = parse_matrix(MATRIX, source="m.yaml")
    (_, params), = layer_points(matrix)
    cmd = layer_command(params, matrix.model_of(matrix.arms["ll-bf16"]), "/out/rep-0.json", "ll-bf16")
    assert cmd[:3] == ["python", "-m", "suite.stages.layer.bench"]
    assert cmd[cmd.index("--tokens") + 1] == "1,2,4,8" and cmd[cmd.index("--trace-m") + 1] == "2048"
    assert cmd[cmd.index("--model") + 1] == "/models/g4" and cmd[cmd.index("--compile") + 1] == "vllm"
    # a generated model: --load-format dummy and the --hf-overrides transformers 5.x needs, as `vllm serve` gets
    assert cmd[-4:] == matrix.model_of().model_args() and cmd[-4] == "--load-format" and cmd[-2] == "--hf-overrides"


def test_the_gates_own_calls_are_told_apart_from_the_layers_other_gemms():
    # eager: everything in call order; the MLP's F.linear outside the gate's brackets
    assert gate_calls(["F.linear", GATE_BEGIN, "ll_bf16_gemm", GATE_END, "F.linear"]) == ["ll_bf16_gemm"]
    # compiled, frozen branch: the traced torch.mm is replayed inside the brackets
    assert gate_calls(["F.linear", "F.linear", GATE_BEGIN, "torch.mm", GATE_END]) == ["torch.mm"]
    # compiled, dispatch op: its kernel ran during the graph, before the replayed brackets; the op is the profiler's
    labels = ["ll_bf16_gemm", "F.linear", GATE_BEGIN, GATE_END, "vllm::ll_bf16_router_gemm_dispatch"]
    assert gate_calls(labels) == ["ll_bf16_gemm", "vllm::ll_bf16_router_gemm_dispatch"]
    # a general kernel outside the brackets is another layer's
    assert gate_calls(["torch.mm", GATE_BEGIN, GATE_END]) == []


def _run(arm: str, medians: dict[int, float], path: str = "torch.mm") -> LayerRun:
    return LayerRun.model_validate({
        "arm": arm, "layer": {"class": "vllm.model_executor.models.gemma4.Gemma4DecoderLayer", "layer_index": 0,
                              "layer_type": "sliding_attention", "num_layers": 30, "subgraph": "FFN + MoE",
                              "hidden": 2816, "experts": 128, "top_k": 8, "dtype": "bfloat16",
                              "load_format": "dummy", "gate": "router.proj: GateLinear"},
        "compile": {"backend": "inductor", "trace_m": 2048, "trace_path": path},
        "timing": {"method": "cuda_graph_replay", "calls_per_sample": 20, "samples": 51},
        "device": {"name": "NVIDIA H200"},
        "results": [{"m": t, "median_us": us, "p10_us": us * 0.99, "p90_us": us * 1.01, "path": path,
                     "eager_path": path} for t, us in medians.items()]})


def test_seed_000s_table_from_the_processes_geometric_means():
    runs = {"baseline": {0: _run("baseline", {1: 81.0, 2: 119.0}), 1: _run("baseline", {1: 82.0, 2: 120.0})},
            "ll-bf16": {0: _run("ll-bf16", {1: 77.0, 2: 116.0}), 1: _run("ll-bf16", {1: 78.0, 2: 115.0})}}
    table = layer_table(runs, "baseline", 30)
    base, cand = math.sqrt(81.0 * 82.0), math.sqrt(77.0 * 78.0)
    row = [c.text for c in table.rows[0]]
    assert row == ["1", f"{base:.2f} [81.00–82.00]", f"{cand:.2f} [77.00–78.00]", f"{cand - base:+.2f}",
                   f"{(cand - base) * 30:+.1f}", f"{(base / cand - 1) * 100:+.2f}%"]
    section = layer_section(runs, "baseline")
    names = [getattr(b, "name", None) for b in section.blocks]
    assert names[1:4] == ["layer", "layer-processes", "layer-paths"]  # no reference GEMM stored: no table


def test_the_section_states_the_gpu_clock_the_timings_ran_at():
    runs = {}
    for arm, clock in (("baseline", 1980), ("ll-bf16", 1755)):
        stored = _run(arm, {1: 80.0}).model_dump(by_alias=True)
        stored["results"][0]["sm_clock_mhz"] = clock
        stored["timing"]["warm_s"] = 1.0
        runs[arm] = {0: LayerRun.model_validate(stored)}
    texts = [b.text for b in layer_section(runs, "baseline").blocks if hasattr(b, "text")]
    assert ("SM clock right after each T's timed replays, over every process: 1755–1980 MHz, each T's graph "
            "replayed for 1 s first.") in texts
    # results stored without a clock (CPU, or an older bench) say nothing of it
    assert not any("SM clock" in b.text for b in layer_section({"baseline": {0: _run("baseline", {1: 80.0})}},
                                                                "baseline").blocks if hasattr(b, "text"))


def test_a_dispatch_op_alone_in_the_compiled_path_is_read_as_its_run_time_path():
    """The compiled layer's list appends are rebuilt after the graph, erasing what the op's body appended: the
    stored path is the op alone; read back, it is the op's eager path at that T, not a frozen branch."""
    op = "vllm::ll_bf16_router_gemm_dispatch"
    run = _run("ll-bf16", {1: 77.0}, path=op)
    stored = run.model_dump(by_alias=True)
    stored["results"][0].update(eager_path=f"{op} -> ll_bf16_gemm", frozen_branch=True)
    stored["frozen_branch_ms"] = [1]
    read = LayerRun.model_validate(stored)
    assert read.results[0].path == f"{op} -> ll_bf16_gemm" and not read.results[0].frozen_branch
    assert read.frozen_branch_ms == []
    # a real frozen branch stays one
    frozen = _run("baseline", {1: 81.0}).model_dump(by_alias=True)
    frozen["results"][0].update(eager_path="ll_bf16_gemm", frozen_branch=True)
    assert LayerRun.model_validate(frozen).frozen_branch_ms == [1]


@pytest.mark.e2e
@pytest.mark.parametrize("compile_with", ["vllm", "inductor"])
def test_the_bench_times_vllms_own_gemma4_layer(tmp_path, compile_with):
    """vLLM's real Gemma4DecoderLayer (a scaled-down config: hidden 256, 16 experts, top-4), built, loaded by
    vLLM's dummy loader, compiled (by vLLM's own support_torch_compile, or plain inductor), timed; on a CPU the
    gate has no size branch, so no frozen branch."""
    from suite.fixtures.gemma4 import text_config

    config = text_config(6, vocab_size=1024)
    config.update(hidden_size=256, intermediate_size=192, moe_intermediate_size=64, num_experts=16,
                  top_k_experts=4, num_attention_heads=2, num_key_value_heads=1, num_global_key_value_heads=1,
                  head_dim=64, global_head_dim=128, max_position_embeddings=8192)
    model = tmp_path / "g4"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "suite.stages.layer.bench", "--json", str(out), "--model",
                           str(model), "--tokens", "1,3", "--trace-m", "320", "--calls", "3", "--trials", "3",
                           "--layer-index", "5", "--compile", compile_with], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    layer = result["layer"]
    assert layer["class"] == "vllm.model_executor.models.gemma4.Gemma4DecoderLayer"
    assert layer["layer_type"] == "full_attention" and layer["num_layers"] == 6  # layer 5: the full one
    assert (layer["hidden"], layer["experts"], layer["top_k"]) == (256, 16, 4)
    assert [r["m"] for r in result["results"]] == [1, 3]
    for r in result["results"]:
        assert r["median_us"] > 0 and len(r["samples_us"]) == 3
        assert r["path"] != "none" and r["path"] == r["eager_path"] and not r["frozen_branch"]
        assert not r["recompiled"]  # traced once at T=320: one graph serves every T
    assert result["compile"]["dynamo_graphs_at_trace"] == 1
    assert result["compile"]["backend"] == ("vllm" if compile_with == "vllm" else "inductor")
    assert result["compile"]["env"] == ({"VLLM_DISABLE_COMPILE_CACHE": "1"} if compile_with == "vllm"
                                        else {"VLLM_USE_LAYERNAME": "0"})
