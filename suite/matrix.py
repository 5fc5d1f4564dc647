"""The matrix: what to measure — one model, a runtime, the arms (baseline, patched, ...) and the points —
as one frozen pydantic model, `Matrix`, made of the blocks of :mod:`suite.matrix_blocks` and
:mod:`suite.matrix_jobs`. Its own checks are the rules that span blocks: the baseline among the arms, every point
within each model's length, the verdict's points among the serving points, the order against the runtime
(servers alive together, GPU groups, precompile, ports), no compile cache shared by two arms, what the
model flags of serve_args allow (:mod:`suite.served_model`). Nothing here reads a file or starts a process:
:func:`suite.matrix_load.load_matrix` reads one, with file:line errors.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from suite.design import DesignFields
from suite.matrix_blocks import ArmSpec, ModelSpec, RuntimeSpec, model_flags
from suite.matrix_jobs import (
    AccuracySpec,
    KernelSpec,
    LatencyPoint,
    LayerSpec,
    ProfileSpec,
    ServePoint,
    serve_point_id,
)
from suite.served_model import (
    DEFAULT_MAX_MODEL_LEN,
    HF_OVERRIDES,
    MAX_LEN,
    TOKENIZER,
    ServedModel,
    flag_name,
    flag_values,
)
from suite.server_address import PORT, ServerAddress
from suite.verdict import EXPECT_OTHERS, VerdictSpec

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# the compile caches the runtimes keep per arm (and GPU group); a matrix's env must not point two arms at one
COMPILE_CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


class Matrix(DesignFields):
    name: str = Field(description="the run's name (letters, digits, . _ -): run directories and reports are named by it")
    description: str | None = Field(None, description="what the run measures, in a sentence; the report's first paragraph")
    model: ModelSpec = Field(description="the checkpoint every arm serves (an arm may serve its own: arms.NAME.model)")
    runtime: RuntimeSpec = Field(RuntimeSpec(), description="where and how the servers start: local, docker or slurm")
    serve_args: list[str] = Field([], description=(
        "`vllm serve` flags for every arm, as on its command line, e.g. [--dtype, bfloat16, --max-model-len, \"4096\", "
        "--no-enable-prefix-caching]. The suite reads the model's from them (the last copy wins, as in vLLM): "
        "--served-model-name (the clients ask for it; default the model id), --tokenizer (the bench client's too; "
        f"default the model's), --max-model-len (every point's isl + osl must fit; without one the server gets "
        f"--max-model-len {DEFAULT_MAX_MODEL_LEN}), --load-format (dummy: random weights, no accuracy); and where "
        "the servers listen: --host (default 127.0.0.1; the clients call it) and --port (default: a free port the "
        "suite picks for each server; a fixed one only where one server is alive at a time)"))
    env: dict[str, str] = Field({}, description="environment for every arm's server (secrets redacted in every record)")
    arms: dict[str, ArmSpec] = Field(min_length=1, description="the arms by name: the baseline and each candidate, each a vLLM release and its patch sets")
    baseline: str | None = Field(None, description="the reference arm; default: the first arm")
    serve: list[ServePoint] = Field([], description="serving points: `vllm bench serve` per ISL / OSL / concurrency, every round")
    latency: list[LatencyPoint] = Field([], description="`vllm bench latency` rows (offline, an engine per process)")
    verdict: VerdictSpec | None = Field(None, description="the primary test, declared before the run")
    accuracy: AccuracySpec | None = Field(None, description="lm-eval GSM8K and greedy equivalence against each live server")
    kernel: KernelSpec | None = Field(None, description="the isolated router-gate GEMM per M (a process per arm and round)")
    layer: LayerSpec | None = Field(None, description="the model's own decoder layer per T tokens (µs per layer)")
    profile: ProfileSpec | None = Field(None, description="a torch-profiler window at one point: the gate's kernels and their share")
    probe: bool = Field(False, description="record which router-gate path ran per batch-size bucket")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ARM_NAME.match(value):
            raise ValueError("name may hold letters, digits, '.', '_' and '-' only")
        return value

    @field_validator("serve_args")
    @classmethod
    def _serve_args(cls, value: list[str]) -> list[str]:
        return model_flags(value)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, value: dict[str, ArmSpec]) -> dict[str, ArmSpec]:
        for name in value:
            if not ARM_NAME.match(name):
                raise ValueError(f"arm name {name!r} may hold letters, digits, '.', '_' and '-' only")
        return value

    @model_validator(mode="after")
    def _check(self) -> Matrix:
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(f"baseline {self.baseline!r} is not one of the arms {sorted(self.arms)}")
        if not self.arms[self.baseline_arm].serving:
            raise ValueError(f"the baseline arm {self.baseline_arm!r} must serve (serving: false is for candidates)")
        for name, arm in self.arms.items():
            length = self.model_of(arm).max_model_len
            place = self.flag_place(name, MAX_LEN)
            limit = (f"{MAX_LEN} {length} in {place}" if place else
                     f"the default {MAX_LEN} {length} (give a longer one in serve_args)")
            for i, point in enumerate(self.serve):
                if point.isl + point.osl > length:
                    raise ValueError(f"serve[{i}]: isl + osl = {point.isl + point.osl} exceeds {limit}")
            for i, point in enumerate(self.latency):
                if point.input_len + point.output_len > length:
                    raise ValueError(f"latency[{i}]: input_len + output_len exceeds {limit}")
        if self.verdict is not None and (self.verdict.points is not None or self.verdict.expect is not None):
            ids = [serve_point_id(b.isl, b.osl, c, b.prompts_for(c), b.duration_s) for b in self.serve
                   for c in b.concurrency]
            for field, named in (("points", self.verdict.points or ()),
                                 ("expect", [p for p in self.verdict.expect or {} if p != EXPECT_OTHERS])):
                if unknown := [p for p in named if p not in ids]:
                    raise ValueError(f"verdict.{field}: {unknown} are not serving points of this matrix; its points: "
                                     f"{', '.join(dict.fromkeys(ids)) or '(none)'}")
        if not (self.serve or self.latency or self.accuracy or self.kernel or self.layer or self.profile):
            raise ValueError("nothing to measure: give serve, latency, accuracy, kernel, layer or profile")

        if self.repeats == "auto":
            if self.order == "blocked":
                raise ValueError("repeats: auto needs order: abba (rounds are the unit of the sequential test)")
            if self.verdict is None:
                object.__setattr__(self, "verdict", VerdictSpec())
        elif self.budget_min is not None:
            raise ValueError("budget_min goes with repeats: auto")
        if self.aa == "alternate" and self.verdict is not None and self.verdict.pool_aa:
            raise ValueError("aa: alternate measures the A/A arm in every other round only, so its rounds cannot "
                             "be pooled into a candidate's test (verdict.pool_aa): use aa: true, or pool_aa: false")
        self._check_together()
        for knob, value in (("precompile", self.precompile), ("cooldown_s", self.cooldown_s)):
            if value and self.runtime.kind == "slurm":
                raise ValueError(f"{knob}: the slurm runtime starts each session in a batch job of its own, with no "
                                 f"server before it and no round after another in this process; leave {knob} out")
        for name, arm in self.arms.items():
            if arm.vllm_from is not None and self.runtime.kind != "docker":
                kind = "wheel" if arm.vllm_from.wheel is not None else "git"
                raise ValueError(f"arms.{name}.vllm: a vLLM from a {kind} is built into the arm's image, so it "
                                 f"needs runtime.kind: docker (the {self.runtime.kind} runtime runs an installed "
                                 "vLLM)")
        vendor = self.runtime.hosts_vendor
        for name, arm in self.arms.items():
            if arm.aiter is not None and (self.runtime.kind != "docker" or vendor != "rocm"):
                where = (f"the {self.runtime.kind} runtime" if self.runtime.kind != "docker" else
                         f"runtime.vendor is {vendor}")
                raise ValueError(f"arms.{name}.aiter: an arm's own AITER and tuned CSVs are built into its ROCm "
                                 f"image, so they need runtime.kind: docker with runtime.vendor: rocm ({where})")
        self._check_shared_compile_caches()
        return self

    def _check_together(self) -> None:
        """Servers alive at once (together) against the order, the runtime and its ports; blocks and GPU groups
        need every serving arm's server of a round together."""
        if self.blocks > 1 and not self.all_together:
            raise ValueError(f"blocks: {self.blocks} goes with together: all (blocks inside one round of every "
                             "serving arm's server alive at once)")
        if self.together != 1:
            if self.order != "abba":
                raise ValueError(f"together: {self.together} needs order: abba (a window holds servers of one "
                                 "round)")
            if self.runtime.kind == "slurm":
                raise ValueError(f"together: {self.together}: the slurm runtime runs one session per batch job; "
                                 "use the local or docker runtime")
        if self.all_together:
            self._check_gpu_groups()
        elif self.runtime.gpu_groups is not None:
            raise ValueError("runtime.gpus: a list of GPU groups runs rounds at once, each on its group, only with "
                             "together: all; for every server on the same GPUs write one string, e.g. gpus: "
                             f"\"{','.join(self.runtime.gpu_groups)}\"")
        if self.runtime.cross_groups and self.runtime.gpu_groups is None:
            raise ValueError("runtime.cross_groups: crosses the serving arms over GPU groups: give runtime.gpus as a "
                             "list of one group per serving arm, e.g. gpus: [\"0\", \"1\"]")
        self._check_fixed_ports()

    def _check_fixed_ports(self) -> None:
        """A fixed --port only where one server is alive at a time: servers alive together (together, the rounds
        of GPU groups at once) cannot share it."""
        alive = self.servers_at_once
        if alive < 2:
            return
        why = (f"together: {self.together}" if self.sets_at_once == 1 else
               f"together: {self.together}, {self.sets_at_once} rounds at once on runtime.gpus' groups")
        for name, arm in self.arms.items():
            address = self.address_of(arm)
            if address.fixed:
                raise ValueError(f"{self.flag_place(name, PORT)}: {PORT} {address.port}: up to {alive} servers are "
                                 f"alive at once ({why}) and cannot share one port: leave {PORT} out (the suite "
                                 "picks a free port for each server)")

    @property
    def servers_at_once(self) -> int:
        """The most servers alive at one time: a window's (together: k; together: all: every serving arm's, the A/A
        arm's too) in each of the rounds run at once (GPU groups)."""
        window = 1 if self.together == 1 else self.serving_arms if self.all_together else min(
            int(self.together), self.serving_arms)
        return window * self.sets_at_once

    @property
    def serving_arms(self) -> int:
        """Servers of one round: the serving arms and the A/A arm."""
        return sum(a.serving for a in self.arms.values()) + bool(self.aa)

    @property
    def all_together(self) -> bool:
        """Every serving arm's server of a round alive at once: together: all, or a k that holds them all."""
        return self.order == "abba" and (self.together == "all" or
                                         (self.together > 1 and self.together >= self.serving_arms))

    def _check_shared_compile_caches(self) -> None:
        """Arms whose `env:` (the matrix's, then the arm's) points a compile cache at one directory: vLLM 0.26.0
        keys its AOT-compiled graph without the arm's patch (every server of the 2026-12-05 H100 run, stock and
        patched, used one key: docs/gpu-h200.md), so a shared cache can serve one arm the other's graph. Left
        unset, the runtimes give every arm (and GPU group) a cache of its own."""
        for var in COMPILE_CACHE_VARS:
            holders: dict[str, list[str]] = {}
            for name, arm in self.arms.items():
                if (value := {**self.env, **arm.env}.get(var)) is not None:
                    holders.setdefault(value, []).append(name)
            for value, names in holders.items():
                if len(names) > 1:  # named where the second arm got it: its own env, else the matrix's
                    where = f"arms.{names[1]}.env" if var in self.arms[names[1]].env else "env"
                    raise ValueError(
                        f"{where}: {var}={value} is shared by arms {', '.join(names)}: a compile cache shared by "
                        "arms of different code can serve one arm another's compiled graph (vLLM keys its AOT "
                        f"artifact without the patch: docs/gpu-h200.md); leave {var} unset (every arm gets a cache "
                        "of its own) or give each arm its own under arms.<name>.env")

    def _check_gpu_groups(self) -> None:
        """Rounds at once on groups of GPUs (runtime.gpus, a list): a sequential design's looks fall at the end of
        a wave (every group's set done); crossed, one group per serving arm."""
        groups = self.runtime.gpu_groups
        if groups is None:
            return
        n_serving = sum(a.serving for a in self.arms.values()) + bool(self.aa)
        if self.runtime.cross_groups and len(groups) != n_serving:
            raise ValueError(f"runtime.cross_groups: each of the {n_serving} serving arms (the A/A arm included) "
                             f"needs a GPU group of its own in every round: give {n_serving} groups, not "
                             f"{len(groups)}")
        n = len(groups)
        if self.runtime.cross_groups and self.repeats != "auto" and self.repeats % n:
            raise ValueError(f"runtime.cross_groups: the arms cross over the {n} groups every {n} rounds: "
                             f"repeats must be a multiple of {n} (not {self.repeats})")
        if self.repeats == "auto":
            assert self.verdict is not None and self.verdict.looks is not None
            if self.runtime.cross_groups and self.verdict.looks[0] < 2 * n:
                raise ValueError(f"runtime.cross_groups: the test takes the {n} GPU layouts' difference out, which "
                                 f"leaves no degree of freedom after {n} sets: the first look must come after "
                                 f"{2 * n} sets or more (verdict.looks, e.g. [{2 * n}, {3 * n}])")
            off = [k for k in self.verdict.looks if k % n]
            if off:
                why = (f"the arms cross over the {n} groups every {n} rounds, so a look comes only after whole "
                       "crossings (a GPU's own speed then cancels)" if self.runtime.cross_groups else
                       f"{n} groups run {n} rounds at a time, so a look can come only after a whole wave")
                raise ValueError(f"runtime.gpus: {why}: verdict.looks must be multiples of {n} (not "
                                 f"{', '.join(map(str, dict.fromkeys(off)))}), e.g. [{2 * n}, {3 * n}]")

    @property
    def sets_at_once(self) -> int:
        """Rounds run at the same time: one per GPU group (runtime.gpus, a list), else one (and one under
        runtime.cross_groups, whose every set holds all the groups)."""
        return len(self.runtime.gpu_groups) if self.runtime.gpu_groups and not self.runtime.cross_groups else 1

    @model_validator(mode="after")
    def _model_flags(self) -> Matrix:
        """What the model flags of serve_args must say: a generated model serves dummy weights with the
        generator's own --hf-overrides, an arm's own model is not read with the matrix model's tokenizer, and
        dummy weights claim no accuracy."""
        for name, arm in self.arms.items():
            model = self.model_of(arm)
            where = "model" if arm.model is None else f"arms.{name}.model"
            if model.generate is not None:
                if not model.dummy:
                    raise ValueError(f"{where}.generate: {model.generate} writes a config and a tokenizer, no "
                                     "weights: every arm that serves it needs [--load-format, dummy] in serve_args "
                                     f"(arm {name} has --load-format {model.load_format})")
                for place, args in (("serve_args", self.serve_args), (f"arms.{name}.serve_args", arm.serve_args)):
                    if any((flag_name(t) or "").split(".")[0] == HF_OVERRIDES for t in args):
                        raise ValueError(f"{place}: {HF_OVERRIDES} is set by the generator: {where}.generate: "
                                         f"{model.generate} passes its own {HF_OVERRIDES} "
                                         "(suite.fixtures.gemma4.HF_OVERRIDES); remove it from serve_args")
            if arm.model is not None and self.flag_place(name, TOKENIZER) == "serve_args":
                raise ValueError(f"{where}: the matrix's serve_args give {TOKENIZER} {model.tokenizer} (the matrix "
                                 f"model's), which would read this arm's own model with it: give the arm's own in "
                                 f"arms.{name}.serve_args (the same one again where it is the same tokenizer)")
        if self.accuracy is not None:
            for name, arm in self.arms.items():
                if arm.serving and self.model_of(arm).dummy:
                    raise ValueError(f"accuracy: arm {name} serves random weights (--load-format dummy), so an "
                                     "accuracy score would say nothing about the model: remove accuracy: (or serve "
                                     "real weights)")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline or next(iter(self.arms))

    def model_of(self, arm: ArmSpec | None = None) -> ServedModel:
        """The model an arm serves, as its server serves it: its own model block or the matrix's, with the model
        flags of the matrix's serve_args, then the arm's (suite.served_model). Without an arm: the matrix's
        model with the matrix's serve_args."""
        spec = arm.model if arm is not None and arm.model is not None else self.model
        return ServedModel.resolve(spec.id, [*self.serve_args, *(arm.serve_args if arm is not None else [])],
                                   generate=spec.generate)

    def address_of(self, arm: ArmSpec | None = None) -> ServerAddress:
        """Where an arm's server listens and its clients call it: the --host and --port of the matrix's serve_args,
        then the arm's (suite.server_address), or the defaults. Without an arm: the matrix's serve_args."""
        return ServerAddress.resolve([*self.serve_args, *(arm.serve_args if arm is not None else [])])

    def models_by_arm(self) -> dict[str, ServedModel]:
        """The model each arm of the matrix serves, by arm (the A/A arm serves the baseline's)."""
        return {name: self.model_of(arm) for name, arm in self.arms.items()}

    def flag_place(self, arm: str, flag: str) -> str | None:
        """Where the value of a flag the suite reads (a model flag, the address) that an arm's server gets comes from: ``arms.NAME.serve_args``,
        ``serve_args`` (the matrix's), or None (the suite's default)."""
        if flag_values(self.arms[arm].serve_args, flag) is not None:
            return f"arms.{arm}.serve_args"
        return "serve_args" if flag_values(self.serve_args, flag) is not None else None

    @property
    def rounds(self) -> int:
        """Rounds planned: the fixed repeats, or the sequential design's maximum."""
        if self.repeats == "auto":
            assert self.verdict is not None
            return self.verdict.max_rounds
        return self.repeats

    @property
    def sequential(self) -> bool:
        return self.repeats == "auto"


# The docker runtime (suite/runtime/docker/) imports these from here; its files are being reworked elsewhere, and
# its imports move to suite.matrix_blocks after that.
from suite.matrix_blocks import GPU_LIST, LOCAL_PREFIXES, DockerSpec, VllmSource, file_sha256  # noqa: E402, F401
