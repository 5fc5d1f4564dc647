"""The local runtime's environment for an arm: absolute per-arm caches, the CPU split, the same door for all."""

from __future__ import annotations

import os
from pathlib import Path

from suite.matrix import parse_matrix
from suite.proc import cpu_list, cpu_split
from suite.runtime.base import ArmEnv
from suite.runtime.local import LocalRuntime

MATRIX = """
name: t
model: {id: some/model, max_model_len: 256}
arms:
  baseline: {vllm: "0.32.0"}
serve:
  - {isl: 8, osl: 4, concurrency: 1, num_prompts: 1}
"""


def test_cache_paths_are_absolute_when_the_run_dir_is_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runtime = LocalRuntime(parse_matrix(MATRIX, "m.yaml"), tmp_path / ".cache")
    env = runtime.arm_vars(ArmEnv(arm="baseline", vllm_version="0.32.0+cpu", pythonpath=tmp_path / "ov"),
                           Path("runs/r1/baseline/cache"))
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
