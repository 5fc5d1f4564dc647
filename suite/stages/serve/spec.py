"""The serving kind: one `vllm bench serve` point per job, in every server session, once per round."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.matrix_jobs import serve_point_id
from suite.stages.spec import KindSpec


class ServeParams(BaseModel):
    """One serving point, as `vllm bench serve` runs it (suite.stages.serve.run.serve_command)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    isl: int
    osl: int
    concurrency: int
    num_prompts: int
    random_range_ratio: float
    request_rate: float | None  # None: every request at once (inf)
    num_warmups: int
    seed: int
    duration_s: float | None = None  # sized by time, num_prompts "60s" (one count per round: suite.stages.serve.sizing);
    # num_prompts then holds what a round runs with no measured request rate
    warmup: bool = True  # warm the server at this shape before the session's first point
    client: Literal["persistent", "cli"] = "persistent"

    def hashed(self) -> dict[str, Any]:
        """What the job's hash covers: the knobs added later only when set away from their default, so the
        hashes of runs made before them stay what they were."""
        return self.model_dump(mode="json", exclude_defaults=True)


def serve_points(matrix: Matrix) -> list[tuple[str, ServeParams]]:
    points: dict[str, ServeParams] = {}
    for block in matrix.serve:
        for conc in block.concurrency:
            n, flags = block.prompts_for(conc), block.flags
            pid = serve_point_id(block.isl, block.osl, conc, n, block.duration_s)
            points.setdefault(pid, ServeParams(
                isl=block.isl, osl=block.osl, concurrency=conc, num_prompts=n,
                random_range_ratio=flags.random_range_ratio, request_rate=flags.request_rate,
                num_warmups=flags.num_warmups, seed=flags.seed, duration_s=block.duration_s, warmup=block.warmup,
                client=block.client))
    return list(points.items())


KINDS = (KindSpec("serve", ServeParams, "each-round", serve_points),)
