"""Decoder-layer subgraph benchmark: seed 000's first table, µs per layer of vLLM's own Gemma 4 decoder layer.

Run it as a standalone script in its own process, with the arm's vLLM tree first on ``PYTHONPATH``::

    python -m suite.stages.layer.bench --json OUT.json --model DIR --tokens 1,2,4,8

What it does, per process (one arm):

1. builds the engine's own config from the model directory (``EngineArgs(...).create_engine_config()``, the
   same flags a server takes: ``--load-format dummy``, ``--hf-overrides``) and, inside it, one
   ``Gemma4DecoderLayer`` of the arm's vLLM, exactly as the model builds it; its weights come from vLLM's
   own loader (dummy: the values a ``--load-format dummy`` server has) and ``process_weights_after_loading``;
2. takes the attention out (its module and the input norm become pass-throughs), so the layer's own
   ``forward`` runs what seed 000 timed: the dense FFN, the router (with the gate), the MoE experts and the
   7 RMSNorms after attention;
3. compiles it as the server does, by vLLM's own ``support_torch_compile`` in the engine's config
   (``--compile vllm``: vLLM's backend and passes, its guard-free wrapper), or by plain guard-free
   ``torch.compile`` with inductor (``--compile inductor``); either way with the token dimension dynamic and
   traced first at a large T (``--trace-m``), as an engine's first (profiling) pass does;
4. records, in an untimed pass, which path the router gate took inside the layer per T (eager and compiled;
   a *frozen branch* is a compiled path that differs from the eager one and equals the trace-T path);
5. times each T: CUDA-graph replay on GPU (``--calls`` layer calls captured in one graph, ``--trials``
   replays), a plain loop on CPU; µs per layer, median, p10, p90 and the samples.

The result has the kernel bench's shape (``results`` per T as ``m``) plus a ``layer`` block and the timings of a
reference GEMM, the same work in every arm, taken beside the layer at each T (``reference``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

try:
    from suite.stages.kernel import bench as kernel_bench
    from suite.stages.kernel import gate_paths, timing
except ImportError:  # in an arm's image: /opt/suite/tools/kernel_bench.py and its kernel_*.py lie beside this file
    import kernel_bench  # type: ignore[no-redef]
    import kernel_gate_paths as gate_paths  # type: ignore[no-redef]
    import kernel_timing as timing  # type: ignore[no-redef]

gate_shape = kernel_bench.model_config.gate_shape  # the gate's shape a config implies (suite.model_config)

MResult, PathRecorder = kernel_bench.MResult, gate_paths.PathRecorder

SCHEMA_VERSION = 1
DEFAULT_TOKENS = (1, 2, 4, 8)
DEFAULT_TRACE_T = 2048
GATE_BEGIN, GATE_END = "<gate>", "</gate>"
REFERENCE_WIDTH = 8  # the reference GEMM's weight: hidden x 8*hidden (Gemma 4: 127 MB, beyond the H200's L2)

def _gemma4_layer() -> type:
    from vllm.model_executor.models.gemma4 import Gemma4DecoderLayer

    return Gemma4DecoderLayer


def _mixtral_layer() -> type:
    from vllm.model_executor.models.mixtral import MixtralDecoderLayer

    return MixtralDecoderLayer


# model_type -> (the arm's decoder layer class, the router gate's attribute path, what the subgraph holds)
LAYERS: dict[str, tuple[Callable[[], type], str, str]] = {
    "gemma4_text": (_gemma4_layer, "router.proj",
                    "FFN + MoE + router + 7 RMSNorms (attention and its input norm taken out)"),
    "mixtral": (_mixtral_layer, "block_sparse_moe.gate",
                "MoE + router + the post-attention RMSNorm (attention and its input norm taken out)"),
}


@dataclass
class LayerConfig:
    model: str
    tokens: tuple[int, ...] = DEFAULT_TOKENS
    trace_m: int = DEFAULT_TRACE_T
    layer_index: int = 0
    hf_overrides: dict[str, Any] | None = None
    load_format: str = "dummy"
    calls: int = 20
    trials: int = 51
    warmup: int = 5
    backend: str = "inductor"
    compile: str = "vllm"  # vllm: vLLM's own support_torch_compile; inductor: plain guard-free torch.compile
    device: str = "auto"
    seed: int = 0


def _attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def build_layer(cfg: LayerConfig, device: str) -> tuple[Any, Any, dict[str, Any]]:
    """(the layer with its attention taken out, the engine config it was built in, what it is)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    engine_args = EngineArgs(model=cfg.model, tokenizer=cfg.model, skip_tokenizer_init=True, dtype="bfloat16",
                             load_format=cfg.load_format, hf_overrides=cfg.hf_overrides or {},
                             max_model_len=max(cfg.trace_m, 4096), max_num_batched_tokens=max(cfg.trace_m, 4096))
    vllm_config = engine_args.create_engine_config()
    model_config = vllm_config.model_config
    text = model_config.hf_text_config
    model_type = getattr(text, "model_type", None)
    if model_type not in LAYERS:
        raise SystemExit(f"layer bench: no decoder-layer recipe for model_type {model_type!r} "
                         f"(known: {', '.join(LAYERS)})")
    load_class, gate_path, holds = LAYERS[model_type]
    layer_cls = load_class()
    with set_current_vllm_config(vllm_config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"tcp://127.0.0.1:{kernel_bench.free_port()}",
                                         backend="nccl" if device.startswith("cuda") else "gloo")
            initialize_model_parallel(1, 1)
        _init_workspace(torch.device(device))
        with set_default_torch_dtype(model_config.dtype), torch.device(device):
            layer = layer_cls(text, cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config,
                              prefix=f"model.layers.{cfg.layer_index}")
        get_model_loader(vllm_config.load_config).load_weights(layer, model_config)
        process_weights_after_loading(layer, model_config, torch.device(device))
    layer.eval()
    layer.self_attn = pass_through_attention()
    layer.input_layernorm = torch.nn.Identity()
    gate = _attr_path(layer, gate_path)
    shape = gate_shape(text.to_dict(), cfg.model)
    info = {
        "class": f"{layer_cls.__module__}.{layer_cls.__qualname__}",
        "model_type": model_type,
        "layer_index": cfg.layer_index,
        "layer_type": (getattr(text, "layer_types", None) or [None] * (cfg.layer_index + 1))[cfg.layer_index],
        "num_layers": int(getattr(text, "num_hidden_layers", 0)),
        "subgraph": holds,
        "gate": f"{gate_path}: {type(gate).__module__}.{type(gate).__qualname__}",
        "hidden": shape.hidden,
        "intermediate": int(getattr(text, "intermediate_size", 0)),
        "moe_intermediate": int(getattr(text, "moe_intermediate_size", 0)),
        "experts": shape.experts,
        "top_k": int(getattr(text, "top_k_experts", None) or getattr(text, "num_experts_per_tok", 0)),
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "load_format": cfg.load_format,
        "compilation_mode": str(vllm_config.compilation_config.mode),
    }
    for attr in sorted(vars(gate)):
        if attr.startswith("allow_") and isinstance(getattr(gate, attr), bool):
            info[f"gate_{attr}"] = getattr(gate, attr)
    return layer, vllm_config, info


def _init_workspace(device: Any) -> None:
    """The fused-MoE kernels take their scratch from the worker's workspace manager (vLLM >= 0.2x), which a
    GPU worker sets up at start: set it up here too, where this vLLM has one."""
    try:
        from vllm.v1.worker import workspace
    except ImportError:
        return
    if hasattr(workspace, "init_workspace_manager") and getattr(workspace, "_manager", None) is None:
        workspace.init_workspace_manager(device)


def pass_through_attention() -> Any:
    """The attention taken out of the layer: a module whose output is its input."""
    import torch

    class PassThroughAttention(torch.nn.Module):
        def forward(self, positions: Any = None, hidden_states: Any = None, **kwargs: Any) -> Any:
            return hidden_states

    return PassThroughAttention()


def mark_gate(gate: Any, recorder: PathRecorder) -> None:
    """Bracket the router gate's calls in the recorder's list, so the gate's own path can be told apart from
    the layer's other GEMMs (Dynamo replays the list appends in order)."""
    calls = recorder.calls
    inner = gate.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        calls.append(GATE_BEGIN)
        out = inner(*args, **kwargs)
        calls.append(GATE_END)
        return out

    gate.forward = forward


# Kernels every layer uses (the MLP's and attention's GEMMs too): a gate's only when reached inside its brackets.
GENERAL_KERNELS = frozenset({"torch.mm", "F.linear", "onednn_mm", "sgl_weight_packed_linear"})


def gate_calls(labels: list[str]) -> list[str]:
    """The labels of the router gate's own calls: those inside its brackets, the custom router ops the profiler
    saw, and gate-only kernels anywhere. (A compiled layer's traced appends, the brackets among them, are
    replayed after its graph has run, so a kernel called inside an opaque custom op during the graph, such as
    ``ll_bf16_gemm`` under ``ll_bf16_router_gemm_dispatch``, lands before the brackets.)"""
    out, inside = [], False
    for label in labels:
        if label == GATE_BEGIN:
            inside = True
        elif label == GATE_END:
            inside = False
        elif inside or "::" in label or label not in GENERAL_KERNELS:
            out.append(label)
    return out


def run_time_path(path: str, eager_path: str) -> str | None:
    """The compiled layer's gate path when its gate is an opaque custom op: ``op -> leaf`` with the leaf that
    op's eager pass at the same T reached, or None when the path is not an op alone. A compiled layer's traced
    list appends are reconstructed after its graph runs, which erases what an op's body appended during it; the
    body is not compiled (it runs the same Python at run time as in the eager pass), so its leaf at that T is
    the eager one. Such a path is decided at run time: not a frozen branch."""
    if "::" in path and " -> " not in path and eager_path.startswith(f"{path} -> "):
        return eager_path
    return None


def compile_with_inductor(module: Any, backend: str) -> Any:
    """``torch.compile`` as vLLM's TorchCompileWithNoGuardsWrapper does it for a model: full graph, static
    shapes but the token dimension (``mark_dynamic`` on the input, as ``support_torch_compile`` does), no guards
    kept. (``dynamic=True`` would also make the layer's Python ints symbolic, which vLLM never does.)"""
    import torch

    options = {"guard_filter_fn": lambda entries: [False] * len(entries)}
    return torch.compile(module, fullgraph=True, dynamic=False, backend=backend, options=options)


def compile_with_vllm(host: Any, vllm_config: Any) -> Any:
    """The layer compiled by vLLM itself: ``support_torch_compile`` on a module around it, built in the
    engine's config (``CompilationMode.VLLM_COMPILE`` on GPUs: vLLM's backend, its passes and its guard-free
    wrapper; the token dimension dynamic; traced at the first call). vLLM's CUDA-graph wrappers stay idle (the
    forward context says no graph), so the replay the bench captures holds the compiled kernels."""
    import torch
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import set_current_vllm_config

    @support_torch_compile(dynamic_arg_dims={"hidden_states": 0})
    class VllmCompiledLayer(torch.nn.Module):
        def __init__(self, *, vllm_config: Any, prefix: str = "", inner: Any = None) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return self.inner(hidden_states)

    with set_current_vllm_config(vllm_config):
        return VllmCompiledLayer(vllm_config=vllm_config, prefix="suite_layer", inner=host)


def make_host(layer: Any) -> Any:
    import torch

    class DecoderLayerSubgraph(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.layer = inner

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return self.layer(None, hidden_states, None)[0]

    return DecoderLayerSubgraph(layer)


def measure_layer(layer: Any, vllm_config: Any, gate: Any, cfg: LayerConfig, device: str,
                  log: Callable[[str], None]) -> tuple[list[MResult], dict[str, Any], list[dict[str, Any]]]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    recorder = PathRecorder()
    shims = recorder.install_all()
    mark_gate(gate, recorder)
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
    hidden = layer.hidden_size

    def make_x(t: int) -> Any:
        return torch.randn(t, hidden, generator=gen, dtype=torch.float32).to(device=device, dtype=torch.bfloat16)

    host = make_host(layer)
    inputs = {t: make_x(t) for t in cfg.tokens}
    x_trace = make_x(cfg.trace_m)
    # the same work in every arm, timed beside the layer at each T: what a process's own speed level does to a
    # fixed GEMM (its weight larger than the L2 cache, as the experts' are), to tell that apart from the arm
    ref_weight = (torch.randn(hidden, REFERENCE_WIDTH * hidden, generator=gen) * 0.02).to(device=device,
                                                                                          dtype=torch.bfloat16)

    def reference(x: Any) -> Any:
        return x @ ref_weight

    def in_context(t: int, fn: Callable[[], Any]) -> Any:
        with set_current_vllm_config(vllm_config), set_forward_context(None, vllm_config, num_tokens=t):
            return fn()

    with torch.inference_mode():
        eager = {t: gate_calls(in_context(t, lambda t=t: recorder.record(host, inputs.get(t, x_trace))))
                 for t in (*cfg.tokens, cfg.trace_m)}
        torch._dynamo.reset()
        if cfg.compile == "vllm":
            compiled = compile_with_vllm(host, vllm_config)
        else:
            compiled = compile_with_inductor(host, backend=cfg.backend)
            torch._dynamo.mark_dynamic(x_trace, 0)
        g0 = kernel_bench.dynamo_graph_count()
        t0 = time.perf_counter()
        trace_calls = gate_calls(in_context(cfg.trace_m, lambda: recorder.record(compiled, x_trace)))
        trace_s = time.perf_counter() - t0
        trace_path = gate_paths.classify(trace_calls)
        log(f"traced at T={cfg.trace_m} in {trace_s:.1f}s: gate path {trace_path}")
        results, references = [], []
        timer = timing.time_cuda_graph if device.startswith("cuda") else timing.time_cpu_loop
        for t in cfg.tokens:
            before = kernel_bench.dynamo_graph_count()
            in_context(t, lambda t=t: recorder.record(compiled, inputs[t]))
            recompiled = kernel_bench.dynamo_graph_count() > before
            steady = gate_calls(in_context(t, lambda t=t: recorder.record(compiled, inputs[t])))
            samples = in_context(t, lambda t=t: timer(compiled, inputs[t], cfg.calls, cfg.trials, cfg.warmup))
            clock = timing.sm_clock_mhz() if device.startswith("cuda") else None
            ref_samples = timer(reference, inputs[t], cfg.calls, cfg.trials, cfg.warmup)
            recorder.take()
            references.append({"m": t, **{k: round(v, 4) for k, v in timing.summarize(ref_samples).items()},
                               "samples_us": [round(x, 4) for x in ref_samples]})
            stats = timing.summarize(samples)
            path, eager_path = gate_paths.classify(steady), gate_paths.classify(eager[t])
            frozen = path != eager_path and path == trace_path
            if (resolved := run_time_path(path, eager_path)) is not None:
                path, frozen = resolved, False
            results.append(MResult(m=t, median_us=round(stats["median_us"], 4), p10_us=round(stats["p10_us"], 4),
                                   p90_us=round(stats["p90_us"], 4), n=len(samples), path=path,
                                   calls=gate_paths.count_calls(steady), eager_path=eager_path, frozen_branch=frozen,
                                   recompiled=recompiled, samples_us=[round(s, 4) for s in samples],
                                   sm_clock_mhz=clock))
            log(f"T={t:<4d} median {stats['median_us']:9.2f} us/layer  p10 {stats['p10_us']:9.2f}  "
                f"p90 {stats['p90_us']:9.2f}  gate {path}{'  FROZEN BRANCH' if frozen else ''}"
                f"{'  (recompiled)' if recompiled else ''}")
    compile_info = {
        "wrapper": ("vLLM's support_torch_compile, mode " + str(vllm_config.compilation_config.mode)
                    if cfg.compile == "vllm" else
                    "torch.compile(fullgraph=True, dynamic=False, mark_dynamic(tokens), guard_filter_fn drops all "
                    "guards)"),
        "compile": cfg.compile,
        "backend": "vllm" if cfg.compile == "vllm" else cfg.backend, "trace_m": cfg.trace_m, "trace_path": trace_path,
        "trace_seconds": round(trace_s, 3), "dynamo_graphs_at_trace": kernel_bench.dynamo_graph_count() - g0,
        "eager_trace_path": gate_paths.classify(eager[cfg.trace_m]), "shims": shims,
        "env": {key: os.environ.get(key) for key in COMPILE_ENV[cfg.compile]},
    }
    return results, compile_info, references


def run(cfg: LayerConfig, arm: str | None = None, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    import torch

    device = kernel_bench.resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    layer, vllm_config, info = build_layer(cfg, device)
    log(f"{info['class']} (layer {cfg.layer_index}{', ' + info['layer_type'] if info['layer_type'] else ''}) on "
        f"{device}: {info['subgraph']}")
    results, compile_info, references = measure_layer(layer, vllm_config, _attr_path(layer, LAYERS[info["model_type"]][1]),
                                          cfg, device, log)
    frozen = [r.m for r in results if r.frozen_branch]
    return {
        "schema_version": SCHEMA_VERSION, "arm": arm,
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "host": socket.gethostname(),
        "device": kernel_bench.device_info(device), "torch_version": str(torch.__version__), "vllm_version": kernel_bench.vllm_version(),
        "python_version": platform.python_version(), "layer": info,
        "gate": {"class": info["gate"].split(": ", 1)[1], "source": "the layer's own router gate"},
        "shape": {"hidden": info["hidden"], "experts": info["experts"], "dtype": info["dtype"]},
        "compile": compile_info,
        "timing": {"method": "cuda_graph_replay" if device.startswith("cuda") else "cpu_loop",
                   "calls_per_sample": cfg.calls, "samples": cfg.trials, "warmup": cfg.warmup,
                   "warm_s": timing.WARM_S if device.startswith("cuda") else None,
                   "statistic": "median of per-layer-call us; spread p10/p90"},
        "frozen_branch_ms": frozen,
        "results": [asdict(r) for r in results],
        "reference": {"what": f"x @ W (W: hidden x {REFERENCE_WIDTH}*hidden, bfloat16; the same in every arm), "
                              "timed like the layer right after it at each T", "results": references},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m suite.stages.layer.bench", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, help="where to write the result (atomically)")
    p.add_argument("--model", required=True, help="model directory (its config.json; weights per --load-format)")
    p.add_argument("--arm", default=None, help="arm label stored in the result")
    p.add_argument("--tokens", type=kernel_bench.parse_m_list, default=DEFAULT_TOKENS, help="comma list of T (tokens)")
    p.add_argument("--trace-m", type=int, default=DEFAULT_TRACE_T, help="T of the first (frozen) trace")
    p.add_argument("--layer-index", type=int, default=0)
    p.add_argument("--hf-overrides", type=json.loads, default=None, help="JSON, as vLLM's --hf-overrides")
    p.add_argument("--load-format", default="dummy", help="vLLM's --load-format (dummy: random weights)")
    p.add_argument("--calls", type=int, default=20, help="layer calls per timed sample (per CUDA graph)")
    p.add_argument("--trials", type=int, default=51, help="timed samples per T")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compile", choices=("vllm", "inductor"), default="vllm",
                   help="vllm: the layer compiled by vLLM's own support_torch_compile in the engine's config (as "
                        "the server does); inductor: plain guard-free torch.compile")
    p.add_argument("--backend", default="inductor", help="torch.compile backend of --compile inductor")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0)
    return p


# --compile vllm: no compiled graph from vLLM's cache (a cached AOT artifact would skip the trace that records
# the gate's path, and replay another process's compile). --compile inductor: vLLM >= 0.26 on torch >= 2.11
# passes a layer's name to its custom ops (fused MoE) as a hoisted opaque object that only vLLM's own backend
# lifts out of the graph; as a plain string the op and the kernels it runs are the same.
COMPILE_ENV = {"vllm": {"VLLM_DISABLE_COMPILE_CACHE": "1"}, "inductor": {"VLLM_USE_LAYERNAME": "0"}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in COMPILE_ENV[args.compile].items():
        os.environ.setdefault(key, value)
    cfg = LayerConfig(model=args.model, tokens=args.tokens, trace_m=args.trace_m, layer_index=args.layer_index,
                      hf_overrides=args.hf_overrides, load_format=args.load_format, calls=args.calls,
                      trials=args.trials, warmup=args.warmup, backend=args.backend, compile=args.compile,
                      device=args.device, seed=args.seed)

    def log(msg: str) -> None:
        print(f"[layer{':' + args.arm if args.arm else ''}] {msg}", file=sys.stderr, flush=True)

    result = run(cfg, arm=args.arm, log=log)
    kernel_bench.atomic_write_json(args.json, result)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
