"""Apply an arm's patch sets to the vLLM installed in an image, verify them and record what was applied.

Runs inside `docker build` with the image's own python (stdlib only here); the patching itself is done by
`suite patches apply` (its command module and what it imports, copied to /opt/suite), the same code path as the
local runtime.

Build args read from the environment:
  VLLM_VERSION          the vLLM version the matrix arm asks for; the image's must match (0.32.0 == 0.32.0+cpu)
  SUITE_PATCHES         space-separated set names in the arm's order; a leading '-' applies a set in reverse
  SUITE_PATCH_SHA256S   space-separated NAME=SHA256 of each set's diff, as computed by `suite build`
  VLLM_SITE             optional: the directory holding vllm/ (default: where the image's python finds it)
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE_ROOT = Path(__file__).resolve().parent
DEPS = ("pydantic", "yaml", "rich", "numpy", "scipy")
# `suite patches ARGS` through the command module itself: the image holds only the modules that command
# imports, not every command suite.cli imports
RUN_PATCHES_COMMAND = (
    "import argparse, sys\n"
    "from suite.commands import patches\n"
    "from suite.errors import SuiteError\n"
    "parser = argparse.ArgumentParser(prog='suite patches')\n"
    "patches.add_arguments(parser)\n"
    "args = parser.parse_args()\n"
    "try:\n"
    "    sys.exit(patches.run(args))\n"
    "except SuiteError as exc:\n"
    "    sys.exit(f'suite patches: error: {exc}')\n"
)


def fail(msg: str) -> None:
    print(f"apply_patches: error: {msg}", file=sys.stderr)
    sys.exit(1)


def vllm_site() -> Path:
    if os.environ.get("VLLM_SITE"):
        return Path(os.environ["VLLM_SITE"])
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        fail(f"{sys.executable} finds no vllm package")
    return Path(next(iter(spec.submodule_search_locations))).parent


def suite_deps() -> str | None:
    """suite needs pydantic 2, pyyaml, rich and (suite.matrix -> suite.stats) numpy and scipy; vLLM images
    carry them. Otherwise: a throw-away --target."""
    probe = f"import {', '.join(DEPS)}; assert int(pydantic.VERSION.split('.')[0]) >= 2"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return None
    target = tempfile.mkdtemp(prefix="suite-deps-")
    print(f"apply_patches: installing pydantic, pyyaml, rich, numpy, scipy into {target} (removed afterwards)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--target", target,
                    "pydantic>=2.6", "pyyaml>=6", "rich>=13", "numpy>=1.26", "scipy>=1.10"], check=True)
    return target


def main() -> None:
    want = os.environ.get("VLLM_VERSION", "").strip()
    refs = os.environ.get("SUITE_PATCHES", "").split()
    expected = dict(item.split("=", 1) for item in os.environ.get("SUITE_PATCH_SHA256S", "").split())
    site = vllm_site()
    deps = suite_deps()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(SUITE_ROOT), deps) if p),
               SUITE_PATCHES_DIR=str(SUITE_ROOT / "patches"))
    sys.path[:0] = [p for p in (str(SUITE_ROOT), deps) if p]
    from suite.patches import base_version, vllm_version_of

    version = vllm_version_of(site)
    if want and base_version(version) != base_version(want):
        fail(f"the base image has vLLM {version} at {site}, the arm asks for {want}")
    print(f"apply_patches: vLLM {version} at {site}; patch sets: {' '.join(refs) or '(none)'}")
    applied = []
    for ref in refs:  # one call per set, in the arm's order (a set may rely on an earlier one)
        name, reverse = (ref[1:], True) if ref.startswith("-") else (ref, False)
        cmd = [sys.executable, "-c", RUN_PATCHES_COMMAND, "apply", *(["--reverse"] if reverse else []), name,
               "--target", str(site), "--vllm", version, "--json"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"suite patches apply {ref} failed:\n{proc.stdout}{proc.stderr}")
        (record,) = json.loads(proc.stdout)["patches"]
        applied.append(record)
        print(f"apply_patches: {record['action']} {name} sha256 {record['sha256']} {' '.join(record['files'])}")
    # verify: what was applied is exactly what `suite build` hashed, and every written file compiles
    got = {r["name"]: r["sha256"] for r in applied}
    if got != expected:
        fail(f"applied sha256s {got} differ from the ones the image is labelled with {expected}")
    for record in applied:
        for rel in record["files"]:
            try:
                py_compile.compile(str(site / rel), doraise=True)
            except py_compile.PyCompileError as exc:
                fail(f"{rel} does not compile after patching: {exc.msg}")
    info = {"vllm_version": version, "vllm_site": str(site), "python": sys.version.split()[0], "patches": applied}
    (SUITE_ROOT / "image.json").write_text(json.dumps(info, indent=2) + "\n")
    if deps:
        subprocess.run(["rm", "-rf", deps], check=True)
    print("apply_patches: ok")


if __name__ == "__main__":
    main()
