"""The latency stage: its job and its section."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.latency import run, summary

STAGES = (Stage("latency", run.execute, summary.section),)
