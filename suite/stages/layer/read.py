"""Stored decoder-layer results of a run: the JSON `suite.stages.layer.bench` wrote (one per arm and round), read
back as typed records. The bench writes the kernel bench's shape (rows per T as ``m``) plus a ``layer`` block."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from suite.stages.kernel.read import KernelRun, _Read, load_runs
from suite.store import JobRecord, RunStore


class LayerInfo(_Read):
    """What was built: the layer class, which of the model's layers, the subgraph timed, the shapes."""

    class_: str | None = Field(None, alias="class")
    model_type: str | None = None
    layer_index: int | None = None
    layer_type: str | None = None
    num_layers: int = 0
    subgraph: str | None = None
    gate: str | None = None
    hidden: int | None = None
    intermediate: int | None = None
    moe_intermediate: int | None = None
    experts: int | None = None
    top_k: int | None = None
    dtype: str | None = None
    load_format: str | None = None


class LayerRun(KernelRun):
    """One process's result: µs per layer call per T (``results``, as the kernel bench's rows)."""

    layer: LayerInfo = LayerInfo()


def load_layer_runs(store: RunStore, records: Sequence[JobRecord]) -> dict[str, dict[int, LayerRun]]:
    return load_runs(store, records, "layer", LayerRun)
