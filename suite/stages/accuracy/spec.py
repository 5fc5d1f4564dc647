"""The correctness kinds, at the end of an arm's first server session: greedy equivalence (when the accuracy
block asks for equivalence prompts), then the lm-eval task."""

from __future__ import annotations

from suite.matrix import Matrix
from suite.matrix_jobs import AccuracySpec
from suite.stages.spec import KindSpec


def equivalence_points(matrix: Matrix) -> list[tuple[str, AccuracySpec]]:
    return [("greedy", matrix.accuracy)] if matrix.accuracy is not None and matrix.accuracy.equivalence_prompts else []


def accuracy_points(matrix: Matrix) -> list[tuple[str, AccuracySpec]]:
    return [(matrix.accuracy.task, matrix.accuracy)] if matrix.accuracy is not None else []


KINDS = (
    KindSpec("equivalence", AccuracySpec, "session-end", equivalence_points),
    KindSpec("accuracy", AccuracySpec, "session-end", accuracy_points, result_dir=True),
)
