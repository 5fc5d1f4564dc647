"""The wall-time estimate before a run (`suite.estimate`), held against the stored runs it is seeded by, and
shown where a user looks first: `suite validate`, `suite run --dry-run`."""

from __future__ import annotations

import pytest

from suite.estimate import COSTS, estimate, host_of, point_seconds
from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.run_facts import running_seconds
from tests.conftest import REPO, run_suite
from tests.test_evidence import EVIDENCE, unpack


@pytest.mark.parametrize("matrix, stored, rounds", [
    ("gemma4-h100-tradeoff.yaml", "h100-tradeoff-20261207", 3),
    ("gemma4-h100-abba.yaml", "h100-abba-one-machine-20261206", 4),
])
def test_the_estimate_is_within_a_quarter_of_what_the_stored_gpu_runs_took(tmp_path, matrix, stored, rounds):
    from suite.analysis import load_run

    m = load_matrix(REPO / "matrices" / matrix)
    assert host_of(m, "cpu") == "cuda"  # a local runtime given GPUs
    guess = estimate(m, build_plan(m), "cuda").until(rounds)
    ran, _ = running_seconds(load_run(unpack(EVIDENCE / stored, tmp_path / stored)))
    assert ran is not None and 0.75 < guess / ran < 1.25, (guess, ran)


def test_a_point_takes_its_waves_of_requests_or_its_time():
    from suite.stages.serve.spec import ServeParams

    c = COSTS["cuda"]
    p = ServeParams(isl=128, osl=64, concurrency=1, num_prompts=16, random_range_ratio=0.0, request_rate=None,
                    num_warmups=2, seed=0)
    # 16 waves of one request: 64 decode steps of 5.5 ms and a first token; the stored c1 jobs took 10.3-13.1 s
    assert 10 < point_seconds(p, c) < 13.5
    assert point_seconds(p.model_copy(update={"duration_s": 30.0}), c) == 30.0 + c.job_overhead_s


def test_validate_and_the_dry_run_say_how_long():
    matrix = str(REPO / "matrices" / "gemma4-h100-tradeoff.yaml")
    for args in (("validate", matrix), ("run", matrix, "--dry-run")):
        proc = run_suite(*args, env={"COLUMNS": "300"})
        assert proc.returncode == 0, proc.stderr
        assert "estimate: ~14 min on an H100 / H200 with Gemma 4 26B-A4B: 6 server starts" in proc.stdout, proc.stdout
    dry = run_suite("run", str(REPO / "matrices" / "gemma4.yaml"), "--dry-run", env={"COLUMNS": "300"}).stdout
    assert "repeats: auto stops at the first look that decides: after 2 rounds ~" in dry


@pytest.mark.parametrize("matrix, stored, rounds", [
    ("gemma4-h100-tradeoff.yaml", "h100-tradeoff-20261207", 3),
    ("gemma4-h100-abba.yaml", "h100-abba-one-machine-20261206", 4),
])
def test_a_run_prices_its_own_plan_within_five_percent(tmp_path, matrix, stored, rounds):
    """Priced by the run itself (its server starts, its serving jobs against the seeds), the estimate of the
    same plan lands within 5 % of what that run took: the seeds alone were 3 % and 25 % off."""
    from suite.analysis import load_run
    from suite.calibrate import calibrate

    run_dir = unpack(EVIDENCE / stored, tmp_path / stored)
    cal = calibrate(run_dir, COSTS["cuda"])
    assert cal is not None and cal.starts >= 6
    m = load_matrix(REPO / "matrices" / matrix)
    guess = estimate(m, build_plan(m), "cuda", cal.costs, cal.source())
    ran, _ = running_seconds(load_run(run_dir))
    assert ran is not None and 0.95 < guess.until(rounds) / ran < 1.05, (guess.until(rounds), ran)
    assert guess.lines()[-1].startswith(f"  (priced by your run {stored} on this machine (")


def test_a_run_of_another_machine_does_not_price_the_estimate(tmp_path):
    from suite.calibrate import own_run

    unpack(EVIDENCE / "h100-tradeoff-20261207", tmp_path / "h100-tradeoff-20261207")  # an H100 device machine's
    m = load_matrix(REPO / "matrices" / "gemma4-h100-tradeoff.yaml")
    assert own_run(tmp_path, m) is None


def test_every_matrix_the_nightly_runs_fits_its_limit():
    """The GPU matrices of `make bench-cuda` / `bench-rocm` (the nightly's): a rounds-until-decided one carries a
    time budget that leaves the job's setup, model and image three hours of its limit, and its dry run says so;
    a fixed one is estimated within that."""
    import yaml

    from tests.test_workflow import bench_matrices

    nightly = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    limit = max(job.get("timeout-minutes", 360) for job in nightly["jobs"].values())
    for name in [m for ms in bench_matrices().values() for m in ms]:
        m = load_matrix(REPO / "matrices" / f"{name}.yaml")
        guess = estimate(m, build_plan(m), host_of(m, "cpu"))
        if m.repeats == "auto":
            assert m.budget_min is not None and m.budget_min + 180 <= limit, name
            assert any(line.startswith(f"  budget_min {m.budget_min:g}: ") for line in guess.lines()), name
        else:
            assert guess.total_s / 60 + 180 <= limit, name


def test_a_cooldown_between_rounds_is_in_the_estimate_and_refused_where_it_cannot_run():
    """`cooldown_s`: the design records it, the estimate adds it before each round after the first (each wave of
    rounds under GPU groups in runtime.gpus), and the Slurm runtime, whose sessions are batch jobs of their own, refuses
    it at validate time."""
    from suite.errors import MatrixError
    from suite.matrix_load import parse_matrix

    text = (REPO / "matrices" / "gemma4-h100-abba.yaml").read_text()
    m, rested = load_matrix(REPO / "matrices" / "gemma4-h100-abba.yaml"), parse_matrix(text + "cooldown_s: 60\n")
    plain, cooled = estimate(m, build_plan(m), "cuda"), estimate(rested, build_plan(rested), "cuda")
    assert build_plan(rested).design.cooldown_s == 60
    for n in (2, 4):  # one before each round after round 0
        assert cooled.until(n) - plain.until(n) == pytest.approx(60 * (n - 1))
    with pytest.raises(MatrixError, match="cooldown_s: the slurm runtime starts each session in a batch job"):
        parse_matrix(text.replace("kind: local", "kind: slurm") + "cooldown_s: 60\n")


@pytest.mark.parametrize("vendor, sbatch, host", [("rocm", "[--gres=gpu:h200:1, --time=02:00:00]", "rocm"),
                                                  ("rocm", "[--gpus=2]", "rocm"), (None, "[--gpus=2]", "cuda"),
                                                  ("rocm", "[--cpus-per-task=2]", "cpu"), ("rocm", "[]", "cpu"),
                                                  ("cpu", "[]", "cpu"), (None, "[]", "cpu")])
def test_a_slurm_job_prices_as_a_gpu_host_when_its_sbatch_options_ask_for_gpus(vendor, sbatch, host):
    """A job with GPUs prices as runtime.vendor's host (cuda when not given); one without, as this machine."""
    from suite.matrix_load import parse_matrix

    m = parse_matrix('name: t\nmodel: {id: some/model}\narms:\n  a: {vllm: "0.33.0"}\n'
                     "serve:\n  - {isl: 64, osl: 16, concurrency: 1, num_prompts: 4}\n"
                     f"runtime: {{kind: slurm, {f'vendor: {vendor}, ' if vendor else ''}slurm: {{sbatch: {sbatch}}}}}\n")
    assert host_of(m, "cpu") == host
