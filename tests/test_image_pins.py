"""docker/image_pins.py, the constraints a vendor image's lm-eval layer installs under (issue: a pin file that
pip refuses stops the whole image build; one that pins a shadowed copy replaces what vLLM imports).

Two real site directories on PYTHONPATH, as an image has pip's site-packages above Debian's dist-packages: a
package in both (the first is what `import` loads), and a Debian-style version. The file is then handed to
the real pip, as the Dockerfile does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from suite import REPO_ROOT

SCRIPT = REPO_ROOT / "docker" / "image_pins.py"


def dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def pin_file(tmp_path: Path) -> tuple[str, dict[str, str]]:
    upper, lower = tmp_path / "site-packages", tmp_path / "dist-packages"
    dist(upper, "suite-fake-yaml", "6.0.3")  # pip's copy: what `import` finds
    dist(lower, "suite-fake-yaml", "5.4.1")  # Debian's, shadowed
    dist(lower, "suite-fake-distro-info", "1.1build1")  # not PEP 440
    env = {**os.environ, "PYTHONPATH": f"{upper}{os.pathsep}{lower}"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60,
                          check=True)
    return proc.stdout, env


def test_the_imported_copy_is_pinned_and_a_debian_version_is_left_out(tmp_path):
    text, _ = pin_file(tmp_path)
    lines = text.splitlines()
    assert "suite-fake-yaml==6.0.3" in lines and not any("5.4.1" in line for line in lines)
    assert "# suite-fake-distro-info 1.1build1: not a PEP 440 version, not pinned" in lines
    assert not any(line.startswith("suite-fake-distro-info==") for line in lines)
    assert f"pytest=={__import__('pytest').__version__}" in lines  # the interpreter's own packages too


def test_pip_accepts_the_file_it_refused_before(tmp_path):
    text, env = pin_file(tmp_path)
    pins = tmp_path / "pins.txt"
    pins.write_text(text)
    # pip reads the whole constraints file before it resolves anything: an already-installed requirement is enough
    check = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "-c", str(pins), "pip"]
    ok = subprocess.run(check, capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    pins.write_text(text + "suite-fake-distro-info==1.1build1\n")  # what the image's inline pin line wrote
    refused = subprocess.run(check, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "1.1build1" in refused.stdout + refused.stderr
