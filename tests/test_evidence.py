"""Real GPU runs stay part of CI as data: every stored run under docs/evidence/ (its run directory as collected
on the GPU host, less the reports, in raw.tar.xz; the reports `suite report` wrote beside it) regenerates,
through the CLI, into exactly the reports committed beside it. A change to the statistics or the report that
would alter what a stored H200 run says shows up here as a diff."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from suite.cli import main

EVIDENCE = Path(__file__).resolve().parent.parent / "docs" / "evidence"
RUNS = sorted(p for p in EVIDENCE.iterdir() if (p / "raw.tar.xz").is_file()) if EVIDENCE.is_dir() else []


def test_there_is_gpu_evidence():
    assert RUNS, "docs/evidence/ holds no stored run"
    hosts = {run.name for run in RUNS if "h200" in run.name}
    assert hosts, "no stored H200 run"


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_stored_run_regenerates_its_report(run, tmp_path):
    copy = tmp_path / run.name  # the report names its run by the directory's name
    copy.mkdir()
    with tarfile.open(run / "raw.tar.xz") as tar:
        tar.extractall(copy, filter="data")
    assert (copy / "manifest.json").is_file() and not (copy / "report.md").exists()
    assert main(["report", str(copy)]) == 0
    for name in ("report.md", "report.html"):
        assert (copy / name).read_text() == (run / name).read_text(), (
            f"{run.name}/{name} no longer matches its raw files: regenerate it (unpack raw.tar.xz, `suite report`) "
            "and say why")
