"""The gate-path probe stage: its job, the plugin it loads into its session's server, its section."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.probe import run, summary

STAGES = (Stage("probe", run.execute, summary.section, server_env=run.server_env),)
