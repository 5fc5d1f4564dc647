"""The stages, read by the runner (how to run a job of a kind, how a stage shapes its session's server) and by
the report (each stage's section, in report order): the run-level half of the stage list, in report order.

A stage owns all of itself in its package ``suite/stages/<package>/``. Adding one touches:

1. its package: ``spec.py`` (``KINDS``: each kind's name, params type, placement, points and result layout,
   as ``suite.stages.spec.KindSpec``; on the plan's floor, so it imports only ``suite.matrix``,
   ``suite.matrix_jobs`` and ``suite.stages.spec``), ``stage.py`` (``STAGES``: each kind's ``execute``, server
   hooks and report section, as ``suite.stages.base.Stage``), and the modules these name (``run.py``, ``read.py``, ``summary.py``);
2. its matrix block: a field of ``suite.matrix.Matrix`` (and its spec model, in ``suite.matrix_jobs``) that its
   ``spec.py`` reads;
3. one line in ``suite.stages.kinds.SPECS`` (its ``spec``, at its place in the order of jobs in a session);
4. one line in ``STAGES_BY_PACKAGE`` below (its ``stage``, at its place in the report's section order).

Nothing else names stage kinds: ``suite.plan`` (``KINDS``, ``Job.kind``'s literal, the params union), the
store's layout, the runner, the report and ``tests/test_layering.py`` (the floors of ``spec.py``, ``stage.py``
and ``summary.py``) derive them from these two lists, and ``tests/test_plan.py`` fails when the lists name
different packages or kinds, or a package under ``suite/stages/`` is on neither. Two lines rather than one
because the house rules allow no import by string and the plan sits below the stages: the plan-level facts
must be imported on the plan's floor and the run-level ones above the stages' run modules. A stage whose
bench runs inside an arm image also names its files in the docker runtime (``IMAGE_MODULES``,
``IMAGE_TOOL_FILES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from suite.stages.accuracy import stage as accuracy
from suite.stages.base import Stage
from suite.stages.kernel import stage as kernel
from suite.stages.latency import stage as latency
from suite.stages.layer import stage as layer
from suite.stages.probe import stage as probe
from suite.stages.profile import stage as profile
from suite.stages.serve import stage as serve

# report order: the sections of the stages that have one come in this order (a package's own in its order)
STAGES_BY_PACKAGE = (serve, probe, accuracy, kernel, latency, layer, profile)

STAGES: dict[str, Stage] = {s.kind: s for package in STAGES_BY_PACKAGE for s in package.STAGES}


def stage(kind: str) -> Stage:
    return STAGES[kind]


def sections() -> list[tuple[str, Callable[[Any], Any]]]:
    """Stage sections in report order (the order of STAGES)."""
    return [(s.kind, s.section) for s in STAGES.values() if s.section is not None]
