#!/usr/bin/env python3
"""Build the GPU bundle: what a bare H200 machine (Python 3.12, torch 2.11.0+cu130, no vLLM, no network) needs
to run `suite run` with a real CUDA vLLM, from PyPI only, split into parts that each fit one device transfer.

    python3 scripts/gpu/bundle.py lock     # resolve scripts/gpu/h200-wheels.lock (run when the lists change)
    python3 scripts/gpu/bundle.py build    # download, trim, pack: .gpu/bundle/part-00 ... (git-ignored)

What goes in (docs/gpu-h200.md says why):
- vLLM 0.26.0, the last release that pins torch 2.11.0 (the machine's own torch), unpacked without the parts
  a Hopper serving run never loads (TRIM: FlashAttention 2 — FA3 serves Hopper —, the Blackwell FMHA and
  DeepGEMM trees, FlashMLA, QuTLASS, the Rust tool parser);
- nvidia-cutlass-dsl-libs-cu13 (the cuteDSL runtime behind vLLM's ll_bf16 router GEMM), unpacked;
- the small pure or cp312 wheels vLLM and the suite import that the machine's image lacks (the lock file),
  with the closure of their requirements over the image's package list (scripts/gpu/h200-image.txt).
The suite itself travels as the working tree. Each part is at most PART_MB (one transfer carries <= 64 MiB,
the working tree included).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOCK = HERE / "h200-wheels.lock"
IMAGE = HERE / "h200-image.txt"
OUT = REPO / ".gpu"
PART_MB = 24  # a transfer carries <= 64 MiB: this part plus the working tree (~36 MB with the evidence, 2026-12-07)

VLLM = "vllm==0.26.0"
CUTLASS_LIBS = "nvidia-cutlass-dsl-libs-cu13==4.6.0"
TRIM = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/third_party/fmha_sm100",
    "vllm/third_party/deep_gemm",
    "vllm/_flashmla_C.abi3.so",
    "vllm/_flashmla_extension_C.abi3.so",
    "vllm/_qutlass_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/_rust_tool_parser.abi3.so",
)
# Wheels to carry (the roots of the closure), with the pins the H200 run needs: the cuteDSL stack at 4.6.0
# (vLLM 0.26.0's pin; quack 0.6.5 needs cutlass >= 4.7), and vLLM's own exact pins.
ROOTS = [
    "pydantic==2.14.4", "pydantic-core==2.50.5", "pygal==3.1.3", "fastapi==0.136.3", "starlette", "uvicorn", "httptools", "websockets", "openai",
    "openai-harmony", "pyzmq", "msgspec", "cbor2", "blake3", "cachetools", "pybase64", "partial-json-parser",
    "prometheus-fastapi-instrumentator", "model-hosting-container-standards", "llguidance==1.7.6",
    "xgrammar==0.2.7", "outlines_core==0.2.14", "lark==1.2.2", "lm-format-enforcer==0.11.3", "jsonschema",
    "compressed-tensors==0.17.0", "depyf==0.20.0", "watchfiles", "python-json-logger", "setproctitle", "ijson",
    "apache-tvm-ffi==0.1.10", "nvidia-cutlass-dsl==4.6.0", "nvidia-cutlass-dsl-libs-base==4.6.0",
    "quack-kernels==0.6.0", "torch-c-dlpack-ext",
]
# Requirements never followed: what the roots ask for that a serving run does not import, or that is the
# machine's own (torch and its CUDA libraries), or that travels unpacked (CUTLASS_LIBS).
SKIP = {"torch", "nvidia-cutlass-dsl-libs-cu13", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cuda-nvdisasm", "cuda-python", "nvidia-cuda-runtime-cu12", "triton",
        "loguru", "frozendict", "ray", "datasets", "accelerate"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "manylinux_2_31_x86_64"]
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
              "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def pip_download(spec: str, dest: Path) -> Path:
    """One wheel for the H200 (cp312, manylinux x86_64), no dependencies; returns its path."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
           *[a for p in PLATFORMS for a in ("--platform", p)], "--platform", "any", "-d", str(dest), spec]
    subprocess.run(cmd, check=True)
    name = canonicalize_name(Requirement(spec).name)
    new = [w for w in set(dest.glob("*.whl")) - before] or [
        w for w in dest.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == name]
    if not new:
        raise SystemExit(f"bundle: pip saved no wheel for {spec}")
    return sorted(new)[-1]


def wheel_meta(whl: Path) -> tuple[str, str, list[Requirement]]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    return canonicalize_name(msg["Name"]), msg["Version"], reqs


def image_packages() -> set[str]:
    return {canonicalize_name(line.split("==")[0].strip()) for line in IMAGE.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def lock() -> None:
    """Resolve the closure of ROOTS over what the image lacks, and write name==version per line."""
    have = image_packages()
    dl = OUT / "lock-wheels"
    shutil.rmtree(dl, ignore_errors=True)
    pinned: dict[str, str] = {}
    todo = list(ROOTS)
    while todo:
        spec = todo.pop(0)
        name = canonicalize_name(Requirement(spec).name)
        if name in pinned or name in have or name in SKIP:
            continue
        name, version, reqs = wheel_meta(pip_download(spec, dl))
        pinned[name] = version
        for r in reqs:
            if r.marker is None or r.marker.evaluate(MARKER_ENV):
                todo.append(f"{r.name}{r.specifier}")  # extras are not followed
    LOCK.write_text("# scripts/gpu/bundle.py lock: the wheels carried to the H200 (cp312), beside its image's own\n"
                    + "".join(f"{n}=={v}\n" for n, v in sorted(pinned.items())))
    print(f"bundle: {len(pinned)} wheels locked in {LOCK.relative_to(REPO)}")


def locked() -> list[str]:
    return [line.strip() for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")]


def unpack_wheel(whl: Path, dest: Path, trim: tuple[str, ...] = ()) -> None:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            if any(info.filename == t or info.filename.startswith(t.rstrip("/") + "/") for t in trim):
                continue
            z.extract(info, dest)
    for t in trim:  # zip entries are files: make sure a trimmed tree is really gone
        shutil.rmtree(dest / t, ignore_errors=True)


def build() -> None:
    """Download the locked wheels, vLLM and the cuteDSL libraries; pack one tar.xz; split it in parts."""
    stage = OUT / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "whl").mkdir(parents=True)
    dl = OUT / "dl"
    for spec in locked():
        name, version = spec.split("==")
        cached = [w for w in dl.glob("*.whl")
                  if canonicalize_name(w.name.split("-")[0]) == canonicalize_name(name) and w.name.split("-")[1] == version]
        whl = cached[0] if cached else pip_download(spec, dl)
        shutil.copy2(whl, stage / "whl" / whl.name)
    for spec, folder, trim in ((VLLM, "vllm", TRIM), (CUTLASS_LIBS, "cutlass-libs", ())):
        name, version = spec.split("==")
        cached = [w for w in dl.glob("*.whl") if w.name.startswith(name.replace("-", "_") + "-" + version + "-")]
        whl = cached[0] if cached else pip_download(spec, dl)
        unpack_wheel(whl, stage / folder, trim)
    manifest = {"vllm": VLLM, "cutlass_libs": CUTLASS_LIBS, "trimmed": list(TRIM), "wheels": locked()}
    (stage / "bundle.json").write_text(json.dumps(manifest, indent=2))
    bundle = OUT / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir()
    tar_xz = OUT / "bundle.tar.xz"
    with open(tar_xz, "wb") as out:
        tar = subprocess.Popen(["tar", "-C", str(stage), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-6", "-c"], stdin=tar.stdout, stdout=out, check=True)
        if tar.wait() != 0:
            raise SystemExit("bundle: tar failed")
    digest = hashlib.sha256(tar_xz.read_bytes()).hexdigest()
    subprocess.run(["split", "-b", f"{PART_MB}M", "-d", str(tar_xz), str(bundle / "part-")], check=True)
    (bundle / "SHA256").write_text(f"{digest}  bundle.tar.xz\n")
    tar_xz.unlink()
    for p in sorted(bundle.iterdir()):
        print(f"bundle: {p.relative_to(REPO)} {p.stat().st_size / 1e6:.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["lock", "build"])
    args = ap.parse_args()
    lock() if args.what == "lock" else build()


if __name__ == "__main__":
    if not re.match(r"3\.(1[1-9])", sys.version.split()[0]):
        raise SystemExit("bundle: run with Python >= 3.11")
    main()
