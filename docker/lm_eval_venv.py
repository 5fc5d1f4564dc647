"""Install lm-eval into a virtual environment of its own inside an image, leaving the image's Python as it is.

    python3 lm_eval_venv.py /opt/lm-eval [PIP INSTALL ARGUMENTS...]
    e.g. python3 lm_eval_venv.py /opt/lm-eval "lm-eval[api]==0.4.13"

Runs inside `docker build` with the image's own python3 (stdlib only). lm-eval only talks HTTP to the vLLM
server, so it needs nothing of vLLM's; installing it into the image's Python would have to keep every version
vLLM depends on (one pin pip cannot satisfy fails the build). Here:

1. the venv is made by ``python3 -m venv --system-site-packages`` (``uv venv --seed --system-site-packages``
   where python3 cannot make one: no ensurepip). It sees the image's packages, its own first: what the image
   already has that lm-eval can use (transformers for a tokenizer, numpy, ...) is not installed again;
2. a ``.pth`` file in the venv adds python3's own site directories, so the venv sees them also when python3
   is itself a virtual environment (the CPU image's /opt/venv), where --system-site-packages alone would show
   only the system Python's;
3. the venv's own pip installs the arguments (pip, not ``uv pip``: uv does not count a venv's system site
   packages as installed and would install everything again);
4. the image's distributions (python3's names and versions) are listed before and after: any difference fails
   the build; lm-eval must import in the venv (its own copy, or the image's where that already satisfied pip).

The system's CA bundle is pip's (PIP_CERT) and uv's (SSL_CERT_FILE) unless they are set: a venv's pip bundles
its own certificates, which do not hold a CA the image's system trusts.
"""

from __future__ import annotations

import difflib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

DISTRIBUTIONS = ("import importlib.metadata as m\n"
                 "print('\\n'.join(sorted({f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()})))")
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
PTH_NAME = "suite-image-site.pth"


def fail(msg: str) -> None:
    print(f"lm_eval_venv: error: {msg}", file=sys.stderr)
    sys.exit(1)


def distributions(python: str) -> list[str]:
    """NAME==VERSION of every distribution ``python`` sees, sorted (a fresh process: nothing cached)."""
    return subprocess.run([python, "-c", DISTRIBUTIONS], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def make_venv(venv: Path, env: dict[str, str]) -> None:
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], env=env)
    if made.returncode == 0 and (venv / "bin" / "python").exists():
        return
    uv = shutil.which("uv")
    if uv is None:
        fail(f"{sys.executable} -m venv failed and there is no uv to make {venv} with")
    shutil.rmtree(venv, ignore_errors=True)
    print(f"lm_eval_venv: {sys.executable} cannot make a venv; uv venv --seed makes {venv}", flush=True)
    subprocess.run([uv, "venv", "--seed", "--system-site-packages", "--python", sys.executable, str(venv)],
                   env=env, check=True)


def image_site_pth() -> str:
    """A .pth line (run at the venv's start-up) adding this interpreter's site directories and their .pth files:
    the venv then sees what the image's python3 sees, after its own packages."""
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    return "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n"


def purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        fail("usage: lm_eval_venv.py VENV PIP-INSTALL-ARGUMENTS...")
    venv, pip_args = Path(argv[0]), argv[1:]
    env = dict(os.environ)
    bundle = next((b for b in CA_BUNDLES if Path(b).is_file()), None)
    if bundle is not None:
        env.setdefault("PIP_CERT", bundle)
        env.setdefault("SSL_CERT_FILE", bundle)
    before = distributions(sys.executable)
    make_venv(venv, env)
    python = venv / "bin" / "python"
    (purelib(python) / PTH_NAME).write_text(image_site_pth())
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *pip_args], env=env,
                   check=True)
    after = distributions(sys.executable)
    if after != before:
        diff = "\n".join(difflib.unified_diff(before, after, "before", "after", lineterm="", n=0))
        fail(f"installing lm-eval into {venv} changed {sys.executable}'s packages:\n{diff}")
    check = subprocess.run([str(python), "-c", "import lm_eval.api.registry, lm_eval; print(lm_eval.__file__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        fail(f"lm-eval does not import in {venv}: {(check.stdout + check.stderr).strip()[-2000:]}")
    print(f"lm_eval_venv: lm-eval in {venv} ({check.stdout.strip()}); {len(before)} distributions of "
          f"{sys.executable} unchanged", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
