"""Router-gate kernel microbenchmark: time the MoE router gate as one vLLM tree dispatches it.

Run it as a standalone script in its own process, with the arm's vLLM tree first on ``PYTHONPATH``::

    python -m suite.stages.kernel.bench --json OUT.json --hidden 2816 --experts 128 --m 1,2,4,8,16,32

What it does, per process (one arm):

1. builds the gate: by default vLLM's real ``GateLinear`` (bf16 weight, fp32 out, no bias) outside an engine,
   or a gate from ``--gate-factory module:function`` (used where full vLLM cannot be installed);
2. wraps the candidate kernel functions (``ll_bf16_gemm``, vLLM's CPU GEMM helpers, ``torch.mm``,
   ``F.linear``) in recording shims, *before* compiling, so each call leaves a label in a list (Dynamo
   replays that list mutation on every call of the compiled code); calls of the ``torch.ops.vllm.*router*``
   dispatch ops are read from a CPU profiler trace of the same untimed call;
3. compiles a host module around the gate like vLLM's ``TorchCompileWithNoGuardsWrapper``
   (``fullgraph=True, dynamic=True``, every guard dropped) and traces it first at a large M (``--trace-m``);
4. records, in a separate untimed pass, which path ran for each M (eager and compiled) and flags a
   *frozen branch*: the compiled path at M differs from the eager path at M and equals the trace-M path;
5. times each M: CUDA-graph replay on GPU (``--calls`` calls captured in one graph, replayed for ``WARM_S``
   seconds, then ``--trials`` timed replays, per-call µs; the SM clock read right after), a plain timing loop
   on CPU; reports median, p10, p90 (and the raw samples).

Only torch and the standard library are imported at module level: the timing and path-recording core works
without vLLM (the H200 harness in ``benchmarks/kernel/`` uses it with vLLM's kernel files only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
DEFAULT_M = (1, 2, 4, 8, 16, 32)
DEFAULT_TRACE_M = 2048
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
WARM_S = 1.0  # seconds of graph replays before the timed ones (see time_cuda_graph)


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class MResult:
    m: int
    median_us: float
    p10_us: float
    p90_us: float
    n: int
    path: str
    calls: dict[str, int]
    eager_path: str
    frozen_branch: bool
    recompiled: bool
    samples_us: list[float] = field(default_factory=list)
    sm_clock_mhz: int | None = None  # GPU: the SM clock right after the timed replays (None: CPU, or unknown)


@dataclass
class KernelResult:
    schema_version: int
    arm: str | None
    created_utc: str
    host: str
    device: dict[str, Any]
    torch_version: str
    vllm_version: str | None
    python_version: str
    gate: dict[str, Any]
    shape: dict[str, Any]
    compile: dict[str, Any]
    timing: dict[str, Any]
    shims: list[str]
    results: list[MResult]

    @property
    def frozen_ms(self) -> list[int]:
        return [r.m for r in self.results if r.frozen_branch]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["frozen_branch_ms"] = self.frozen_ms
        return d


def atomic_write_json(path: str, obj: Any) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it into place. (This module runs alone on
    accelerator hosts that have only torch: it imports nothing from the suite, so it keeps its own writer.)"""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 100]) of an already sorted sequence."""
    if not sorted_values:
        raise ValueError("no samples")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> dict[str, float]:
    s = sorted(samples_us)
    return {"median_us": percentile(s, 50), "p10_us": percentile(s, 10), "p90_us": percentile(s, 90)}


# --------------------------------------------------------------------------------------------------
# path recording


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


# --------------------------------------------------------------------------------------------------
# compile like vLLM, time


def _unwrap_output(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def make_host(gate: Any) -> Any:
    """A module whose forward calls the gate and returns the logits (GateLinear returns (out, bias))."""
    import torch

    class RouterGateHost(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.gate = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _unwrap_output(self.gate(x))

    return RouterGateHost(gate)


def compile_guard_free(module: Any, backend: str = "inductor") -> Any:
    """``torch.compile`` as vLLM's TorchCompileWithNoGuardsWrapper does it: full graph, no guards kept."""
    import torch

    options = {"guard_filter_fn": lambda entries: [False] * len(entries)}
    return torch.compile(module, fullgraph=True, dynamic=True, backend=backend, options=options)


def dynamo_graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def sm_clock_mhz() -> int | None:
    """The GPU's SM clock now (nvidia-smi; the first visible device), or None where none can be read."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    cmd = ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"]
    if visible.isdigit():
        cmd += ["-i", visible]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return int(out[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def time_cuda_graph(fn: Callable[[Any], Any], x: Any, calls: int, trials: int, warmup: int,
                    warm_s: float = WARM_S) -> list[float]:
    """Per-call µs for ``trials`` replays of one CUDA graph holding ``calls`` calls of ``fn(x)``, after the
    graph has been replayed for ``warm_s`` seconds: a GPU left idle while the host compiled runs at a low SM
    clock and takes a few hundred ms of work to reach its boost clock, which short timed bursts never give."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x)
    for _ in range(max(3, warmup)):
        graph.replay()
    torch.cuda.synchronize()
    warm_until = time.perf_counter() + warm_s
    while time.perf_counter() < warm_until:
        graph.replay()
        torch.cuda.synchronize()
    samples = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(trials):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return samples


def time_cpu_loop(fn: Callable[[Any], Any], x: Any, calls: int, trials: int, warmup: int) -> list[float]:
    """Per-call µs of a plain loop of ``calls`` calls, ``trials`` times."""
    for _ in range(warmup):
        fn(x)
    samples = []
    for _ in range(trials):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(x)
        samples.append((time.perf_counter_ns() - t0) / 1000.0 / calls)
    return samples


@dataclass
class MeasureConfig:
    hidden: int = 2816
    experts: int = 128
    m_values: tuple[int, ...] = DEFAULT_M
    trace_m: int = DEFAULT_TRACE_M
    calls: int = 50
    trials: int = 101
    warmup: int = 10
    backend: str = "inductor"
    device: str = "auto"
    seed: int = 0
    op_pattern: str = DEFAULT_OP_PATTERN


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def device_info(device: str) -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        idx = torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(idx)
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(idx),
            "capability": f"{cap[0]}.{cap[1]}",
            "cuda_version": torch.version.cuda,
        }
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"type": "cpu", "name": name, "threads": torch.get_num_threads()}


def measure_gate(
    gate: Any,
    recorder: PathRecorder,
    cfg: MeasureConfig,
    device: str,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[list[MResult], dict[str, Any]]:
    """Eager paths, guard-free compile traced at ``trace_m``, compiled paths, then timings per M.

    ``recorder`` must already be installed (before this compiles anything).
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)

    def make_x(m: int) -> torch.Tensor:
        return torch.randn(m, cfg.hidden, generator=gen, dtype=torch.float32).to(
            device=device, dtype=torch.bfloat16
        )

    host = make_host(gate)
    inputs = {m: make_x(m) for m in cfg.m_values}
    x_trace = make_x(cfg.trace_m)

    with torch.inference_mode():
        eager: dict[int, list[str]] = {}
        for m in (*cfg.m_values, cfg.trace_m):
            eager[m] = recorder.record(host, inputs.get(m, x_trace))

        # Guard-free cache entries hang off the host's forward code object, shared by every host built in this
        # process: start from an empty cache so this gate is traced afresh, not served another gate's graph.
        torch._dynamo.reset()
        compiled = compile_guard_free(host, backend=cfg.backend)
        g0 = dynamo_graph_count()
        t0 = time.perf_counter()
        trace_calls = recorder.record(compiled, x_trace)
        trace_s = time.perf_counter() - t0
        graphs_after_trace = dynamo_graph_count()
        trace_path = classify(trace_calls)
        log(f"traced at M={cfg.trace_m} in {trace_s:.1f}s: path {trace_path}")

        compiled_calls: dict[int, list[str]] = {}
        recompiled: dict[int, bool] = {}
        for m in cfg.m_values:
            before = dynamo_graph_count()
            first = recorder.record(compiled, inputs[m])
            recompiled[m] = dynamo_graph_count() > before
            # a second call records the steady state (after any recompile the first call triggered)
            compiled_calls[m] = recorder.record(compiled, inputs[m])
            if classify(first) != classify(compiled_calls[m]):
                log(
                    f"M={m}: first compiled call took {classify(first)}, later calls {classify(compiled_calls[m])}"
                )

        timer = time_cuda_graph if device.startswith("cuda") else time_cpu_loop
        results: list[MResult] = []
        for m in cfg.m_values:
            samples = timer(compiled, inputs[m], cfg.calls, cfg.trials, cfg.warmup)
            clock = sm_clock_mhz() if device.startswith("cuda") else None
            recorder.take()
            stats = summarize(samples)
            path = classify(compiled_calls[m])
            eager_path = classify(eager[m])
            frozen = path != eager_path and path == trace_path
            results.append(
                MResult(
                    m=m,
                    median_us=round(stats["median_us"], 4),
                    p10_us=round(stats["p10_us"], 4),
                    p90_us=round(stats["p90_us"], 4),
                    n=len(samples),
                    path=path,
                    calls=count_calls(compiled_calls[m]),
                    eager_path=eager_path,
                    frozen_branch=frozen,
                    recompiled=recompiled[m],
                    samples_us=[round(s, 4) for s in samples],
                    sm_clock_mhz=clock,
                )
            )
            log(
                f"M={m:<5d} median {stats['median_us']:9.3f} us  p10 {stats['p10_us']:9.3f}  "
                f"p90 {stats['p90_us']:9.3f}  path {path}{'  FROZEN BRANCH' if frozen else ''}"
                f"{'  (recompiled)' if recompiled[m] else ''}"
            )
    compile_info = {
        "wrapper": "torch.compile(fullgraph=True, dynamic=True, guard_filter_fn drops all guards)",
        "backend": cfg.backend,
        "trace_m": cfg.trace_m,
        "trace_path": trace_path,
        "trace_seconds": round(trace_s, 3),
        "dynamo_graphs_at_trace": graphs_after_trace - g0,
        "eager_trace_path": classify(eager[cfg.trace_m]),
    }
    return results, compile_info


# --------------------------------------------------------------------------------------------------
# building vLLM's GateLinear outside an engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_vllm_gate(
    hidden: int, experts: int, device: str, seed: int, force_ll_bf16_fake: bool = False
) -> tuple[Any, dict[str, Any]]:
    """vLLM's own GateLinear(hidden, experts, bias=False, out_dtype=fp32), bf16 weights, loaded.

    With ``force_ll_bf16_fake`` (CPU tests only) Tier 1 is forced on and ``ll_bf16_gemm`` replaced by a CPU
    function that computes the same product, so the frozen-branch bug can be shown without a GPU.
    """
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

    gen = torch.Generator(device="cpu").manual_seed(seed)
    weight = (torch.randn(experts, hidden, generator=gen) * 0.02).to(torch.bfloat16)
    with set_current_vllm_config(VllmConfig()):
        if not model_parallel_is_initialized():
            init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                local_rank=0,
                backend="nccl" if device.startswith("cuda") else "gloo",
            )
            initialize_model_parallel(1, 1)
        with torch.device(device):
            gate = GateLinear(
                hidden,
                experts,
                bias=False,
                out_dtype=torch.float32,
                params_dtype=torch.bfloat16,
                prefix="gate",
            )
    gate.weight.data.copy_(weight.to(gate.weight.device))
    gate.quant_method.process_weights_after_loading(gate)
    gate.eval()

    info: dict[str, Any] = {
        "source": "vllm GateLinear",
        "class": f"{type(gate).__module__}.{type(gate).__qualname__}",
        "forced": None,
    }
    for attr in sorted(vars(gate)):
        if attr.startswith("allow_") and isinstance(getattr(gate, attr), bool):
            info[attr] = getattr(gate, attr)
    info["LL_BF16_MAX_TOKENS"] = getattr(gate, "LL_BF16_MAX_TOKENS", None)

    if force_ll_bf16_fake:
        if device.startswith("cuda"):
            raise ValueError("--force-ll-bf16-fake is a CPU test aid; on GPU the real kernel runs")
        ll_bf16 = importlib.import_module(LL_BF16_MODULE)
        ref = weight.float()

        def ll_bf16_gemm_cpu_fake(x: Any, w: Any, output_dtype: Any = torch.float32) -> Any:
            # `@` keeps this out of the torch.mm / F.linear shims: only the ll_bf16_gemm label is recorded
            return (x.float() @ ref.t()).to(output_dtype)

        ll_bf16.ll_bf16_gemm = ll_bf16_gemm_cpu_fake
        gate.allow_ll_bf16_gemm = True
        info["forced"] = "allow_ll_bf16_gemm=True, ll_bf16_gemm = CPU fake (test aid)"
    return gate, info


def load_factory(spec: str) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """``module:function``; the function takes (hidden, experts, device, seed) and returns (gate, info)."""
    if ":" not in spec:
        raise ValueError(f"gate factory must be module:function, got {spec!r}")
    mod_name, fn_name = spec.split(":", 1)
    return getattr(importlib.import_module(mod_name), fn_name)


def vllm_version() -> str | None:
    try:
        import vllm

        return getattr(vllm, "__version__", None)
    except Exception:  # noqa: BLE001 - a tree without a usable vllm package
        return None


def run(
    cfg: MeasureConfig,
    arm: str | None = None,
    gate_factory: str | None = None,
    force_ll_bf16_fake: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> KernelResult:
    import torch

    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if gate_factory:
        gate, info = load_factory(gate_factory)(cfg.hidden, cfg.experts, device, cfg.seed)
        info.setdefault("source", gate_factory)
    else:
        gate, info = build_vllm_gate(cfg.hidden, cfg.experts, device, cfg.seed, force_ll_bf16_fake)
    recorder = PathRecorder(op_pattern=cfg.op_pattern)
    shims = recorder.install_all()
    log(f"gate {info.get('class', info.get('source'))} on {device}; shims: {', '.join(shims)}")
    results, compile_info = measure_gate(gate, recorder, cfg, device, log=log)
    return KernelResult(
        schema_version=SCHEMA_VERSION,
        arm=arm,
        created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        device=device_info(device),
        torch_version=str(torch.__version__),
        vllm_version=vllm_version(),
        python_version=platform.python_version(),
        gate=info,
        shape={
            "hidden": cfg.hidden,
            "experts": cfg.experts,
            "dtype": "bfloat16",
            "out_dtype": "float32",
            "bias": False,
        },
        compile=compile_info,
        timing={
            "method": "cuda_graph_replay" if device.startswith("cuda") else "cpu_loop",
            "calls_per_sample": cfg.calls,
            "samples": cfg.trials,
            "warmup": cfg.warmup,
            "warm_s": WARM_S if device.startswith("cuda") else None,
            "statistic": "median of per-call us; spread p10/p90",
        },
        shims=shims,
        results=results,
    )


def parse_m_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad M list {text!r}: {exc}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"bad M list {text!r}: need positive integers")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m suite.stages.kernel.bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="where to write the result (atomically)")
    p.add_argument("--arm", default=None, help="arm label stored in the result")
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--m", type=parse_m_list, default=DEFAULT_M, help="comma list of M (tokens)")
    p.add_argument("--trace-m", type=int, default=DEFAULT_TRACE_M, help="M of the first (frozen) trace")
    p.add_argument("--calls", type=int, default=50, help="calls per timed sample (per CUDA graph)")
    p.add_argument("--trials", type=int, default=101, help="timed samples per M")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (tests may use aot_eager)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--op-pattern", default=DEFAULT_OP_PATTERN, help="regex of torch.ops.vllm ops to record")
    p.add_argument("--gate-factory", default=None, help="module:function building the gate instead of vLLM")
    p.add_argument(
        "--force-ll-bf16-fake",
        action="store_true",
        help="CPU test aid: force GateLinear Tier 1 on with a recording CPU ll_bf16_gemm",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = MeasureConfig(
        hidden=args.hidden,
        experts=args.experts,
        m_values=args.m,
        trace_m=args.trace_m,
        calls=args.calls,
        trials=args.trials,
        warmup=args.warmup,
        backend=args.backend,
        device=args.device,
        seed=args.seed,
        op_pattern=args.op_pattern,
    )

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[kernel{':' + args.arm if args.arm else ''}] {msg}", file=sys.stderr, flush=True)

    result = run(
        cfg, arm=args.arm, gate_factory=args.gate_factory, force_ll_bf16_fake=args.force_ll_bf16_fake, log=log
    )
    atomic_write_json(args.json, result.to_dict())
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
