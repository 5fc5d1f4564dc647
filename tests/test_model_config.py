"""The router gate's shape comes from the arm's model's config (suite.model_config.gate_shape), read by the kernel
bench where its job runs: each model family's keys, the error for a config without a gate, the stage's command
from a shipped matrix against the command a stored run of the same matrix ran, and that stored run read back."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from suite.fixtures.gemma4 import generate, text_config
from suite.matrix_load import gate_shape_problems, load_matrix, parse_matrix
from suite.model_config import EXPERTS_KEYS, GateShape, gate_shape, local_config, read_config
from suite.plan import build_plan
from suite.stages.kernel import bench
from suite.stages.kernel.run import kernel_command
from suite.stages.kernel.spec import KernelParams
from tests.conftest import REPO, load_script

unpack = load_script(REPO / "scripts" / "evidence_reports.py", "evidence_reports").unpack
STAGES_RUN = REPO / "docs" / "evidence" / "h200-stages-20261202"  # a stored run of matrices/gemma4-h200-stages.yaml

# Config dicts as the hub's config.json files hold them (the keys vLLM's model code reads)
GEMMA4_MM = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
             "text_config": {"model_type": "gemma4_text", "hidden_size": 2816, "enable_moe_block": True,
                             "num_experts": 128, "top_k_experts": 8}, "vision_config": {"hidden_size": 1152}}
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8}
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_local_experts": 8}
DBRX = {"architectures": ["DbrxForCausalLM"], "d_model": 6144, "ffn_config": {"moe_num_experts": 16}}


@pytest.mark.parametrize(("config", "shape"), [
    (text_config(6), GateShape(2816, 128)),  # the Gemma 4 generator's text config
    (GEMMA4_MM, GateShape(2816, 128)),  # Gemma 4 26B-A4B-it on the hub: the gate's keys in its text_config
    (QWEN3_MOE, GateShape(2048, 128)),
    (DEEPSEEK_V3, GateShape(7168, 256)),  # the routed experts; a shared expert is no gate output
    (MIXTRAL, GateShape(4096, 8)),
    (DBRX, GateShape(6144, 16)),
], ids=["gemma4-generated", "gemma4-hub", "qwen3-moe", "deepseek-v3", "mixtral", "dbrx"])
def test_each_family_gives_its_gate_shape(config, shape):
    assert gate_shape(config) == shape


def test_a_generated_tiny_moe_gives_its_own_shape(tiny_model):
    assert gate_shape(read_config(str(tiny_model))) == GateShape(128, 8)  # Mixtral: num_local_experts


def test_a_generated_gemma4_model_directory_gives_the_real_shape(tmp_path):
    model = generate("gemma4-26b-a4b-6l", tmp_path / "g4", vocab_size=4096)
    assert gate_shape(read_config(str(model))) == GateShape(2816, 128)


@pytest.mark.parametrize("config", [
    {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096},  # dense: no routed experts
    {"text_config": {"hidden_size": 2816, "num_experts": 128, "enable_moe_block": False}},  # Gemma 4 dense
    {"num_experts": 8},  # no hidden size
    {"hidden_size": 4096, "num_experts": None},  # null, as a dense Gemma 4 writes it
])
def test_a_config_without_a_gate_names_the_model_and_the_keys_tried(config):
    with pytest.raises(ValueError) as err:
        gate_shape(config, "org/dense-model")
    msg = str(err.value)
    assert msg.startswith("org/dense-model: its config gives no router gate shape")
    assert all(key in msg for key in ("hidden_size", *EXPERTS_KEYS))


def test_local_and_hub_configs_are_read_and_unreadable_ones_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_MOE))
    assert read_config(str(tmp_path)) == local_config(str(tmp_path)) == QWEN3_MOE
    assert local_config("org/not-a-directory") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no readable config.json"):
        read_config(str(empty))


def _toy_gate(hidden: int, experts: int, device: str, seed: int) -> tuple[torch.nn.Module, dict]:
    """A gate of the given shape without vLLM (the bench's --gate-factory)."""
    gate = torch.nn.Linear(hidden, experts, bias=False).to(device=device, dtype=torch.bfloat16)
    return gate, {"source": "test toy gate"}


def test_the_bench_reads_the_shape_from_the_models_config(tmp_path):
    """The kernel job's process: --model gives the shape (written into the result); by hand, --hidden and
    --experts still do; both at once, or a model without a gate, stop the bench with the reason."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**MIXTRAL, "hidden_size": 32, "num_local_experts": 4}))
    quick = ["--m", "1,2", "--trace-m", "4", "--calls", "1", "--trials", "2", "--warmup", "1", "--device", "cpu",
             "--backend", "eager", "--gate-factory", f"{__name__}:_toy_gate", "--quiet"]
    out = tmp_path / "k.json"
    assert bench.main(["--json", str(out), "--model", str(tmp_path / "m"), *quick]) == 0
    shape = json.loads(out.read_text())["shape"]
    assert (shape["hidden"], shape["experts"], shape["model"]) == (32, 4, str(tmp_path / "m"))
    assert bench.main(["--json", str(out), "--hidden", "16", "--experts", "2", *quick]) == 0
    shape = json.loads(out.read_text())["shape"]
    assert (shape["hidden"], shape["experts"], "model" in shape) == (16, 2, False)  # as before: no model
    with pytest.raises(SystemExit, match="drop --hidden and --experts, or drop --model"):
        bench.main(["--json", str(out), "--model", str(tmp_path / "m"), "--hidden", "16", *quick])
    (tmp_path / "m" / "config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(SystemExit, match="its config gives no router gate shape, no routed experts"):
        bench.main(["--json", str(out), "--model", str(tmp_path / "m"), *quick])


def _stored_command(tmp_path) -> list[str]:
    run = unpack(STAGES_RUN, tmp_path / STAGES_RUN.name)
    record = json.loads((run / "baseline" / "kernel" / "h2816-e128" / "rep-0.job.json").read_text())
    return record["command"]


def test_the_stages_command_from_a_migrated_matrix_times_the_gate_the_old_one_did(tmp_path, monkeypatch):
    """matrices/gemma4-h200-stages.yaml said kernel: {hidden: 2816, experts: 128, ...}; its stored run's kernel
    job ran the bench with those. The migrated matrix's job passes the arm's (generated) model instead, and the
    bench resolves it to the same shape and every other setting alike."""
    monkeypatch.chdir(tmp_path)
    matrix = load_matrix(REPO / "matrices" / "gemma4-h200-stages.yaml")
    (job,) = [j for j in build_plan(matrix).jobs if j.kind == "kernel" and j.arm == "baseline"]
    assert isinstance(job.params, KernelParams) and job.point == "gate"
    model = replace(matrix.model_of(matrix.arms["baseline"]), id=str(generate("gemma4-26b-a4b", tmp_path / "g4", vocab_size=4096)))
    new = kernel_command(job.params, model, "out.json", "baseline")
    old = _stored_command(tmp_path)
    old = old[old.index("--json"):]  # the interpreter the run had
    assert old[old.index("--hidden"):old.index("--hidden") + 4] == ["--hidden", "2816", "--experts", "128"]
    assert new[new.index("--model") + 1] == model.id and "--hidden" not in new
    parse = bench.build_parser().parse_args
    new_args, old_args = parse(new[3:]), parse(old)
    assert bench.gate_shape_of(new_args) == bench.gate_shape_of(old_args) == (2816, 128)
    same = ("m", "trace_m", "calls", "trials", "warmup", "backend", "device", "seed", "arm")
    assert {k: getattr(new_args, k) for k in same} == {k: getattr(old_args, k) for k in same}


def test_a_stored_run_with_kernel_jobs_loads_and_reports_the_same_shape(tmp_path):
    """A run recorded while the matrix gave the shape: its job records (params with hidden and experts) load,
    its results say 2816 x 128, and its report's kernel section says the same."""
    from suite.analysis import load_run
    from suite.cli import main
    from suite.stages.kernel.read import load_kernel_runs

    run_dir = unpack(STAGES_RUN, tmp_path / STAGES_RUN.name)
    run = load_run(run_dir)
    kernel = [r for r in run.store.records() if r.job.kind == "kernel"]
    assert kernel and all(isinstance(r.job.params, KernelParams) for r in kernel)
    assert {(r.job.params.hidden, r.job.params.experts, r.job.point) for r in kernel} == {(2816, 128, "h2816-e128")}
    # the record's hash is what the plan hashed then: the params as recorded, the shape among them
    assert all(r.job.params.hashed()["hidden"] == 2816 for r in kernel)
    by_arm, unreadable = load_kernel_runs(run.store, kernel)
    assert not unreadable
    assert {(res.shape.hidden, res.shape.experts) for rounds in by_arm.values() for res in rounds.values()} == {
        (2816, 128)}
    assert main(["report", str(run_dir)]) == 0
    assert "Gate 2816×128 (bfloat16 in, float32 out" in (run_dir / "report.md").read_text()


def test_a_local_model_without_a_gate_is_named_before_anything_runs(tmp_path):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"hidden_size": 64, "model_type": "llama"}))
    text = (f"name: t\nmodel: {{id: {dense}}}\narms:\n  A: {{vllm: '0.32.0'}}\n  B: {{vllm: '0.32.0'}}\n"
            "kernel: {m: [1]}\n")
    (problem,) = gate_shape_problems(parse_matrix(text))
    assert problem.startswith(f"kernel: {dense}: its config gives no router gate shape")
    assert gate_shape_problems(parse_matrix(text.replace("kernel: {m: [1]}", "latency: [{input_len: 8, output_len: "
                                                                             "4, batch_size: 1}]"))) == []
