"""The latency kind: one `vllm bench latency` batch size per job, offline."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.stages.spec import KindSpec


class LatencyParams(BaseModel):
    """One `vllm bench latency` batch size of a latency block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_len: int
    output_len: int
    batch_size: int
    num_iters_warmup: int
    num_iters: int


def latency_points(matrix: Matrix) -> list[tuple[str, LatencyParams]]:
    return [(f"in{b.input_len}-out{b.output_len}-bs{bs}",
             LatencyParams(input_len=b.input_len, output_len=b.output_len, batch_size=bs,
                           num_iters_warmup=b.flags.num_iters_warmup, num_iters=b.flags.num_iters))
            for b in matrix.latency for bs in b.batch_size]


KINDS = (KindSpec("latency", LatencyParams, "offline", latency_points),)
