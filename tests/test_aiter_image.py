"""An arm's own AITER (a wheel or a git ref) and tuned BF16 GEMM CSVs (`aiter:`), built into its ROCm image:
the matrix field and its refusals at their file:line, the image plan's build args, context files, identity and
labels, the manifest's record of it, and the ROCm Dockerfile's step (hadolint, its place, its build args)."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from suite.errors import MatrixError
from suite.matrix_load import load_matrix
from suite.runtime.docker import DOCKER_DIR
from suite.runtime.docker.images import image_aiter_source, plan_image

ROCM = DOCKER_DIR / "rocm" / "Dockerfile"
AITER_URL = "https://github.com/ROCm/aiter"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
WHEEL = "amd_aiter-0.1.19-cp312-cp312-linux_x86_64.whl"
CSV = "M,N,K,cu_num,libtype,solidx,us\n1,256,6144,256,hipblaslt,7,2.1\n"
MATRIX = """\
name: own-aiter
model: {{id: google/gemma-4-26B-A4B-it}}
runtime: {runtime}
arms:
  baseline: {{vllm: "0.33.0"}}
  mine:
    vllm: "0.33.0"
    aiter: {aiter}
serve:
  - {{isl: 128, osl: 16, concurrency: [1], num_prompts: 2}}
serve_args: [--max-model-len, "4096"]
"""
ROCM_RUNTIME = "{kind: docker, vendor: rocm}"


def write(tmp_path: Path, aiter: str, runtime: str = ROCM_RUNTIME, files: dict[str, bytes] | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX.format(runtime=runtime, aiter=aiter))
    return path


def plan(path: Path, resolve=lambda url, ref: None):
    m = load_matrix(path)
    return plan_image(m, "mine", m.arms["mine"], lambda ref: "sha256:" + "d" * 64, resolve_ref=resolve)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_git_ref_resolves_at_plan_time_and_pins_the_build_command(tmp_path):
    path = write(tmp_path, f'{{git: "{AITER_URL}", ref: v0.1.19, tuned_gemm_bf16: [configs/gate.csv]}}',
                 files={"configs/gate.csv": CSV.encode()})
    asked = []
    p = plan(path, lambda url, ref: asked.append((url, ref)) or COMMIT)
    assert asked == [(AITER_URL, "v0.1.19")]
    args = p.build_args()
    aiter = {k: v for k, v in args.items() if "AITER" in k}
    assert aiter == {
        "SUITE_AITER_SOURCE": "git", "AITER_WHEEL": "", "AITER_WHEEL_SHA256": "", "AITER_GIT_URL": AITER_URL,
        "AITER_GIT_REF": "v0.1.19", "AITER_GIT_COMMIT": COMMIT, "AITER_PREBUILD_KERNELS": "1",
        "AITER_GPU_ARCHS": "gfx950", "SUITE_AITER_GEMM_BF16": f"1-gate.csv={sha(CSV.encode())}",
        "SUITE_AITER_CONFIG_GEMM_BF16": "/opt/suite/aiter/bf16_tuned_gemm/1-gate.csv"}
    ctx = {rel: src for rel, src in p.context_files if rel.startswith("aiter/")}
    assert ctx == {"aiter/README.txt": DOCKER_DIR / "aiter-README.txt",
                   "aiter/bf16_tuned_gemm/1-gate.csv": tmp_path / "configs" / "gate.csv"}
    cmd = shlex.join(p.build_command(Path("/ctx"), buildx=True))
    assert (f"--build-arg SUITE_AITER_SOURCE=git --build-arg AITER_WHEEL= --build-arg AITER_WHEEL_SHA256= "
            f"--build-arg AITER_GIT_URL={AITER_URL} --build-arg AITER_GIT_REF=v0.1.19 "
            f"--build-arg AITER_GIT_COMMIT={COMMIT} --build-arg AITER_PREBUILD_KERNELS=1 "
            f"--build-arg AITER_GPU_ARCHS=gfx950 --build-arg SUITE_AITER_GEMM_BF16=1-gate.csv={sha(CSV.encode())} "
            "--build-arg SUITE_AITER_CONFIG_GEMM_BF16=/opt/suite/aiter/bf16_tuned_gemm/1-gate.csv ") in cmd
    # the labels, as the manifest reads them back
    src = image_aiter_source(p.labels())
    assert src is not None and (src.kind, src.url, src.ref, src.commit) == ("git", AITER_URL, "v0.1.19", COMMIT)
    assert [(c.name, c.sha256) for c in src.tuned_gemm_bf16] == [("1-gate.csv", sha(CSV.encode()))]
    # a moved ref is a new image; offline: provisional
    assert plan(path, lambda u, r: "f" * 40).identity != p.identity
    assert plan(path).build_args()["AITER_GIT_COMMIT"] == ""
    # a full sha is its own commit: no lookup
    pinned = write(tmp_path / "pinned", f'{{git: "{AITER_URL}", ref: "{COMMIT}", build_env: {{PREBUILD_KERNELS: 0, '
                   'GPU_ARCHS: "gfx942;gfx950"}}')
    args = plan(pinned, lambda u, r: pytest.fail("looked up")).build_args()
    assert (args["AITER_GIT_COMMIT"], args["AITER_PREBUILD_KERNELS"], args["AITER_GPU_ARCHS"]) == (COMMIT, "0",
                                                                                                   "gfx942;gfx950")
    assert args["SUITE_AITER_CONFIG_GEMM_BF16"] == ""  # no CSVs: AITER's own default


def test_a_wheel_travels_content_addressed_with_its_sha256_and_keeps_the_default_when_asked(tmp_path):
    data = b"aiter wheel bytes"
    path = write(tmp_path, f"{{wheel: dist/{WHEEL}, tuned_gemm_bf16: [a.csv, b.csv], keep_default_bf16: true}}",
                 files={f"dist/{WHEEL}": data, "a.csv": CSV.encode(), "b.csv": b"M,N,K\n"})
    p = plan(path)
    args = p.build_args()
    assert (args["SUITE_AITER_SOURCE"], args["AITER_WHEEL"], args["AITER_WHEEL_SHA256"]) == ("wheel", WHEEL, sha(data))
    assert args["AITER_GIT_URL"] == args["AITER_PREBUILD_KERNELS"] == args["AITER_GPU_ARCHS"] == ""
    assert args["SUITE_AITER_CONFIG_GEMM_BF16"] == ("/opt/suite/aiter/bf16_tuned_gemm/0-aiter-default.csv:"
                                                    "/opt/suite/aiter/bf16_tuned_gemm/1-a.csv:"
                                                    "/opt/suite/aiter/bf16_tuned_gemm/2-b.csv")
    ctx = [rel for rel, _ in p.context_files if rel.startswith("aiter/")]
    assert ctx == ["aiter/README.txt", f"aiter/wheel/{sha(data)}/{WHEEL}", "aiter/bf16_tuned_gemm/1-a.csv",
                   "aiter/bf16_tuned_gemm/2-b.csv"]
    cmd = shlex.join(p.build_command(Path("/ctx"), buildx=False))
    assert f"--build-arg AITER_WHEEL={WHEEL} --build-arg AITER_WHEEL_SHA256={sha(data)} " in cmd
    labels = p.labels()
    assert labels["suite.aiter.source"] == "wheel" and labels["suite.aiter.wheel.sha256"] == sha(data)
    # a wheel whose bytes differ from the sha256 the matrix gives is refused at its line
    bad = write(tmp_path / "bad", f'{{wheel: dist/{WHEEL}, sha256: "{"0" * 64}"}}', files={f"dist/{WHEEL}": data})
    with pytest.raises(MatrixError, match=rf"matrix.yaml:8: arms.mine.aiter.sha256: {WHEEL} has sha256"):
        load_matrix(bad)


def test_the_identity_follows_each_csvs_content(tmp_path):
    path = write(tmp_path, "{tuned_gemm_bf16: [gate.csv]}", files={"gate.csv": CSV.encode()})
    first = plan(path)
    assert first.build_args()["SUITE_AITER_SOURCE"] == "base"  # CSVs over the base image's AITER
    (tmp_path / "gate.csv").write_text(CSV + "2,256,6144,256,hipblaslt,9,2.3\n")
    changed = plan(path)
    assert changed.identity != first.identity and changed.tag != first.tag
    assert changed.build_args()["SUITE_AITER_GEMM_BF16"] != first.build_args()["SUITE_AITER_GEMM_BF16"]
    # an arm without aiter: still a ROCm image whose labels say the base image's AITER
    m = load_matrix(path)
    base = plan_image(m, "baseline", m.arms["baseline"], lambda ref: "sha256:" + "d" * 64)
    assert image_aiter_source(base.labels()).kind == "base" and base.identity != first.identity


@pytest.mark.parametrize("runtime,aiter,files,message", [
    ("{kind: docker, vendor: cuda}", "{tuned_gemm_bf16: [g.csv]}", {"g.csv": b"x"},
     r"matrix.yaml:8: arms.mine.aiter: .*need runtime.kind: docker with runtime.vendor: rocm "
     r"\(runtime.vendor is cuda\)"),
    ("{kind: docker}", "{tuned_gemm_bf16: [g.csv]}", {"g.csv": b"x"},
     r"matrix.yaml:8: arms.mine.aiter: .*\(runtime.vendor is cpu\)"),  # the docker runtime's default
    ("{kind: local}", "{tuned_gemm_bf16: [g.csv]}", {"g.csv": b"x"},
     r"matrix.yaml:8: arms.mine.aiter: .*\(the local runtime\)"),
    (ROCM_RUNTIME, f'{{wheel: dist/{WHEEL}, git: "{AITER_URL}", ref: v0.1.19}}', {},
     r"matrix.yaml:8: arms.mine.aiter: give either wheel: PATH or git: URL \(with ref:\), not both"),
    (ROCM_RUNTIME, "{tuned_gemm_bf16: [configs/missing.csv]}", {},
     r"matrix.yaml:8: arms.mine.aiter.tuned_gemm_bf16\[0\]: tuned CSV .*configs/missing.csv does not exist"),
    (ROCM_RUNTIME, f"{{wheel: dist/{WHEEL}}}", {},
     r"matrix.yaml:8: arms.mine.aiter.wheel: AITER wheel file .* does not exist"),
    (ROCM_RUNTIME, f'{{git: "{AITER_URL}"}}', {}, r"matrix.yaml:8: arms.mine.aiter.git: needs ref:"),
    (ROCM_RUNTIME, "{wheel: dist/vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl}", {},
     r"matrix.yaml:8: arms.mine.aiter.wheel: .*not of AITER"),
    (ROCM_RUNTIME, "{}", {}, r"matrix.yaml:8: arms.mine.aiter: give wheel: PATH, git: URL with ref:, or "
     r"tuned_gemm_bf16"),
    (ROCM_RUNTIME, f'{{git: "{AITER_URL}", ref: v1, build_env: {{PREBUILD_KERNELS: 4}}}}', {},
     r"matrix.yaml:8: arms.mine.aiter.build_env: PREBUILD_KERNELS: 4 is not 0, 1, 2 or 3"),
    (ROCM_RUNTIME, f'{{git: "{AITER_URL}", ref: v1, build_env: {{GPU_ARCHS: sm_90}}}}', {},
     r"matrix.yaml:8: arms.mine.aiter.build_env: GPU_ARCHS: 'sm_90' is not a list of GPU targets"),
    (ROCM_RUNTIME, f'{{git: "{AITER_URL}", ref: v1, build_env: {{MAX_JOBS: "8"}}}}', {},
     r"matrix.yaml:8: arms.mine.aiter.build_env: 'MAX_JOBS': the image build passes AITER's PREBUILD_KERNELS and "
     r"GPU_ARCHS only"),
    (ROCM_RUNTIME, f"{{wheel: dist/{WHEEL}, build_env: {{GPU_ARCHS: gfx942}}}}", {f"dist/{WHEEL}": b"w"},
     r"matrix.yaml:8: arms.mine.aiter.build_env: goes with git:"),
])
def test_refusals_name_the_fields_line(tmp_path, runtime, aiter, files, message):
    with pytest.raises(MatrixError, match=message):
        load_matrix(write(tmp_path, aiter, runtime=runtime, files=files))


@pytest.mark.parametrize(("old", "said"), [
    ("prebuild_kernels: 0", "prebuild_kernels: retired: AITER's build variables go under its own names in the "
     "arm's aiter.build_env: write build_env: {PREBUILD_KERNELS: 0}"),
    ("gpu_archs: gfx942", "gpu_archs: retired: AITER's build variables go under its own names in the arm's "
     "aiter.build_env: write build_env: {GPU_ARCHS: gfx942}"),
    ('gpu_archs: "gfx942;gfx950"', "gpu_archs: retired: AITER's build variables go under its own names in the "
     "arm's aiter.build_env: write build_env: {GPU_ARCHS: \"gfx942;gfx950\"}"),
])
def test_the_retired_aiter_build_knobs_say_the_build_env_to_write(tmp_path, old, said):
    path = write(tmp_path, f'{{git: "{AITER_URL}", ref: v0.1.19, {old}}}')
    with pytest.raises(MatrixError) as exc:
        load_matrix(path)
    assert str(exc.value) == f"{path}:8: arms.mine.aiter.{said}"


# What the ROCm image's build was given for AITER's build variables before they moved into build_env (the
# prebuild_kernels: 0 / gpu_archs: "gfx942;gfx950" fields, and neither), with the job hashes of that arm: the
# same matrix written with build_env builds with these exact arguments, in this order, and plans the same jobs.
PINNED_BUILD = {
    "{PREBUILD_KERNELS: 0, GPU_ARCHS: \"gfx942;gfx950\"}": ("0", "gfx942;gfx950", "d5e2624678f0394b"),
    "{}": ("1", "gfx950", "a132293af7c6631c"),
}


@pytest.mark.parametrize("build_env", list(PINNED_BUILD))
def test_build_env_gives_the_image_build_the_same_arguments_as_the_fields_it_replaced(tmp_path, build_env):
    from suite.plan import build_plan

    prebuild, archs, job_hash = PINNED_BUILD[build_env]
    path = write(tmp_path, f'{{git: "{AITER_URL}", ref: v0.1.19, build_env: {build_env}}}')
    p = plan(path, lambda url, ref: COMMIT)
    argv = p.build_command(Path("/ctx"), buildx=True)
    args = [a for a in argv[argv.index("--build-arg"):argv.index("-t")] if a != "--build-arg"]
    assert [a for a in args if not a.startswith(("SUITE_VERSION=", "SUITE_IDENTITY="))] == [
        "BASE_IMAGE=vllm/vllm-openai-rocm:v0.33.0", "BASE_DIGEST=sha256:" + "d" * 64, "VLLM_VERSION=0.33.0",
        "SUITE_PATCHES=", "SUITE_PATCH_SHA256S=", "SUITE_PATCH_FILES=",
        "SUITE_PATCH_FINGERPRINT=75567f1ddbe703c72cf3714eee9fd6dca70cd2363aa01ffbcd64068eac0986cc",
        "SUITE_VLLM_SOURCE=pypi", "VLLM_WHEEL=", "VLLM_WHEEL_SHA256=", "VLLM_GIT_URL=", "VLLM_GIT_REF=",
        "VLLM_GIT_COMMIT=", "SUITE_AITER_SOURCE=git", "AITER_WHEEL=", "AITER_WHEEL_SHA256=",
        f"AITER_GIT_URL={AITER_URL}", "AITER_GIT_REF=v0.1.19", f"AITER_GIT_COMMIT={COMMIT}",
        f"AITER_PREBUILD_KERNELS={prebuild}", f"AITER_GPU_ARCHS={archs}", "SUITE_AITER_GEMM_BF16=",
        "SUITE_AITER_CONFIG_GEMM_BF16="]
    assert argv[:argv.index("--build-arg")] == ["docker", "buildx", "build", "--builder", "default", "--load",
                                                "--progress=plain", "-f", "/ctx/Dockerfile"]
    assert p.aiter_build.identity_parts() == ("aiter", "git", AITER_URL, "v0.1.19", COMMIT, prebuild, archs, "")
    assert {j.hash for j in build_plan(load_matrix(path)).jobs if j.arm == "mine"} == {job_hash}


def test_a_prebuilt_image_and_aiter_are_refused_together(tmp_path):
    path = write(tmp_path, "{tuned_gemm_bf16: [g.csv]}", files={"g.csv": b"x"})
    path.write_text(path.read_text().replace('    vllm: "0.33.0"\n', '    vllm: "0.33.0"\n    image: mine:latest\n'))
    with pytest.raises(MatrixError, match=r"matrix.yaml:9: arms.mine.aiter: a prebuilt image"):
        load_matrix(path)


# ---------------------------------------------------------------- the ROCm Dockerfile's AITER step


def instructions(build_args: dict[str, str] | None = None) -> list[tuple[str, str]]:
    return [(i["instruction"], i["value"]) for i in DockerfileParser(str(ROCM), build_args=build_args).structure]


def test_hadolint_rocm_dockerfile():
    exe = Path(sys.executable).parent / "hadolint"
    exe_s = str(exe) if exe.is_file() else shutil.which("hadolint")
    if not exe_s:
        pytest.skip("hadolint is not installed")
    proc = subprocess.run([exe_s, str(ROCM)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_aiter_step_comes_after_the_arms_vllm_and_before_the_patch_layer():
    instrs = instructions()
    vllm = next(k for k, (ins, val) in enumerate(instrs) if ins == "RUN" and "VLLM_WHEEL_SHA256" in val)
    copy = instrs.index(("COPY", "aiter/ /tmp/suite-aiter/"))
    aiter = next(k for k, (ins, val) in enumerate(instrs) if ins == "RUN" and "AITER_WHEEL_SHA256" in val)
    env = instrs.index(("ENV", "AITER_CONFIG_GEMM_BF16=${SUITE_AITER_CONFIG_GEMM_BF16}"))
    patch = instrs.index(("RUN", "${PYTHON} /opt/suite/apply_patches.py"))
    assert vllm < copy < aiter < env < instrs.index(("ARG", "PYTHON=python3")) < patch
    run = instrs[aiter][1]
    assert "--no-deps --force-reinstall" in run and "--no-deps --reinstall" in run  # pip, or uv-only images
    assert 'wheel="/tmp/suite-aiter/wheel/${AITER_WHEEL_SHA256}/${AITER_WHEEL}"' in run and "sha256sum -c" in run
    assert "submodule update -q --init --recursive" in run and "--no-build-isolation" in run
    assert 'PREBUILD_KERNELS="${AITER_PREBUILD_KERNELS}" GPU_ARCHS="${AITER_GPU_ARCHS}"' in run
    assert '[ "$(cat /opt/suite/aiter-git-commit)" != "${AITER_GIT_COMMIT}" ]' in run
    # the commit is checked before the submodules are fetched and anything is built
    assert run.index("aiter-git-commit)\" !=") < run.index("submodule update")
    args = {val.split("=", 1)[0]: val.split("=", 1)[1] for ins, val in instrs if ins == "ARG" and "=" in val}
    assert args["SUITE_AITER_SOURCE"] == "base" and args["SUITE_AITER_CONFIG_GEMM_BF16"] == '""'


def test_the_dockerfile_takes_every_aiter_build_arg_and_sets_the_labels(tmp_path):
    path = write(tmp_path, f'{{git: "{AITER_URL}", ref: v0.1.19, tuned_gemm_bf16: [g.csv]}}', files={"g.csv": b"x"})
    p = plan(path, lambda u, r: COMMIT)
    args = p.build_args()
    declared = {val.split("=", 1)[0] for ins, val in instructions() if ins == "ARG"}
    assert set(args) <= declared
    parser = DockerfileParser(str(ROCM), build_args=args)
    want = p.labels()
    assert {k: parser.labels.get(k) for k in want} == want
    assert parser.envs["AITER_CONFIG_GEMM_BF16"] == "/opt/suite/aiter/bf16_tuned_gemm/1-g.csv"
