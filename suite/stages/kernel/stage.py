"""The kernel stage: its job and its section."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.kernel import run, summary

STAGES = (Stage("kernel", run.execute, summary.section),)
