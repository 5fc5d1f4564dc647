"""The gate-path probe's kind: one job at the start of an arm's first server session."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.stages.spec import KindSpec


class ProbeParams(BaseModel):
    """The gate-path probe takes nothing but its session's server."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def probe_points(matrix: Matrix) -> list[tuple[str, ProbeParams]]:
    return [("gate-paths", ProbeParams())] if matrix.probe else []


KINDS = (KindSpec("probe", ProbeParams, "session-start", probe_points),)
