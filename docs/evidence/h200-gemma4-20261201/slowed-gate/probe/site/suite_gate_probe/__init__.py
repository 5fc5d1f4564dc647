"""In-server router-gate probe: a vLLM general plugin that records which GateLinear path ran per batch size.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (API server, engine core,
workers) before the model is built. ``suite.stages.probe.run`` copies this package, self-contained (stdlib,
torch and vLLM only; nothing from ``suite``), into a directory with a ``suite_gate_probe-*.dist-info``
whose entry point names :func:`register`, and puts that directory on the server's PYTHONPATH.

:func:`register` does nothing unless ``SUITE_GATE_PROBE_DIR`` is set. Then, as soon as vLLM's
``gate_linear`` module is imported (or at once if it already is), it wraps:

- ``GateLinear.forward``: one record per call, keyed by the batch-size bucket of ``x.shape[0]`` and the
  *path*: the ordered labels of the instrumented implementations that ran inside that call;
- the Python kernel of every ``torch.ops.vllm.<name>`` op that ``gate_linear`` defines (``<name>_impl``:
  fp32/ROCm dispatch ops, and ``ll_bf16_router_gemm_dispatch``, ``rocm_aiter_router_gemm``,
  ``suite_gate_delay`` where a patch set added them). Re-registered in the dispatcher, so the wrapper runs
  at run time even when the op is called from a compiled graph;
- the kernels behind the tiers: ``ll_bf16_gemm``, ``ops.fp32_router_gemm``, the bf16x3 and ROCm fp32 router
  GEMMs, and per gate layer its ``quant_method.apply`` (tier 6, "F.linear" through ReplicatedLinear) and
  the ``dispatch_unquantized_gemm()`` result it holds; ``torch.mm``, ``F.linear`` and vLLM's CPU GEMMs
  (``onednn_mm``, ``weight_packed_linear_cpu``) are recorded only while a gate call is in progress;
- the platform's ``set_additional_forward_context`` (called once per model step with ``num_tokens``), to
  count the steps per bucket independently of the gate.

While ``torch.compile`` traces, every wrapper is a pass-through (``torch.compiler.is_compiling()``), so a
compiled graph holds exactly what vLLM would have put there: a Python branch frozen at trace time shows up
as steps in a bucket with no ``GateLinear.forward`` call at run time, and opaque custom ops still report.

Counters are flushed atomically to ``$SUITE_GATE_PROBE_DIR/<pid>.json`` every ``SUITE_GATE_PROBE_FLUSH_S``
seconds (default 0.5) and at exit. A file ``STOP`` in that directory ends the probe: a last flush, the
Python-level wrappers are removed, the op wrappers become pass-throughs.
"""

from __future__ import annotations

import atexit
import importlib.abc
import inspect
import json
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

ENV_DIR = "SUITE_GATE_PROBE_DIR"
ENV_FLUSH = "SUITE_GATE_PROBE_FLUSH_S"
STOP_FILE = "STOP"
SCHEMA = 1

# (upper bound inclusive, label); the last bucket is open
BUCKETS: tuple[tuple[int, str], ...] = ((1, "1"), (4, "2-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"),
                                        (128, "33-128"))
OVER = ">128"
BUCKET_LABELS = tuple(label for _, label in BUCKETS) + (OVER,)

GATE_MODULE = "vllm.model_executor.layers.fused_moe.router.gate_linear"
SEP = " > "


def bucket(m: int) -> str:
    """Batch-size bucket of a token count M: 1, 2-4, 5-8, 9-16, 17-32, 33-128, >128 (0 counts as "1")."""
    for hi, label in BUCKETS:
        if m <= hi:
            return label
    return OVER


class _State:
    def __init__(self) -> None:
        self.active = False
        self.out_dir = ""
        # counters: ("gate", bucket, path) | ("outside", bucket, path) | ("steps", bucket, "") -> count
        self.counts: dict[tuple[str, str, str], int] = {}
        self.gates: weakref.WeakSet = weakref.WeakSet()
        self.present_ops: list[str] = []
        self.instrumented: list[str] = []
        self.restore: list[Callable[[], None]] = []
        self.tls = threading.local()
        self.seq = 0
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.errors: list[str] = []


_S = _State()


def _count(key: tuple[str, str, str]) -> None:
    counts = _S.counts
    counts[key] = counts.get(key, 0) + 1


def _stack() -> list[list[str]]:
    st = getattr(_S.tls, "stack", None)
    if st is None:
        st = _S.tls.stack = []
    return st


def _note(label: str) -> bool:
    """Append label to the innermost gate call in progress; False when none is."""
    st = getattr(_S.tls, "stack", None)
    if not st:
        return False
    frame = st[-1]
    if not frame or frame[-1] != label:
        frame.append(label)
    return True


def _is_compiling() -> bool:
    return False  # replaced by torch.compiler.is_compiling once torch is imported (_instrument_gate_module)


def _first_rows(args: tuple, kwargs: dict) -> int | None:
    for a in (*args, *kwargs.values()):
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
    return None


# ------------------------------------------------------------------------------------------ wrappers


def _wrap_gate_specific(fn: Callable, label: str) -> Callable:
    """A gate-only implementation (custom-op kernel, router GEMM): recorded inside a gate call, and as an
    "outside" call (no GateLinear.forward running: a compiled graph called it) otherwise."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling() or not _S.active:
            return fn(*args, **kwargs)
        if _note(label):
            return fn(*args, **kwargs)
        st = _stack()
        frame = [label]
        st.append(frame)
        try:
            return fn(*args, **kwargs)
        finally:
            st.pop()
            m = _first_rows(args, kwargs)
            _count(("outside", bucket(m or 0), SEP.join(frame)))

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", label)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


def _wrap_generic(fn: Callable, label_of: Callable[[tuple, dict], str]) -> Callable:
    """A general kernel (torch.mm, F.linear, CPU GEMMs) used by every layer: recorded only inside a gate call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _is_compiling() and _S.active and getattr(_S.tls, "stack", None):
            _note(label_of(args, kwargs))
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


def _patch_attr(owner: Any, name: str, new: Any) -> None:
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, new)
    _S.restore.append(lambda: setattr(owner, name, old))


def _mm_label(args: tuple, kwargs: dict) -> str:
    out_dtype = kwargs.get("out_dtype")
    return f"torch.mm(out_dtype={str(out_dtype).replace('torch.', '')})" if out_dtype is not None else "torch.mm"


def _wrap_function_attr(module: Any, name: str, label: str, generic: bool = False) -> None:
    fn = getattr(module, name, None)
    if fn is None or getattr(fn, "_suite_probe", False):
        return
    new = _wrap_generic(fn, lambda a, k: label) if generic else _wrap_gate_specific(fn, label)
    new._suite_probe = True  # type: ignore[attr-defined]
    _patch_attr(module, name, new)
    _S.instrumented.append(f"{module.__name__}.{name}")


# ------------------------------------------------------------------------------------------ GateLinear


def _instrument_gate_layer(layer: Any) -> None:
    """Per layer: tier 6 (ReplicatedLinear -> quant_method.apply) and its dispatch_unquantized_gemm() result."""
    qm = getattr(layer, "quant_method", None)
    if qm is None or getattr(qm, "_suite_probe", False):
        return
    try:
        qm._suite_probe = True
        apply = qm.apply  # bound method
        qm.apply = _wrap_generic(apply, lambda a, k: "F.linear (tier 6: ReplicatedLinear)")
        _S.restore.append(lambda: qm.__dict__.pop("apply", None))
        impl = getattr(qm, "_gemm_impl", None)
        if impl is not None:
            name = getattr(impl, "__name__", None) or getattr(getattr(impl, "func", None), "__name__", "gemm")
            qm._gemm_impl = _wrap_generic(impl, lambda a, k, n=name: f"dispatch_unquantized_gemm->{n}")
            _S.restore.append(lambda: setattr(qm, "_gemm_impl", impl))
    except (AttributeError, TypeError) as exc:  # a quant method with slots or read-only attributes
        _S.errors.append(f"{getattr(layer, 'prefix', '?')}: {exc}")


def _instrument_gate_module(module: Any) -> None:
    global _is_compiling
    import torch

    _is_compiling = torch.compiler.is_compiling

    cls = getattr(module, "GateLinear", None)
    if cls is None:
        _S.errors.append(f"{module.__name__} has no GateLinear")
        return
    orig_init = cls.__dict__["__init__"]
    orig_forward = cls.__dict__["forward"]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        if _S.active:
            _S.gates.add(self)
            _instrument_gate_layer(self)
            _start_flusher()

    def forward(self: Any, x: Any) -> Any:
        if _is_compiling() or not _S.active:
            return orig_forward(self, x)
        st = _stack()
        frame: list[str] = []
        st.append(frame)
        try:
            return orig_forward(self, x)
        finally:
            st.pop()
            _count(("gate", bucket(int(x.shape[0])), SEP.join(frame) or "(no instrumented kernel)"))
            if st:  # a gate inside a gate (never in vLLM): let the outer call show it too
                _note("GateLinear.forward")

    __init__.__wrapped__ = orig_init  # type: ignore[attr-defined]
    forward.__wrapped__ = orig_forward  # type: ignore[attr-defined]
    _patch_attr(cls, "__init__", __init__)
    _patch_attr(cls, "forward", forward)
    _S.instrumented.append(f"{module.__name__}.GateLinear.forward")

    # every torch.ops.vllm.<name> op this module defines through a module-level <name>_impl
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import vllm_lib

    for attr in sorted(vars(module)):
        if not attr.endswith("_impl") or not callable(getattr(module, attr)):
            continue
        op = attr[: -len("_impl")]
        if not hasattr(torch.ops.vllm, op):
            continue
        impl = getattr(module, attr)
        # torch >= 2.8 refuses a second Python kernel for the same key unless allow_override=True (the H200's
        # torch 2.11); older ones only warn. One op that cannot be wrapped never stops the rest of the probe.
        override = {"allow_override": True} if "allow_override" in inspect.signature(vllm_lib.impl).parameters else {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": intended
                vllm_lib.impl(op, _wrap_gate_specific(impl, f"torch.ops.vllm.{op}"),
                              dispatch_key=current_platform.dispatch_key, **override)
        except RuntimeError as exc:
            _S.errors.append(f"wrapping torch.ops.vllm.{op}: {exc}")
            continue
        _S.present_ops.append(op)
        _S.instrumented.append(f"torch.ops.vllm.{op}")

    # steps per bucket, counted where vLLM builds each step's forward context
    orig_extra = current_platform.set_additional_forward_context

    def set_additional_forward_context(*args: Any, **kwargs: Any) -> Any:
        if not _is_compiling() and _S.active:
            n = kwargs.get("num_tokens")
            if n is not None:
                _count(("steps", bucket(int(n)), ""))
        return orig_extra(*args, **kwargs)

    current_platform.set_additional_forward_context = set_additional_forward_context
    _S.restore.append(lambda: current_platform.__dict__.pop("set_additional_forward_context", None))
    _S.instrumented.append("current_platform.set_additional_forward_context")

    # kernels reached through lazy imports or module attributes at call time
    import torch.nn.functional as F

    for mod_name, names in (
        ("vllm.model_executor.kernels.linear.cute_dsl.ll_bf16", ("ll_bf16_gemm",)),
        ("vllm.model_executor.layers.fused_moe.router.bf16x3_router_gemm_cutedsl",
         ("bf16x3_router_gemm", "_bf16x3_router_gemm")),
        ("vllm.model_executor.layers.fused_moe.router.rocm_fp32_router_gemm", ("rocm_fp32_router_gemm",)),
        ("vllm.model_executor.layers.fused_moe.router.bf16x3_router_gemm_rocm", ("bf16x3_router_gemm",)),
    ):
        _when_imported(mod_name, lambda m, names=names: [_wrap_function_attr(m, n, n) for n in names])

    def ops_hook(m: Any) -> None:
        _wrap_function_attr(m, "fp32_router_gemm", "ops.fp32_router_gemm")
        _wrap_function_attr(m, "onednn_mm", "onednn_mm (CPU oneDNN)", generic=True)
        _wrap_function_attr(m, "weight_packed_linear_cpu", "weight_packed_linear_cpu (CPU sgl)", generic=True)

    _when_imported("vllm._custom_ops", ops_hook)
    for owner, name, label_of in ((torch, "mm", _mm_label), (F, "linear", lambda a, k: "F.linear")):
        fn = getattr(owner, name)
        new = _wrap_generic(fn, label_of)
        new._suite_probe = True  # type: ignore[attr-defined]
        _patch_attr(owner, name, new)
        _S.instrumented.append(f"{owner.__name__}.{name}")


# ------------------------------------------------------------------------------------------ import hooks


_HOOKS: dict[str, list[Callable[[Any], Any]]] = {}


class _HookLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str):
        self.loader = loader
        self.name = name

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _run_hooks(self.name, module)


class _HookFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookLoader(spec.loader, fullname)
                return spec
        return None


_FINDER = _HookFinder()


def _run_hooks(name: str, module: Any) -> None:
    for hook in _HOOKS.pop(name, []):
        try:
            hook(module)
        except Exception as exc:  # the probe must never break the server
            _S.errors.append(f"instrumenting {name}: {type(exc).__name__}: {exc}")


def _when_imported(name: str, hook: Callable[[Any], Any]) -> None:
    """Run hook(module) right after `name` is imported (now, if it already is)."""
    if name in sys.modules:
        _HOOKS.setdefault(name, []).append(hook)
        _run_hooks(name, sys.modules[name])
        return
    _HOOKS.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# ------------------------------------------------------------------------------------------ output


def _gate_info(layer: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"prefix": getattr(layer, "prefix", ""), "class": type(layer).__name__}
    for attr in sorted(vars(layer)):
        if attr.startswith("allow_") or attr in ("is_unquantized", "out_dtype"):
            info[attr] = str(getattr(layer, attr)).replace("torch.", "")
    w = getattr(layer, "weight", None)
    if w is not None:
        info["weight_dtype"] = str(w.dtype).replace("torch.", "")
        info["weight_shape"] = list(w.shape)
    return info


def snapshot() -> dict[str, Any]:
    counts = dict(_S.counts)  # an atomic copy under the GIL
    calls = [{"kind": k, "bucket": b, "path": p, "count": n} for (k, b, p), n in sorted(counts.items())]
    try:
        from vllm.platforms import current_platform

        platform = type(current_platform).__name__
    except Exception:  # noqa: BLE001
        platform = "?"
    return {"schema": SCHEMA, "pid": os.getpid(), "argv": sys.argv[:3], "written_at": time.time(),
            "seq": _S.seq, "active": _S.active, "platform": platform, "gates": [_gate_info(g) for g in list(_S.gates)],
            "present_ops": list(_S.present_ops), "instrumented": list(_S.instrumented), "errors": list(_S.errors),
            "counts": calls}


def flush() -> None:
    if not _S.out_dir:
        return
    with _S.lock:
        _S.seq += 1
        data = json.dumps(snapshot(), indent=1, sort_keys=True)
        path = os.path.join(_S.out_dir, f"{os.getpid()}.json")
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            _S.errors.append(f"flush: {exc}")


def stop() -> None:
    """Last flush, then remove the Python-level wrappers (op wrappers stay as pass-throughs)."""
    if not _S.active:
        return
    flush()
    _S.active = False
    for undo in reversed(_S.restore):
        try:
            undo()
        except Exception as exc:  # noqa: BLE001
            _S.errors.append(f"restore: {exc}")
    _S.restore.clear()
    flush()


def _flusher(interval: float) -> None:
    stop_path = os.path.join(_S.out_dir, STOP_FILE)
    while _S.active:
        time.sleep(interval)
        if os.path.exists(stop_path):
            stop()
            return
        flush()


def _start_flusher() -> None:
    if _S.thread is not None:
        return
    interval = float(os.environ.get(ENV_FLUSH) or 0.5)
    _S.thread = threading.Thread(target=_flusher, args=(interval,), name="suite-gate-probe", daemon=True)
    _S.thread.start()
    atexit.register(flush)


def register() -> None:
    """The `vllm.general_plugins` entry point; may run several times per process (vLLM's contract)."""
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir or _S.out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, STOP_FILE)):
        return
    _S.out_dir = out_dir
    _S.active = True
    _when_imported(GATE_MODULE, _instrument_gate_module)
