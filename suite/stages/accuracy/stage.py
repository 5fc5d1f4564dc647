"""The correctness stages: greedy equivalence (its findings go into the accuracy section) and lm-eval."""

from __future__ import annotations

from suite.stages.accuracy import equivalence, run, summary
from suite.stages.base import Stage

STAGES = (
    Stage("equivalence", equivalence.execute),
    Stage("accuracy", run.execute, summary.section),
)
