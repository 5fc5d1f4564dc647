"""The layer kind: the decoder-layer subgraph benchmark, one job per arm, offline.

The matrix's ``layer:`` block (`suite.matrix_jobs.LayerSpec`) gives the rows and the bench's own flags; a job
carries them as the plan resolved them (`LayerParams`), which is also what its record stores.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.stages.spec import KindSpec


class LayerParams(BaseModel):
    """A layer job: the rows (T) and the bench's flags as values (``iters``: ``--calls``), the fields the matrix's
    block had, so records written from it load as they are and job hashes hold (runs recorded before the layer
    could be compiled two ways have no ``compile``: vLLM's, the default then and now)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[int]
    trace_m: int
    compile: Literal["vllm", "inductor"] = "vllm"
    layer_index: int
    iters: int
    trials: int


def layer_points(matrix: Matrix) -> list[tuple[str, LayerParams]]:
    spec = matrix.layer
    if spec is None:
        return []
    flags = spec.flags
    return [(f"layer{flags.layer_index}",
             LayerParams(tokens=spec.tokens, trace_m=flags.trace_m, compile=flags.compile,
                         layer_index=flags.layer_index, iters=flags.iters, trials=flags.trials))]


KINDS = (KindSpec("layer", LayerParams, "offline", layer_points),)
