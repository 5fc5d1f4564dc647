"""The layer stage: its job and its section."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.layer import run, summary

STAGES = (Stage("layer", run.execute, summary.section),)
