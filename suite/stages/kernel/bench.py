"""Router-gate kernel microbenchmark: time the MoE router gate as one vLLM tree dispatches it.

Run it as a standalone script in its own process, with the arm's vLLM tree first on ``PYTHONPATH``::

    python -m suite.stages.kernel.bench --json OUT.json --model MODEL --m 1,2,4,8,16,32

The gate's shape is the model's: ``--model`` (a local directory or a hub id) has it read from the model's own
config (``hidden_size`` and its routed experts' key: suite.model_config.gate_shape), in this process, where the
arm's server loads the same model; the suite's kernel stage passes the arm's model so. By hand, ``--hidden`` and
``--experts`` give it instead (default 2816 x 128, Gemma 4 26B-A4B's gate).

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

Only torch and the standard library are imported at module level, and beside them the benchmark's own
timing harness (suite.stages.kernel.timing), path recording (suite.stages.kernel.gate_paths) and the model
config's reading (suite.model_config), which import nothing of the suite either: the benchmark works without
vLLM (the H200 harness in ``benchmarks/kernel/`` uses it with vLLM's kernel files only). In an arm's image the
four are files side by side under /opt/suite/tools: ``kernel_bench.py``, ``kernel_timing.py``,
``kernel_gate_paths.py`` and ``kernel_model_config.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

try:
    from suite import model_config
    from suite.stages.kernel import gate_paths, timing
except ImportError:  # in an arm's image: kernel_gate_paths.py, kernel_timing.py, kernel_model_config.py beside it
    import kernel_gate_paths as gate_paths  # type: ignore[no-redef]
    import kernel_model_config as model_config  # type: ignore[no-redef]
    import kernel_timing as timing  # type: ignore[no-redef]

SCHEMA_VERSION = 1
DEFAULT_M = (1, 2, 4, 8, 16, 32)
DEFAULT_TRACE_M = 2048
DEFAULT_SHAPE = (2816, 128)  # by hand, without --model: Gemma 4 26B-A4B's gate (hidden, experts)


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


@dataclass
class MeasureConfig:
    hidden: int = DEFAULT_SHAPE[0]
    experts: int = DEFAULT_SHAPE[1]
    m_values: tuple[int, ...] = DEFAULT_M
    trace_m: int = DEFAULT_TRACE_M
    calls: int = 50
    trials: int = 101
    warmup: int = 10
    backend: str = "inductor"
    device: str = "auto"
    seed: int = 0
    op_pattern: str = gate_paths.DEFAULT_OP_PATTERN


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
    recorder: gate_paths.PathRecorder,
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
        trace_path = gate_paths.classify(trace_calls)
        log(f"traced at M={cfg.trace_m} in {trace_s:.1f}s: path {trace_path}")

        compiled_calls: dict[int, list[str]] = {}
        recompiled: dict[int, bool] = {}
        for m in cfg.m_values:
            before = dynamo_graph_count()
            first = recorder.record(compiled, inputs[m])
            recompiled[m] = dynamo_graph_count() > before
            # a second call records the steady state (after any recompile the first call triggered)
            compiled_calls[m] = recorder.record(compiled, inputs[m])
            if gate_paths.classify(first) != gate_paths.classify(compiled_calls[m]):
                log(
                    f"M={m}: first compiled call took {gate_paths.classify(first)}, "
                    f"later calls {gate_paths.classify(compiled_calls[m])}"
                )

        timer = timing.time_cuda_graph if device.startswith("cuda") else timing.time_cpu_loop
        results: list[MResult] = []
        for m in cfg.m_values:
            samples = timer(compiled, inputs[m], cfg.calls, cfg.trials, cfg.warmup)
            clock = timing.sm_clock_mhz() if device.startswith("cuda") else None
            recorder.take()
            stats = timing.summarize(samples)
            path = gate_paths.classify(compiled_calls[m])
            eager_path = gate_paths.classify(eager[m])
            frozen = path != eager_path and path == trace_path
            results.append(
                MResult(
                    m=m,
                    median_us=round(stats["median_us"], 4),
                    p10_us=round(stats["p10_us"], 4),
                    p90_us=round(stats["p90_us"], 4),
                    n=len(samples),
                    path=path,
                    calls=gate_paths.count_calls(compiled_calls[m]),
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
        "eager_trace_path": gate_paths.classify(eager[cfg.trace_m]),
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
        ll_bf16 = importlib.import_module(gate_paths.LL_BF16_MODULE)
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
    model: str | None = None,
) -> KernelResult:
    import torch

    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    if gate_factory:
        gate, info = load_factory(gate_factory)(cfg.hidden, cfg.experts, device, cfg.seed)
        info.setdefault("source", gate_factory)
    else:
        gate, info = build_vllm_gate(cfg.hidden, cfg.experts, device, cfg.seed, force_ll_bf16_fake)
    recorder = gate_paths.PathRecorder(op_pattern=cfg.op_pattern)
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
            **({"model": model} if model else {}),  # the model whose config gave the shape (by hand: none)
        },
        compile=compile_info,
        timing={
            "method": "cuda_graph_replay" if device.startswith("cuda") else "cpu_loop",
            "calls_per_sample": cfg.calls,
            "samples": cfg.trials,
            "warmup": cfg.warmup,
            "warm_s": timing.WARM_S if device.startswith("cuda") else None,
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
    p.add_argument("--model", default=None,
                   help="the model whose gate to time (a local directory or a hub id): its config gives the shape")
    p.add_argument("--hidden", type=int, default=None,
                   help=f"the gate's input size, without --model (default {DEFAULT_SHAPE[0]})")
    p.add_argument("--experts", type=int, default=None,
                   help=f"the gate's routed experts, without --model (default {DEFAULT_SHAPE[1]})")
    p.add_argument("--m", type=parse_m_list, default=DEFAULT_M, help="comma list of M (tokens)")
    p.add_argument("--trace-m", type=int, default=DEFAULT_TRACE_M, help="M of the first (frozen) trace")
    p.add_argument("--calls", type=int, default=50, help="calls per timed sample (per CUDA graph)")
    p.add_argument("--trials", type=int, default=101, help="timed samples per M")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (tests may use aot_eager)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--op-pattern", default=gate_paths.DEFAULT_OP_PATTERN, help="regex of torch.ops.vllm ops to record"
    )
    p.add_argument("--gate-factory", default=None, help="module:function building the gate instead of vLLM")
    p.add_argument(
        "--force-ll-bf16-fake",
        action="store_true",
        help="CPU test aid: force GateLinear Tier 1 on with a recording CPU ll_bf16_gemm",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def gate_shape_of(args: argparse.Namespace) -> tuple[int, int]:
    """(hidden, experts): the model's config's (``--model``), else ``--hidden`` / ``--experts`` (or their
    defaults). SystemExit with the reason when the config gives none, or when both ways are given."""
    if args.model is None:
        return (DEFAULT_SHAPE[0] if args.hidden is None else args.hidden,
                DEFAULT_SHAPE[1] if args.experts is None else args.experts)
    if args.hidden is not None or args.experts is not None:
        raise SystemExit("kernel bench: --model gives the gate's shape from the model's config: drop --hidden and "
                         "--experts, or drop --model")
    try:
        shape = model_config.gate_shape(model_config.read_config(args.model), args.model)
    except ValueError as exc:
        raise SystemExit(f"kernel bench: {exc}") from None
    return shape.hidden, shape.experts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    hidden, experts = gate_shape_of(args)
    cfg = MeasureConfig(
        hidden=hidden,
        experts=experts,
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

    if args.model is not None:
        log(f"gate {hidden} x {experts}: {args.model}'s config")
    result = run(
        cfg, arm=args.arm, gate_factory=args.gate_factory, force_ll_bf16_fake=args.force_ll_bf16_fake, log=log,
        model=args.model,
    )
    atomic_write_json(args.json, result.to_dict())
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
