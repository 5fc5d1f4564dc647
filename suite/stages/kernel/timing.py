"""The kernel benchmark's timing harness: per-call µs of a compiled call, by CUDA-graph replay on GPU
(``time_cuda_graph``: the graph replayed for ``WARM_S`` seconds before the timed replays, ``sm_clock_mhz`` read
right after them) or by a plain loop on CPU (``time_cpu_loop``), and the statistics the results report
(``summarize``: median, p10, p90).

Standalone, as the benchmarks that time with it (suite.stages.kernel.bench, suite.stages.layer.bench): the
standard library at module level, torch where it is used, nothing of the suite. In an arm's image it is
/opt/suite/tools/kernel_timing.py, beside them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

WARM_S = 1.0  # seconds of graph replays before the timed ones (see time_cuda_graph)


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


def sm_clock_mhz() -> int | None:
    """The GPU's SM clock now (nvidia-smi; the first visible device), or None where none can be read."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    cmd = ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"]
    if visible.isdigit():
        cmd += ["-i", visible]
    try:  # not suite.proc.query: in an arm's image this module stands alone, without the suite package
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True,
                             stdin=subprocess.DEVNULL).stdout.split()
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
