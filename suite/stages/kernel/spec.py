"""The kernel kind: the router-gate microbenchmark, one job per arm, offline.

The matrix's ``kernel:`` block (`suite.matrix_jobs.KernelSpec`) gives the rows and the bench's own flags; a job
carries them as the plan resolved them (`KernelParams`), which is also what its record stores.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from suite.matrix import Matrix
from suite.stages.spec import KindSpec

POINT = "gate"  # the one point: the gate of the arm's model (runs before the shape came from it: h<hidden>-e<experts>)


class KernelParams(BaseModel):
    """A kernel job: the rows (M) and the bench's flags as values (``iters``: ``--calls``), the fields the matrix's
    block had, so records written from it load as they are and job hashes hold. The gate's shape is no param: the
    bench reads it from the arm's model's config where the job runs. ``hidden`` and ``experts`` are read back from
    a job recorded while the matrix gave the shape (the bench's result says the same), and never planned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    m: list[int]
    trace_m: int
    iters: int
    trials: int
    hidden: int | None = Field(None, gt=0)
    experts: int | None = Field(None, gt=0)

    def hashed(self) -> dict[str, Any]:
        """What the job's hash covers: the block's fields (a recorded shape, when there is one, as it was)."""
        return self.model_dump(mode="json", exclude_none=True)


def kernel_points(matrix: Matrix) -> list[tuple[str, KernelParams]]:
    spec = matrix.kernel
    if spec is None:
        return []
    flags = spec.flags
    return [(POINT, KernelParams(m=spec.m, trace_m=flags.trace_m, iters=flags.iters, trials=flags.trials))]


KINDS = (KindSpec("kernel", KernelParams, "offline", kernel_points),)
