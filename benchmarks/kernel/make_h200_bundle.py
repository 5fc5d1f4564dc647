"""Prepare (here) and reassemble (on the GPU machine) what the H200 kernel run needs; never commit the output.

``make`` (on the development machine)::

    python benchmarks/kernel/make_h200_bundle.py make --vllm-wheel wheels/vllm-0.33.0-*.whl \
        --wheels wheels/gpu --out .cache/h200

writes, under the git-ignored ``--out``:

- ``tree/vllm/``: the wheel's ``model_executor/kernels/linear/cute_dsl/`` files, unchanged, plus a shim for the
  two things they import from the rest of vLLM (``vllm.platforms.current_platform`` and
  ``vllm.utils.torch_utils.current_stream``) and empty package ``__init__`` files;
- ``part1/`` and ``part2/``: the wheels for the GPU machine, any wheel larger than ``--chunk-mb`` cut into
  chunks, spread so each part stays under the device tool's 64 MiB carry limit; ``part2/manifest.json``
  lists every wheel with its chunks and sha256.

``assemble`` (on the GPU machine)::

    python3 benchmarks/kernel/make_h200_bundle.py assemble --from STASH --from .cache/h200/part2 --to DIR

joins the chunks found in the ``--from`` folders and checks each wheel's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import zipfile
from pathlib import Path

KERNEL_PREFIX = "vllm/model_executor/kernels/linear/cute_dsl/"

SHIM_FILES = {
    "vllm/__init__.py": '''"""Shim written by the suite's make_h200_bundle.py: NOT vLLM. It holds only what vLLM's cuteDSL router kernel
files (copied unchanged from the vLLM {version} wheel) import from the rest of vLLM."""

__version__ = "{version}"
__bundle__ = "cute_dsl kernel files from {wheel} + suite shim (vllm.platforms, vllm.utils.torch_utils)"
''',
    "vllm/platforms/__init__.py": '''"""Shim (suite): the parts of vllm.platforms.current_platform the cuteDSL router kernels call."""

import torch


class _CudaPlatform:
    def is_cuda(self) -> bool:
        return torch.cuda.is_available()

    def is_rocm(self) -> bool:
        return False

    def get_device_capability(self):
        major, minor = torch.cuda.get_device_capability()
        return major, minor

    @staticmethod
    def _as_int(capability) -> int:
        if isinstance(capability, tuple):
            return capability[0] * 10 + capability[1]
        return int(capability)

    def is_device_capability(self, capability) -> bool:
        major, minor = self.get_device_capability()
        return major * 10 + minor == self._as_int(capability)

    def is_device_capability_family(self, capability) -> bool:
        major, _ = self.get_device_capability()
        return major == self._as_int(capability) // 10

    def has_device_capability(self, capability) -> bool:
        major, minor = self.get_device_capability()
        return major * 10 + minor >= self._as_int(capability)

    def is_arch_support_pdl(self) -> bool:
        # vLLM: programmatic dependent launch needs SM90 or newer
        return self.has_device_capability(90)


current_platform = _CudaPlatform()
''',
    "vllm/utils/__init__.py": "",
    "vllm/utils/torch_utils.py": '''"""Shim (suite): vllm.utils.torch_utils.current_stream for the cuteDSL router kernels."""

import torch


def current_stream() -> torch.cuda.Stream:
    return torch.cuda.current_stream()
''',
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/kernels/__init__.py": "",
    "vllm/model_executor/kernels/linear/__init__.py": "",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_tree(tree: Path, version: str, origin: str, kernel_files: dict[str, bytes]) -> dict[str, str]:
    """Write the shim and ``kernel_files`` ({path under vllm/...: content}, copied unchanged) into ``tree``."""
    if tree.exists():
        shutil.rmtree(tree)
    for rel, text in SHIM_FILES.items():
        p = tree / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text.format(version=version, wheel=origin))
    copied = {}
    for name, data in sorted(kernel_files.items()):
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        copied[name] = hashlib.sha256(data).hexdigest()
    (tree / "BUNDLE.json").write_text(json.dumps({"origin": origin, "files": copied}, indent=2) + "\n")
    return copied


def make(args: argparse.Namespace) -> int:
    out = Path(args.out)
    wheel = Path(args.vllm_wheel)
    version = wheel.name.split("-")[1]
    tree = out / "tree"
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if n.startswith(KERNEL_PREFIX) and n.endswith(".py")}
    if not files:
        raise SystemExit(f"no {KERNEL_PREFIX} files in {wheel}")
    copied = write_tree(tree, version, wheel.name, files)

    parts = [out / "part1", out / "part2"]
    for p in parts:
        if p.exists():
            shutil.rmtree(p)
        p.mkdir(parents=True)
    chunk = int(args.chunk_mb * 1024 * 1024)
    budget = [0, 0]
    manifest = []
    for whl in sorted(Path(args.wheels).glob("*.whl"), key=lambda p: -p.stat().st_size):
        entry = {"wheel": whl.name, "sha256": sha256(whl), "chunks": []}
        data = whl.read_bytes()
        pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] if len(data) > chunk else [data]
        for i, piece in enumerate(pieces):
            k = 0 if budget[0] <= budget[1] else 1
            name = f"{whl.name}.chunk{i:03d}" if len(pieces) > 1 else whl.name
            (parts[k] / name).write_bytes(piece)
            budget[k] += len(piece)
            entry["chunks"].append(name)
        manifest.append(entry)
    (parts[1] / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for p, b in zip(parts, budget, strict=True):
        print(f"{p}: {b / 2**20:.1f} MiB")
    print(f"{tree}: {len(copied)} kernel files from {wheel.name} + shim")
    return 0


def assemble(args: argparse.Namespace) -> int:
    sources = [Path(s) for s in args.sources]
    manifest = None
    for s in sources:
        if (s / "manifest.json").exists():
            manifest = json.loads((s / "manifest.json").read_text())
    if manifest is None:
        raise SystemExit(f"no manifest.json in {sources}")
    dest = Path(args.to)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in manifest:
        target = dest / entry["wheel"]
        with open(target, "wb") as fh:
            for chunk in entry["chunks"]:
                found = next((s / chunk for s in sources if (s / chunk).exists()), None)
                if found is None:
                    raise SystemExit(f"missing chunk {chunk} (looked in {[str(s) for s in sources]})")
                fh.write(found.read_bytes())
        if sha256(target) != entry["sha256"]:
            raise SystemExit(f"sha256 mismatch for {target}")
        print(f"ok {entry['wheel']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--vllm-wheel", required=True)
    m.add_argument("--wheels", required=True, help="folder of the wheels the GPU machine lacks")
    m.add_argument("--out", default=".cache/h200")
    m.add_argument("--chunk-mb", type=float, default=40.0)
    a = sub.add_parser("assemble")
    a.add_argument("--from", dest="sources", action="append", required=True)
    a.add_argument("--to", required=True)
    args = p.parse_args(argv)
    return make(args) if args.cmd == "make" else assemble(args)


if __name__ == "__main__":
    sys.exit(main())
