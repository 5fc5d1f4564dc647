"""What an arm's servers import, read in the arm's own environment without importing any of it.

`suite.runtime.software` runs this file's text as ``python -c TEXT OUT`` through the arm's runtime (the local
runtime's interpreter with the arm's overlay first on PYTHONPATH; under docker the image's python3 in a
container of the arm's image), so it is standard library only and Python 3.8 or newer. It writes one JSON
object to OUT:

- ``python``: the interpreter's version;
- ``packages``: for each import name of PACKAGES, the distribution that installed it, its version and its
  directory (None when the arm's interpreter cannot find it); found by ``importlib.util.find_spec``, which
  imports nothing of a top-level package (importing torch costs seconds; importing AITER copies its JIT tree);
- ``torch_version``: the constants of torch/version.py (``cuda``, ``hip``, ``git_version``), read as a file;
- ``vllm_root`` and ``files``: every file of the vllm package found (``vllm/...`` -> sha256), bytecode
  caches left out (they follow what ran before, not what is installed).
"""

import ast
import hashlib
import json
import os
import platform
import sys
from importlib import metadata, util

PACKAGES = ("vllm", "torch", "triton", "flashinfer", "aiter")
CHUNK = 1 << 20


def distributions():
    """import name -> the distributions that install it (Python 3.10+; older: none known)."""
    try:
        return metadata.packages_distributions()
    except AttributeError:
        return {}


def location(name):
    """The directory of a top-level package (a module's file), or None when it is not importable here."""
    try:
        spec = util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    paths = list(spec.submodule_search_locations or [])
    return paths[0] if paths else spec.origin


def package(name, dists):
    path = location(name)
    if path is None:
        return None
    for dist in dict.fromkeys(dists.get(name) or []):
        try:
            return {"distribution": dist, "version": metadata.version(dist), "path": path}
        except metadata.PackageNotFoundError:
            continue
    return {"distribution": None, "version": None, "path": path}


def constants(path):
    """The simple ``NAME = "value"`` / ``NAME: T = value`` constants of a Python file, not executed."""
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            value = node.value.value
            out[target.id] = value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def tree_files(root):
    """Every file under the package directory ``root`` as ``vllm/...`` -> sha256 (an unreadable one says why)."""
    parent = os.path.dirname(os.path.abspath(root))
    out = {}
    for here, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(here, name)
            rel = os.path.relpath(path, parent).replace(os.sep, "/")
            try:
                out[rel] = sha256(path)
            except OSError as exc:
                out[rel] = "unreadable: " + (exc.strerror or type(exc).__name__)
    return out


def main(out_path):
    # `python -c` puts the working directory first on the path; a server's `vllm` does not
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    dists = distributions()
    packages = {name: package(name, dists) for name in PACKAGES}
    torch = packages["torch"]
    torch_version = {}
    if torch is not None and os.path.isdir(torch["path"]):
        found = constants(os.path.join(torch["path"], "version.py"))
        torch_version = {k: found.get(k) for k in ("cuda", "hip", "git_version")}
    vllm = packages["vllm"]
    root = vllm["path"] if vllm is not None and os.path.isdir(vllm["path"]) else None
    answer = {"python": platform.python_version(), "packages": packages, "torch_version": torch_version,
              "vllm_root": root, "files": tree_files(root) if root else {}}
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(answer, fh)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
