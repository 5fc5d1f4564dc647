"""Stored decoder-layer results of a run: the JSON `suite.stages.layer.bench` wrote (one per arm and round), read
back as typed records. The bench writes the kernel bench's shape (rows per T as ``m``) plus a ``layer`` block."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from suite.records import JobRecord
from suite.stages.kernel.read import ByArm, KernelRun, _Read, load_runs
from suite.stages.layer.bench import run_time_path
from suite.store import RunStore, Unreadable


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


class ReferenceRow(_Read):
    m: int
    median_us: float


class LayerReference(_Read):
    """The reference GEMM the bench times beside the layer at each T (the same work in every arm)."""

    what: str = "?"
    results: list[ReferenceRow] = []


class LayerRun(KernelRun):
    """One process's result: µs per layer call per T (``results``, as the kernel bench's rows). A row whose
    compiled gate path is an opaque dispatch op alone is read as that op's run-time path (the bench's
    ``run_time_path``; results stored before the bench resolved it themselves read the same)."""

    layer: LayerInfo = LayerInfo()
    reference: LayerReference | None = None  # results stored before the bench timed one have none

    @model_validator(mode="after")
    def _run_time_paths(self) -> LayerRun:
        for row in self.results:
            if row.eager_path is not None and (resolved := run_time_path(row.path, row.eager_path)) is not None:
                row.path, row.frozen_branch = resolved, False
        self.frozen_branch_ms = [r.m for r in self.results if r.frozen_branch]
        return self


def load_layer_runs(store: RunStore, records: Sequence[JobRecord]) -> tuple[ByArm[LayerRun], list[Unreadable]]:
    return load_runs(store, records, "layer", LayerRun)
