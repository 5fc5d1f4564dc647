"""Matrix fields that were retired, and what an old matrix should write instead.

A retired field is refused like any unknown field, but its error names the field that replaced it and, where
the old value says it, the exact line to write (``repeats: 3`` for ``offline_repeats: 3``). Each entry is a
path pattern (``*`` stands for any arm name) and a message made from the value the matrix gave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from suite.sbatch import DEFAULT_TIME
from suite.served_model import MODEL_FLAGS


@dataclass(frozen=True)
class Retired:
    path: tuple[str, ...]  # where the field sat; "*": any key there (an arm's name)
    says: Callable[[Any], str]  # the message, from the value the old matrix gave

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
                f"[{flag}, {_flag(value)}]")
    return says


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


def _gate_shape(field: str, key: str) -> Callable[[Any], str]:
    def says(value: Any) -> str:
        return (f"retired: the gate's shape now comes from each arm's model's config ({key}), read where the job "
                f"runs: delete {field}: {_flag(value)} from kernel. Where {_flag(value)} is not the model's own, the "
                "kernel table now times the model's gate instead (`python -m suite.stages.kernel.bench --hidden H "
                "--experts E` times any other shape by hand)")
    return says


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
    # the router gate's shape: the arm's model's own (its config's hidden_size and routed experts)
    Retired(("kernel", "hidden"), _gate_shape("hidden", "its hidden_size")),
    Retired(("kernel", "experts"), _gate_shape(
        "experts", "its routed experts: num_experts, num_local_experts, n_routed_experts or moe_num_experts, by "
        "family")),
    # the model block's copies of vLLM's own flags: given in serve_args, as on a `vllm serve` command line
    *(Retired((*where, field), _model_flag(flag)) for where in (("model",), ("arms", "*", "model"))
      for flag, field in MODEL_FLAGS.items()),
)


def retired_message(loc: Sequence[Any], value: Any) -> str | None:
    """The message for a retired field at ``loc`` (a matrix location, arm names included), or None."""
    return next((r.says(value) for r in RETIRED if r.matches(loc)), None)
