"""The two router-gate variants measured on the H200, for ``suite.stages.kernel.bench --gate-factory``.

Full vLLM cannot be installed on the GPU machine (no network, no matching wheel set), so these gates are
built here around vLLM 0.33.0's real cuteDSL kernel (``vllm.model_executor.kernels.linear.cute_dsl.ll_bf16``,
carried from the wheel at run time, with a two-function shim for the rest of vLLM; see make_h200_bundle.py):

- ``frozen_branch_gate``: GateLinear.forward of 0.33.0 for this layer (bf16 weight, fp32 out, no bias,
  SM90): Tier 1 behind the inline Python branch ``x.shape[0] <= LL_BF16_MAX_TOKENS``, else Tier 6
  ``torch.mm(x, weight.T, out_dtype=torch.float32)``. Under guard-free compile traced at a large M the branch
  is frozen to the torch.mm side.
- ``dispatch_op_gate``: the patch: the same decision made at run time inside a custom op
  ``torch.ops.vllm.ll_bf16_router_gemm_dispatch(x, weight, max_tokens)`` that compile cannot see into.
"""

from __future__ import annotations

import os
from typing import Any

import torch

LL_BF16_MAX_TOKENS = 16  # GateLinear.LL_BF16_MAX_TOKENS in 0.33.0
_LL_BF16 = "vllm.model_executor.kernels.linear.cute_dsl.ll_bf16"


CPU_FAKE_ENV = "SUITE_KERNEL_FAKE_LL_BF16"


def _cuda_mm_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Tier 6 as GateLinear writes it; ``out_dtype`` exists for CUDA only, so a CPU dry run casts instead."""
    if x.is_cuda:
        return torch.mm(x, weight.T, out_dtype=torch.float32)
    return torch.mm(x.float(), weight.float().T)


def _install_cpu_fake() -> None:
    import vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 as ll_bf16

    def ll_bf16_gemm_cpu_fake(
        x: torch.Tensor, weight: torch.Tensor, output_dtype=torch.float32
    ) -> torch.Tensor:
        return (x.float() @ weight.float().t()).to(output_dtype)

    ll_bf16.ll_bf16_gemm = ll_bf16_gemm_cpu_fake


def _ll_bf16_available(device: str) -> tuple[bool, str | None]:
    """(allow Tier 1, forced note). On CPU, ``SUITE_KERNEL_FAKE_LL_BF16=1`` forces Tier 1 with a CPU stand-in
    for the kernel so the harness can be rehearsed without a GPU."""
    from vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 import is_available

    if not device.startswith("cuda"):
        if os.environ.get(CPU_FAKE_ENV) == "1":
            _install_cpu_fake()
            return True, "CPU dry run: ll_bf16_gemm replaced by a CPU stand-in"
        return False, None
    return torch.cuda.get_device_capability()[0] >= 9 and is_available(), None


@torch.library.custom_op("vllm::ll_bf16_router_gemm_dispatch", mutates_args=())
def ll_bf16_router_gemm_dispatch(x: torch.Tensor, weight: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Tier 1 for 0 < M <= max_tokens, decided at run time; otherwise the cuBLAS bf16 x bf16 -> fp32 tier."""
    m = x.shape[0]
    if 0 < m <= max_tokens:
        from vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 import ll_bf16_gemm

        return ll_bf16_gemm(x.contiguous(), weight)
    return _cuda_mm_fp32(x, weight)


@ll_bf16_router_gemm_dispatch.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, max_tokens: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


class FrozenBranchGate(torch.nn.Module):
    """GateLinear 0.33.0's Tier 1 / Tier 6 dispatch for a bf16, fp32-out, bias-free gate on SM90."""

    LL_BF16_MAX_TOKENS = LL_BF16_MAX_TOKENS

    def __init__(self, weight: torch.Tensor, allow_ll_bf16_gemm: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.allow_ll_bf16_gemm = allow_ll_bf16_gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.allow_ll_bf16_gemm and x.shape[0] <= self.LL_BF16_MAX_TOKENS and x.dtype == torch.bfloat16:
            from vllm.model_executor.kernels.linear.cute_dsl.ll_bf16 import ll_bf16_gemm

            return ll_bf16_gemm(x, self.weight)
        return _cuda_mm_fp32(x, self.weight)


class DispatchOpGate(torch.nn.Module):
    """The patched Tier 1: the M decision inside ``torch.ops.vllm.ll_bf16_router_gemm_dispatch``."""

    LL_BF16_MAX_TOKENS = LL_BF16_MAX_TOKENS

    def __init__(self, weight: torch.Tensor, allow_ll_bf16_gemm: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.allow_ll_bf16_gemm = allow_ll_bf16_gemm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.allow_ll_bf16_gemm and x.dtype == torch.bfloat16:
            return torch.ops.vllm.ll_bf16_router_gemm_dispatch(x, self.weight, self.LL_BF16_MAX_TOKENS)
        return _cuda_mm_fp32(x, self.weight)


def _weight(hidden: int, experts: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(experts, hidden, generator=gen) * 0.02).to(device=device, dtype=torch.bfloat16)


def _info(gate: torch.nn.Module, variant: str, forced: str | None) -> dict[str, Any]:
    import vllm

    return {
        "source": f"benchmarks.kernel.h200_gates:{variant}",
        "class": f"{type(gate).__module__}.{type(gate).__qualname__}",
        "kernel_module": _LL_BF16,
        "kernel_files": getattr(vllm, "__bundle__", None),
        "allow_ll_bf16_gemm": gate.allow_ll_bf16_gemm,
        "LL_BF16_MAX_TOKENS": LL_BF16_MAX_TOKENS,
        "forced": forced,
    }


def frozen_branch_gate(hidden: int, experts: int, device: str, seed: int) -> tuple[torch.nn.Module, dict]:
    allow, forced = _ll_bf16_available(device)
    gate = FrozenBranchGate(_weight(hidden, experts, device, seed), allow)
    return gate, _info(gate, "frozen_branch_gate", forced)


def dispatch_op_gate(hidden: int, experts: int, device: str, seed: int) -> tuple[torch.nn.Module, dict]:
    allow, forced = _ll_bf16_available(device)
    gate = DispatchOpGate(_weight(hidden, experts, device, seed), allow)
    return gate, _info(gate, "dispatch_op_gate", forced)
