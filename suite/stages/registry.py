"""The one static registry of stages, read by the runner (how to run a job of a kind, how a stage shapes its
session's server) and by the report (each stage's section, in report order)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from suite.stages.accuracy import equivalence as equivalence_run
from suite.stages.accuracy import run as accuracy_run
from suite.stages.accuracy import summary as accuracy_summary
from suite.stages.base import JobEnv, SessionEnv
from suite.stages.kernel import run as kernel_run
from suite.stages.kernel import summary as kernel_summary
from suite.stages.latency import run as latency_run
from suite.stages.latency import summary as latency_summary
from suite.stages.layer import run as layer_run
from suite.stages.layer import summary as layer_summary
from suite.stages.probe import run as probe_run
from suite.stages.probe import summary as probe_summary
from suite.stages.profile import run as profile_run
from suite.stages.profile import summary as profile_summary
from suite.stages.serve import run as serve_run
from suite.store import JobNotes


@dataclass(frozen=True)
class Stage:
    kind: str
    execute: Callable[[JobEnv], JobNotes]
    section: Callable[[Any], Any] | None = None  # the report's section of this stage (None: part of the core)
    server_args: Callable[[SessionEnv], list[str]] | None = None
    server_env: Callable[[SessionEnv], dict[str, str]] | None = None


STAGES: dict[str, Stage] = {
    "serve": Stage("serve", serve_run.execute),
    "equivalence": Stage("equivalence", equivalence_run.execute),
    "probe": Stage("probe", probe_run.execute, probe_summary.section, server_env=probe_run.server_env),
    "accuracy": Stage("accuracy", accuracy_run.execute, accuracy_summary.section),
    "kernel": Stage("kernel", kernel_run.execute, kernel_summary.section),
    "latency": Stage("latency", latency_run.execute, latency_summary.section),
    "layer": Stage("layer", layer_run.execute, layer_summary.section),
    "profile": Stage("profile", profile_run.execute, profile_summary.section,
                     server_args=profile_run.server_args),
}


def stage(kind: str) -> Stage:
    return STAGES[kind]


def sections() -> list[tuple[str, Callable[[Any], Any]]]:
    """Stage sections in report order (the order of STAGES)."""
    return [(s.kind, s.section) for s in STAGES.values() if s.section is not None]
