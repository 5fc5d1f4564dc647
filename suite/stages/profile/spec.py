"""The profile kind: a torch-profiler window in a server session of its own per arm, after everything else.

A job carries the window as the plan resolved it from the matrix's ``profile:`` block (`ProfileParams`), which is
also what its record stores.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from suite.matrix import Matrix
from suite.stages.spec import KindSpec


class ProfileParams(BaseModel):
    """One profiled window: its point (isl, osl, concurrency), its prompts' seed, the requests of the window and
    of the warm-up before it (None: the concurrency, one request per slot), the kernel families; the fields the
    matrix's block had, so records written from it load as they are and job hashes hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    isl: int
    osl: int
    concurrency: int
    num_prompts: int | None = None
    warmup_prompts: int | None = None
    seed: int = 0
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
    return [("decode-window", ProfileParams(isl=spec.isl, osl=spec.osl, concurrency=spec.concurrency,
                                            num_prompts=spec.num_prompts, warmup_prompts=spec.warmup_prompts,
                                            seed=spec.seed, families=spec.families))]


KINDS = (KindSpec("profile", ProfileParams, "own-session", profile_points),)
