"""Where a process runs: the machine's identity as its own tools name it (``HostIdentity``).

Every job record, server start and stretch of a run carries one, so that a run resumed on another machine, a
Slurm job requeued onto another node or a session moved to other GPUs can be told from the records alone. The
machine is its host name, its machine id and the UUIDs (AMD: ASIC serials) of the accelerators it lists; the
rest (CPU model, kernel, driver, CUDA / ROCm version, power limit, clocks) says what kind of machine it was.

NVIDIA: ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,driver_version,power.limit,clocks.max.sm,clocks.sm,name
--format=csv,noheader,nounits`` and the CUDA version from ``nvidia-smi``'s own header. AMD: ``amd-smi static
--asic --bus --driver --json`` and ``amd-smi version --json``. A tool that is missing or fails leaves its
fields empty; nothing here raises.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import socket
from pathlib import Path
from typing import Any

from suite.proc import query
from suite.records import GpuIdentity, HostIdentity, boot_id

TOOL_TIMEOUT_S = 20.0
NVIDIA_FIELDS = ("index", "uuid", "pci.bus_id", "driver_version", "power.limit", "clocks.max.sm", "clocks.sm", "name")
NVIDIA_QUERY = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"]
NVIDIA_HEADER = ["nvidia-smi"]
AMD_STATIC = ["amd-smi", "static", "--asic", "--bus", "--driver", "--json"]
AMD_VERSION = ["amd-smi", "version", "--json"]
CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")


def _output(argv: list[str]) -> str | None:
    """The tool's stdout, or None when it is missing, fails or hangs."""
    return query(argv, timeout_s=TOOL_TIMEOUT_S)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def cpu_model(cpuinfo: str | None) -> str | None:
    """The first "model name" of /proc/cpuinfo (x86), else its "Model" / "cpu model" line (Arm, others)."""
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("model name", "cpu model", "model") and value.strip() and not value.strip().isdigit():
            return value.strip()
    return None


def nvidia_gpus(csv: str | None) -> list[GpuIdentity]:
    """``NVIDIA_QUERY``'s lines as identities (the name last: a comma in it stays in it); "[N/A]" read as None."""
    out = []
    for line in (csv or "").splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",", len(NVIDIA_FIELDS) - 1)]
        row = {f: (None if not v or v.startswith("[") else v) for f, v in zip(NVIDIA_FIELDS, values, strict=False)}
        out.append(GpuIdentity(index=row.get("index"), name=row.get("name"), uuid=row.get("uuid"),
                               pci_bus_id=row.get("pci.bus_id"), driver=row.get("driver_version"),
                               power_limit_w=row.get("power.limit"), clocks_max_sm=row.get("clocks.max.sm"),
                               clocks_sm=row.get("clocks.sm")))
    return out


def _na(value: Any) -> str | None:
    return None if value in (None, "", "N/A") else str(value)


def amd_gpus(text: str | None) -> list[GpuIdentity]:
    """``AMD_STATIC``'s JSON as identities: a list of GPUs (or {"gpu_data": [...]}, as newer releases wrap it),
    each {"gpu": N, "asic": {"market_name", "asic_serial", ...}, "bus": {"bdf", ...}, "driver": {"version"}}."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    out = []
    for gpu in data if isinstance(data, list) else []:
        if not isinstance(gpu, dict):
            continue
        asic, bus, driver = (gpu.get(k) if isinstance(gpu.get(k), dict) else {} for k in ("asic", "bus", "driver"))
        out.append(GpuIdentity(index=_na(gpu.get("gpu")), name=_na(asic.get("market_name")),
                               uuid=_na(asic.get("asic_serial")), pci_bus_id=_na(bus.get("bdf")),
                               driver=_na(driver.get("version"))))
    return out


def rocm_version(text: str | None) -> str | None:
    """The "rocm_version" anywhere in ``AMD_VERSION``'s JSON."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return None
    todo = [data]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if _na(item.get("rocm_version")):
                return str(item["rocm_version"])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return None


@functools.lru_cache(maxsize=1)
def _cuda_version() -> str | None:
    m = CUDA_VERSION.search(_output(NVIDIA_HEADER) or "")
    return m[1] if m else None


@functools.lru_cache(maxsize=1)
def _rocm() -> tuple[tuple[GpuIdentity, ...], str | None]:
    if not shutil.which(AMD_STATIC[0]):
        return (), None
    return tuple(amd_gpus(_output(AMD_STATIC))), rocm_version(_output(AMD_VERSION))


def host_identity(image_id: str | None = None) -> HostIdentity:
    """This machine now: host name, machine id, boot, CPU, kernel, the accelerators (NVIDIA through nvidia-smi,
    else AMD through amd-smi; the SM clock as it is now), the Slurm job and node when inside one, and the
    arm's image (``image_id``, docker runtime)."""
    gpus = nvidia_gpus(_output(NVIDIA_QUERY))
    cuda = _cuda_version() if gpus else None
    rocm = None
    if not gpus:
        amd, rocm = _rocm()
        gpus = list(amd)
    fields: dict[str, Any] = dict(
        hostname=socket.gethostname(), machine_id=_read("/etc/machine-id"), boot_id=boot_id(),
        cpu=cpu_model(_read("/proc/cpuinfo")), kernel=platform.release(), gpus=gpus, cuda=cuda, rocm=rocm,
        slurm_job=os.environ.get("SLURM_JOB_ID") or None, slurm_node=os.environ.get("SLURMD_NODENAME") or None,
        image_id=image_id)
    return HostIdentity(**{k: v for k, v in fields.items() if v not in (None, [])})


@functools.lru_cache(maxsize=1)
def this_machine() -> HostIdentity:
    """``host_identity()`` once per process, for the records of its jobs and its stretch (the machine does not change
    under a running process; a server start probes again for its GPUs' clocks at that moment)."""
    return host_identity()
