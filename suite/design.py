"""The experimental design: its knobs (`DesignFields`, top-level fields of the matrix) and what the plan makes of
them once (`Design`, by `suite.plan.design_of`), recorded in the manifest and read by the runner, the estimate, the
analysis and the report; nothing else derives it.

The unit is the **round**: one fresh server session of every serving arm (ABBA order: the arms of a round in a
fresh seeded random order, `round_order`). Servers alive at once are one idea, ``together``: 1 (one server at a
time), k (a round's servers in time windows of k, started together, their jobs alternating) or every serving
arm's server of a round at once (``together: all``: the round is one window, measured in ``blocks`` short
alternating blocks of every point, its servers optionally on a GPU group of their own). A round's blocks share one
start of its servers, so a round, never a block, is what the verdict pairs and the sequential test counts.
``blocked`` order keeps one server per arm for the whole run: a quick look, nothing paired.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from suite.matrix_blocks import MAX_REPEATS, Strict

Order = Literal["blocked", "abba"]


class DesignFields(Strict):
    """The matrix's design: top-level fields of the matrix (`suite.matrix.Matrix` holds them), owned here with
    the `Design` they make. The rules that tie them to the runtime and the verdict block are the matrix's."""

    repeats: int | Literal["auto"] = Field(1, description=(
        "rounds of every job: each serving point once per arm and round (blocked: inside its one server), each "
        "offline job (latency, kernel, layer) once per arm and round in a process of its own; 'auto': serving "
        "rounds until the verdict block's primary test decides (group-sequential), at most the last of "
        "verdict.looks, and the offline jobs in as many rounds as the first look"))
    budget_min: float | None = Field(None, gt=0, description="with repeats: auto, stop at the last look that fits")
    order: Order = Field("blocked", description=(
        "blocked: one server per arm for the whole run; abba: a fresh server per arm and round, the arms of a "
        "round in a fresh seeded random order (order_seed), the round the unit of the verdict"))
    together: int | Literal["all"] = Field(1, description=(
        "order: abba: servers alive at once. 1: one at a time; k: a round's serving arms, in its random order, "
        "in time windows of k servers started together, their jobs alternating; all: every serving arm's "
        "server of a round at once (the A/A arm's too), the round one window measured in `blocks` short "
        "alternating blocks of every point, on a GPU group of its own with runtime.gpus a list of groups"))
    blocks: int = Field(1, ge=1, le=32, description=(
        "together: all only: blocks per round (each block: every point once per arm, the arms taking turns, the "
        "points in a fresh seeded order); the verdict scores a round by the median of its blocks (in log; with "
        "two, their geometric mean): one block off its server's level hardly moves it, and blocks of a steady "
        "server cost it ~20-35 % more variance than their mean would (docs/statistics.md)"))
    aa: bool | Literal["alternate"] = Field(False, description=(
        "also run the baseline arm twice to measure the A/A noise floor (the A/A control); alternate: its "
        "sessions in every other round only (rounds 0, 2, 4, ...): half the A/A arm's server starts (a sixth of "
        "all with three arms), the control tested on the rounds it has and never pooled into a candidate's test"))
    drift_check: bool = Field(False, description="repeat the first point at the end of each session")
    order_seed: int = Field(0, ge=0, description="seed of the random orders: the arms of each abba round (a "
                            "fresh permutation per round, recorded in the manifest's plan), the turns in a window, "
                            "the points of a block")
    precompile: bool = Field(False, description=(
        "before the first server session of a stretch (a run or a --resume), start every serving arm's server "
        "once (GPU groups in runtime.gpus: once per group), wait for /health and stop it unmeasured: its compile "
        "caches are filled, so every measured session starts warm. On the H200 the two servers of a round "
        "that compiled cold sat 2-3 % apart for their whole life in 3 of 7 such rounds, never in 12 warm ones "
        "(docs/gpu-h200.md); costs one cold start of each arm"))
    quiet_s: float = Field(0, ge=0, le=600, description=(
        "no request reaches a server (in a window of servers alive together: any of the window's servers) until this many "
        "seconds after it (the window's last) answered /health; then the warm-up"))
    cooldown_s: float = Field(0, ge=0, le=3600, description=(
        "seconds with no server alive before each round after the first (GPU groups in runtime.gpus: each wave of "
        "rounds): the GPUs' temperature and clocks settle back to idle, so every round starts from the same "
        "state, not from the heat of the one before; runtimes local and docker (a Slurm run's sessions are batch "
        "jobs of their own); the estimate counts it"))

    @field_validator("order", mode="before")
    @classmethod
    def _order(cls, value: object) -> object:
        if value == "interleaved":
            raise ValueError("interleaved is retired: write order: abba with together: all (every serving "
                             "arm's server of a round at once; blocks, GPU groups and the rest unchanged)")
        return value

    @field_validator("together")
    @classmethod
    def _together(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 8:
            raise ValueError("together: 1 to 8 servers alive at once, or all")
        return value

    @field_validator("repeats")
    @classmethod
    def _repeats(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_REPEATS:
            raise ValueError(f"{value:,} is beyond the limit {MAX_REPEATS:,} (or give 'auto')" if value > 0
                             else "repeats must be >= 1 (or 'auto')")
        return value


class Design(BaseModel):
    """The experimental design of a run: the order, how many servers are alive together and whether a round's
    servers all start together, the blocks of every point a round holds, the GPU groups and their layouts, the A/A
    arm, the precompile and quiet periods, the seed of the random orders, the sequential looks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: Order | Literal["independent runs"] = "blocked"  # `suite compare` of two runs: "independent runs"
    together: int = 1  # servers alive at once: a window's sessions (every serving arm's under together: all)
    all_together: bool = False  # together: all: a round is one window, every serving arm's server started at once
    blocks: int = 1  # together: all: blocks of every point per round (a job's repeat // blocks: its round)
    sets_at_once: int = 1  # GPU groups (runtime.gpus, a list): rounds run at the same time (a wave), one per group
    gpu_groups: list[str] | None = None  # runtime.gpus as groups, in the matrix's order (an index names a cache)
    cross_groups: bool = False  # runtime.cross_groups: one round at a time, each serving arm on its own group
    precompile: bool = False  # every serving arm's server started once, unmeasured, before the first session
    aa: bool | str = False  # the A/A arm: true (every round), "alternate" (even rounds only), false
    quiet_s: float = 0  # no request until this long after the servers answered /health
    cooldown_s: float = 0  # no server alive for this long before each round (wave) after the first
    order_seed: int = 0  # seed of the random orders: the arms of a round, the turns in a window, a block's points
    looks: tuple[int, ...] = ()  # repeats: auto: the rounds after which the sequential test looks

    @model_validator(mode="before")
    @classmethod
    def _interleaved(cls, data: Any) -> Any:
        """A design recorded before ``together: all`` replaced order interleaved reads as what it was."""
        if isinstance(data, dict) and data.get("order") == "interleaved":
            data = {**data, "order": "abba", "all_together": True}
        return data

    unit: ClassVar[str] = "round"  # what the verdict pairs and the sequential test counts: one name in every design
    units: ClassVar[str] = "rounds"

    @property
    def paired(self) -> bool:
        """Each round's arms ran back to back or alive together (abba): compare them per round."""
        return self.order == "abba"

    @property
    def layouts(self) -> int:
        """GPU layouts the rounds cycle through (runtime.cross_groups: one per group, round r in layout r mod N);
        1 for every other design."""
        return len(self.gpu_groups) if self.cross_groups and self.gpu_groups and self.all_together else 1

    @property
    def words(self) -> str:
        """The design in a phrase, for the plan, the run's first lines and the report."""
        if self.order == "blocked":
            return "blocked: one server per arm for the whole run"
        if self.all_together:
            blocks = f", {self.blocks} blocks of every point" if self.blocks > 1 else ""
            return f"abba, together: all (every serving arm's server of a round started at once{blocks})"
        if self.together > 1:
            return f"abba, together: {self.together} (a round's servers in windows of {self.together})"
        return "abba: a fresh server per arm and round, the arms in a fresh random order"


def round_order(arms: list[str], r: int, seed: int = 0, stream: str = "") -> list[str]:
    """The arm order of round r under ABBA (and the order arms are put in windows with together: k): a fresh
    seeded random permutation per round. A fixed order, a rotation or mirrored pairs line up with periodic
    drift of the host (a neutral arm read changed in 10.4 % of runs at a drift period of 8 sessions under the
    rotation this replaced, 9.3 % at 6 under randomised mirrored pairs); a fresh order per round stays at
    4.3-5.6 % under linear, AR(1), random-walk and periodic drift (benchmarks/simulation/drift_order.py,
    docs/statistics.md): drift becomes noise of the round's score, never a bias of one arm. Seeded by a string
    (``random.Random`` hashes it with SHA-512: the same on every machine and Python run); ``stream`` names
    another sequence of orders (the offline rounds', a window's turns) drawn from the same seed."""
    order = list(arms)
    random.Random(f"suite-round-order:{seed}:{r}" + (f":{stream}" if stream else "")).shuffle(order)
    return order
