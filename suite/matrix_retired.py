"""Matrix fields that were retired, and what an old matrix should write instead.

A retired field is refused like any unknown field, but its error names the field that replaced it and, where
the old value says it, the exact line to write (``repeats: 3`` for ``offline_repeats: 3``). Each entry is a
path pattern (``*`` stands for any key or index there: an arm's name, a point's place in its list) and a
message made from the value the matrix gave, or, for fields that became one (the profile block's isl, osl and
concurrency: its ``point``), from the block that held them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from suite.bench_flags import KERNEL, LATENCY, LAYER, SERVE, BenchFlag, BenchTool
from suite.lm_eval_flags import OLD_FIELDS
from suite.matrix_jobs import DEFAULT_NUM_PROMPTS, DEFAULT_PROFILE_POINT, PROFILE_SEED, PointLabel
from suite.sbatch import DEFAULT_TIME
from suite.served_model import MODEL_FLAGS
from suite.server_address import DEFAULT_HOST, FREE_PORT, HOST, PORT

YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}  # plain words YAML reads as no text


@dataclass(frozen=True)
class Retired:
    path: tuple[str, ...]  # where the field sat; "*": any key there (an arm's name)
    says: Callable[[Any], str]  # the message, from the value the old matrix gave
    in_block: bool = False  # says is given the mapping that held the field (fields read together), not its value

    def matches(self, loc: Sequence[Any]) -> bool:
        return len(loc) == len(self.path) and all(p in ("*", str(x)) for p, x in zip(self.path, loc, strict=True))


def _flag(value: Any) -> str:
    return "" if value is None else str(value)


def _sbatch(option: str, form: Callable[[Any], str] | None = None,
            note: Callable[[Any], str] | None = None) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        written = form(value) if form else f"{option}={_flag(value)}"
        return (f"retired: write sbatch's own option in runtime.slurm.sbatch, e.g. sbatch: [{written}] "
                "(every option there goes to each session's batch job as it is)" + (note(value) if note else ""))
    return says


def _model_flag(flag: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        return (f"retired: give vLLM's own flag in serve_args (the matrix's, or an arm's for its own model): "
                f"[{flag}, {_yaml_word(_flag(value))}]")
    return says


def _bench_flag(tool: BenchTool, flag: BenchFlag, where: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        return (f"retired: give {tool.owner}'s own flag in {where}: "
                f"[{flag.flag}, {json.dumps(flag.written(value))}]")
    return says


def _lm_eval_flag(field: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        if field == "limit" and value is None:
            return ("retired: lm-eval's own flags go in accuracy.lm_eval_args, and without a --limit the whole test "
                    "set is asked: delete it")
        flags = ", ".join(map(_yaml_word, OLD_FIELDS[field](value)))
        return f"retired: give lm-eval's own flag in accuracy.lm_eval_args: [{flags}]"
    return says


def _yaml_word(text: str) -> str:
    """A flag or value as a YAML list writes it: a plain word bare, anything YAML might read as other than that
    text (a number, true, a key=value pair) quoted."""
    plain = re.fullmatch(r"-{0,2}[A-Za-z][A-Za-z0-9_.-]*", text) and text.lower() not in YAML_WORDS
    return text if plain else json.dumps(text)


def _quoted(value: Any) -> str:
    return '"' + str(value).strip().replace(" ", "") + '"'


def _docker_gpus(value: Any) -> str:
    if str(value).strip() == "all":
        return ("retired: the GPUs the servers see are runtime.gpus for every runtime; a docker container gets every "
                "GPU when it is left out: delete it (or write gpus: all under runtime)")
    return ("retired: the GPUs the servers see are runtime.gpus for every runtime: write gpus: "
            f"{_quoted(value)} under runtime, beside kind (not under runtime.docker)")


def _gpu_groups(value: Any) -> str:
    groups = "[" + ", ".join(map(_quoted, value)) + "]" if isinstance(value, list) else _quoted(value)
    return ("retired: GPU groups are runtime.gpus given as a list: write gpus: "
            f"{groups} under runtime (together: all, each round on its group; with cross_groups each serving arm on "
            "its own)")


PROFILE_POINT = ("isl", "osl", "concurrency")  # the profile block's fields that became its point


def _profile_point(block: Mapping[str, Any]) -> str:
    """The point an old profile block gave, as ``point:`` writes it, the old defaults completing it."""
    default = PointLabel.parse(DEFAULT_PROFILE_POINT)
    given = [k for k in PROFILE_POINT if k in block]
    point = PointLabel(**{k: block.get(k, getattr(default, k)) for k in PROFILE_POINT})
    defaults = [f"{k} {getattr(default, k)}" for k in PROFILE_POINT if k not in given]
    return (f'retired: the profiled point is one field, written as the report names a point: write point: "{point}" '
            f"in place of {_listed(given)}" + (f" ({_listed(defaults)}: the defaults it had)" if defaults else ""))


def _listed(words: Sequence[str]) -> str:
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _profile_seed(value: Any) -> str:
    said = f"retired: the profiled window's prompts use seed {PROFILE_SEED}, the same requests for every arm: delete it"
    return said if value == PROFILE_SEED else said + (f" (this matrix's seed {value} is no longer taken: the window "
                                                      f"uses seed {PROFILE_SEED})")


def _profile_concurrency(block: Mapping[str, Any]) -> Any:
    """The profiled concurrency a block gives: its old field, else its point's, else the default point's."""
    if "concurrency" in block:
        return block["concurrency"]
    try:
        return PointLabel.parse(block.get("point", DEFAULT_PROFILE_POINT)).concurrency
    except ValueError:  # a point that is no point has its own error
        return PointLabel.parse(DEFAULT_PROFILE_POINT).concurrency


def _profile_warmup(block: Mapping[str, Any]) -> str:
    concurrency = _profile_concurrency(block)
    value = block.get("warmup_prompts")
    said = ("retired: the warm-up before the profiled window is one request per concurrency slot, at the window's "
            f"shape ({concurrency} requests at concurrency {concurrency}): delete it")
    if value == 0:
        return said + " (a window without a warm-up is no longer taken)"
    return said if value in (None, concurrency) else said + f" (this matrix's {value} requests become {concurrency})"


def _vendor(where: str, default: str, when: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        text = ("retired: the hosts' GPU vendor is runtime.vendor for every runtime: write vendor: "
                f"{_flag(value)} under runtime, beside kind (not under runtime.{where})")
        return text + (f"; or delete it: {default} is the default {when}" if str(value) == default else "")
    return says


def _aiter_build(name: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        text = _flag(value)
        text = f'"{text}"' if ";" in text else text
        return (f"retired: AITER's build variables go under its own names in the arm's aiter.build_env: write "
                f"build_env: {{{name}: {text}}}")
    return says


def _gate_shape(field: str, key: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        return (f"retired: the gate's shape now comes from each arm's model's config ({key}), read where the job "
                f"runs: delete {field}: {_flag(value)} from kernel. Where {_flag(value)} is not the model's own, the "
                "kernel table now times the model's gate instead (`python -m suite.stages.kernel.bench --hidden H "
                "--experts E` times any other shape by hand)")
    return says


def _address(flag: str, default: Any, said: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        text = ("retired: where the servers listen is vLLM's own flag in serve_args (the matrix's, or an arm's): "
                f"write serve_args: [{flag}, {json.dumps(_flag(value))}]")
        return text + (f"; or delete it: {said} is the default" if _flag(value) == str(default) else "")
    return says


def _seconds(value: Any) -> str:
    try:
        return f"{float(value):g}s"
    except (TypeError, ValueError):
        return f"{_flag(value)}s"


def _point_size(block: Mapping[str, Any]) -> str:
    """A serving point's size by time, as num_prompts writes it; the count the point also gave, which it ran only
    in a first round with no measured rate."""
    seconds = block.get("duration_s")
    said = ("retired: a point's size is one field, num_prompts, and seconds size it by time: write num_prompts: "
            f'"{_seconds(seconds)}"')
    if "num_prompts" not in block:
        return said + f" in place of duration_s: {_flag(seconds)}"
    return (said + f" in place of duration_s: {_flag(seconds)} and num_prompts: {_flag(block['num_prompts'])} "
            f"(duration_s sized the point: the count was only what a first round with no measured request rate ran, "
            f"which now runs {DEFAULT_NUM_PROMPTS})")


RETIRED: tuple[Retired, ...] = (
    Retired(("settle_s",), lambda _: (
        "retired: load at the first point's shape until a deadline did not end the slow state after a start in "
        "the stored H200 runs (a 20 s and a 30 s settle: both INCONCLUSIVE, the slow first minute unchanged); "
        "delete it, and keep quiet_s (no request for that long after /health) with warm-ups, or precompile: true "
        "for cold compiles")),
    Retired(("side_by_side",), lambda v: (
        f"retired: servers alive at once are `together: {v}` (with order: abba; together: all is every serving "
        "arm's server of a round at once, what order: interleaved was)")),
    Retired(("offline_repeats",), lambda v: (
        f"retired: `repeats` counts the rounds of every job, offline ones (latency, kernel, layer) included: write "
        f"repeats: {v} (a matrix that also serves runs its serving points that many rounds too)")),
    Retired(("verdict", "max_rounds"), lambda v: (
        f"retired: the last of verdict.looks is the most rounds a sequential run takes: write looks ending at {v}, "
        f"e.g. looks: [{max(1, int(v) // 2) if isinstance(v, int) else 2}, {v}]")),
    # which GPUs the servers see: one field, runtime.gpus (a string, or a list of groups)
    Retired(("runtime", "docker", "gpus"), _docker_gpus),
    Retired(("runtime", "gpu_groups"), _gpu_groups),
    # the hosts' GPU vendor: one field, runtime.vendor
    Retired(("runtime", "docker", "vendor"), _vendor("docker", "cpu", "of the docker runtime")),
    Retired(("runtime", "slurm", "gpu_vendor"), _vendor("slurm", "cuda", "of a slurm job that asks for GPUs")),
    # where the servers listen: vLLM's own --host and --port in serve_args
    Retired(("runtime", "host"), _address(HOST, DEFAULT_HOST, DEFAULT_HOST)),
    Retired(("runtime", "port"), _address(PORT, FREE_PORT, f"{FREE_PORT}, a free port the suite picks for each server,")),
    Retired(("runtime", "slurm", "poll_interval_s"), lambda _: (
        "retired: the Slurm driver polls squeue at a fixed interval of a few seconds (a session's job runs for "
        "minutes); delete it")),
    Retired(("runtime", "slurm", "max_resubmits"), lambda v: (
        "retired: runtime.max_restarts bounds how often a lost session starts again, a crashed server or (slurm) a "
        f"batch job that ended before its jobs were done: write max_restarts: {_flag(v)} under runtime, beside kind "
        "(not under runtime.slurm)")),
    # AITER's build knobs: its own environment variables, by their names
    Retired(("arms", "*", "aiter", "prebuild_kernels"), _aiter_build("PREBUILD_KERNELS")),
    Retired(("arms", "*", "aiter", "gpu_archs"), _aiter_build("GPU_ARCHS")),
    # runtime.slurm's typed sbatch fields: one list of sbatch's own options (suite.sbatch)
    Retired(("runtime", "slurm", "partition"), _sbatch("--partition")),
    Retired(("runtime", "slurm", "gpus_per_job"), _sbatch(
        "--gres", lambda v: f"--gres=gpu:{v}" if v else "",
        lambda v: f"; with gres_type TYPE: --gres=gpu:TYPE:{v}" if v else "; gpus_per_job: 0 asked for no GPU")),
    Retired(("runtime", "slurm", "gres_type"), _sbatch(
        "--gres", lambda v: f"--gres=gpu:{_flag(v)}:N", lambda _: "; N: the GPUs that gpus_per_job gave")),
    Retired(("runtime", "slurm", "cpus_per_task"), _sbatch("--cpus-per-task")),
    Retired(("runtime", "slurm", "mem"), _sbatch("--mem")),
    Retired(("runtime", "slurm", "exclusive"), _sbatch(
        "--exclusive", lambda v: "--exclusive" if v is True else "",
        lambda v: "" if v is True else "; exclusive: false is sbatch's default")),
    Retired(("runtime", "slurm", "time_limit"), _sbatch(
        "--time", note=lambda _: f"; a list without a --time asks for --time={DEFAULT_TIME}")),
    Retired(("runtime", "slurm", "extra_sbatch"), _sbatch(
        "", lambda v: ", ".join(map(str, v)) if isinstance(v, list) else _flag(v))),
    # the profile block: its point as the report names one; seed 0 and one warm-up request per concurrency slot
    *(Retired(("profile", field), _profile_point, in_block=True) for field in PROFILE_POINT),
    Retired(("profile", "seed"), _profile_seed),
    Retired(("profile", "warmup_prompts"), _profile_warmup, in_block=True),
    # the router gate's shape: the arm's model's own (its config's hidden_size and routed experts)
    Retired(("kernel", "hidden"), _gate_shape("hidden", "its hidden_size")),
    Retired(("kernel", "experts"), _gate_shape(
        "experts", "its routed experts: num_experts, num_local_experts, n_routed_experts or moe_num_experts, by "
        "family")),
    # the model block's copies of vLLM's own flags: given in serve_args, as on a `vllm serve` command line
    *(Retired((*where, field), _model_flag(flag)) for where in (("model",), ("arms", "*", "model"))
      for flag, field in MODEL_FLAGS.items()),
    # a serving point's size by time: num_prompts in seconds
    Retired(("serve", "*", "duration_s"), _point_size, in_block=True),
    # a serving point's, a latency row's and the kernel and layer blocks' copies of their bench tools' flags:
    # given in their bench_args
    *(Retired(("serve", "*", flag.field), _bench_flag(SERVE, flag, "the point's bench_args")) for flag in SERVE.flags),
    *(Retired(("latency", "*", flag.field), _bench_flag(LATENCY, flag, "the row's bench_args"))
      for flag in LATENCY.flags),
    *(Retired((block, flag.field), _bench_flag(tool, flag, f"{block}.bench_args"))
      for block, tool in (("kernel", KERNEL), ("layer", LAYER)) for flag in tool.flags),
    # the accuracy block's copies of lm-eval's settings: its own flags, given in lm_eval_args
    *(Retired(("accuracy", field), _lm_eval_flag(field)) for field in OLD_FIELDS),
)


def retired_message(loc: Sequence[Any], value: Any, block: Mapping[str, Any] | None = None) -> str | None:
    """The message for a retired field at ``loc`` (a matrix location, arm names included), given ``value``, in
    ``block`` (the mapping that held it; without one, the field alone), or None."""
    held = block if block is not None else {str(loc[-1]): value} if loc else {}
    return next((r.says(held if r.in_block else value) for r in RETIRED if r.matches(loc)), None)
