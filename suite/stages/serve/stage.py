"""The serving stage as the runner sees it; its sections are the report's core (suite.report_sections)."""

from __future__ import annotations

from suite.stages.base import Stage
from suite.stages.serve import run

STAGES = (Stage("serve", run.execute),)
