"""Apply an arm's patches (patch sets and diff files of the matrix's own) to the vLLM installed in an image,
verify them and record what was applied.

Runs inside `docker build` with the image's own python (stdlib only here); the patching itself is done by
`suite patches apply` (its command module and what it imports, copied to /opt/suite), the same code path as the
local runtime: a set by its name, a diff file by its path in the image (/opt/suite/patches/_files/<sha256>/<name>,
copied there by `suite build`), forward or reverse, strict.

Build args read from the environment:
  VLLM_VERSION          the vLLM version the matrix arm asks for; the image's must match (0.32.0 == 0.32.0+cpu)
                        unless the arm brings its own vLLM (then it names the release patch sets are chosen for)
  SUITE_PATCHES         space-separated patch names in the arm's order (a set's name, a diff file's file name);
                        a leading '-' applies one in reverse
  SUITE_PATCH_SHA256S   space-separated NAME=SHA256 of each one's diff, in the same order, as `suite build` hashed
  SUITE_PATCH_FILES     space-separated NAME=SHA256 of those that are diff files (not sets)
  SUITE_VLLM_SOURCE     pypi (the base image's vLLM), wheel or git (installed over it by the Dockerfile's step
                        before this one; a git build leaves the commit it built in /opt/suite/vllm-git-commit)
  VLLM_WHEEL, VLLM_WHEEL_SHA256, VLLM_GIT_URL, VLLM_GIT_REF: recorded in image.json
  VLLM_SITE             optional: the directory holding vllm/ (default: where the image's python finds it)
  SUITE_LM_EVAL_VENV    optional: lm-eval's venv, whose packages fill in what python3 lacks (default /opt/lm-eval)
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
PATCH_FILES = SUITE_ROOT / "patches" / "_files"  # suite.runtime.docker.build_context.PATCH_FILES
GIT_COMMIT_FILE = SUITE_ROOT / "vllm-git-commit"  # written by the Dockerfiles' git step
DEPS = ("pydantic", "yaml", "rich", "numpy", "scipy")
LM_EVAL_VENV = Path(os.environ.get("SUITE_LM_EVAL_VENV", "/opt/lm-eval"))  # docker/lm_eval_venv.py's venv
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


def lm_eval_site() -> str | None:
    """The site-packages of lm-eval's venv (lm_eval_venv.py made it in an earlier layer, from this python3's
    base: the same Python), None where there is none."""
    python = LM_EVAL_VENV / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def suite_deps() -> tuple[str | None, bool]:
    """suite needs pydantic 2, pyyaml, rich and (suite.matrix -> suite.stats) numpy and scipy; vLLM images
    carry most of them. What python3 lacks (scipy, say) comes from lm-eval's venv when it has it (lm-eval
    brings scipy: no download, no time), else from a throw-away --target. Returns the directory for PYTHONPATH
    (None: python3 has everything) and whether to remove it afterwards."""
    probe = f"import {', '.join(DEPS)}; assert int(pydantic.VERSION.split('.')[0]) >= 2"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return None, False
    site = lm_eval_site()
    if site is not None and subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                           env=dict(os.environ, PYTHONPATH=site)).returncode == 0:
        print(f"apply_patches: pydantic, pyyaml, rich, numpy, scipy with lm-eval's venv's packages ({site})")
        return site, False
    target = tempfile.mkdtemp(prefix="suite-deps-")
    print(f"apply_patches: installing pydantic, pyyaml, rich, numpy, scipy into {target} (removed afterwards)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--target", target,
                    "pydantic>=2.6", "pyyaml>=6", "rich>=13", "numpy>=1.26", "scipy>=1.10"], check=True)
    return target, True


def patch_args() -> list[tuple[str, bool, str, str]]:
    """(name, reverse, expected sha256, what to give `suite patches apply`) per patch, in the arm's order."""
    refs = os.environ.get("SUITE_PATCHES", "").split()
    pairs = [tuple(item.split("=", 1)) for item in os.environ.get("SUITE_PATCH_SHA256S", "").split()]
    files = set(os.environ.get("SUITE_PATCH_FILES", "").split())
    if [ref.lstrip("-") for ref in refs] != [name for name, _ in pairs]:
        fail(f"SUITE_PATCHES {refs} and SUITE_PATCH_SHA256S {[n for n, _ in pairs]} name different patches")
    out = []
    for ref, (name, sha) in zip(refs, pairs, strict=True):
        what = name
        if f"{name}={sha}" in files:
            path = PATCH_FILES / sha / name
            if not path.is_file():
                fail(f"diff file {name} (sha256 {sha}) is not in the build context at {path}")
            what = str(path)  # a path: `suite patches apply` reads it as a diff file named {name}
        out.append((name, ref.startswith("-"), sha, what))
    return out


def vllm_source() -> dict[str, str]:
    """Where the image's vLLM came from (the Dockerfile's step before this one), for image.json."""
    kind = os.environ.get("SUITE_VLLM_SOURCE", "").strip() or "pypi"
    if kind == "wheel":
        return {"kind": kind, "wheel": os.environ.get("VLLM_WHEEL", ""),
                "sha256": os.environ.get("VLLM_WHEEL_SHA256", "")}
    if kind == "git":
        if not GIT_COMMIT_FILE.is_file():
            fail(f"SUITE_VLLM_SOURCE=git but the git step left no {GIT_COMMIT_FILE}")
        return {"kind": kind, "url": os.environ.get("VLLM_GIT_URL", ""), "ref": os.environ.get("VLLM_GIT_REF", ""),
                "commit": GIT_COMMIT_FILE.read_text().strip()}
    return {"kind": "pypi"}


def main() -> None:
    want = os.environ.get("VLLM_VERSION", "").strip()
    patches = patch_args()
    source = vllm_source()
    site = vllm_site()
    deps, temporary = suite_deps()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(SUITE_ROOT), deps) if p),
               SUITE_PATCHES_DIR=str(SUITE_ROOT / "patches"))
    sys.path[:0] = [p for p in (str(SUITE_ROOT), deps) if p]
    from suite.patches import base_version, vllm_version_of

    version = vllm_version_of(site)
    patch_version = version
    if source["kind"] != "pypi":
        # the arm's own vLLM (a dev build reports 0.34.0.dev12+g...): patch sets are chosen for the release the
        # matrix names, and that is the version the arm reports
        print(f"apply_patches: vLLM from {source['kind']} reports {version}; the arm is vLLM {want or version}")
        patch_version = want or version
    elif want and base_version(version) != base_version(want):
        fail(f"the base image has vLLM {version} at {site}, the arm asks for {want}")
    print(f"apply_patches: vLLM {version} at {site}; patches: "
          f"{' '.join(('-' if rev else '') + name for name, rev, _, _ in patches) or '(none)'}")
    applied = []
    for name, reverse, _, what in patches:  # one call each, in the arm's order (one may rely on an earlier one)
        cmd = [sys.executable, "-c", RUN_PATCHES_COMMAND, "apply", *(["--reverse"] if reverse else []), what,
               "--target", str(site), "--vllm", patch_version, "--json"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"suite patches apply {'-' if reverse else ''}{name} failed:\n{proc.stdout}{proc.stderr}")
        (record,) = json.loads(proc.stdout)["patches"]
        applied.append(record)
        print(f"apply_patches: {record['action']} {record['name']} sha256 {record['sha256']} "
              f"{' '.join(record['files'])}")
    # verify: what was applied is exactly what `suite build` hashed (in order), and every written file compiles
    got = [(r["name"], r["sha256"]) for r in applied]
    expected = [(name, sha) for name, _, sha, _ in patches]
    if got != expected:
        fail(f"applied (name, sha256) {got} differ from the ones the image is labelled with {expected}")
    for record in applied:
        for rel in record["files"]:
            try:
                py_compile.compile(str(site / rel), doraise=True)
            except py_compile.PyCompileError as exc:
                fail(f"{rel} does not compile after patching: {exc.msg}")
    info = {"vllm_version": version, "vllm_site": str(site), "vllm_source": source, "python": sys.version.split()[0],
            "patches": applied}
    (SUITE_ROOT / "image.json").write_text(json.dumps(info, indent=2) + "\n")
    if deps and temporary:
        subprocess.run(["rm", "-rf", deps], check=True)
    print("apply_patches: ok")


if __name__ == "__main__":
    main()
