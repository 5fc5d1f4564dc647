"""Latency points through the real `vllm bench latency` (offline: the engine runs inside the tool, no server).

One job = one (input_len, output_len, batch_size): the tool times ``num_iters`` generate calls of one batch
after ``num_iters_warmup`` warm-up calls, all in one process, and writes its JSON (``latencies`` in seconds,
``avg_latency``, ``percentiles``); that raw JSON is the job's result file. The report shows, per candidate arm,
seed 000's end-to-end table: median latency per batch size before → after, with the p10–p90 spread of the
iterations, Δ, speedup and a verdict from suite.stats on the per-iteration latencies.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from suite.errors import SuiteError
from suite.runtime.base import read_tail
from suite.store import read_json

# flags this module sets itself: a copy in serve_args is dropped so the tool sees one value
OWN_FLAGS = {"--model", "--tokenizer", "--max-model-len", "--served-model-name", "--input-len", "--output-len",
             "--batch-size", "--num-iters-warmup", "--num-iters", "--output-json"}
NUMBER = re.compile(r"^-\d")


# ---------------------------------------------------------------------------------------- command


def engine_flags(vllm_root: Path | None = None) -> set[str]:
    """The option strings `EngineArgs.add_cli_args` defines, read from vLLM's source without importing it
    (importing vLLM costs tens of seconds here). ``vllm_root`` is a directory holding ``vllm/`` (an arm's
    overlay); default: the installed package."""
    path = None
    if vllm_root is not None and (vllm_root / "vllm" / "engine" / "arg_utils.py").is_file():
        path = vllm_root / "vllm" / "engine" / "arg_utils.py"
    else:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise SuiteError("vLLM is not installed in this environment (run `make setup`)")
        path = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError) as exc:
        raise SuiteError(f"cannot read vLLM's engine arguments from {path}: {exc}") from None
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    flags.add(arg.value)
    if "--dtype" not in flags:
        raise SuiteError(f"{path}: found no engine arguments (is this vLLM's arg_utils.py?)")
    return flags


def _flag_name(token: str) -> str:
    """`--max_num_seqs=4` -> `--max-num-seqs`; `--compilation-config.mode` -> `--compilation-config`."""
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name.split(".", 1)[0]


def split_engine_args(args: list[str], flags: set[str]) -> tuple[list[str], list[str]]:
    """Split `vllm serve` arguments into (engine args `vllm bench latency` accepts, the rest). A flag owns the
    tokens after it up to the next flag (store-true flags own none), so no type table is needed."""
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        group = [token]
        i += 1
        while i < len(args) and (not args[i].startswith("-") or NUMBER.match(args[i])):
            group.append(args[i])
            i += 1
        if not token.startswith("-"):
            dropped += group  # a stray positional value
            continue
        name = _flag_name(token)
        base = "--" + name[5:] if name.startswith("--no-") else name  # BooleanOptionalAction negation
        if name in OWN_FLAGS or (name not in flags and base not in flags):
            dropped += group
        else:
            kept += group
    return kept, dropped


# `vllm bench latency` draws its prompts as np.random.randint(10000, ...) (vllm/benchmarks/latency.py): the
# model (or its tokenizer) must know token ids up to 9999, or every generate call fails validation.
PROMPT_ID_BOUND = 10000


def check_vocab(model: str) -> None:
    """Fail before spending minutes on engine start-up when a local model's vocabulary is too small."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return  # a hub id: real checkpoints have vocabularies far above 10000
    try:
        cfg = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if isinstance(vocab, int) and vocab < PROMPT_ID_BOUND:
        raise SuiteError(f"{model}: vocab_size {vocab} < {PROMPT_ID_BOUND}: `vllm bench latency` sends random token "
                         f"ids below {PROMPT_ID_BOUND} and vLLM rejects them as out of vocabulary; use a model "
                         f"with a larger vocabulary (e.g. the tiny MoE with its embeddings padded)")


def latency_command(*, vllm: str, model: str, tokenizer: str, max_model_len: int, params: dict[str, Any],
                    engine_args: list[str], output_json: Path) -> list[str]:
    """The exact `vllm bench latency` command for one point (vLLM's own flags)."""
    return [
        vllm, "bench", "latency",
        "--model", model,
        "--tokenizer", tokenizer,
        "--max-model-len", str(max_model_len),
        "--input-len", str(params["input_len"]),
        "--output-len", str(params["output_len"]),
        "--batch-size", str(params["batch_size"]),
        "--num-iters-warmup", str(params["num_iters_warmup"]),
        "--num-iters", str(params["num_iters"]),
        *engine_args,
        "--output-json", str(output_json),
    ]


# ---------------------------------------------------------------------------------------- running


def run_tool(cmd: list[str], *, env: dict[str, str], log_path: Path, timeout_s: float, what: str) -> None:
    """Run a tool in its own process group (the engine spawns workers): on a timeout or Ctrl-C the whole
    group is killed, so nothing is left behind."""
    from suite.runtime.local import _parent_death_hook

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_parent_death_hook())
        except OSError as exc:
            raise SuiteError(f"cannot start {cmd[0]}: {exc}") from None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SuiteError(f"{what} timed out after {timeout_s:.0f} s\n  command: {' '.join(cmd)}\n"
                             f"--- log tail ---\n{read_tail(log_path, 20)}") from None
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc, grace=0.0)  # engine processes that outlived a finished tool
    if code != 0:
        raise SuiteError(f"{what} failed (exit status {code})\n  command: {' '.join(cmd)}\n"
                         f"--- log tail ---\n{read_tail(log_path, 20)}")


def _kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    from suite.runtime.local import wait_group_gone

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(grace, 0.1))
        if wait_group_gone(proc.pid, max(grace, 2.0)):
            return


def execute(ctx: Any, job: Any, server: Any) -> dict[str, Any]:
    """Executor of `latency` jobs (offline: ``server`` is None)."""
    from suite.runtime.local import vllm_executable

    check_vocab(ctx.matrix.model.id)
    arm_env = ctx.arm_envs[job.arm]
    env = ctx.runtime.offline_env(arm_env, ctx.store.cache_dir(job.arm))
    env.update(ctx.plan.arms[job.arm].env)
    if Path(ctx.matrix.model.id).is_dir():
        env.setdefault("HF_HUB_OFFLINE", "1")
    serve_args = [*ctx.matrix.serve_args, *ctx.plan.arms[job.arm].serve_args]
    engine_args, dropped = split_engine_args(serve_args, engine_flags(arm_env.pythonpath))

    result = ctx.store.result_path(job)
    partial = result.with_name(f".{result.stem}.partial.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)
    cmd = latency_command(vllm=vllm_executable(), model=ctx.matrix.model.id, tokenizer=ctx.tokenizer,
                          max_model_len=ctx.matrix.model.max_model_len, params=job.params,
                          engine_args=engine_args, output_json=partial)
    cmd = ctx.runtime.offline_argv(arm_env, cmd)
    p = job.params
    timeout_s = 900.0 + 2.0 * (p["num_iters_warmup"] + p["num_iters"]) * (1 + p["output_len"] * 0.05)
    try:
        run_tool(cmd, env=env, log_path=ctx.store.log_path(job), timeout_s=timeout_s, what="`vllm bench latency`")
        try:
            raw = read_json(partial)
        except (OSError, json.JSONDecodeError) as exc:
            raise SuiteError(f"`vllm bench latency` wrote no readable JSON ({exc})\n  command: {' '.join(cmd)}\n"
                             f"--- log tail ---\n{read_tail(ctx.store.log_path(job), 20)}") from None
        lat = raw.get("latencies")
        if not isinstance(lat, list) or len(lat) != p["num_iters"] or not all(
                isinstance(x, int | float) and x > 0 for x in lat):
            raise SuiteError(f"`vllm bench latency` JSON has no valid `latencies` for {p['num_iters']} iterations: "
                             f"{str(lat)[:200]}")
        os.replace(partial, result)  # the tool's own bytes, renamed into place in one step
    finally:
        partial.unlink(missing_ok=True)
        partial.with_name(partial.stem + ".pytorch.json").unlink(missing_ok=True)
    return {"command": cmd, "dropped_serve_args": dropped}


# ---------------------------------------------------------------------------------------- report










