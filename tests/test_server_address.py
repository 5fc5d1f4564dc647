"""Where the servers listen is vLLM's own `vllm serve --host` / `--port`, in serve_args (the matrix's, then an
arm's), read as the model flags are read; the suite passes its chosen address to `vllm serve` exactly as it did
while they were runtime.host and runtime.port, and the plan's jobs are the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.runner import dry_run
from suite.runtime.base import ArmEnv, arm_address
from suite.runtime.docker.containers import container_config
from suite.runtime.local import LocalRuntime
from suite.server_address import ServerAddress, without_address
from suite.sessions import server_argv_tail
from suite.store import ArmDirs

BASE = """\
name: t
model: {id: org/m}
arms:
  base: {vllm: "0.32.0"}
  cand: {vllm: "0.32.0", serve_args: [--max-num-seqs, "4"]}
serve:
  - {isl: 8, osl: 4, concurrency: 1}
"""


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize(("args", "address"), [
    ([], ("127.0.0.1", 0, set())),
    (["--dtype", "bfloat16"], ("127.0.0.1", 0, set())),
    (["--host", "0.0.0.0", "--port", "8000"], ("0.0.0.0", 8000, {"--host", "--port"})),
    (["--port=8001", "--host=::1"], ("::1", 8001, {"--host", "--port"})),
    (["--port", "8000", "--port", "8002"], ("127.0.0.1", 8002, {"--port"})),  # the last copy wins, as in vLLM
    (["--port", "0"], ("127.0.0.1", 0, {"--port"})),  # 0: a free port the suite picks, as when left out
])
def test_the_address_is_read_as_vllm_reads_its_flags(args, address):
    got = ServerAddress.resolve(args)
    assert (got.host, got.port, set(got.given)) == address
    assert got.fixed == (address[1] != 0)


def test_an_arms_serve_args_come_after_the_matrixs():
    m = parse_matrix(BASE.replace('serve_args: [--max-num-seqs, "4"]', 'serve_args: [--port, "9001"]')
                     + 'serve_args: [--host, 0.0.0.0, --port, "9000"]\n')
    assert (m.address_of(m.arms["base"]).host, m.address_of(m.arms["base"]).port) == ("0.0.0.0", 9000)
    assert (m.address_of(m.arms["cand"]).host, m.address_of(m.arms["cand"]).port) == ("0.0.0.0", 9001)
    assert arm_address(m, "cand").port == 9001
    assert without_address(["--host", "h", "--dtype", "x", "--port=1"]) == ["--dtype", "x"]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("args", "said"), [
    ('[--port, x]', "serve_args: --port 'x': not a port number (0 for a free one)"),
    ('[--port, "70000"]', "serve_args: --port 70000: a port is 0 (a free one the suite picks) to 65535"),
    ('[--port, "-1"]', "serve_args: --port -1: a port is 0"),
    ('[--port]', "serve_args: --port needs a value after it"),
    ('[--host, ""]', "serve_args: --host must not be empty"),
    ('[--host]', "serve_args: --host needs a value after it"),
])
def test_an_address_vllm_would_refuse_is_refused(args, said):
    with pytest.raises(MatrixError, match="<matrix>:8: ") as err:
        parse_matrix(BASE + f"serve_args: {args}\n")
    assert said in str(err.value)


@pytest.mark.parametrize(("extra", "said"), [
    ('serve_args: [--port, "8000"]\norder: abba\ntogether: all\n',
     "serve_args: --port 8000: up to 2 servers are alive at once (together: all) and cannot share one port: leave "
     "--port out (the suite picks a free port for each server)"),
    ('serve_args: [--port, "8000"]\norder: abba\ntogether: 2\n', "up to 2 servers are alive at once (together: 2)"),
    # an arm's own port: the A/A arm is the baseline started again beside it
    ('order: abba\ntogether: all\naa: true\n', "arms.base.serve_args: --port 8005: up to 3 servers"),
    # GPU groups: rounds at once, a server of the same arm in each
    ('order: abba\ntogether: all\nrepeats: 2\nruntime: {gpus: ["0", "1"]}\n',
     "arms.base.serve_args: --port 8005: up to 4 servers are alive at once (together: all, 2 rounds at once on "
     "runtime.gpus' groups)"),
])
def test_a_fixed_port_for_servers_alive_at_once_is_refused(extra, said):
    text = BASE.replace('base: {vllm: "0.32.0"}', 'base: {vllm: "0.32.0", serve_args: [--port, "8005"]}') \
        if "serve_args" not in extra else BASE
    with pytest.raises(MatrixError) as err:
        parse_matrix(text + extra)
    assert said in str(err.value)


def test_a_fixed_port_serves_one_server_at_a_time():
    m = parse_matrix(BASE + 'serve_args: [--port, "8000"]\norder: abba\n')
    assert m.servers_at_once == 1 and m.address_of(m.arms["base"]).port == 8000
    assert parse_matrix(BASE + 'serve_args: [--port, "0"]\norder: abba\ntogether: all\n').servers_at_once == 2


# ---------------------------------------------------------------- retired


@pytest.mark.parametrize(("runtime", "said"), [
    ("{kind: local, host: 0.0.0.0}", 'runtime.host: retired: where the servers listen is vLLM\'s own flag in '
     'serve_args (the matrix\'s, or an arm\'s): write serve_args: [--host, "0.0.0.0"]'),
    ("{kind: local, port: 8000}", 'runtime.port: retired: where the servers listen is vLLM\'s own flag in serve_args '
     '(the matrix\'s, or an arm\'s): write serve_args: [--port, "8000"]'),
    ("{kind: local, host: 127.0.0.1}", 'write serve_args: [--host, "127.0.0.1"]; or delete it: 127.0.0.1 is the '
     'default'),
    ("{kind: local, port: 0}", 'write serve_args: [--port, "0"]; or delete it: 0, a free port the suite picks for '
     'each server, is the default'),
])
def test_runtime_host_and_port_are_retired_with_the_flags_to_write(runtime, said):
    with pytest.raises(MatrixError) as err:
        parse_matrix(BASE + f"runtime: {runtime}\n")
    assert f"<matrix>:8: runtime.{'port' if 'port' in runtime else 'host'}: " in str(err.value)
    assert said in str(err.value)


# ---------------------------------------------------------------- the same servers, the same jobs

# `vllm serve`'s arguments and the jobs' (key, arm, hash) as main made them from runtime.host / runtime.port, before
# they became serve_args (hub model ids: the hashes do not depend on the checkout's path)
BEFORE = {
    # runtime: {kind: local, host: 0.0.0.0, port: 8000} with serve_args: [--dtype, bfloat16]
    'serve_args: [--host, 0.0.0.0, --port, "8000", --dtype, bfloat16]\n': (8000, {
        "base": ["org/m", "--served-model-name", "org/m", "--host", "0.0.0.0", "--port", "8000", "--max-model-len",
                 "2048", "--dtype", "bfloat16", "--x"],
        "cand": ["org/m", "--served-model-name", "org/m", "--host", "0.0.0.0", "--port", "8000", "--max-model-len",
                 "2048", "--dtype", "bfloat16", "--max-num-seqs", "4", "--x"],
    }, [("serve/isl8-osl4-c1-n3/rep-0", "base", "c070c2fab0afdbe6"),
        ("serve/isl8-osl4-c1-n3/rep-0", "cand", "a23c24210b2ceb1a")]),
    # runtime: {kind: local, port: 8123} with serve_args: [--served-model-name, mm, --max-model-len, 4k]
    "serve_args: [--served-model-name, mm, --port=8123, --max-model-len, 4k]\n": (8123, {
        "base": ["org/m", "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "mm", "--max-model-len",
                 "4k", "--x"],
        "cand": ["org/m", "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "mm", "--max-model-len",
                 "4k", "--max-num-seqs", "4", "--x"],
    }, [("serve/isl8-osl4-c1-n3/rep-0", "base", "c3ed153d1ceded7d"),
        ("serve/isl8-osl4-c1-n3/rep-0", "cand", "67fdd34e93d943ef")]),
}


@pytest.mark.parametrize("serve_args", sorted(BEFORE))
def test_the_server_command_line_and_the_jobs_are_what_runtime_host_and_port_made(serve_args):
    port, argv, jobs = BEFORE[serve_args]
    m = parse_matrix(BASE + serve_args)
    plan = build_plan(m)
    assert {arm: server_argv_tail(m, arm, plan, m.address_of(plan.arms[arm]).port, ["--x"]) for arm in plan.arms} == argv
    assert all(m.address_of(plan.arms[arm]).port == port for arm in plan.arms)
    assert [(j.key, j.arm, j.hash) for j in plan.jobs] == jobs


def test_the_runtimes_serve_and_call_the_arms_host(tmp_path):
    m = parse_matrix(BASE + 'serve_args: [--host, 0.0.0.0, --port, "8000"]\n')
    arm = ArmEnv(arm="cand", vllm_version="0.32.0")
    dirs = ArmDirs(tmp_path, tmp_path / "cache")
    spec = LocalRuntime(m, tmp_path / ".cache", host="cpu").server_spec(
        arm, argv_tail=["m"], extra_env={}, dirs=dirs, log_path=tmp_path / "s.log", port=8000, redact=[])
    assert spec.base_url == "http://0.0.0.0:8000"
    # docker: the server listens on every interface inside its container, its port published on the arm's host
    cfg = container_config(m, ArmEnv(arm="cand", vllm_version="0.32.0", image="i"),
                           argv_tail=server_argv_tail(m, "cand", build_plan(m), 8000), extra_env={},
                           dirs=ArmDirs.in_run(tmp_path / "runs" / "r", "cand"), port=8000)
    assert cfg.publish == ("0.0.0.0", 8000, 8000)
    assert cfg.command[cfg.command.index("--host"):cfg.command.index("--host") + 4] == [
        "--host", "0.0.0.0", "--port", "8000"]


def test_the_dry_run_prints_the_servers_and_clients_address(tmp_path):
    path = Path(tmp_path / "m.yaml")
    path.write_text(BASE + 'serve_args: [--host, 0.0.0.0, --port, "8000", --dtype, bfloat16]\n')
    lines = dry_run(path, tmp_path / "runs").splitlines()
    server = next(line for line in lines if line.startswith("  [cand] server: "))
    assert server.endswith("vllm serve org/m --served-model-name org/m --host 0.0.0.0 --port PORT --max-model-len "
                           "2048 --dtype bfloat16 --max-num-seqs 4")
    client = next(line for line in lines if "] client: " in line)
    assert " --base-url http://0.0.0.0:PORT " in client
