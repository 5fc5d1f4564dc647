"""Gate probe end to end: real `vllm serve` (tiny MoE, CPU, eager) with the probe plugin, through the CLI.

Two arms: the installed vLLM, and the overlay with synthetic-gate-delay (50 us). On CPU every gate takes
tier 6 (ReplicatedLinear -> vLLM's CPU GEMM); the patched arm must also show its custom op in every bucket.
"""

from __future__ import annotations

import json

import pytest

from suite.stages.probe.plugin import SEP
from tests.conftest import processes_mentioning, run_matrix_once

pytestmark = pytest.mark.e2e

MATRIX = """\
name: probe-e2e
model: {{id: {model}}}
runtime: {{kind: local, startup_timeout_s: 600}}
serve_args: [--served-model-name, tiny-moe, --max-model-len, "512", --dtype, bfloat16, --max-num-seqs, "8", --enforce-eager]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  baseline: {{vllm: "0.32.0"}}
  patched: {{vllm: "0.32.0", patches: [synthetic-gate-delay], env: {{SUITE_GATE_DELAY_US: "50"}}}}
serve:
  - {{isl: 16, osl: 4, concurrency: [1], num_prompts: 1}}
probe: true
"""

TIER6 = "F.linear (tier 6: ReplicatedLinear)"
DELAY = "torch.ops.vllm.suite_gate_delay"
GATES_PER_STEP = 2  # the tiny MoE has two MoE layers


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory, tiny_model):
    _, run_dir, proc = run_matrix_once(tmp_path_factory.mktemp("probe"), MATRIX.format(model=tiny_model))
    return run_dir, proc


def _result(run_dir, arm):
    return json.loads((run_dir / arm / "probe" / "gate-paths" / "rep-0.json").read_text())


def test_run_succeeds(probe_run):
    run_dir, proc = probe_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jobs: 4 ok, 0 failed, 0 missing" in proc.stdout


def test_each_bucket_reachable_with_max_num_seqs_8_ran_eager_with_one_gate_call_per_layer_and_step(probe_run):
    run_dir, _ = probe_run
    for arm in ("baseline", "patched"):
        buckets = _result(run_dir, arm)["buckets"]
        # prefills of 12, 24, 100, 200 tokens; decode steps with 1, 2, 4 and 8 running requests
        for label in ("1", "2-4", "5-8", "9-16", "17-32", "33-128", ">128"):
            b = buckets[label]
            assert b["steps"] > 0, (arm, label, b)
            assert b["verdict"] == "eager (GateLinear.forward ran)", (arm, label, b)
            assert b["forward_calls"] == GATES_PER_STEP * b["steps"], (arm, label, b)
            assert sum(b["paths"].values()) == b["forward_calls"]
        assert all(not b["outside"] for b in buckets.values()), arm  # eager: no op call outside forward


def test_cpu_gates_take_tier6_and_only_the_patched_arm_runs_the_delay_op(probe_run):
    run_dir, _ = probe_run
    base, patched = _result(run_dir, "baseline"), _result(run_dir, "patched")
    for label, b in base["buckets"].items():
        for path in b["paths"]:
            labels = path.split(SEP)
            assert labels[0] == TIER6 and DELAY not in labels, (label, path)
    for label, b in patched["buckets"].items():
        for path in b["paths"]:
            labels = path.split(SEP)
            assert labels[:2] == [DELAY, TIER6], (label, path)
    assert "suite_gate_delay" in patched["present_ops"] and "suite_gate_delay" not in base["present_ops"]
    gates = [g for p in base["processes"] for g in p["gates"]]
    assert len(gates) == GATES_PER_STEP and all(g["allow_ll_bf16_gemm"] == "False" for g in gates)


def test_report_shows_paths_per_arm_and_bucket(probe_run):
    run_dir, _ = probe_run
    report = (run_dir / "report.md").read_text()
    assert "## Gate paths (probe)" in report
    section = report.split("## Gate paths (probe)", 1)[1].split("\n## ", 1)[0]
    assert "| M | baseline | patched |" in section
    for label in ("1", "2-4", "5-8", "9-16", "17-32", "33-128", ">128"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {label} |"))
        _, base_cell, patched_cell = row.strip().strip("|").split("|")
        assert TIER6 in base_cell and DELAY not in base_cell, row
        assert TIER6 in patched_cell and DELAY in patched_cell, row
    assert "**Gate paths differ** between `baseline` and `patched`" in section
    assert "`patched`: `torch.ops.vllm.suite_gate_delay` ran" in section
    assert "never ran" not in section


def test_probe_stopped_before_the_serve_job_and_no_process_is_left(probe_run):
    run_dir, _ = probe_run
    for arm in ("baseline", "patched"):
        files = list((run_dir / arm / "probe" / "procs" / "server-0").glob("*.json"))
        assert files, arm
        final = [json.loads(f.read_text()) for f in files]
        # the STOP file ended the probe in every process (the serve job after it ran unwrapped)
        assert all(not f["active"] for f in final), arm
        assert all(not f["errors"] for f in final), [f["errors"] for f in final]
    assert processes_mentioning(str(run_dir)) == []
