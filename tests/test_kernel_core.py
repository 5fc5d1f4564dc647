"""The router-gate microbenchmark's core without vLLM: statistics, path labels, frozen-branch detection on
toy gates under the same guard-free compile, the markdown section and the CLI's argument checks."""

from __future__ import annotations

import types

import pytest
import torch

from suite.commands.kernel import parse_arm_args, parse_arms
from suite.errors import SuiteError
from suite.stages.kernel.bench import MeasureConfig, measure_gate
from suite.stages.kernel.gate_paths import PathRecorder, classify
from suite.stages.kernel.read import KernelRun
from suite.stages.kernel.summary import comparison_rows, render_kernel_md, render_kernel_text
from suite.stages.kernel.timing import percentile, summarize

# Toy "kernel module": gates look the fast kernel up here at call time, as GateLinear does with ll_bf16.
toy_kernels = types.ModuleType("toy_kernels")


def _fast(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() @ w.float().t()).contiguous()


toy_kernels.fast = _fast


@torch.library.custom_op("suite_test::toy_router_dispatch", mutates_args=())
def toy_router_dispatch(x: torch.Tensor, w: torch.Tensor, max_tokens: int) -> torch.Tensor:
    if x.shape[0] <= max_tokens:
        return toy_kernels.fast(x, w)
    return torch.mm(x.float(), w.float().t())


@toy_router_dispatch.register_fake
def _(x: torch.Tensor, w: torch.Tensor, max_tokens: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)


class BranchGate(torch.nn.Module):
    """Python branch on M, like GateLinear's Tier 1 (frozen by a guard-free compile)."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= 16:
            return toy_kernels.fast(x, self.weight)
        return torch.mm(x.float(), self.weight.float().t())


class OpGate(BranchGate):
    """The same decision inside a custom op (opaque to compile)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.suite_test.toy_router_dispatch(x, self.weight, 16)


def _measure(gate_cls: type[BranchGate]) -> dict[int, object]:
    w = torch.randn(8, 32).to(torch.bfloat16)
    rec = PathRecorder(op_namespace="suite_test", op_pattern="router")
    rec.wrap_attribute("fast", toy_kernels, "fast", rebind_modules=False)
    rec.wrap_attribute("torch.mm", torch, "mm", rebind_modules=False)
    try:
        cfg = MeasureConfig(
            hidden=32, experts=8, m_values=(1, 4, 16, 32), trace_m=64, calls=2, trials=3, warmup=1
        )
        cfg.backend = "eager"
        results, info = measure_gate(gate_cls(w), rec, cfg, "cpu")
    finally:
        rec.uninstall()
    assert toy_kernels.fast is _fast
    return {r.m: r for r in results} | {"info": info}


def test_percentiles_and_summary():
    s = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(s, 50) == 3.0
    assert percentile(s, 10) == pytest.approx(1.4)
    assert percentile([7.0], 90) == 7.0
    got = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert got == {"median_us": 3.0, "p10_us": pytest.approx(1.4), "p90_us": pytest.approx(4.6)}
    with pytest.raises(ValueError):
        percentile([], 50)


def test_classify_prefers_the_most_specific_leaf():
    assert classify([]) == "none"
    assert classify(["torch.mm"]) == "torch.mm"
    assert classify(["torch.mm", "ll_bf16_gemm"]) == "ll_bf16_gemm"
    assert classify(["vllm::ll_bf16_router_gemm_dispatch", "ll_bf16_gemm"]) == (
        "vllm::ll_bf16_router_gemm_dispatch -> ll_bf16_gemm"
    )
    assert classify(["onednn_mm", "F.linear"]) == "onednn_mm"


def test_python_branch_is_flagged_frozen_after_a_large_trace():
    res = _measure(BranchGate)
    assert res["info"]["trace_path"] == "torch.mm"
    for m in (1, 4, 16):
        assert res[m].eager_path == "fast"
        assert res[m].path == "torch.mm"
        assert res[m].frozen_branch
        assert res[m].n == 3 and res[m].p10_us <= res[m].median_us <= res[m].p90_us
    assert res[32].path == "torch.mm" and not res[32].frozen_branch


def test_custom_op_dispatch_is_not_frozen_and_its_op_is_recorded():
    res = _measure(OpGate)
    assert res["info"]["trace_path"] == "suite_test::toy_router_dispatch -> torch.mm"
    for m in (1, 4, 16):
        assert res[m].path == "suite_test::toy_router_dispatch -> fast"
        assert res[m].eager_path == res[m].path
        assert not res[m].frozen_branch
        assert res[m].calls == {"fast": 1, "suite_test::toy_router_dispatch": 1}
    assert res[32].path == "suite_test::toy_router_dispatch -> torch.mm"


def _fake_result(arm: str, medians: dict[int, float], path: str, frozen: tuple[int, ...] = ()) -> KernelRun:
    return KernelRun.model_validate({
        "arm": arm,
        "shape": {"hidden": 2816, "experts": 128, "dtype": "bfloat16", "out_dtype": "float32", "bias": False},
        "compile": {"backend": "inductor", "trace_m": 2048, "trace_path": "torch.mm"},
        "timing": {"method": "cuda_graph_replay", "calls_per_sample": 50, "samples": 101},
        "device": {"name": "NVIDIA H200"},
        "torch_version": "2.11.0+cu130",
        "vllm_version": "0.33.0",
        "gate": {"class": "X"},
        "frozen_branch_ms": list(frozen),
        "results": [
            {
                "m": m,
                "median_us": v,
                "p10_us": v * 0.9,
                "p90_us": v * 1.1,
                "n": 101,
                "path": path,
                "eager_path": "ll_bf16_gemm",
                "frozen_branch": m in frozen,
            }
            for m, v in medians.items()
        ],
    })


def test_report_section_speedup_spread_and_frozen_marker():
    base = _fake_result("baseline", {1: 6.0, 16: 7.0}, "torch.mm", frozen=(1, 16))
    patched = _fake_result("patched", {1: 1.5, 16: 2.8}, "vllm::ll_bf16_router_gemm_dispatch -> ll_bf16_gemm")
    results = {"baseline": base, "patched": patched}
    rows = comparison_rows(results, "baseline")
    assert [r.m for r in rows] == [1, 16]
    assert rows[0].arms["patched"].speedup == pytest.approx(4.0)
    md = render_kernel_md(results, "baseline")
    assert "| 1 | 6.00 [5.40–6.60] | 1.50 [1.35–1.65] | 4.00× |" in md
    assert "| 16 | 7.00 [6.30–7.70] | 2.80 [2.52–3.08] | 2.50× |" in md
    assert "**frozen branch** (eager: `ll_bf16_gemm`)" in md
    assert "baseline: frozen branch at M = 1, 16" in md
    text = render_kernel_text(results, "baseline")
    assert "4.00x" in text and "FROZEN" in text
    with pytest.raises(KeyError):
        comparison_rows(results, "nope")


def test_arm_specs_are_checked(tmp_path):
    assert parse_arms(["a=", f"b={tmp_path}"]) == [("a", ""), ("b", str(tmp_path))]
    for bad in (["noequals"], ["a=", "a="], [f"bad name={tmp_path}"], ["a=/does/not/exist"]):
        with pytest.raises(SuiteError):
            parse_arms(bad)
    assert parse_arm_args(["a=--x 1", "a=--y"], ["a", "b"]) == {"a": ["--x", "1", "--y"]}
    with pytest.raises(SuiteError):
        parse_arm_args(["c=--x"], ["a", "b"])


def test_across_processes_pairs_the_rounds_and_judges_each_m():
    """Three processes per arm: at M=1 the candidate is 10 % slower in every process (worse), at M=16 it
    swings either way with the process (not significant); the cells are the medians' geometric means."""
    import math
    import statistics

    from suite.render import markdown
    from suite.stages.kernel.summary import across_processes

    base = {r: _fake_result("baseline", {1: v1, 16: v16}, "torch.mm")
            for r, (v1, v16) in enumerate([(6.0, 7.0), (6.6, 7.4), (5.7, 6.9)])}
    cand = {r: _fake_result("patched", {1: v1, 16: v16}, "torch.mm")
            for r, (v1, v16) in enumerate([(6.0 * 1.095, 7.3), (6.6 * 1.1, 7.0), (5.7 * 1.105, 7.1)])}
    md = markdown.table(across_processes({"baseline": base, "patched": cand}, "baseline"))
    row1 = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    gm = statistics.geometric_mean([6.0, 6.6, 5.7])
    gm_c = statistics.geometric_mean([6.0 * 1.095, 6.6 * 1.1, 5.7 * 1.105])
    assert f"| {gm:.2f} (3) | {gm_c:.2f} (3) | +10.0% [" in row1 and "| worse: 95% interval excludes 0" in row1
    row16 = next(line for line in md.splitlines() if line.startswith("| 16 |"))
    logs = [math.log(c / b) for b, c in ((7.0, 7.3), (7.4, 7.0), (6.9, 7.1))]
    assert f"| {(math.exp(statistics.mean(logs)) - 1) * 100:+.1f}% [" in row16 and "not significant" in row16
    assert across_processes({"baseline": {0: base[0]}, "patched": {0: cand[0]}}, "baseline") is None
