"""The profile kind: a torch-profiler window in a server session of its own per arm, after everything else.

The matrix's ``profile:`` block (`suite.matrix_jobs.ProfileSpec`) names its point as the report names one; a job
carries the window as the plan resolved it (`ProfileParams`), which is also what its record stores.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.matrix_jobs import PROFILE_SEED
from suite.stages.spec import KindSpec


class ProfileParams(BaseModel):
    """One profiled window: its point (isl, osl, concurrency), its prompts' seed, the requests of the window and
    of the warm-up before it (None: the concurrency, one request per slot), the kernel families. New plans give
    seed 0 and no warm-up count; records written while the matrix block had fields of these names (a seed, a
    warm-up count) load as they are, so their job hashes hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    isl: int
    osl: int
    concurrency: int
    num_prompts: int | None = None
    warmup_prompts: int | None = None
    seed: int = PROFILE_SEED
    families: dict[str, str]

    @property
    def num_prompts_or_default(self) -> int:
        return self.concurrency if self.num_prompts is None else self.num_prompts

    @property
    def warmup_prompts_or_default(self) -> int:
        return self.concurrency if self.warmup_prompts is None else self.warmup_prompts


def profile_points(matrix: Matrix) -> list[tuple[str, ProfileParams]]:
    spec = matrix.profile
    if spec is None:
        return []
    point = spec.shape
    return [("decode-window", ProfileParams(isl=point.isl, osl=point.osl, concurrency=point.concurrency,
                                            num_prompts=spec.num_prompts, families=spec.families))]


KINDS = (KindSpec("profile", ProfileParams, "own-session", profile_points),)
