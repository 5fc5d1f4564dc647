"""Which vLLM image an NVIDIA arm is built on, by the host's driver: vLLM's `vllm/vllm-openai:vX.Y.Z` images are
CUDA 13 builds and need driver R580 or newer; the same release's `-cu129` build (CUDA 12.9) runs on R535 and
newer (minor-version compatibility below R575). With no `runtime.docker.base_image` the suite picks the build the
driver runs; a base the driver cannot run, or a driver older than R535, is refused with the exact fix (the
preflight says it before any pull)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from suite.matrix import Matrix
from suite.runtime.docker import image_vendor

CUDA13_DRIVER = 580  # vllm/vllm-openai:vX.Y.Z: CUDA 13.0
CUDA129_DRIVER = 535  # vllm/vllm-openai:vX.Y.Z-cu129: CUDA 12.9
CUDA_13_BASE = "vllm/vllm-openai:v{vllm}"
CUDA_129_BASE = "vllm/vllm-openai:v{vllm}-cu129"
UPGRADE = (f"upgrade the NVIDIA driver to R{CUDA13_DRIVER} or newer (R{CUDA129_DRIVER} or newer runs the CUDA "
           "12.9 build)")


@dataclass(frozen=True)
class BaseChoice:
    image: str
    runs: bool  # the driver runs it (or no driver here to ask: a build host)
    why: str
    fix: str = ""


def is_cuda13(image: str) -> bool:
    """A vLLM CUDA image of the CUDA 13 build: vLLM names its other builds by a suffix (-cu129, -cu128, ...)."""
    return "-cu12" not in image.rsplit(":", 1)[-1]


def cuda_base(vllm: str, override: str | None, driver: int | None) -> BaseChoice:
    """The base of an NVIDIA arm of vLLM ``vllm``: the matrix's ``override`` (``{vllm}`` filled in) when it names
    one, else the CUDA 13 build on R580+ (or with no driver here), the CUDA 12.9 build on R535-R579."""
    if override is not None:
        image = override.replace("{vllm}", vllm)
        need = CUDA13_DRIVER if is_cuda13(image) else CUDA129_DRIVER
        if driver is None or driver >= need:
            return BaseChoice(image, True, f"{image} as the matrix names it" + (
                f" (driver R{driver})" if driver is not None else ""))
        fix = (f'runtime.docker.base_image: "{CUDA_129_BASE}" (or no base_image: the suite then picks it), or '
               + UPGRADE) if need == CUDA13_DRIVER and driver >= CUDA129_DRIVER else UPGRADE
        return BaseChoice(image, False, f"NVIDIA driver R{driver} cannot run {image} (a CUDA "
                          f"{'13' if need == CUDA13_DRIVER else '12.9'} build needs R{need} or newer)", fix)
    if driver is None or driver >= CUDA13_DRIVER:
        image = CUDA_13_BASE.replace("{vllm}", vllm)
        return BaseChoice(image, True, f"{image} (CUDA 13" + (
            f", driver R{driver})" if driver is not None else "; no NVIDIA driver on this host: a run needs R580+)"))
    if driver >= CUDA129_DRIVER:
        image = CUDA_129_BASE.replace("{vllm}", vllm)
        return BaseChoice(image, True, f"{image}: the CUDA 12.9 build, as driver R{driver} cannot run the CUDA 13 "
                          f"one (R{CUDA13_DRIVER}+)")
    return BaseChoice(CUDA_13_BASE.replace("{vllm}", vllm), False, f"NVIDIA driver R{driver} is older than any vLLM "
                      f"image supports (CUDA 13: R{CUDA13_DRIVER}+, CUDA 12.9: R{CUDA129_DRIVER}+)", UPGRADE)


def nvidia_driver_major(path: Path = Path("/proc/driver/nvidia/version")) -> int | None:
    """The NVIDIA kernel driver's major version on this host (None: no NVIDIA driver)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+)\.\d+", text)
    return int(m.group(1)) if m else None


def engine_is_here() -> bool:
    """The Docker engine runs on this host (its socket), so this host's driver, devices and disks are its own."""
    return os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")


def host_driver(matrix: Matrix) -> int | None:
    """The driver the matrix's NVIDIA containers will run on: this host's, when the engine is here."""
    if image_vendor(matrix) != "cuda" or not engine_is_here():
        return None
    return nvidia_driver_major()
