"""Which kernel path one router-gate call takes. ``PathRecorder`` wraps the Python-level kernel entry points a
gate may reach (``PY_CANDIDATES``, then ``torch.mm`` and ``F.linear``) in recording shims and reads the calls of
vLLM's router dispatch ops from a CPU profiler trace; ``classify`` names the path of one call (``op -> leaf``),
``count_calls`` counts what it called.

No vLLM needed, and nothing of the suite: the standard library at module level, torch and the candidate kernels
imported when recording starts. The router-gate and decoder-layer benchmarks record with it; in an arm's image
it is /opt/suite/tools/kernel_gate_paths.py, beside them.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

LL_BF16_MODULE = "vllm.model_executor.kernels.linear.cute_dsl.ll_bf16"

# (label, module, attribute): Python-level kernel entry points a gate may reach. A module that cannot be
# imported in this tree is skipped (it is simply not a path this tree has).
PY_CANDIDATES: tuple[tuple[str, str, str], ...] = (
    ("ll_bf16_gemm", LL_BF16_MODULE, "ll_bf16_gemm"),
    ("ll_fp32w_gemm", "vllm.model_executor.kernels.linear.cute_dsl.ll_fp32w", "LL_FP32W_GEMM_KERNEL"),
    (
        "bf16x3_router_gemm",
        "vllm.model_executor.layers.fused_moe.router.bf16x3_router_gemm_cutedsl",
        "bf16x3_router_gemm",
    ),
    ("fp32_router_gemm", "vllm._custom_ops", "fp32_router_gemm"),
    ("onednn_mm", "vllm._custom_ops", "onednn_mm"),
    ("sgl_weight_packed_linear", "vllm._custom_ops", "weight_packed_linear_cpu"),
)
# Leaf labels, most specific first: the path of a call is the first of these it reached.
LEAF_ORDER = (
    "ll_bf16_gemm",
    "ll_fp32w_gemm",
    "bf16x3_router_gemm",
    "fp32_router_gemm",
    "sgl_weight_packed_linear",
    "onednn_mm",
    "torch.mm",
    "F.linear",
)
DEFAULT_OP_PATTERN = r"router"


class PathRecorder:
    """Records which kernel entry points one gate call reached.

    Two sources, combined per call:

    - Python entry points (``ll_bf16_gemm``, vLLM's GEMM helpers, ``torch.mm``, ``F.linear``) are replaced by
      shims that append a label to ``self.calls``. The shims are plain Python, so Dynamo traces through them
      and replays the list mutation after every call of the compiled code; code that runs eagerly (a custom
      op's implementation) records directly. Install before compiling.
    - Custom ops (``torch.ops.<namespace>.<op>`` matching ``op_pattern``) cannot be replaced without breaking
      compilation, so their calls are read from a CPU ``torch.profiler`` trace of the same call.

    The recording pass is separate from the timing: on GPU the timed calls are CUDA-graph replays, in which no
    Python runs at all; on CPU the shims add one list append per call.
    """

    def __init__(self, op_namespace: str = "vllm", op_pattern: str = DEFAULT_OP_PATTERN) -> None:
        self.calls: list[str] = []
        self.installed: list[str] = []
        self._originals: dict[str, Any] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self.op_namespace = op_namespace
        self.op_regex = re.compile(op_pattern)

    def _make_shim(self, label: str, target: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def shim(*args: Any, **kwargs: Any) -> Any:
            calls.append(label)
            return target(*args, **kwargs)

        shim.__name__ = f"recording_{re.sub(r'[^0-9A-Za-z_]', '_', label)}"
        shim.__wrapped__ = target  # type: ignore[attr-defined]
        return shim

    def wrap_attribute(self, label: str, owner: Any, attr: str, rebind_modules: bool = True) -> bool:
        """Wrap ``owner.attr``; also rebind modules under ``vllm`` that imported the same object by name."""
        original = getattr(owner, attr, None)
        if original is None or not callable(original):
            return False
        shim = self._make_shim(label, original)
        setattr(owner, attr, shim)
        self._patched.append((owner, attr, original))
        if rebind_modules:
            for mod in list(sys.modules.values()):
                name = getattr(mod, "__name__", "") or ""
                if mod is owner or not (name == "vllm" or name.startswith("vllm.")):
                    continue
                try:
                    if getattr(mod, attr, None) is original:
                        setattr(mod, attr, shim)
                        self._patched.append((mod, attr, original))
                except Exception:  # noqa: BLE001 - exotic module objects; nothing to rebind there
                    continue
        self._originals[label] = original
        self.installed.append(label)
        return True

    def wrap_python_candidates(self, candidates: Iterable[tuple[str, str, str]] = PY_CANDIDATES) -> None:
        for label, module_name, attr in candidates:
            try:
                module = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001 - absent in this tree, or needs a GPU-only package
                continue
            self.wrap_attribute(label, module, attr)

    def wrap_torch_fallbacks(self) -> None:
        import torch
        import torch.nn.functional as F

        # Inductor keeps its own reference to torch.mm for extern kernels; import it first so the compiled
        # code calls the real function and only the traced (replayed) shim records.
        for name in ("torch._inductor.select_algorithm", "torch._inductor.kernel.mm"):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an older torch lays inductor out differently
                pass
        self.wrap_attribute("torch.mm", torch, "mm", rebind_modules=False)
        self.wrap_attribute("F.linear", F, "linear", rebind_modules=False)

    def install_all(self) -> list[str]:
        self.wrap_python_candidates()
        self.wrap_torch_fallbacks()
        return [*self.installed, f"profiler:{self.op_namespace}::/{self.op_regex.pattern}/"]

    def uninstall(self) -> None:
        """Put every wrapped attribute back (a compiled graph keeps what it traced)."""
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()
        self.installed.clear()

    def original(self, label: str) -> Any:
        return self._originals[label]

    def take(self) -> list[str]:
        out = list(self.calls)
        self.calls.clear()
        return out

    def record(self, fn: Callable[..., Any], *args: Any) -> list[str]:
        """Labels of everything one ``fn(*args)`` reached: shim labels, then matching custom ops."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        self.take()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn(*args)
            if any(getattr(a, "is_cuda", False) for a in args):
                torch.cuda.synchronize()
        labels = self.take()
        prefix = f"{self.op_namespace}::"
        for event in prof.events():
            name = event.name
            if name.startswith(prefix) and self.op_regex.search(name[len(prefix) :]):
                labels.append(name)
        return labels


def classify(calls: Sequence[str]) -> str:
    """One path label for the calls of one gate invocation: ``op -> leaf``, ``leaf`` or ``none``.

    The leaf is the most specific kernel reached: a label outside ``LEAF_ORDER`` (a kernel the caller wrapped
    on purpose) first, then ``LEAF_ORDER``'s order (``ll_bf16_gemm`` before the ``torch.mm`` it may call).
    """
    ops = sorted({c for c in calls if "::" in c})
    leaves = [c for c in calls if "::" not in c]
    leaf = min(leaves, key=lambda c: LEAF_ORDER.index(c) if c in LEAF_ORDER else -1) if leaves else None
    parts = ops + ([leaf] if leaf else [])
    return " -> ".join(parts) if parts else "none"


def count_calls(calls: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        out[c] = out.get(c, 0) + 1
    return dict(sorted(out.items()))
