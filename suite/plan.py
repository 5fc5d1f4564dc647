"""Expand a matrix into an ordered plan: sessions (one server lifetime of one arm) holding jobs.

Pure: no I/O, no processes. ``format_plan`` prints it for ``suite run --dry-run``.

The design (`suite.design.Design`: the order, servers alive together, blocks, GPU groups, the A/A arm) is made
once from the matrix; the plan lays the sessions out by it:
- ``blocked``: one server per arm; inside it, round r runs every point before round r+1.
- ``abba``: every round is a fresh server per serving arm, the arms of each round in a fresh random order drawn
  from ``order_seed`` (``round_order``), so drift of the machine over time falls on the arms at random: it
  widens the round scores' spread, never biases one arm.
- ``abba`` with ``together: k`` (k > 1): each round's serving arms, in the same random order, are cut into time
  windows of k sessions. The servers of a window are alive at once (started together, their jobs alternating,
  ``suite.sessions.run_window``), so whatever drifts on the host within a window drifts for all its arms alike;
  which arms share a window changes at random from round to round.
- ``together: all``: every serving arm's server of a round alive at once, the round one window; in it ``blocks``
  blocks, each every point once per arm in a fresh seeded order (job repeat = the block's index over the run), the
  arms taking turns job by job. Sessions carry their round (``Session.round``), so blocks sharing one server start
  never count as independent rounds.
Offline jobs (latency, kernel, layer) run after the server sessions, one session per arm and round (``repeats``;
under ``repeats: auto`` as many rounds as the first look), each round's arms in a fresh random order of their
own, so their tables compare arms across processes (engine starts), the unit that varies from start to start.
The A/A mode adds an arm ``<baseline>.aa`` that is the baseline again (``aa: alternate``: in even rounds only); the
drift check repeats the first serve point at the end of every session.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, model_validator

from suite.design import Design, round_order
from suite.matrix import Matrix
from suite.matrix_blocks import ArmSpec
from suite.served_model import MODEL_FLAGS, SERVED, TOKENIZER, ServedModel, without_flags
from suite.server_address import without_address
from suite.stages.kinds import KINDS
from suite.stages.spec import SERVER_PLACEMENTS, Placement

AA_SUFFIX = ".aa"


# What the plan knows of each job kind (its params type, placement, points and result layout) is declared by its
# stage, in the stage's own ``spec.py``, and gathered in job order by ``suite.stages.kinds``.
PARAMS: dict[str, type[BaseModel]] = {kind: spec.params for kind, spec in KINDS.items()}
# Derived from KINDS, so a new kind is written down once: the kinds a Job takes, and the params types (each
# once, in KINDS order; a kind's own type is enforced by Job._params_match_kind).
JobKind = Literal[tuple(KINDS)]  # type: ignore[valid-type]
JobParams = Union[tuple(dict.fromkeys(PARAMS.values()))]  # type: ignore[valid-type]  # noqa: UP007 (built, not written)


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: JobKind
    arm: str
    session: int
    point: str
    repeat: int = 0  # the round (ABBA); a blocked session's repeat inside its one server
    tag: str = ""
    params: JobParams
    hash: str

    @model_validator(mode="before")
    @classmethod
    def _params_of_kind(cls, data: Any) -> Any:
        """Params given as a mapping (a record read back, a test), or none, become the kind's own type."""
        if isinstance(data, dict) and isinstance(data.get("params", {}), dict) and data.get("kind") in PARAMS:
            data = {**data, "params": PARAMS[data["kind"]].model_validate(data.get("params", {}))}
        return data

    @model_validator(mode="after")
    def _params_match_kind(self) -> Job:
        want = PARAMS[self.kind]
        if type(self.params) is not want:
            raise ValueError(f"a {self.kind} job takes {want.__name__}, not {type(self.params).__name__}")
        return self

    @property
    def key(self) -> str:
        """Path-safe id of the job inside its arm: ``serve/isl128-osl32-c4-n12/rep-0``."""
        suffix = f"-{self.tag}" if self.tag else ""
        return f"{self.kind}/{self.point}/rep-{self.repeat}{suffix}"


class Session(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str
    index: int
    needs_server: bool
    jobs: list[Job]
    window: int | None = None  # sessions of one window run side by side (their servers alive at once)
    round: int | None = None  # together: all: the round (its jobs' repeats are its blocks); else derived
    gpus: str | None = None  # GPU groups (runtime.gpus): the GPUs this session's server sees (its round's group;
    # under runtime.cross_groups the arm's group in this set)


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    matrix: str
    design: Design
    arms: dict[str, ArmSpec]
    baseline: str
    sessions: list[Session]

    @property
    def jobs(self) -> list[Job]:
        return [j for s in self.sessions for j in s.jobs]

    @property
    def order(self) -> str:
        return self.design.order

    def wave_of(self, rnd: int) -> int:
        """The wave a round runs in: the rounds that run at the same time, one per GPU group."""
        return rnd // self.design.sets_at_once

    def wave_of_session(self, session: Session) -> int | None:
        """A round's wave under GPU groups (runtime.gpus); None without groups or for a session of no set."""
        return None if self.design.sets_at_once == 1 or session.round is None else self.wave_of(session.round)

    def group_of_session(self, session: Session) -> int | None:
        """The index of the GPU group a session's server runs on (runtime.gpus' groups; it names the arm's compile
        cache there); None without groups."""
        groups = self.design.gpu_groups
        return None if not groups or session.gpus is None else groups.index(session.gpus)

    def group_of(self, job: Job) -> int | None:
        """The GPU group of the server a job runs against; None without groups, and for an offline job (no
        server)."""
        if not self.design.gpu_groups or KINDS[job.kind].placement == "offline":
            return None
        return self.group_of_session(next(s for s in self.sessions if s.arm == job.arm and s.index == job.session))

    def lane_of(self, job: Job) -> int | None:
        """The lane (thread) a job's round runs in when sets run at once, one per GPU group: each lane has
        its own bench client. None: the run's one client (no groups, one round at a time, an offline job)."""
        if self.design.sets_at_once == 1 or KINDS[job.kind].placement == "offline":
            return None
        return self.round_of(job) % self.design.sets_at_once

    def round_of(self, job: Job) -> int:
        """The round a job belongs to: under together: all its round (its repeat is the block), else its repeat."""
        return job.repeat // self.design.blocks


def effective_arms(matrix: Matrix) -> dict[str, ArmSpec]:
    arms = dict(matrix.arms)
    if matrix.aa:
        base = matrix.baseline_arm
        arms = {base: arms[base], base + AA_SUFFIX: arms[base], **{k: v for k, v in arms.items() if k != base}}
    return arms


def _model_block(model: ServedModel) -> dict[str, Any]:
    """A model as the matrix's model block dumped it while it held its own copies of vLLM's model flags (the
    ones serve_args do not give as None, load_format only when not auto): a matrix written before they moved
    to serve_args and one written after plan the same job hashes, so a run resumes across the change."""
    block: dict[str, Any] = {"id": model.id, "max_model_len": model.max_model_len,
                             "served_name": model.served_name if SERVED in model.given else None,
                             "tokenizer": model.tokenizer if TOKENIZER in model.given else None}
    if model.load_format != "auto":
        block["load_format"] = model.load_format
    if model.generate is not None:
        block["generate"] = model.generate
    return block


def _hash(matrix: Matrix, arm: ArmSpec, kind: str, params: JobParams) -> str:
    flags = list(MODEL_FLAGS)
    dumped = arm.model_dump(mode="json")
    # where the servers listen is no part of what a job measures (it was runtime.host and runtime.port, unhashed)
    dumped["serve_args"] = without_address(arm.serve_args)
    if arm.aiter is not None:  # AITER's build variables hash as they did while they were fields of their own
        dumped["aiter"] = arm.aiter.hashed()
    if arm.model is not None:  # its model flags hash with its model, as they were its model block's
        dumped.update(model=_model_block(matrix.model_of(arm)), serve_args=without_flags(dumped["serve_args"], flags))
    content = {
        "model": _model_block(matrix.model_of()),
        "serve_args": without_flags(without_address(matrix.serve_args), flags),
        "env": matrix.env,
        "arm": dumped,
        "kind": kind,
        "params": params.hashed() if hasattr(params, "hashed") else params.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def _job(matrix: Matrix, arms: dict[str, ArmSpec], kind: str, arm: str, session: int, point: str,
         params: JobParams, repeat: int = 0, tag: str = "") -> Job:
    return Job(kind=kind, arm=arm, session=session, point=point, repeat=repeat, tag=tag, params=params,
               hash=_hash(matrix, arms[arm], kind, params))


def each_round(kind: str) -> bool:
    """Whether jobs of ``kind`` repeat in every round (the serving points), not once a run (correctness, the
    probe) or in offline rounds of their own."""
    return KINDS[kind].placement == "each-round"


def _asked(matrix: Matrix, placement: Placement) -> list[tuple[str, str, BaseModel]]:
    """(kind, point id, params) of every job the matrix asks for at a placement, in KINDS order."""
    return [(kind, pid, params) for kind, spec in KINDS.items() if spec.placement == placement
            for pid, params in spec.points(matrix)]


def _server_jobs(matrix: Matrix, design: Design, arms: dict[str, ArmSpec], arm: str, session: int,
                 repeats: Sequence[int], first_session: bool) -> list[Job]:
    def jobs(placement: Placement, repeat: int = 0, tag: str = "") -> list[Job]:
        if placement == "each-round" and not arms[arm].serving:
            return []
        if placement != "each-round" and not first_session:
            return []
        return [_job(matrix, arms, kind, arm, session, pid, params, repeat=repeat, tag=tag)
                for kind, pid, params in _asked(matrix, placement)]

    measured = [j for r in repeats for j in block_order(jobs("each-round", r), design, r)]
    first = measured[:1]  # the drift repeat: the session's first measured point again, at its end
    drift = [j.model_copy(update={"tag": "drift"}) for j in first] if matrix.drift_check else []
    return [*jobs("session-start"), *measured, *drift, *jobs("session-end")]


def block_order(jobs: list[Job], design: Design, block: int) -> list[Job]:
    """The order of one block's points under ``together: all``: a fresh seeded random order per block, the same for
    every arm (the arms take turns job by job, so each turn measures one point on every arm). A fixed order puts
    each point at the same place in every block, so whatever that place does falls on one point always: on the
    2-core box a server that sat idle while the other arms measured served its first ~0.6 s at half speed, and
    concurrency 1, first in every block, read ~20 % slower in every block but the first (which followed the
    warm-up). Other designs keep the matrix's."""
    if not design.all_together or len(jobs) < 2:
        return jobs
    keys = round_order([j.key for j in jobs], block, design.order_seed, "points")
    by_key = {j.key: j for j in jobs}
    return [by_key[k] for k in keys]


def in_round(matrix: Matrix, arm: str, r: int) -> bool:
    """Whether an arm of the plan is measured in round r: every arm is, but the A/A arm of ``aa: alternate``
    only in even rounds (0, 2, 4, ...)."""
    return not (matrix.aa == "alternate" and arm == matrix.baseline_arm + AA_SUFFIX and r % 2 == 1)


def build_plan(matrix: Matrix) -> Plan:
    design = design_of(matrix)
    arms = effective_arms(matrix)
    names = list(arms)
    serving = [a for a in names if arms[a].serving]
    has_server_work = any(_asked(matrix, p) for p in SERVER_PLACEMENTS)
    sessions: list[Session] = []
    counters = dict.fromkeys(names, 0)

    def add(arm: str, jobs: list[Job], needs_server: bool, window: int | None = None,
            rnd: int | None = None, gpus: str | None = None) -> None:
        if jobs:
            sessions.append(Session(arm=arm, index=counters[arm], needs_server=needs_server, jobs=jobs,
                                    window=window, round=rnd, gpus=gpus))
            counters[arm] += 1

    def server_jobs(arm: str, repeats: Sequence[int], first: bool) -> list[Job]:
        return _server_jobs(matrix, design, arms, arm, counters[arm], repeats, first)

    if has_server_work and design.order == "blocked":
        for arm in names:
            add(arm, server_jobs(arm, [r for r in range(matrix.rounds) if in_round(matrix, arm, r)], True), True)
    elif has_server_work:  # abba: a fresh server per serving arm and round, the arms in a fresh random order
        groups = design.gpu_groups
        for arm in names:  # a correctness-only arm: its first session only, first, on its own (the first group)
            if not arms[arm].serving:
                add(arm, server_jobs(arm, range(0, 1), True), True, gpus=groups[0] if groups else None)
        windows = 0
        for r in range(matrix.rounds):
            order = [a for a in round_order(serving, r, design.order_seed) if in_round(matrix, a, r)]
            if design.all_together:  # the round one window, its blocks inside it
                b = design.blocks
                for arm in order:
                    add(arm, server_jobs(arm, range(r * b, (r + 1) * b), r == 0), True, window=r, rnd=r,
                        gpus=set_gpus(design, serving, arm, r))
                continue
            for w in range(0, len(order), design.together):  # windows of `together` servers (1: one at a time)
                for arm in order[w:w + design.together]:
                    add(arm, server_jobs(arm, range(r, r + 1), r == 0), True,
                        window=windows if design.together > 1 else None)
                windows += 1
    offline = _asked(matrix, "offline")
    rounds = offline_rounds(matrix)
    for r in range(rounds):  # one round: one session per arm, all arms; a random order from 2 rounds on
        for arm in (names if rounds == 1 else round_order(names, r, design.order_seed, "offline")):
            add(arm, [_job(matrix, arms, kind, arm, counters[arm], pid, params, repeat=r)
                      for kind, pid, params in offline], False)
    for kind, pid, params in _asked(matrix, "own-session"):
        for arm in names:
            add(arm, [_job(matrix, arms, kind, arm, counters[arm], pid, params)], True)
    return Plan(matrix=matrix.name, design=design, arms=arms, baseline=matrix.baseline_arm, sessions=sessions)


def design_of(matrix: Matrix) -> Design:
    """The matrix's design, made once (`build_plan`): the unit, servers alive together, blocks, GPU groups and
    layouts, the A/A arm, the precompile, quiet and cooldown periods, the seed, the looks."""
    everyone = matrix.all_together
    looks = tuple(matrix.verdict.looks) if matrix.repeats == "auto" and matrix.verdict is not None else ()
    groups = matrix.runtime.gpu_groups
    return Design(order=matrix.order, together=matrix.serving_arms if everyone else int(matrix.together),
                  all_together=everyone, blocks=matrix.blocks if everyone else 1,
                  sets_at_once=len(groups) if groups and not matrix.runtime.cross_groups else 1,
                  gpu_groups=groups, cross_groups=matrix.runtime.cross_groups, precompile=matrix.precompile,
                  aa=matrix.aa, quiet_s=matrix.quiet_s, cooldown_s=matrix.cooldown_s, order_seed=matrix.order_seed,
                  looks=looks)


def offline_rounds(matrix: Matrix) -> int:
    """Rounds of the offline jobs: ``repeats``, or under ``repeats: auto`` the first look's count (the rounds
    every sequential run has)."""
    if matrix.repeats == "auto":
        assert matrix.verdict is not None and matrix.verdict.looks
        return matrix.verdict.looks[0]
    return matrix.repeats


def set_gpus(design: Design, serving: list[str], arm: str, r: int) -> str | None:
    """The GPUs of an arm's server in round r (GPU groups: runtime.gpus): the round's group (set r on group r mod
    N); under runtime.cross_groups the i-th serving arm's own, group (i + r) mod N, so that over N sets every arm
    has been on every group once."""
    groups = design.gpu_groups
    if not groups:
        return None
    return groups[(serving.index(arm) + r) % len(groups)] if design.cross_groups else groups[r % len(groups)]


def session_round(session: Session) -> int | None:
    """The round a server session belongs to: its own (together: all), else its serve jobs'
    repeat (ABBA); None for offline sessions."""
    if session.round is not None:
        return session.round
    rounds = {j.repeat for j in session.jobs if j.kind == "serve"}
    return min(rounds) if rounds else None


def format_plan(plan: Plan) -> str:
    lines = [f"plan for {plan.matrix}: {len(plan.sessions)} sessions, {len(plan.jobs)} jobs, order {plan.order}",
             f"  design: {plan.design.words}"]
    if plan.design.cooldown_s:
        lines.append(f"  cooldown: {plan.design.cooldown_s:g} s with no server alive before each round after the first"
                     + (" (each wave)" if plan.design.sets_at_once > 1 else ""))
    if plan.design.precompile:
        lines.append("  precompile: every serving arm's server started once (per GPU group) before the first session "
                     "of a stretch, stopped unmeasured" + ("; crossed groups: one round's layout at a time"
                                                           if plan.design.cross_groups else ""))
    for arm, spec in plan.arms.items():
        patches = ", ".join(("-" if p.reverse else "") + p.name for p in spec.patches) or "none"
        lines.append(f"  arm {arm}: vLLM {spec.vllm}; patches: {patches}")
    for s in plan.sessions:
        what = "server" if s.needs_server else "offline"
        window = f", window {s.window}" if s.window is not None else ""
        if s.round is not None and plan.design.blocks > 1:
            window += (f", round {s.round}: {plan.design.blocks} blocks, rep-{s.round * plan.design.blocks} to "
                           f"rep-{(s.round + 1) * plan.design.blocks - 1}")
        if s.gpus is not None:
            window += (f", on GPUs {s.gpus}" if plan.design.sets_at_once == 1 else
                       f", wave {plan.wave_of(s.round or 0)} on GPUs {s.gpus}")
        lines.append(f"  session {s.arm}#{s.index} ({what}, {len(s.jobs)} jobs{window})")
        for j in s.jobs:
            lines.append(f"    {j.key}")
    return "\n".join(lines)
