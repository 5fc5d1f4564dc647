"""The kernel kind: the router-gate microbenchmark, one job per arm, offline."""

from __future__ import annotations

from suite.matrix import Matrix
from suite.matrix_jobs import KernelSpec
from suite.stages.spec import KindSpec


def kernel_points(matrix: Matrix) -> list[tuple[str, KernelSpec]]:
    return [(f"h{matrix.kernel.hidden}-e{matrix.kernel.experts}", matrix.kernel)] if matrix.kernel is not None else []


KINDS = (KindSpec("kernel", KernelSpec, "offline", kernel_points),)
