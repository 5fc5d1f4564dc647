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
    # today's vLLM: resolved and the matrix's patch sets tracked on it before anything is fetched or built; the
    # fetch, build and run only when every set applies there
    names = [s.get("name") for s in job["steps"]]
    track = step("Track the patch sets on today's vLLM")
    assert names.index(track["name"]) < names.index("Download the model") < names.index("Build images")
    for needle in ('.venv/bin/suite patches track --vllm "$WANTED_VLLM" --matrix "$MATRIX_FILE"', "--json",
                   "--markdown track-summary.md", "SUITE_VLLM_VERSION=", "GITHUB_ENV", "::warning title="):
        assert needle in track["run"], needle
    assert track["env"]["WANTED_VLLM"] == "${{ inputs.vllm || 'latest' }}" and "vllm" in on["workflow_dispatch"]["inputs"]
    for name in ("Download the model", "Build images", "Run the matrix"):
        assert step(name)["if"] == "steps.track.outputs.runnable == 'true'", name
    for name in ("Find the previous run of this matrix", "Index the run (history carried over from the previous night)",
                 "Compare with the previous night"):
        assert step(name)["if"] == "steps.run.outputs.run_dir != ''", name
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


def _index_previous(work: Path, prev: Path) -> None:
    """The previous night's artifact carries its history index (previous/history.sqlite) with its own run."""
    proc = subprocess.run([sys.executable, "-m", "suite", "history", "--db", str(work / "previous" / "history.sqlite"),
                           "--index", str(prev), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_compare_and_summary_steps_run(tmp_path: Path) -> None:
    """The workflow's own index, compare, summary and fail scripts, on last night's run and a slower tonight:
    tonight's verdict beside the previous night's (history), the night-over-night table below it, and a
    candidate that turns REGRESSION fails the job (a night-over-night regression only warns)."""
    work = tmp_path / "ws"
    (work / ".venv").mkdir(parents=True)
    (work / ".venv" / "bin").symlink_to(VENV_BIN)
    prev = build_run_dir(work / "previous" / "20261128T012300Z-smoke-cpu")
    build_report(prev)
    _index_previous(work, prev)
    tonight = build_run_dir(work / "runs" / "20261129T012300Z-smoke-cpu", scale={"patched": 0.1})
    build_report(tonight)
    out, summary = tmp_path / "out.txt", tmp_path / "summary.md"
    env = {"RUN_DIR": "runs/20261129T012300Z-smoke-cpu", "MIN_EFFECT": "0", "ARTIFACT": "nightly-h100-smoke-cpu",
           "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary), "NAME": "smoke-cpu",
           "VLLM": "0.32.0", "RUNNABLE": "true"}
    r = _bash(_script("Index the run (history carried over from the previous night)"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    history = (work / "history.md").read_text().splitlines()
    assert history[0] == "| run | created | vLLM | status | patched vs baseline |"
    assert history[2].startswith("| `20261129T012300Z-smoke-cpu` |") and "| 0.32.0 | complete | **REGRESSION**" in history[2]
    assert history[3].startswith("| `20261128T012300Z-smoke-cpu` |") and len(history) == 4
    r = _bash(_script("Compare with the previous night"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert outputs == {"compared": "true", "compare_rc": "1"}
    assert (work / "runs" / "compare" / "patched" / "report.html").is_file()
    r = _bash(_script("Summary"), work, env | {"RUN_RC": "0", "COMPARE_RC": "1"})
    assert r.returncode == 0, r.stderr
    text = summary.read_text()
    assert text.startswith("## h100: smoke-cpu on vLLM 0.32.0\n")
    assert "## Verdict" in text and "**patched vs baseline: REGRESSION**" in text  # tonight's own verdict
    assert "## Serving" not in text  # only the verdict of the long report
    # tonight's verdict right above the previous night's, then the night-over-night comparison
    assert text.index("### Tonight beside the previous nights") < text.index("| `20261129T012300Z-smoke-cpu` |") \
        < text.index("| `20261128T012300Z-smoke-cpu` |") < text.index("### Night over night")
    assert "#### suite compare: smoke-cpu" in text
    assert "patched@tonight vs patched@previous: REGRESSION" in text
    assert re.search(r"▼ isl\d+-osl\d+-c\d+-n\d+ \w+_ms: ", text)
    fail = _script("Fail on failed jobs or a new regression")
    r = _bash(fail, work, env | {"RUN_RC": "0", "COMPARE_RC": "1"})
    assert r.returncode == 1
    assert "::warning::an arm regressed against its previous night" in r.stdout
    assert re.search(r"::error::patched vs baseline: REGRESSION on vLLM 0\.32\.0 \(the previous night: "
                     r"(?!REGRESSION)[A-Z ]+\)", r.stdout), r.stdout
    r = _bash(fail, work, env | {"RUN_RC": "1", "COMPARE_RC": "0"})
    assert r.returncode == 1 and "suite run reported failed or missing jobs" in r.stdout


def test_a_regression_already_there_the_night_before_does_not_fail_again(tmp_path: Path) -> None:
    work = tmp_path / "ws"
    (work / ".venv").mkdir(parents=True)
    (work / ".venv" / "bin").symlink_to(VENV_BIN)
    prev = build_run_dir(work / "previous" / "20261128T012300Z-smoke-cpu", scale={"patched": 0.1})
    _index_previous(work, prev)
    build_run_dir(work / "runs" / "20261129T012300Z-smoke-cpu", scale={"patched": 0.1})
    env = {"RUN_DIR": "runs/20261129T012300Z-smoke-cpu", "NAME": "smoke-cpu", "RUNNABLE": "true", "RUN_RC": "0",
           "COMPARE_RC": "0"}
    r = _bash(_script("Index the run (history carried over from the previous night)"), work, env)
    assert r.returncode == 0, r.stderr
    r = _bash(_script("Fail on failed jobs or a new regression"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_first_night_has_nothing_to_compare(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    r = _bash(_script("Compare with the previous night"), tmp_path,
              {"RUN_DIR": "runs/x", "MIN_EFFECT": "0", "ARTIFACT": "nightly-h100-smoke-cpu", "GITHUB_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert out.read_text().strip() == "compared=false"
    assert "nothing to compare" in (tmp_path / "compare-summary.md").read_text()


# ---------------------------------------------------------------- today's vLLM: the tracking step


def test_nightly_matrices_follow_today_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every arm of every nightly matrix takes its release from SUITE_VLLM_VERSION (the tracking step's), with
    today's pin as the default, so the baseline and the patched arms always run one release."""
    from suite.matrix_load import load_matrix, parse_matrix

    bench = bench_matrices()
    for name in bench["BENCH_CUDA"] + bench["BENCH_ROCM"]:
        path = ROOT / "matrices" / f"{name}.yaml"
        raw = yaml.safe_load(path.read_text())
        assert {a["vllm"] for a in raw["arms"].values()} == {"${SUITE_VLLM_VERSION:-0.33.0}"}, name
        monkeypatch.delenv("SUITE_VLLM_VERSION", raising=False)
        assert {a.vllm for a in load_matrix(path).arms.values()} == {"0.33.0"}, name
        monkeypatch.setenv("SUITE_VLLM_VERSION", "0.34.0")
        assert {a.vllm for a in parse_matrix(path.read_text(), str(path)).arms.values()} == {"0.34.0"}, name


def _track_env(tmp_path: Path, work: Path, sets: Path) -> dict[str, str]:
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "suite-vllm-src").symlink_to(ROOT / ".cache" / "vllm-src")  # the trees tests share (0.33.0's wheel)
    for name in ("out", "env"):
        (tmp_path / name).write_text("")
    return {"RUNNER_TOOL_CACHE": str(tool), "SUITE_PATCHES_DIR": str(sets), "MATRIX_FILE": "matrices/gemma4.yaml",
            "GITHUB_OUTPUT": str(tmp_path / "out"), "GITHUB_ENV": str(tmp_path / "env"), "WANTED_VLLM": "0.33.0"}


@pytest.fixture
def track_work(tmp_path: Path) -> tuple[Path, Path]:
    from suite.patches import vllm_source_tree

    vllm_source_tree("0.33.0")  # into .cache/vllm-src once (the docker tests fetch it too)
    work = tmp_path / "ws"
    (work / ".venv").mkdir(parents=True)
    (work / ".venv" / "bin").symlink_to(VENV_BIN)
    (work / "matrices").mkdir()
    shutil.copy(ROOT / "matrices" / "gemma4.yaml", work / "matrices" / "gemma4.yaml")
    sets = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", sets, ignore=shutil.ignore_patterns("tracked"))
    return work, sets


def test_track_step_skips_a_matrix_whose_patch_set_no_longer_applies(tmp_path: Path, track_work) -> None:
    """The gemma4 matrix on a "today" its set's diffs predate (ll-bf16-router-gemm-dispatch cut back to its 0.32.0
    diff, 0.33.0 as today): the step ends green with a warning naming the hunk, the matrix is not run, the job
    summary carries the alert, and the job does not fail."""
    work, sets = track_work
    manifest = sets / "ll-bf16-router-gemm-dispatch" / "manifest.yaml"
    manifest.write_text(manifest.read_text().split('  "0.33.0"')[0])
    (sets / "ll-bf16-router-gemm-dispatch" / "0.33.0.diff").unlink()
    env = _track_env(tmp_path, work, sets)
    r = _bash(_script("Track the patch sets on today's vLLM"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "out").read_text().splitlines())
    gate = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
    assert outputs == {"vllm": "0.33.0", "runnable": "false",
                       "reason": f"ll-bf16-router-gemm-dispatch no longer applies on vLLM 0.33.0 ({gate}, hunk "
                                 "@@ -22,7 +22,7 @@)"}
    assert (tmp_path / "env").read_text() == "SUITE_VLLM_VERSION=0.33.0\n"
    assert ("::warning title=ll-bf16-router-gemm-dispatch no longer applies on vLLM 0.33.0::patch set "
            "'ll-bf16-router-gemm-dispatch' (ll-bf16-router-gemm-dispatch/0.32.0.diff) does not apply to") in r.stdout
    assert "not running matrices/gemma4.yaml" in r.stdout
    # the step's outputs, as the summary and fail steps get them
    summary = tmp_path / "summary.md"
    env |= {"VLLM": outputs["vllm"], "RUNNABLE": outputs["runnable"], "REASON": outputs["reason"],
            "GITHUB_STEP_SUMMARY": str(summary), "ARTIFACT": "nightly-h100-smoke-cpu"}
    r = _bash(_script("Summary"), work, env)
    assert r.returncode == 0, r.stderr
    text = summary.read_text()
    assert text.startswith("## h100: smoke-cpu on vLLM 0.33.0\n\n### Patch sets on vLLM 0.33.0\n")
    assert "> [!CAUTION]\n> **ll-bf16-router-gemm-dispatch no longer applies to vLLM 0.33.0**: `0.32.0.diff` " \
           f"fails at `{gate}`, hunk `@@ -22,7 +22,7 @@`." in text
    assert "**Not run tonight**: ll-bf16-router-gemm-dispatch no longer applies on vLLM 0.33.0" in text
    assert "Night over night" not in text and "No report" not in text
    r = _bash(_script("Fail on failed jobs or a new regression"), work, env)
    assert r.returncode == 0 and "not run tonight" in r.stdout


def test_track_step_runs_a_matrix_on_an_earlier_diff_it_found_applying(tmp_path: Path, track_work) -> None:
    """A matrix whose set has no diff for today's release but whose newest earlier one applies runs there: the
    step exports the release, and the matrix then loads on it (the earlier diff, by the record tracking left)."""
    work, sets = track_work
    matrix = work / "matrices" / "gemma4.yaml"
    matrix.write_text(matrix.read_text().replace("patches: [ll-bf16-router-gemm-dispatch]",
                                                 "patches: [perturbed-gate-logits]"))
    env = _track_env(tmp_path, work, sets)
    r = _bash(_script("Track the patch sets on today's vLLM"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "out").read_text().splitlines())
    assert outputs == {"vllm": "0.33.0", "runnable": "true", "reason": ""}
    assert "vLLM 0.33.0: every patch set applies" in r.stdout
    assert "0.32.0.diff` (earlier release's)" in (work / "track-summary.md").read_text()
    proc = subprocess.run([sys.executable, "-c", "import sys; from suite.matrix_load import load_matrix; "
                           "from suite.patches import resolve_patches; m = load_matrix(sys.argv[1]); "
                           "print(m.arms['patched'].vllm, resolve_patches(m.arms['patched'].patches, "
                           "m.arms['patched'].vllm)[0].diff_path.name)", str(matrix)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SUITE_PATCHES_DIR=str(sets), SUITE_VLLM_VERSION="0.33.0"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0.33.0", "0.32.0.diff"]


def test_track_step_fails_clearly_when_tracking_cannot_run(tmp_path: Path, track_work) -> None:
    work, sets = track_work
    r = _bash(_script("Track the patch sets on today's vLLM"), work,
              _track_env(tmp_path, work, sets) | {"WANTED_VLLM": "0.33"})
    assert r.returncode == 1
    assert "::error::suite patches track failed (exit 2)" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
