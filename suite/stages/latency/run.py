"""Latency points through the real `vllm bench latency` (offline: the engine runs inside the tool, no server).

One job = one (input_len, output_len, batch_size): the tool times ``num_iters`` generate calls of one batch
after ``num_iters_warmup`` warm-up calls, all in one process, and writes its JSON (``latencies`` in seconds,
``avg_latency``, ``percentiles``); that raw JSON is the job's result file. The report shows, per candidate arm,
seed 000's end-to-end table: median latency per batch size before → after, with the p10–p90 spread of the
iterations, Δ, speedup and a verdict from suite.stats on the per-iteration latencies.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from pathlib import Path

from suite.errors import SuiteError
from suite.model_config import local_config, text_config
from suite.proc import failure, run_tool
from suite.records import CommandNotes
from suite.served_model import MODEL_FLAGS, without_flags
from suite.stages.base import JobEnv
from suite.stages.latency.spec import LatencyParams
from suite.store import read_json

# flags this module sets itself: a copy in serve_args is dropped so the tool sees one value
OWN_FLAGS = {"--model", "--tokenizer", "--max-model-len", "--served-model-name", "--input-len", "--output-len",
             "--batch-size", "--num-iters-warmup", "--num-iters", "--output-json", "--load-format"}
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
    cfg = local_config(model)
    if cfg is None:
        return  # a hub id (real checkpoints have vocabularies far above 10000), or no readable config
    vocab = cfg.get("vocab_size") or text_config(cfg).get("vocab_size")
    if isinstance(vocab, int) and vocab < PROMPT_ID_BOUND:
        raise SuiteError(f"{model}: vocab_size {vocab} < {PROMPT_ID_BOUND}: `vllm bench latency` sends random token "
                         f"ids below {PROMPT_ID_BOUND} and vLLM rejects them as out of vocabulary; use a model "
                         f"with a larger vocabulary (e.g. the tiny MoE with its embeddings padded)")


def latency_command(*, vllm: str, model: str, tokenizer: str, max_model_len: int, params: LatencyParams,
                    engine_args: list[str], output_json: Path, model_args: list[str] | None = None) -> list[str]:
    """The exact `vllm bench latency` command for one point (vLLM's own flags). ``model_args``: the model's own
    flags (``ServedModel.model_args``: ``--load-format dummy`` and a generated model's ``--hf-overrides``)."""
    return [
        vllm, "bench", "latency",
        "--model", model,
        "--tokenizer", tokenizer,
        "--max-model-len", str(max_model_len),
        *(model_args or []),
        "--input-len", str(params.input_len),
        "--output-len", str(params.output_len),
        "--batch-size", str(params.batch_size),
        "--num-iters-warmup", str(params.num_iters_warmup),
        "--num-iters", str(params.num_iters),
        *engine_args,
        "--output-json", str(output_json),
    ]


# ---------------------------------------------------------------------------------------- running


def timeout_for(p: LatencyParams) -> float:
    return 900.0 + 2.0 * (p.num_iters_warmup + p.num_iters) * (1 + p.output_len * 0.05)


class LatencyNotes(CommandNotes):
    """A latency job's notes: its command line, and the matrix's serve flags `vllm bench latency` does not take."""

    dropped_serve_args: list[str] = []


def execute(env: JobEnv) -> LatencyNotes:
    """Executor of `latency` jobs (offline: no server; the engine runs inside the tool, in the arm's vLLM)."""
    job = env.job
    p = job.params
    assert isinstance(p, LatencyParams), job.kind
    check_vocab(env.model.id)
    # the model's flags come from the resolved model (its tokenizer, length, load format), not as dropped copies
    engine_args, dropped = split_engine_args(without_flags(env.serve_args, list(MODEL_FLAGS)),
                                             engine_flags(env.vllm_root))

    result = env.result
    partial = result.with_name(f".{result.stem}.partial.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)
    tool = env.tool(latency_command(vllm="vllm", model=env.model.id, tokenizer=env.tokenizer,
                                    max_model_len=env.model.max_model_len, params=p,
                                    engine_args=engine_args, output_json=partial, model_args=env.model.model_args()))
    cmd = tool.argv
    try:
        run_tool(cmd, env=tool.env, log_path=env.log, timeout_s=timeout_for(p), what="`vllm bench latency`")
        try:
            raw = read_json(partial)
        except (OSError, json.JSONDecodeError) as exc:
            raise failure("`vllm bench latency`", f"wrote no readable JSON ({exc})", cmd, env.log) from None
        lat = raw.get("latencies")
        if not isinstance(lat, list) or len(lat) != p.num_iters or not all(
                isinstance(x, int | float) and x > 0 for x in lat):
            raise SuiteError(f"`vllm bench latency` JSON has no valid `latencies` for {p.num_iters} iterations: "
                             f"{str(lat)[:200]}")
        os.replace(partial, result)  # the tool's own bytes, renamed into place in one step
    finally:
        partial.unlink(missing_ok=True)
        partial.with_name(partial.stem + ".pytorch.json").unlink(missing_ok=True)
    return LatencyNotes(command=cmd, dropped_serve_args=dropped)
