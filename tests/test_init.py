"""`suite init`: a starter matrix for "my change on my GPU" that validates, carries the settings the stored GPU runs
relied on, says how long it takes, and refuses a diff that would not apply before anything is pulled."""

from __future__ import annotations

import pytest

from suite.matrix_load import load_matrix
from tests.conftest import REPO, run_suite

BAD_DIFF = ("--- a/vllm/model_executor/layers/fused_moe/router/no_such_file.py\n"
            "+++ b/vllm/model_executor/layers/fused_moe/router/no_such_file.py\n"
            "@@ -1,3 +1,3 @@\n import torch\n-x = 1\n+x = 2\n y = 3\n")


def said(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.parametrize("gpu, runtime, vendor", [("h100", None, "cuda"), ("mi355x", "slurm", "rocm"),
                                                  ("h200", "local", None)])
def test_a_gpu_starter_validates_and_carries_what_the_gpu_runs_relied_on(tmp_path, gpu, runtime, vendor):
    path = tmp_path / "mine.yaml"
    # vLLM 0.32.0: the release installed here, so the patch check reads its files without a download
    args = ["init", str(path), "--gpu", gpu, "--vllm", "0.32.0", *(["--runtime", runtime] if runtime else [])]
    proc = run_suite(*args, env={"COLUMNS": "300"})
    assert proc.returncode == 0, said(proc)
    assert f"wrote {path}" in said(proc) and "estimate: ~" in said(proc) and f"next: suite run {path} --dry-run" in said(proc)
    m = load_matrix(path)
    assert "--no-enable-prefix-caching" in m.serve_args and m.quiet_s == 8 and m.drift_check
    assert (m.repeats, m.order, m.verdict.metrics, m.verdict.looks) == ("auto", "abba", ("mean_tpot_ms",), (2, 4, 6))
    assert {c for b in m.serve for c in b.concurrency} >= {1, 8, 16}
    assert m.runtime.kind == (runtime or "docker")
    assert m.runtime.hosts_vendor == vendor  # docker's image and slurm's apptainer flag; local: this machine's
    (patch,) = m.arms["patched"].patches
    assert patch.name == ("rocm-aiter-router-gemm" if gpu == "mi355x" else "ll-bf16-router-gemm-dispatch")
    assert run_suite("validate", str(path)).returncode == 0
    again = run_suite(*args)
    assert again.returncode != 0 and "exists" in said(again)  # never overwritten


def test_a_diff_that_would_not_apply_is_named_by_its_hunk(tmp_path):
    (tmp_path / "mine.diff").write_text(BAD_DIFF)
    path = tmp_path / "mine.yaml"
    proc = run_suite("init", str(path), "--gpu", "cpu", "--diff", str(tmp_path / "mine.diff"), env={"COLUMNS": "300"})
    assert proc.returncode == 2, said(proc)
    assert ("arms.patched.patches: diff file 'mine.diff'" in said(proc) and "hunk '@@ -1,3 +1,3 @@': file does not "
            "exist" in said(proc))
    assert load_matrix(path).arms["patched"].patches[0].path == str(tmp_path / "mine.diff")  # kept, to fix the diff


def test_a_cpu_starter_plans_and_prices_the_tiny_model(tmp_path):
    diff = REPO / "patches" / "synthetic-gate-delay" / "0.32.0.diff"
    path = tmp_path / "cpu.yaml"
    assert run_suite("init", str(path), "--gpu", "cpu", "--diff", str(diff)).returncode == 0
    m = load_matrix(path)
    assert m.model.id == str(REPO / "models" / "tiny-moe") and m.runtime.kind == "local"
    assert m.verdict.looks == (2, 4)
    # no run of this model here yet (an empty runs directory): the seeds price it; after one, that run does
    dry = run_suite("run", str(path), "--dry-run", "--out", str(tmp_path / "runs"), env={"COLUMNS": "300"})
    assert dry.returncode == 0 and "estimate: ~" in dry.stdout and "on this project's 2-core CPU" in dry.stdout
