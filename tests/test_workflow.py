""".github/workflows/nightly.yml: actionlint (PyPI wheel, with shellcheck from PyPI for the run: scripts) lints it
clean and does catch a broken copy; its structure is what the nightly needs; its compare and summary scripts
are executed here against real run directories.

actionlint and shellcheck come from the dev extras (.venv/bin); the lint tests skip when they are missing
unless CI is set, so CI fails rather than skipping.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suite.report import build_report
from tests.test_report_html import build_run_dir

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
VENV_BIN = Path(sys.executable).parent
ACTIONLINT = shutil.which("actionlint", path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
needs_actionlint = pytest.mark.skipif(ACTIONLINT is None and not os.environ.get("CI"),
                                      reason="actionlint not installed (dev extras)")


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT, "actionlint is not installed (dev extras)"
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([ACTIONLINT, "-no-color", "-config-file", str(ROOT / ".github" / "actionlint.yaml"),
                           str(path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def load() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def step(name: str) -> dict:
    (found,) = [s for s in load()["jobs"]["bench"]["steps"] if s.get("name") == name]
    return found


@needs_actionlint
def test_actionlint_clean() -> None:
    assert shutil.which("shellcheck", path=str(VENV_BIN)) or shutil.which("shellcheck"), \
        "shellcheck missing: actionlint would skip the run: scripts"
    r = actionlint(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_actionlint
def test_actionlint_catches_mistakes(tmp_path: Path) -> None:
    text = WORKFLOW.read_text()
    broken = (text.replace("steps.run.outputs.run_dir", "steps.runn.outputs.run_dir", 1)
              .replace('run: .venv/bin/suite build "$MATRIX_FILE"', 'run: .venv/bin/suite build $MATRIX_FILE')
              .replace("[self-hosted,", "[self-hosted, gpu-xl,"))
    bad = tmp_path / ".github" / "workflows" / "nightly.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(broken)
    r = actionlint(bad)
    assert r.returncode != 0
    assert "runn" in r.stdout  # unknown step id in an expression
    assert "SC2086" in r.stdout  # shellcheck: unquoted variable
    assert "gpu-xl" in r.stdout  # unknown self-hosted runner label


def test_structure() -> None:
    wf = load()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as True
    assert "schedule" in on and on["schedule"][0]["cron"] and "workflow_dispatch" in on
    job = wf["jobs"]["bench"]
    assert job["runs-on"][0] == "self-hosted"
    platforms = {e["platform"] for e in job["strategy"]["matrix"]["include"]}
    assert platforms == {"h100", "mi355x"}
    assert job["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    for needle in ("make setup", ".venv/bin/suite build", ".venv/bin/suite run", "curl",
                   "/actions/artifacts?name=", ".venv/bin/suite compare", "--fail-on-regression", "GITHUB_STEP_SUMMARY"):
        assert needle in runs, needle
    uses = [s.get("uses", "") for s in job["steps"]]
    assert "actions/checkout@v4" in uses and uses.count("actions/upload-artifact@v4") == 2
    dl = step("Download the previous night's run")
    assert dl["uses"] == "actions/download-artifact@v4" and "run-id" in dl["with"] and "github-token" in dl["with"]
    up = step("Upload the run")
    assert up["if"].startswith("always()")  # a failed night still uploads what it measured
    # the matrices the nightly runs are the ones `make bench-cuda` / `make bench-rocm` run, on their platforms
    bench = bench_matrices()
    nightly = {(e["platform"], e["matrix"]) for e in job["strategy"]["matrix"]["include"]}
    assert nightly == {("h100", m) for m in bench["BENCH_CUDA"]} | {("mi355x", m) for m in bench["BENCH_ROCM"]}


def bench_matrices() -> dict[str, list[str]]:
    """BENCH_CUDA and BENCH_ROCM of the Makefile, as make reads them."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "show"], cwd=ROOT,
                         input="show:\n\t@echo $(BENCH_CUDA)\n\t@echo $(BENCH_ROCM)\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return {"BENCH_CUDA": out[0].split(), "BENCH_ROCM": out[1].split()}


def test_make_bench_fetches_first_and_goes_on_past_a_failed_matrix(tmp_path: Path) -> None:
    """`make bench-cuda` / `bench-rocm`: every model fetched before any build; a matrix that fails does not
    stop the next one; the target fails at the end, naming it. Run through make with a `suite` that logs its
    calls and fails the first matrix's run."""
    log = tmp_path / "calls"
    fake = tmp_path / "suite"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$*" = "run matrices/one.yaml" ] && exit 1\nexit 0\n')
    fake.chmod(0o755)
    proc = subprocess.run(["make", "--no-print-directory", "bench", "MATRICES=one two", f"SUITE={fake}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "bench: failed: one" in proc.stderr
    assert log.read_text().splitlines() == [
        "fetch matrices/one.yaml", "fetch matrices/two.yaml", "build matrices/one.yaml", "run matrices/one.yaml",
        "build matrices/two.yaml", "run matrices/two.yaml"]


def test_make_bench_skips_a_matrix_whose_model_cannot_be_fetched_and_runs_the_rest(tmp_path: Path) -> None:
    """A gated model or an unset checkpoint variable skips its matrix, with the fetch's last words as the reason;
    the others are built and run; a target whose every matrix was skipped fails."""
    log = tmp_path / "calls"
    fake = tmp_path / "suite"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                    'if [ "$*" = "fetch matrices/two.yaml" ]; then echo "model org/x: GatedRepoError: 401 (the '
                    'repository is gated)" >&2; exit 1; fi\nexit 0\n')
    fake.chmod(0o755)
    proc = subprocess.run(["make", "--no-print-directory", "bench", "MATRICES=one two three", f"SUITE={fake}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "bench: skipped two: its model could not be fetched: model org/x: GatedRepoError" in proc.stderr
    assert "bench: ran one three; 1 skipped (above)" in proc.stderr
    assert log.read_text().splitlines() == [
        "fetch matrices/one.yaml", "fetch matrices/two.yaml", "fetch matrices/three.yaml",
        "build matrices/one.yaml", "run matrices/one.yaml", "build matrices/three.yaml", "run matrices/three.yaml"]
    none = subprocess.run(["make", "--no-print-directory", "bench", "MATRICES=two", f"SUITE={fake}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert none.returncode != 0 and "bench: nothing to run: every matrix was skipped" in none.stderr


def _script(name: str) -> str:
    """A step's run: script with the workflow's ${{ matrix.* }} expressions filled in as the runner would."""
    text = step(name)["run"]
    return text.replace("${{ matrix.platform }}", "h100").replace("${{ matrix.matrix }}", "smoke-cpu")


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=120)


def test_compare_and_summary_steps_run(tmp_path: Path) -> None:
    """The workflow's own compare and summary scripts, on last night's run and a slower tonight."""
    work = tmp_path / "ws"
    (work / ".venv").mkdir(parents=True)
    (work / ".venv" / "bin").symlink_to(VENV_BIN)
    prev = build_run_dir(work / "previous" / "20261128T012300Z-smoke-cpu")
    build_report(prev)
    tonight = build_run_dir(work / "runs" / "20261129T012300Z-smoke-cpu", scale={"patched": 0.1})
    build_report(tonight)
    out, summary = tmp_path / "out.txt", tmp_path / "summary.md"
    env = {"RUN_DIR": "runs/20261129T012300Z-smoke-cpu", "MIN_EFFECT": "0", "ARTIFACT": "nightly-h100-smoke-cpu",
           "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}
    r = _bash(_script("Compare with the previous night"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs == {"compared": "true", "compare_rc": "1"}
    assert (work / "runs" / "compare" / "patched" / "report.html").is_file()
    r = _bash(_script("Summary"), work, env | {"RUN_RC": "0", "COMPARE_RC": "1"})
    assert r.returncode == 0, r.stderr
    text = summary.read_text()
    assert text.startswith("## h100: smoke-cpu")
    assert "## Verdict" in text and "**patched vs baseline: REGRESSION**" in text  # tonight's own verdict
    assert "## Serving" not in text  # only the verdict of the long report
    assert "#### suite compare: smoke-cpu" in text
    assert "patched@tonight vs patched@previous: REGRESSION" in text
    assert re.search(r"▼ isl\d+-osl\d+-c\d+-n\d+ \w+_ms: ", text)
    r = _bash(_script("Fail on failed jobs or a significant regression"), work, env | {"RUN_RC": "0",
                                                                                       "COMPARE_RC": "1"})
    assert r.returncode == 1 and "significant regression" in r.stdout
    r = _bash(_script("Fail on failed jobs or a significant regression"), work, env | {"RUN_RC": "0",
                                                                                       "COMPARE_RC": "0"})
    assert r.returncode == 0


def test_first_night_has_nothing_to_compare(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    r = _bash(_script("Compare with the previous night"), tmp_path,
              {"RUN_DIR": "runs/x", "MIN_EFFECT": "0", "ARTIFACT": "nightly-h100-smoke-cpu", "GITHUB_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert out.read_text().strip() == "compared=false"
    assert "nothing to compare" in (tmp_path / "compare-summary.md").read_text()
