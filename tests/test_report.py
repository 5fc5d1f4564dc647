"""Report arithmetic on hand-made raw results: every number in the report is recomputed from the files."""

from __future__ import annotations

import pytest

from suite.matrix import parse_matrix
from suite.plan import build_plan
from suite.report import build_report, load_run
from suite.store import RunStore, atomic_write_json, new_manifest

MATRIX = """\
name: rep
model: {id: some/model}
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0"}
serve:
  - {isl: 64, osl: 16, concurrency: [2, 4], num_prompts: 8}
repeats: 3
"""
KEYS = ["output_throughput"] + [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")]


def raw(tput: float, lat: float, completed: int = 8, failed: int = 0) -> dict:
    out = {k: lat for k in KEYS[1:]} | {"output_throughput": tput, "completed": completed, "failed": failed,
                                         "duration": 1.0, "latencies": [0.5] * completed}
    return out


def make_run(tmp_path, values, fail_job: str | None = None):
    matrix = parse_matrix(MATRIX)
    plan = build_plan(matrix)
    store = RunStore.create(tmp_path, matrix.name)
    store.write_manifest(new_manifest("m.yaml", matrix.model_dump(mode="json"),
                                      {"order": plan.order, "baseline": plan.baseline, "arms": list(plan.arms)}))
    for job in plan.jobs:
        if job.key == fail_job and job.arm == "patched":
            store.write_record(job, "failed", error="boom: server died")
            continue
        tput, lat = values[(job.arm, job.params["concurrency"], job.repeat)]
        atomic_write_json(store.result_path(job), raw(tput, lat))
        store.write_record(job, "ok")
    return store.root


def values_for(base: list[float], cand: list[float]):
    out = {}
    for c in (2, 4):
        for r in range(3):
            out[("baseline", c, r)] = (base[r], 100.0 / base[r])
            out[("patched", c, r)] = (cand[r], 100.0 / cand[r])
    return out


def test_clear_improvement_is_significant_and_cells_match_raw(tmp_path):
    root = make_run(tmp_path, values_for([100, 101, 99], [120, 121, 119]))
    text = build_report(root).read_text()
    # medians of the raw files, and Δ of geometric means
    assert "| 64 | 16 | 2 | 8 | 100.0 → 120.0 (+20.0%) ▲ |" in text
    assert "IMPROVEMENT" in text
    assert "| 24/24 | 0/0 |" in text  # completed/failed summed over repeats, baseline/patched
    run = load_run(root)
    assert len(run.points) == 2 and [len(v) for v in run.points["isl64-osl16-c2-n8"].reps.values()] == [3, 3]


def test_regression_in_latency_reads_worse(tmp_path):
    root = make_run(tmp_path, values_for([100, 101, 99], [80, 81, 79]))
    text = build_report(root).read_text()
    assert "REGRESSION" in text
    assert "1.00 → 1.25 (+25.0%) ▼" in text  # mean TTFT went up: worse


def test_noise_is_not_significant(tmp_path):
    root = make_run(tmp_path, values_for([100, 110, 90], [102, 93, 108]))
    text = build_report(root).read_text()
    assert "NO SIGNIFICANT CHANGE" in text
    table = text.split("## Serving")[1].split("## Statistics")[0]
    assert "▲" not in table and "▼" not in table and " · |" in table


def test_failed_job_is_listed_never_hidden(tmp_path):
    root = make_run(tmp_path, values_for([100, 101, 99], [120, 121, 119]),
                    fail_job="serve/isl64-osl16-c4-n8/rep-1")
    text = build_report(root).read_text()
    assert "## Failed jobs" in text
    assert "| patched | serve/isl64-osl16-c4-n8/rep-1 | boom: server died |" in text
    assert "n | Verdict" in text and "| 3/2 |" in text  # the point still reports, with 2 repeats


def test_report_is_a_pure_function_of_the_files(tmp_path):
    root = make_run(tmp_path, values_for([100, 101, 99], [120, 121, 119]))
    first = build_report(root).read_text()
    assert build_report(root).read_text() == first


@pytest.mark.parametrize("n_missing", [1])
def test_missing_arm_results_show_as_missing(tmp_path, n_missing):
    root = make_run(tmp_path, values_for([100, 101, 99], [120, 121, 119]))
    for f in (root / "patched" / "serve" / "isl64-osl16-c4-n8").glob("rep-*.json"):
        f.unlink()
    text = build_report(root).read_text()
    assert "| 64 | 16 | 4 | 8 | missing |" in text
