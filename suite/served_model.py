"""The model an arm serves, as vLLM serves it: `ServedModel`, resolved from the matrix's ``model:`` block (the
checkpoint's id and its generator) and the arm's `vllm serve` flags (the matrix's ``serve_args``, then the
arm's). Four of vLLM's own flags say what the suite needs to know besides the id, and a matrix gives them in
serve_args exactly as on a `vllm serve` command line:

- ``--served-model-name``: the name the clients ask for (default: the id; of several names, the first);
- ``--tokenizer``: what the bench client counts tokens with (default: the model's);
- ``--max-model-len``: each point's isl + osl must fit (default :data:`DEFAULT_MAX_MODEL_LEN`, which the suite
  then passes to the server itself, as it always has);
- ``--load-format``: ``dummy`` (random weights of the config's shapes) refuses accuracy and is what a generated
  model (``model.generate``) needs (default: auto).

They are read the way vLLM reads them: the last copy wins, ``--flag value`` and ``--flag=value`` alike, and
``--max_model_len`` is ``--max-model-len``. vLLM's own parser is not imported (importing vLLM takes seconds and
torch; the suite's host may have no vLLM at all): :func:`human_readable_int` is vLLM 0.32's, for ``4k`` and
``4K``. Runs are read back (:mod:`suite.records`) through the same :meth:`ServedModel.resolve`, with the model
block's old fields as the values serve_args did not give.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SERVED = "--served-model-name"
TOKENIZER = "--tokenizer"
MAX_LEN = "--max-model-len"
LOAD_FORMAT = "--load-format"
HF_OVERRIDES = "--hf-overrides"
# vLLM's flags that describe the model served; the model block's old fields of the same names, for records
MODEL_FLAGS = {SERVED: "served_name", TOKENIZER: "tokenizer", MAX_LEN: "max_model_len",
               LOAD_FORMAT: "load_format"}
DEFAULT_MAX_MODEL_LEN = 2048  # what the suite passes as --max-model-len when serve_args give none
MAX_MODEL_LEN = 100_000_000  # a longer --max-model-len is refused as a typo

NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse takes these as values, not options
HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def flag_name(token: str) -> str | None:
    """The option a token names, spelt as vLLM's parser spells it: ``--max_model_len=4k`` -> ``--max-model-len``
    (underscores before the first '.' become dashes; a dotted JSON key such as ``--hf-overrides.x`` stays dotted).
    None for a token that is no long option (a value, ``-tp``)."""
    if not token.startswith("--"):
        return None
    key = token.split("=", 1)[0]
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def is_option(token: str) -> bool:
    """Whether argparse reads a token as an option (``-1`` and ``-0.5`` are values)."""
    return token.startswith("-") and not NEGATIVE_NUMBER.match(token)


def occurrences(args: Sequence[str], flag: str, *, many: bool | None = None,
                spell: Callable[[str], str | None] = flag_name) -> list[tuple[int, int, list[str]]]:
    """Every place ``flag`` stands in args: (its index, the index after its values, its values). ``--flag=v`` holds
    one value; ``--flag v`` the next token, and a flag of many values (``many``, argparse's nargs='+'; by default
    only ``--served-model-name``, as vLLM has it) every token up to the next option. A flag with no value after it
    has an empty list. ``spell``: the option a token names, as the tool's parser spells it (default vLLM's,
    :func:`flag_name`)."""
    many = flag == SERVED if many is None else many
    out = []
    i = 0
    while i < len(args):
        token = args[i]
        start, i = i, i + 1
        if spell(token) != flag:
            continue
        if "=" in token:
            out.append((start, i, [token.split("=", 1)[1]]))
            continue
        values: list[str] = []
        while i < len(args) and not is_option(args[i]) and (many or not values):
            values.append(args[i])
            i += 1
        out.append((start, i, values))
    return out


def flag_values(args: Sequence[str], flag: str) -> list[str] | None:
    """The values the last ``flag`` in args gives (vLLM takes the last copy), or None when args do not give it."""
    found = occurrences(args, flag)
    return found[-1][2] if found else None


def map_flag_values(args: Sequence[str], flag: str, fn: Callable[[str], str]) -> list[str]:
    """args with every value of ``flag`` replaced by ``fn(value)`` (a tokenizer's local path made absolute)."""
    out = list(args)
    for start, _end, values in occurrences(args, flag):
        if "=" in out[start]:
            out[start] = f"{out[start].split('=', 1)[0]}={fn(values[0])}"
        else:
            for k in range(len(values)):
                out[start + 1 + k] = fn(values[k])
    return out


def without_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """args less every copy of ``flags`` and its values."""
    drop = {k for flag in flags for start, end, _ in occurrences(args, flag) for k in range(start, end)}
    return [token for k, token in enumerate(args) if k not in drop]


def human_readable_int(value: str) -> int:
    """vLLM 0.32's ``vllm.utils.argparse_utils.human_readable_int``: ``2048``, ``4k`` = 4,000, ``4K`` = 4,096,
    ``25.6k`` = 25,600 (no decimals with a binary suffix). Raises ValueError."""
    value = value.strip()
    match = HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        if "." in number:
            raise ValueError(f"decimals are not allowed with binary suffixes like {suffix}: did you mean "
                             f"{number}{suffix.lower()}?")
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
    return int(value)


def parse_max_model_len(value: str) -> int:
    """A --max-model-len value as vLLM reads it, for the points' feasibility check: a length, never vLLM's
    ``auto`` / ``-1`` (the model's own length, which the suite cannot know without the checkpoint)."""
    if value.strip().lower() in ("auto", "-1"):
        raise ValueError(f"{MAX_LEN} {value}: the suite checks every point's isl + osl against the length, "
                         "so give it as a number (e.g. 4096, 4k = 4000, 4K = 4096)")
    try:
        n = human_readable_int(value)
    except ValueError as exc:
        why = str(exc) if "decimals" in str(exc) else "not a length"
        raise ValueError(f"{MAX_LEN} {value!r}: {why} (vLLM takes e.g. 4096, 4k = 4000, 4K = 4096)") from None
    if not 0 < n <= MAX_MODEL_LEN:
        why = "must be > 0" if n <= 0 else f"{n:,} is beyond the limit {MAX_MODEL_LEN:,} (a typo?)"
        raise ValueError(f"{MAX_LEN} {value}: {why}")
    return n


def not_empty(flag: str) -> Callable[[str], object]:
    """A flag's value rule: any text but an empty one."""
    def check(value: str) -> object:
        if not value.strip():
            raise ValueError(f"{flag} must not be empty")
        return value
    return check


def check_flag_values(args: Sequence[str], rules: Mapping[str, Callable[[str], object] | None]) -> None:
    """Refuse what vLLM would refuse or the suite cannot read of the flags in ``rules``: a flag without its
    value, a value its rule (None: any) raises ValueError on. The message starts with the flag."""
    for flag, rule in rules.items():
        for _start, _end, values in occurrences(args, flag):
            if not values:
                raise ValueError(f"{flag} needs a value after it")
            if rule is not None:
                rule(values[0])


def check_model_flags(args: Sequence[str]) -> None:
    """Refuse model flags vLLM would refuse or the suite cannot read: a flag without its value, an empty
    tokenizer, a --max-model-len that is no length. The message starts with the flag."""
    check_flag_values(args, {SERVED: None, TOKENIZER: not_empty(TOKENIZER), MAX_LEN: parse_max_model_len,
                             LOAD_FORMAT: None})


@dataclass(frozen=True)
class ServedModel:
    """One arm's model as its server serves it and its clients ask for it: the checkpoint (``id``, a hub id or an
    absolute directory), its generator, and what the four model flags of its serve_args say, or their defaults.
    ``given`` names the flags the serve_args gave (the others are the defaults the suite supplies)."""

    id: str
    served_name: str
    tokenizer: str
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    load_format: str = "auto"
    generate: str | None = None
    given: frozenset[str] = field(default=frozenset())

    @classmethod
    def resolve(cls, id: str, serve_args: Sequence[str], *, generate: str | None = None,
                base: Mapping[str, Any] | None = None, strict: bool = True) -> ServedModel:
        """The model ``id`` served with ``serve_args`` (the matrix's, then the arm's). ``base``: values of the model
        block's old fields (``served_name``, ``tokenizer``, ``max_model_len``, ``load_format``: a run recorded
        before they moved to serve_args), taken where the serve_args give none. ``strict``: raise ValueError on a
        --max-model-len that is no length; else (a record) keep the base's or the default."""
        base = base or {}
        given = {flag: values for flag in MODEL_FLAGS if (values := flag_values(serve_args, flag))}
        name = given.get(SERVED, [base.get("served_name") or ""])[0] or id
        tokenizer = given.get(TOKENIZER, [base.get("tokenizer") or ""])[0] or id
        length = base.get("max_model_len") or DEFAULT_MAX_MODEL_LEN
        if MAX_LEN in given:
            try:
                length = parse_max_model_len(given[MAX_LEN][0])
            except ValueError:
                if strict:
                    raise
                del given[MAX_LEN]
        load_format = (given.get(LOAD_FORMAT, [base.get("load_format") or ""])[0] or "auto").lower()
        return cls(id=id, served_name=name, tokenizer=tokenizer, max_model_len=int(length), load_format=load_format,
                   generate=generate, given=frozenset(given))

    @property
    def dummy(self) -> bool:
        """Random weights of the config's shapes (--load-format dummy): timings are real, outputs are not."""
        return self.load_format == "dummy"

    def generator_args(self) -> list[str]:
        """A generated model's --hf-overrides (suite.fixtures.gemma4.HF_OVERRIDES), which the suite passes itself."""
        if self.generate is None:
            return []
        from suite.fixtures.gemma4 import HF_OVERRIDES as OVERRIDES

        return [HF_OVERRIDES, json.dumps(OVERRIDES, separators=(",", ":"))]

    def server_defaults(self) -> tuple[list[str], list[str]]:
        """What the suite adds to `vllm serve` besides serve_args: (``--served-model-name NAME`` right after the
        model, unless serve_args give it; ``--max-model-len 2048`` unless serve_args give it, and a generated
        model's --hf-overrides). Never a second copy of a flag serve_args give (vLLM warns of duplicates)."""
        name = [] if SERVED in self.given else [SERVED, self.served_name]
        length = [] if MAX_LEN in self.given else [MAX_LEN, str(self.max_model_len)]
        return name, [*length, *self.generator_args()]

    def model_args(self) -> list[str]:
        """The model's own engine flags for the offline tools (`vllm bench latency`, the layer bench), which take
        the model's flags from the suite rather than from serve_args: ``--load-format`` unless auto, and a
        generated model's --hf-overrides."""
        if self.load_format == "auto":
            return []
        return [LOAD_FORMAT, self.load_format, *self.generator_args()]

    def weights_note(self) -> str | None:
        """One line for the report and the manifest when the weights are not a checkpoint's."""
        if not self.dummy:
            return None
        config = f"real-shape config {self.generate}" if self.generate else "the config of this model"
        return f"dummy (--load-format dummy, {config}): timings are real, outputs are not a model's"
