"""The persistent `vllm bench serve` client (suite.stages.serve.client and its worker) and session warm-ups.

Without a server: the real worker process (vLLM's benchmark module) answers the protocol, rejects bad
arguments with vLLM's own parser, survives failing points, is restarted when it dies, is ended when it hangs,
and the client falls back to the CLI when the worker cannot serve. With a server (e2e): one point through the
CLI and through the persistent client give the same result keys and agree, and three points through one
persistent client cost far less wall time than three CLI runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from suite.errors import SuiteError
from suite.proc import start, stop_group
from suite.runtime.base import free_port, http_ok
from suite.stages.serve.client import (
    WORKER_PATH,
    PersistentClient,
    flag_value,
    result_argv,
    with_flag,
    without_flag,
)
from suite.stages.serve.sizing import prompts_for
from suite.stages.serve.warmup import (
    SEED_SHIFT,
    WarmPoint,
    shape_of,
    warm_argv,
    warm_prompts,
    warm_session,
)
from tests.conftest import processes_mentioning

SERVED = "tiny-moe"


def worker_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}


def point_argv(base_url: str, tokenizer: Path | str, *, prompts: int = 16, concurrency: int = 4,
               isl: int = 64, osl: int = 16, seed: int = 0) -> list[str]:
    """The arguments after `vllm bench serve` of one point, with the flags the suite passes."""
    return [
        "--backend", "vllm", "--base-url", base_url, "--model", SERVED, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(isl), "--random-output-len", str(osl),
        "--random-range-ratio", "0.0", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--num-warmups", "0", "--seed", str(seed), "--ignore-eos",
        "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ argv helpers


def test_flag_helpers_handle_both_spellings():
    argv = ["--a", "1", "--b=2", "--ignore-eos", "--a", "3"]
    assert flag_value(argv, "--a") == "3"  # the last one wins, as in argparse
    assert flag_value(argv, "--b") == "2"
    assert flag_value(argv, "--c") is None
    assert without_flag(argv, "--a") == ["--b=2", "--ignore-eos"]
    assert without_flag(argv, "--b") == ["--a", "1", "--ignore-eos", "--a", "3"]
    assert without_flag(argv, "--ignore-eos", takes_value=False) == ["--a", "1", "--b=2", "--a", "3"]
    assert with_flag(argv, "--b", "9") == ["--a", "1", "--ignore-eos", "--a", "3", "--b", "9"]


def test_result_argv_adds_a_temporary_name_or_keeps_the_callers(tmp_path):
    result = tmp_path / "r0.json"
    argv, tmp = result_argv(["--num-prompts", "4"], result)
    assert tmp == tmp_path / ".r0.json.partial"
    assert "--save-result" in argv and flag_value(argv, "--result-dir") == str(tmp_path)
    argv, tmp = result_argv(["--save-result", "--result-dir", "/x", "--result-filename", ".p"], result)
    assert tmp == Path("/x/.p") and argv.count("--save-result") == 1


# ------------------------------------------------------------------------------------------ warm-up helpers


def test_warm_argv_few_prompts_other_seed_no_result_flags():
    argv = [*point_argv("http://h:1", "tok", prompts=64, concurrency=4, seed=7), "--num-warmups", "3",
            "--result-dir", "/runs/x", "--result-filename", ".r.partial"]
    warm = warm_argv(argv, warm_prompts(4))
    assert flag_value(warm, "--num-prompts") == "8"
    assert flag_value(warm, "--num-warmups") == "0"
    assert flag_value(warm, "--seed") == str(7 + SEED_SHIFT)
    assert flag_value(warm, "--result-dir") is None and flag_value(warm, "--result-filename") is None
    assert shape_of(warm) == shape_of(argv)  # the same load for the server
    assert warm_prompts(1) == 2 and warm_prompts(None) >= 8


def test_shape_ignores_count_seed_and_files_but_not_load():
    a = point_argv("http://h:1", "tok", prompts=16, concurrency=4, seed=0)
    assert shape_of(a) == shape_of(with_flag(with_flag(a, "--num-prompts", "99"), "--seed", "3"))
    assert shape_of(a) != shape_of(with_flag(a, "--max-concurrency", "8"))
    assert shape_of(a) != shape_of(with_flag(a, "--random-input-len", "128"))
    assert shape_of(a) != shape_of(without_flag(a, "--ignore-eos", takes_value=False))


def test_prompts_for_a_duration():
    assert prompts_for(10.0, 3.3, 4) == 36  # ceil(33.0) = 33 -> next multiple of 4
    assert prompts_for(10.0, 3.2, 4) == 32  # 32.000000000000004 is 32
    assert prompts_for(0.5, 3.3, 4) == 8  # at least 2 x concurrency
    assert prompts_for(4.0, 2.5, 1) == 10
    for bad in (0, None, -1.0):
        with pytest.raises(SuiteError, match="no request rate"):
            prompts_for(10.0, bad, 4)
    with pytest.raises(SuiteError):
        prompts_for(0, 3.3, 4)


# ------------------------------------------------------------------------------------------ the real worker


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    log = tmp_path_factory.mktemp("client") / "worker.log"
    with PersistentClient(sys.executable, env=worker_env(), log_path=log) as c:
        yield c


def test_handshake_reports_the_installed_vllm(client):
    from suite.runtime.local import installed_vllm_version

    assert client.mode == "persistent", client.fallback_reason
    hello = client.handshake
    assert hello["ready"] is True and hello["interface"] == "module"
    assert hello["vllm"].split("+")[0] == installed_vllm_version().split("+")[0]
    assert hello["tokenizer_cache"] is True and hello["bench_timing"] is True
    assert hello["pid"] == client.pid and client.alive()


def test_bad_points_answered_and_the_worker_keeps_serving(client, tmp_path):
    pid = client.pid
    result = tmp_path / "r.json"
    with pytest.raises(SuiteError, match="unrecognized arguments: --no-such-flag") as err:
        client.run(["--no-such-flag"], result, 60)
    assert "bench serve --no-such-flag" in str(err.value)  # the command is named
    with pytest.raises(SuiteError, match="invalid int value: 'x'"):
        client.run(["--num-prompts", "x"], result, 60)
    # an exception inside vLLM's own code (main_async refuses it before touching the network)
    with pytest.raises(SuiteError, match="max-concurrency must be greater than 0"):
        client.run(["--dataset-name", "random", "--max-concurrency", "0"], result, 60)
    assert client.pid == pid and client.alive() and client.restarts == 0
    assert not result.exists() and not list(tmp_path.glob(".*partial"))


def test_stdout_carries_only_protocol_lines(tmp_path):
    """Talk to the worker directly: every stdout line is JSON, bad requests get an answer, EOF ends it."""
    with open(tmp_path / "w.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, str(WORKER_PATH)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, env=worker_env(), text=True)
    try:
        hello = json.loads(proc.stdout.readline())
        assert hello["ready"] is True
        proc.stdin.write('not json\n[1, 2]\n{"id": 5, "argv": "--help"}\n{"id": 6, "argv": ["--help"]}\n')
        proc.stdin.close()
        answers = [json.loads(line) for line in proc.stdout]  # fails on any non-JSON line
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [a["id"] for a in answers] == [None, None, 5, 6]
    assert not any(a["ok"] for a in answers)
    assert "JSON" in answers[0]["error"] and "list of strings" in answers[2]["error"]
    assert "exited" in answers[3]["error"]  # --help prints usage (to the log) and exits: answered, not fatal
    assert "usage: vllm bench serve" in (tmp_path / "w.log").read_text()


def test_a_dead_worker_is_restarted(client, tmp_path):
    old = client.pid
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while client.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(SuiteError, match="unrecognized arguments"):  # answered by a new worker
        client.run(["--no-such-flag"], tmp_path / "r.json", 60)
    assert client.mode == "persistent" and client.alive()
    assert client.pid != old and client.restarts == 1
    assert "client worker died" in client.log_path.read_text()


def test_a_hung_worker_is_ended_on_timeout(client, tmp_path):
    old, grace = client.pid, client.kill_grace_s
    os.kill(old, signal.SIGSTOP)
    client.kill_grace_s = 1.0
    try:
        with pytest.raises(SuiteError, match="timed out after 2 s; the worker was ended"):  # the timeout's path,
            client.run(["--no-such-flag"], tmp_path / "r.json", 2)  # not a wall-clock bound a busy box can break
    finally:
        client.kill_grace_s = grace
    assert not client.alive() and not Path(f"/proc/{old}").exists()  # ended and reaped


def test_the_worker_cancels_a_point_on_a_hung_server(client, tiny_model, tmp_path):
    """A server that accepts connections and never answers: the worker cancels the point at timeout_s."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    grace = client.kill_grace_s
    client.kill_grace_s = 120.0  # room for a busy box: the worker's own answer, however late, is what counts
    try:
        with pytest.raises(SuiteError, match=r"persistent client\) timed out after 3 s") as exc:
            client.run(point_argv(url, tiny_model, prompts=4, concurrency=2), tmp_path / "r.json", 3)
        assert "the worker was ended" not in str(exc.value)  # answered by the worker, not killed by us
    finally:
        client.kill_grace_s = grace
        hung.close()
    assert not client.alive()  # a cancelled point gets a fresh worker next time
    assert not list(tmp_path.glob("*.json*"))


# ------------------------------------------------------------------------------------------ the CLI path


def test_cli_mode_starts_no_worker(tmp_path):
    with PersistentClient(sys.executable, env=worker_env(), log_path=tmp_path / "c.log", mode="cli") as c:
        assert c.mode == "cli" and c.pid is None and c.handshake is None and c.fallback_reason is None
        assert c.command(["--num-prompts", "4"])[1:] == ["bench", "serve", "--num-prompts", "4"]
    with pytest.raises(SuiteError, match="unknown client mode"):
        PersistentClient(sys.executable, log_path=tmp_path / "c.log", mode="fast")  # type: ignore[arg-type]


def test_falls_back_to_the_cli_when_the_worker_dies_at_start(tmp_path):
    log = tmp_path / "c.log"
    dead = [sys.executable, "-c", "import sys; sys.exit(3)"]
    vllm = str(Path(sys.executable).parent / "vllm")
    with PersistentClient(dead, env=worker_env(), log_path=log, cli=[vllm], start_timeout_s=30) as c:
        assert c.mode == "cli" and "exit status 3" in c.fallback_reason
        marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
        # the CLI's own parser answers, with its exit status and the command
        with pytest.raises(SuiteError, match=r"`vllm bench serve` failed \(exit status 2\)"):
            c.run(["--no-such-flag", "--metadata", f"m={marker}"], tmp_path / "r.json", 120)
        assert "unrecognized arguments: --no-such-flag" in log.read_text()
        # a CLI point that runs past its timeout: its whole process group is ended
        with pytest.raises(SuiteError, match="timed out after 1 s"):
            c.run(["--dataset-name", "random", "--metadata", f"m={marker}"], tmp_path / "r.json", 1)
        assert processes_mentioning(marker) == []
    assert "falling back" in log.read_text()


def test_falls_back_to_the_cli_when_the_interface_differs(tmp_path):
    env = {**worker_env(), "VLLM_USE_RUST_BENCH": "1"}  # the CLI would exec the Rust benchmark instead
    with PersistentClient(sys.executable, env=env, log_path=tmp_path / "c.log") as c:
        assert c.mode == "cli" and c.handshake is None
        assert "cannot run vLLM's benchmark module" in c.fallback_reason and "Rust" in c.fallback_reason


# ------------------------------------------------------------------------------------------ end to end


class _Server:
    """`vllm serve` of the tiny MoE (eager, 1 GiB KV cache, dev mode for /reset_prefix_cache)."""

    def __init__(self, model: Path, log: Path):
        self.tmp = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))  # short: ZMQ IPC socket paths
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {**worker_env(), "TMPDIR": str(self.tmp), "VLLM_CACHE_ROOT": str(self.tmp / "vllm-cache"),
                    "TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "inductor"), "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_SERVER_DEV_MODE": "1"}
        self.cmd = [str(Path(sys.executable).parent / "vllm"), "serve", str(model), "--served-model-name",
                    SERVED, "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "bfloat16",
                    "--max-model-len", "2048", "--max-num-seqs", "8", "--enforce-eager"]

    def __enter__(self) -> _Server:
        self.proc = start(self.cmd, env=self.env, log_path=self.log)
        deadline = time.monotonic() + 300
        while not http_ok(f"{self.base_url}/health", timeout=2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"vllm serve did not become healthy:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        stop_group(self.proc, grace_s=30)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@pytest.mark.e2e
def test_persistent_client_matches_the_cli_and_costs_less(tiny_model, tmp_path):
    vllm = str(Path(sys.executable).parent / "vllm")
    with _Server(tiny_model, tmp_path / "server.log") as server:
        argv = [*point_argv(server.base_url, tiny_model, prompts=16, concurrency=4), "--metadata", "arm=a"]
        cli_runs, p_runs = [], []
        load_before = _loadavg()
        with PersistentClient(sys.executable, env=worker_env(), log_path=tmp_path / "cli.log", cli=[vllm],
                              mode="cli") as cli:
            t0 = time.monotonic()
            for i in range(3):
                cli_runs.append(cli.run(argv, tmp_path / f"cli-{i}.json", 300))
            cli_total = time.monotonic() - t0
        t0 = time.monotonic()
        with PersistentClient(sys.executable, env=worker_env(), log_path=tmp_path / "worker.log",
                              cli=[vllm]) as pc:
            startup = time.monotonic() - t0
            for i in range(3):
                p_runs.append(pc.run(argv, tmp_path / f"p-{i}.json", 300, log_path=tmp_path / f"p-{i}.log"))
            p_total = time.monotonic() - t0

            # warm-ups through the same client: one per distinct shape, then the prefix cache reset
            other = with_flag(argv, "--max-concurrency", "2")
            warm = warm_session(pc, [WarmPoint(argv, 4), WarmPoint(with_flag(argv, "--num-prompts", "99"), 4),
                                     WarmPoint(other, 2)],
                                reset_prefix_cache=lambda: http_ok(f"{server.base_url}/reset_prefix_cache",
                                                                   method="POST", timeout=30.0),
                                scratch_dir=tmp_path / "warm")
        load_after = _loadavg()

        cli_raw = [json.loads((tmp_path / f"cli-{i}.json").read_text()) for i in range(3)]
        p_raw = [json.loads((tmp_path / f"p-{i}.json").read_text()) for i in range(3)]
        durations = [r["duration"] for r in p_raw]
        print(f"\nload {load_before} -> {load_after}")
        print("CLI point wall s:        ", [round(r.wall_s, 2) for r in cli_runs], f"total {cli_total:.1f}")
        print("persistent point wall s: ", [round(r.wall_s, 2) for r in p_runs],
              f"total {p_total:.1f} (worker start {startup:.1f})")
        print("bench durations s:       ", [round(d, 2) for d in durations],
              f"measuring share (persistent points) {sum(durations) / sum(r.wall_s for r in p_runs):.2f}")
        print("client CPU util CLI/persistent:", [r.client_cpu_util for r in cli_runs],
              [r.client_cpu_util for r in p_runs])
        print("output tok/s CLI/persistent:", [round(r["output_throughput"]) for r in cli_raw],
              [round(r["output_throughput"]) for r in p_raw])
        print("warm-up:", warm.record().model_dump_json())

    # the same tool: same keys, same work done, throughput in the same range
    assert all(r.mode == "cli" for r in cli_runs) and all(r.mode == "persistent" for r in p_runs)
    for c, p in zip(cli_raw, p_raw, strict=True):
        assert set(c) == set(p)
        assert c["completed"] == p["completed"] == 16 and c["failed"] == p["failed"] == 0
        assert c["total_output_tokens"] == p["total_output_tokens"] == 16 * 16  # --ignore-eos
        assert c["total_input_tokens"] == p["total_input_tokens"]  # same seed, same prompts
        assert c["arm"] == p["arm"] == "a" and c["max_concurrency"] == p["max_concurrency"] == 4
        assert 1 / 3 < p["output_throughput"] / c["output_throughput"] < 3
        assert len(p["ttfts"]) == len(c["ttfts"]) == 16  # --save-detailed
    assert all(r.client_cpu_s and r.client_cpu_s > 0 for r in p_runs)
    assert min(r.client_cpu_s for r in cli_runs) > max(r.client_cpu_s for r in p_runs)  # the CLI's imports
    assert all(r.bench_wall_s and r.bench_wall_s >= d for r, d in zip(p_runs, durations, strict=True))
    for i in range(3):  # each point's output went to its own log
        assert (tmp_path / f"p-{i}.log").read_text().count("Serving Benchmark Result") == 1
    # three points through one persistent client, its start-up included, against three CLI runs
    assert p_total < 0.6 * cli_total, (p_total, cli_total)

    assert [s.concurrency for s in warm.shapes] == [4, 2]  # the 99-prompt point has the first one's shape
    assert all(s.ok and s.completed == s.prompts == 2 * s.concurrency and s.mode == "persistent"
               for s in warm.shapes), warm.record()
    assert warm.prefix_cache_reset is True  # VLLM_SERVER_DEV_MODE=1
    assert warm.for_argv(with_flag(argv, "--seed", "5")) is warm.shapes[0]
    n = prompts_for(2.0, warm.shapes[0].request_throughput, 4)
    assert n % 4 == 0 and n >= 8
    assert not list((tmp_path / "warm").iterdir())  # the scratch results are discarded
