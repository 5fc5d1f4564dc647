"""The layer kind: the decoder-layer subgraph benchmark, one job per arm, offline."""

from __future__ import annotations

from suite.matrix import Matrix
from suite.matrix_jobs import LayerSpec
from suite.stages.spec import KindSpec


def layer_points(matrix: Matrix) -> list[tuple[str, LayerSpec]]:
    return [(f"layer{matrix.layer.layer_index}", matrix.layer)] if matrix.layer is not None else []


KINDS = (KindSpec("layer", LayerSpec, "offline", layer_points),)
