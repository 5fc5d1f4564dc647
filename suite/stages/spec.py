"""What the plan knows of a job kind (`KindSpec`), declared by each stage in its own ``spec.py``.

This module and every ``suite/stages/<package>/spec.py`` sit on the plan's floor (below ``suite.plan``, above
``suite.matrix`` and its blocks, ``suite.matrix_blocks`` and ``suite.matrix_jobs``): they may import the matrix and
each other, never a stage's run, read or summary modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from suite.matrix import Matrix

# Where a kind's jobs go:
# - session-start: the arm's first server session, before anything is measured (the gate-path probe);
# - each-round: every server session, once per round it holds (serving points; the drift repeat follows);
# - session-end: the arm's first server session, after its serving (correctness: greedy equivalence, GSM8K);
# - offline: one session per arm without a server (each job its own process: `vllm bench latency`, kernel,
#   layer);
# - own-session: a server session of its own per arm, after everything else (the profiler's server).
Placement = Literal["session-start", "each-round", "session-end", "offline", "own-session"]
SERVER_PLACEMENTS: tuple[Placement, ...] = ("session-start", "each-round", "session-end")


@dataclass(frozen=True)
class KindSpec:
    """What the plan knows of one job kind: a stage's ``spec.py`` declares its kinds as ``KINDS``, a tuple of
    these, and ``suite.stages.kinds`` gathers them; the plan, the store's layout and the dry-run loop over
    the result, and ``Job.kind``'s literal and ``Job.params``' union are derived from it. A params type with a
    ``hashed()`` method gives the job hash its content (``ServeParams``: knobs added later left out at their
    default); any other is hashed as its ``model_dump(mode="json")``."""

    kind: str
    params: type[BaseModel]
    placement: Placement
    points: Callable[[Matrix], list[tuple[str, BaseModel]]]  # the (point id, params) a matrix asks for, in order
    result_dir: bool = False  # the raw output is a directory (lm-eval's), not one JSON file
