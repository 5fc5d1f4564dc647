"""lm-eval command construction, the offline task file, failure paths and the equivalence prompt set.

The end-to-end runs against real servers are in test_accuracy_e2e.py; these need no server.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml

from suite.errors import SuiteError
from suite.fixtures.gsm8k import write_synthetic_gsm8k
from suite.stages.accuracy.equivalence import equivalence_prompts, prompt_set_sha256, run_equivalence
from suite.stages.accuracy.run import lm_eval_command, lm_eval_task_yaml, run_accuracy, write_local_task
from suite.stages.accuracy.spec import AccuracyParams


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def _model_args(cmd: list[str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in _flag(cmd, "--model_args").split(","))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_completions_command_local_dataset(tmp_path: Path) -> None:
    spec = AccuracyParams(
        dataset=str(tmp_path), limit=20, max_gen_toks=32, concurrency=4, seed=7, num_fewshot=3
    )
    cmd = lm_eval_command(
        base_url="http://127.0.0.1:18200/v1/", served_name="tiny-moe", tokenizer="tok", spec=spec,
        out_dir=tmp_path / "out", include_dir=tmp_path / "task",
    )  # fmt: skip
    assert cmd[1:4] == ["-m", "lm_eval", "run"]
    assert _flag(cmd, "--model") == "local-completions"
    assert _model_args(cmd) == {
        "model": "tiny-moe",
        "base_url": "http://127.0.0.1:18200/v1/completions",
        "num_concurrent": "4",
        "max_retries": "3",
        "seed": "7",
        "tokenizer": "tok",
        "tokenizer_backend": "huggingface",
        "tokenized_requests": "False",
    }
    assert _flag(cmd, "--tasks") == "suite_local_gsm8k"
    assert (
        _flag(cmd, "--num_fewshot") == "3" and _flag(cmd, "--seed") == "7" and _flag(cmd, "--limit") == "20"
    )
    assert _flag(cmd, "--gen_kwargs") == "max_gen_toks=32"
    assert _flag(cmd, "--output_path") == str(tmp_path / "out") and "--log_samples" in cmd
    assert _flag(cmd, "--include_path") == str(tmp_path / "task")
    assert "--apply_chat_template" not in cmd


def test_chat_command_hub_dataset(tmp_path: Path) -> None:
    spec = AccuracyParams(endpoint="chat")  # hub dataset, no limit
    cmd = lm_eval_command(
        base_url="http://h:1",
        served_name="m",
        tokenizer="org/tok",
        spec=spec,
        out_dir=tmp_path,
        include_dir=None,
    )
    assert _flag(cmd, "--model") == "local-chat-completions" and "--apply_chat_template" in cmd
    args = _model_args(cmd)
    assert args["base_url"] == "http://h:1/v1/chat/completions" and "tokenizer" not in args
    assert _flag(cmd, "--tasks") == "gsm8k" and _flag(cmd, "--num_fewshot") == "5"
    assert "--limit" not in cmd and "--include_path" not in cmd
    with pytest.raises(SuiteError, match="containing ','"):
        lm_eval_command(
            base_url="http://h:1",
            served_name="a,b",
            tokenizer="t",
            spec=spec,
            out_dir=tmp_path,
            include_dir=None,
        )


def test_local_task_includes_lm_eval_gsm8k(tmp_path: Path) -> None:
    data = write_synthetic_gsm8k(tmp_path / "data", n_test=5, n_train=5)
    name = write_local_task(AccuracyParams(dataset=str(data)), tmp_path / "task")
    conf = yaml.safe_load((tmp_path / "task" / f"{name}.yaml").read_text())
    assert name == "suite_local_gsm8k" and conf["task"] == name
    assert Path(conf["include"]) == lm_eval_task_yaml("gsm8k") and Path(conf["include"]).is_file()
    assert conf["dataset_path"] == "json" and conf["dataset_name"] is None
    assert conf["dataset_kwargs"]["data_files"] == {
        "train": str((data / "train.jsonl").resolve()),
        "test": str((data / "test.jsonl").resolve()),
    }
    with pytest.raises(SuiteError, match="missing"):
        write_local_task(AccuracyParams(dataset=str(tmp_path / "task")), tmp_path / "t2")


def test_the_runtime_maps_lm_evals_interpreter_for_the_task_search_and_the_run(tmp_path: Path) -> None:
    """The stage names lm-eval's Python (LM_EVAL_PYTHON) for both its commands; the local runtime's mapping makes
    it this interpreter (the docker runtime's: the image's /opt/lm-eval venv, tests/test_docker_unit.py)."""
    from suite.proc import LM_EVAL_PYTHON
    from suite.runtime.local import host_vllm
    from suite.stages.accuracy.run import tool_task_yaml

    seen: list[list[str]] = []

    def argv(cmd: list[str]) -> list[str]:
        seen.append(cmd)
        return host_vllm(cmd)

    assert Path(tool_task_yaml("gsm8k", argv)) == lm_eval_task_yaml("gsm8k")
    data = write_synthetic_gsm8k(tmp_path / "data", n_test=5, n_train=5)
    with pytest.raises(SuiteError, match="lm-eval"):  # no server: lm-eval fails, after starting as mapped
        run_accuracy(base_url=f"http://127.0.0.1:{_closed_port()}", served_name="m", tokenizer="t",
                     spec=AccuracyParams(dataset=str(data), limit=1), out_dir=tmp_path / "o",
                     log_path=tmp_path / "l.log", timeout_s=1.5, argv=argv)  # fmt: skip
    # the search above, the run's own search for its local task, lm-eval itself
    assert [cmd[0] for cmd in seen] == [LM_EVAL_PYTHON] * 3
    assert seen[1][1] == "-c" and seen[2][1:4] == ["-m", "lm_eval", "run"]
    assert (tmp_path / "l.log").read_text().startswith(f"$ {host_vllm([LM_EVAL_PYTHON])[0]} -m lm_eval run ")


def test_unknown_dataset_is_an_error(tmp_path: Path) -> None:
    spec = AccuracyParams(dataset="someone/else")
    with pytest.raises(SuiteError, match="neither an existing local directory"):
        run_accuracy(base_url="http://127.0.0.1:1", served_name="m", tokenizer="t", spec=spec,
                     out_dir=tmp_path / "o", log_path=tmp_path / "l.log")  # fmt: skip


def test_timeout_kills_lm_eval_and_reports_the_command(tmp_path: Path) -> None:
    data = write_synthetic_gsm8k(tmp_path / "data", n_test=5, n_train=5)
    spec = AccuracyParams(dataset=str(data), limit=2)
    with pytest.raises(SuiteError) as err:
        run_accuracy(base_url=f"http://127.0.0.1:{_closed_port()}", served_name="m", tokenizer="t", spec=spec,
                     out_dir=tmp_path / "o", log_path=tmp_path / "l.log", timeout_s=1.5)  # fmt: skip
    msg = str(err.value)
    assert "timed out" in msg and "lm_eval run" in msg and "--include_path" in msg
    assert (tmp_path / "l.log").read_text().startswith("$ ")
    assert not (tmp_path / "o" / "suite-accuracy.json").exists()
    # the process group is gone: no lm_eval process of ours runs with this output path
    ours = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).count(str(tmp_path / "o"))]
    assert ours == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_equivalence_prompt_set_is_fixed_by_seed() -> None:
    a, b = equivalence_prompts(16, seed=0), equivalence_prompts(16, seed=0)
    assert a == b and len(set(a)) == 16
    assert prompt_set_sha256(a) == prompt_set_sha256(b) != prompt_set_sha256(equivalence_prompts(16, seed=1))
    assert equivalence_prompts(8, seed=0)[0].startswith("Question: ")


def test_equivalence_unreachable_server_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="equivalence: POST"):
        run_equivalence(base_url=f"http://127.0.0.1:{_closed_port()}", served_name="m", n_prompts=2,
                        max_tokens=4, out_path=tmp_path / "eq.json")  # fmt: skip
    assert not (tmp_path / "eq.json").exists()
    assert json.dumps(equivalence_prompts(2))  # serializable


def test_a_server_that_trusts_remote_code_has_clients_that_do(tmp_path: Path) -> None:
    """`--trust-remote-code` in the serve args: lm-eval loads the tokenizer with trust_remote_code=True."""
    spec = AccuracyParams(dataset=str(tmp_path))
    cmd = lm_eval_command(base_url="http://h:1", served_name="m", tokenizer="org/tok", spec=spec,
                          out_dir=tmp_path / "out", include_dir=None, trust_remote_code=True)
    assert _model_args(cmd)["trust_remote_code"] == "True"
    plain = lm_eval_command(base_url="http://h:1", served_name="m", tokenizer="org/tok", spec=spec,
                            out_dir=tmp_path / "out", include_dir=None)
    assert "trust_remote_code" not in _model_args(plain)
