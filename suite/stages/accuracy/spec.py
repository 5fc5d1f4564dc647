"""The correctness kinds, at the end of an arm's first server session: greedy equivalence (when the accuracy
block asks for equivalence prompts), then the lm-eval task.

The matrix's ``accuracy:`` block (`suite.matrix_jobs.AccuracySpec`) gives lm-eval's own flags in lm_eval_args; a
job carries them as the plan resolved them (`AccuracyParams`), which is also what its record stores.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from suite.lm_eval_flags import Endpoint, lm_eval_flags
from suite.matrix import Matrix
from suite.matrix_jobs import AccuracySpec
from suite.stages.spec import KindSpec

LM_EVAL_DEFAULTS = lm_eval_flags([])  # lm-eval's settings when lm_eval_args give none
OWN_DEFAULTS = AccuracySpec()


class AccuracyParams(BaseModel):
    """One arm's lm-eval task and greedy equivalence: lm-eval's settings as the accuracy block's lm_eval_args say
    them (`suite.lm_eval_flags.LmEvalFlags`), and the block's own fields. The fields are those the block had while
    it held lm-eval's settings as fields of its own, so records written then load as they are and job hashes
    hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = LM_EVAL_DEFAULTS.task
    num_fewshot: int = LM_EVAL_DEFAULTS.num_fewshot
    limit: int | None = LM_EVAL_DEFAULTS.limit
    endpoint: Endpoint = LM_EVAL_DEFAULTS.endpoint
    max_gen_toks: int = LM_EVAL_DEFAULTS.max_gen_toks
    concurrency: int = LM_EVAL_DEFAULTS.concurrency
    seed: int = LM_EVAL_DEFAULTS.seed
    dataset: str = OWN_DEFAULTS.dataset
    min_accuracy: float | None = OWN_DEFAULTS.min_accuracy
    max_drop: float | None = OWN_DEFAULTS.max_drop
    equivalence_prompts: int = OWN_DEFAULTS.equivalence_prompts
    equivalence_max_tokens: int = OWN_DEFAULTS.equivalence_max_tokens


def accuracy_params(spec: AccuracySpec) -> AccuracyParams:
    """The block as a job carries it."""
    own = spec.model_dump(exclude={"lm_eval_args"})
    return AccuracyParams(**vars(spec.flags), **own)


def equivalence_points(matrix: Matrix) -> list[tuple[str, AccuracyParams]]:
    spec = matrix.accuracy
    return [("greedy", accuracy_params(spec))] if spec is not None and spec.equivalence_prompts else []


def accuracy_points(matrix: Matrix) -> list[tuple[str, AccuracyParams]]:
    if matrix.accuracy is None:
        return []
    params = accuracy_params(matrix.accuracy)
    return [(params.task, params)]


KINDS = (
    KindSpec("equivalence", AccuracyParams, "session-end", equivalence_points),
    KindSpec("accuracy", AccuracyParams, "session-end", accuracy_points, result_dir=True),
)
