"""The kernel kind: the router-gate microbenchmark, one job per arm, offline."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from suite.matrix import Matrix
from suite.matrix_jobs import KernelSpec
from suite.stages.spec import KindSpec

POINT = "gate"  # the one point: the gate of the arm's model (runs before the shape came from it: h<hidden>-e<experts>)


class KernelParams(KernelSpec):
    """A kernel job: the matrix's kernel block. The gate's shape is no param: the bench reads it from the arm's
    model's config where the job runs. ``hidden`` and ``experts`` are read back from a job recorded while the
    matrix gave the shape (the bench's result says the same), and never planned."""

    hidden: int | None = Field(None, gt=0)
    experts: int | None = Field(None, gt=0)

    def hashed(self) -> dict[str, Any]:
        """What the job's hash covers: the block's fields (a recorded shape, when there is one, as it was)."""
        return self.model_dump(mode="json", exclude_none=True)


def kernel_points(matrix: Matrix) -> list[tuple[str, KernelParams]]:
    return [(POINT, KernelParams(**matrix.kernel.model_dump()))] if matrix.kernel is not None else []


KINDS = (KindSpec("kernel", KernelParams, "offline", kernel_points),)
