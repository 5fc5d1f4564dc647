"""The job kinds of every stage, in the order of the jobs in a session: the plan-level half of the stage list
(the run-level half, in report order, is ``suite.stages.registry``; ``tests/test_plan.py`` keeps the two
naming the same packages and kinds). Each entry is a stage package's ``spec.py``, whose ``KINDS`` declare the
kind names, params types, placements, points and result layout; ``suite.plan`` derives everything it knows
of kinds from ``KINDS`` here.

Sits on the plan's floor with the ``spec.py`` modules it lists: it may not import anything above the plan.
"""

from __future__ import annotations

from suite.stages.accuracy import spec as accuracy
from suite.stages.kernel import spec as kernel
from suite.stages.latency import spec as latency
from suite.stages.layer import spec as layer
from suite.stages.probe import spec as probe
from suite.stages.profile import spec as profile
from suite.stages.serve import spec as serve
from suite.stages.spec import KindSpec

# job order: inside a placement, a package's kinds run in this order (equivalence before accuracy, latency
# before kernel before layer); the placements themselves are ordered by suite.plan
SPECS = (probe, serve, accuracy, latency, kernel, layer, profile)

KINDS: dict[str, KindSpec] = {spec.kind: spec for package in SPECS for spec in package.KINDS}
