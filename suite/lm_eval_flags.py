"""The accuracy block's ``lm_eval_args``: lm-eval's own flags of `lm-eval run`, as on its command line, read the way
lm-eval's parser reads them (:mod:`suite.bench_flags`' reader) into `LmEvalFlags`, the values the accuracy job's
params record and the stage writes into lm-eval's command.

lm-eval itself is not imported: the suite runs it through the interpreter that holds it (an arm image's venv
under the docker runtime), and the suite's own host may have none. Its parser (lm-eval 0.4's ``lm_eval._cli.run``)
is followed instead:

- a flag is spelt as lm-eval spells it, underscores and all (``--num_fewshot``, never ``--num-fewshot``), or by
  its short name (``-f``); ``--flag value`` and ``--flag=value`` alike; no abbreviations;
- the last copy of a flag wins, but ``--tasks`` gathers the tasks of every copy (each value a name or a comma
  list) and ``--model_args`` / ``--gen_kwargs`` merge the ``key=value`` pairs of every copy in order (each value a
  comma list, or one JSON object), a later key winning;
- values are converted as lm-eval converts them: ``--limit`` a number, ``--seed`` one integer for all four of its
  seeds or a comma list of three or four (``None`` leaving one unset, a missing fourth lm-eval's default), a
  ``key=value`` value ``true``/``false``, a number or a Python literal.

Taken: ``--tasks`` (one task: the report pairs its questions), ``--num_fewshot``, ``--limit`` (a count), ``--seed``
(one seed: the suite gives it to all four of lm-eval's seeds and to the requests, ``seed`` of model_args),
``--gen_kwargs max_gen_toks=N``, ``--model`` (``local-completions`` or ``local-chat-completions``: the arm's server's
completions or chat endpoint), ``--model_args num_concurrent=N``. The flags and the model_args keys the suite sets
itself are refused with where they come from; any other flag or key is refused with the list of those taken: the
stage writes lm-eval's command from the job's params (what a resume, the estimate and the report read), so a flag
is taken only where the params record its value.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from suite.bench_flags import BenchFlag, BenchTool, in_range, tool_args
from suite.matrix_blocks import MAX_CONCURRENCY, MAX_PROMPTS, MAX_TOKENS
from suite.served_model import is_option

Endpoint = Literal["completions", "chat"]
# lm-eval's models for an OpenAI-compatible server, and the endpoint of the arm's server each one asks
ENDPOINTS: dict[str, Endpoint] = {"local-completions": "completions", "local-chat-completions": "chat"}
MODEL_OF: dict[Endpoint, str] = {endpoint: model for model, endpoint in ENDPOINTS.items()}
LM_EVAL_SEEDS = "0,1234,1234,1234"  # lm-eval's default seeds (python, numpy, torch, few-shot)
MAX_FEWSHOT = 1_000
# lm-eval's short names of the flags below
SHORT = {"-t": "--tasks", "-M": "--model", "-a": "--model_args", "-L": "--limit", "-f": "--num_fewshot",
         "-o": "--output_path", "-s": "--log_samples"}


def spelling(token: str) -> str | None:
    """The flag a token names as lm-eval's parser spells it (a short name as its long one), or None for a value."""
    if not is_option(token):
        return None
    name = token.split("=", 1)[0]
    return SHORT.get(name, name)


def _seeds(text: str) -> list[int | None]:
    """lm-eval's --seed: one integer for all four seeds, or three or four comma-separated ('None': unset), a
    missing fourth taken from lm-eval's default."""
    items = [None if t.strip().lower() == "none" else int(t) for t in text.split(",")]
    if len(items) == 1:
        return items * 4
    if not 3 <= len(items) <= 4:
        raise ValueError(text)
    return items + [int(t) for t in LM_EVAL_SEEDS.split(",")][len(items):]


def _one_seed(seeds: list[int | None]) -> str | None:
    if seeds[0] is None or len(set(seeds)) != 1:
        return ("the suite gives one seed to all four of lm-eval's seeds and to the requests (model_args seed): "
                "write one integer")
    return None


def _cli_value(text: str) -> Any:
    """A ``key=value`` value as lm-eval converts it: true / false, an integer, a float, a Python literal, or text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.isnumeric():
        return int(text)
    try:
        return float(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text


def _split_top_level(text: str) -> list[str]:
    """``a=1,b=[2,3]`` -> ``a=1``, ``b=[2,3]``: split on the commas outside brackets and quotes, as lm-eval does."""
    parts: list[str] = []
    buf: list[str] = []
    depth, quote = 0, None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append("".join(buf))
            buf = []
            continue
        buf.append(char)
    parts.append("".join(buf))
    return [p for p in parts if p]


def _pairs(values: list[str]) -> dict[str, Any]:
    """One copy of --model_args or --gen_kwargs as lm-eval reads it: a JSON object, or ``key=value`` comma lists.
    Values after a JSON object (which lm-eval would drop) are refused."""
    try:
        first = json.loads(values[0])
    except json.JSONDecodeError:
        if "{" in values[0]:
            raise ValueError(values[0]) from None
        first = None
    if isinstance(first, dict):
        if len(values) > 1:
            raise ValueError(values[1])
        return first
    out: dict[str, Any] = {}
    for value in values:
        for item in _split_top_level(value):
            key, eq, text = item.partition("=")
            if not eq:
                raise ValueError(item)
            out[key] = _cli_value(text)
    return out


def _merged(default: Mapping[str, Any]) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """lm-eval's merge of every copy's pairs in order, onto the suite's default."""
    return lambda copies: {k: v for pairs in (default, *copies) for k, v in pairs.items()}


def _whole(name: str, low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} must be an integer"
        why = in_range(low, high)(value)
        return f"{name} {why}" if why else None
    return check


def _keys(field: str, taken: Mapping[str, Callable[[Any], str | None]],
          own: Mapping[str, str]) -> Callable[[dict[str, Any]], str | None]:
    def check(pairs: dict[str, Any]) -> str | None:
        for key, value in pairs.items():
            if key in own:
                return f"{key} is set by the suite: {own[key]}"
            if key not in taken:
                return f"{key}: {field} take {', '.join(taken)} here"
            if why := taken[key](value):
                return why
        return None
    return check


def _pairs_written(pairs: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in pairs.items())


def _count(value: float | None) -> str | None:
    if value is None:
        return None
    if not value.is_integer():
        return "a count of questions, a whole number (a fraction of the test set is not taken here)"
    return in_range(1, MAX_PROMPTS)(int(value))


def _one_task(tasks: list[str]) -> str | None:
    if len(tasks) != 1 or not tasks[0]:
        return "one task: the report pairs the arms' answers to its questions"
    return None


DEFAULT_MODEL_ARGS = {"num_concurrent": 8}
DEFAULT_GEN_KWARGS = {"max_gen_toks": 256}

LM_EVAL = BenchTool(
    "lm-eval run",
    (
        BenchFlag("--tasks", lambda values: [t for v in values for t in v.split(",")], "task names", _one_task,
                  ["gsm8k"], "the lm-eval task, one", many=True,
                  gather=lambda copies: [t for tasks in copies for t in tasks], write=",".join),
        BenchFlag("--num_fewshot", int, "an integer", in_range(0, MAX_FEWSHOT), 5, "few-shot examples per question"),
        BenchFlag("--limit", float, "a number", _count, None, "questions asked, the first ones of the test set",
                  write=lambda v: "the whole test set (1,319 for GSM8K)" if v is None else f"{v:g}"),
        BenchFlag("--seed", _seeds, "an integer (or lm-eval's comma list of seeds)", _one_seed, [1234] * 4,
                  "lm-eval's seeds and the requests' (one integer)", write=lambda v: str(v[0])),
        BenchFlag("--gen_kwargs", _pairs, "key=value pairs (or a JSON object)",
                  _keys("gen_kwargs", {"max_gen_toks": _whole("max_gen_toks", 1, MAX_TOKENS)}, {}),
                  DEFAULT_GEN_KWARGS, "max_gen_toks=N: tokens generated per answer at most", many=True,
                  gather=_merged(DEFAULT_GEN_KWARGS), write=_pairs_written),
        BenchFlag("--model", str, "a model name",
                  lambda m: None if m in ENDPOINTS else "the suite asks the arm's server: local-completions (its "
                  "completions endpoint) or local-chat-completions (its chat endpoint, with the chat template)",
                  "local-completions", "local-completions or local-chat-completions"),
        BenchFlag("--model_args", _pairs, "key=value pairs (or a JSON object)",
                  _keys("model_args", {"num_concurrent": _whole("num_concurrent", 1, MAX_CONCURRENCY)}, {
                      "model": "the arm's served name (model.id, or --served-model-name in serve_args)",
                      "base_url": "the URL of the arm's server (--model picks its endpoint)",
                      "tokenizer": "the arm's tokenizer (model.id, or --tokenizer in serve_args)",
                      "tokenizer_backend": "huggingface, the arm's tokenizer",
                      "tokenized_requests": "False: the server tokenizes the prompts",
                      "trust_remote_code": "from serve_args (--trust-remote-code), as the server gets it",
                      "max_retries": "3",
                      "seed": "from --seed, the same seed",
                  }),
                  DEFAULT_MODEL_ARGS, "num_concurrent=N: questions in flight", many=True,
                  gather=_merged(DEFAULT_MODEL_ARGS), write=_pairs_written),
    ),
    {
        "--output_path": "the results go into the run directory",
        "--log_samples": "the samples go into the run directory (the report pairs them per question)",
        "--include_path": "accuracy.dataset: a local directory's task is lm-eval's own on that directory's files",
        "--apply_chat_template": "with --model local-chat-completions",
        "--trust_remote_code": "from serve_args (--trust-remote-code), as the server gets it",
    },
    spell=spelling,
    field="lm_eval_args",
    owner="lm-eval",
)


@dataclass(frozen=True)
class LmEvalFlags:
    """An accuracy block's lm_eval_args, read: what the accuracy job's params record (their fields of these
    names)."""

    task: str
    num_fewshot: int
    limit: int | None
    endpoint: Endpoint
    max_gen_toks: int
    concurrency: int
    seed: int


def lm_eval_flags(args: list[str]) -> LmEvalFlags:
    """lm_eval_args read (raises ValueError, the message starting with the flag)."""
    v = LM_EVAL.read(args)
    return LmEvalFlags(task=v["tasks"][0], num_fewshot=v["num_fewshot"],
                       limit=None if v["limit"] is None else int(v["limit"]), endpoint=ENDPOINTS[v["model"]],
                       max_gen_toks=v["gen_kwargs"]["max_gen_toks"], concurrency=v["model_args"]["num_concurrent"],
                       seed=v["seed"][0])


# The accuracy block's fields that were copies of lm-eval's flags: the lm_eval_args that say what each one said
OLD_FIELDS: dict[str, Callable[[Any], list[str]]] = {
    "task": lambda v: ["--tasks", str(v)],
    "num_fewshot": lambda v: ["--num_fewshot", str(v)],
    "limit": lambda v: ["--limit", str(v)],
    "endpoint": lambda v: ["--model", MODEL_OF.get(v, "local-completions or local-chat-completions")],
    "max_gen_toks": lambda v: ["--gen_kwargs", f"max_gen_toks={v}"],
    "concurrency": lambda v: ["--model_args", f"num_concurrent={v}"],
    "seed": lambda v: ["--seed", str(v)],
}


LmEvalArgs = tool_args(lm_eval_flags)
