"""The profile stage: its job, the profiler flags of its own server session, its section."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.profile import run, summary

STAGES = (Stage("profile", run.execute, summary.section, server_args=run.server_args),)
