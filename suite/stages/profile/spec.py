"""The profile kind: a torch-profiler window in a server session of its own per arm, after everything else."""

from __future__ import annotations

from suite.matrix import Matrix
from suite.matrix_jobs import ProfileSpec
from suite.stages.spec import KindSpec


def profile_points(matrix: Matrix) -> list[tuple[str, ProfileSpec]]:
    return [("decode-window", matrix.profile)] if matrix.profile is not None else []


KINDS = (KindSpec("profile", ProfileSpec, "own-session", profile_points),)
