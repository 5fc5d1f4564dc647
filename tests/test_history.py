"""History index (SQLite) and `suite compare`, on run directories built from real `vllm bench serve` results."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from suite.analysis import load_run
from suite.cli import main
from suite.history import find_run, index_run, list_runs, previous_run
from suite.store import RunStore
from tests.test_report_html import build_run_dir


def set_created(run_dir: Path, created: str) -> None:
    RunStore(run_dir).update_manifest(created=created)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    base = tmp_path / "runs"
    a = build_run_dir(base / "20261128T010000Z-smoke-cpu")
    set_created(a, "2026-11-28T01:00:00+00:00")
    b = build_run_dir(base / "20261129T010000Z-smoke-cpu", scale={"patched": 0.1})
    set_created(b, "2026-11-29T01:00:00+00:00")
    return base


def test_index_and_list(runs: Path) -> None:
    db = runs / "history.sqlite"
    a = index_run(runs / "20261128T010000Z-smoke-cpu")  # default: beside the runs
    assert db.is_file()
    assert a.matrix == "smoke-cpu" and a.arms == ["baseline", "patched"] and a.status == "complete"
    assert a.vllm_versions == {"baseline": "0.32.0", "patched": "0.32.0"}
    assert a.patches["patched"][0].name == "synthetic-gate-delay" and len(a.patches["patched"][0].sha256 or "") == 64
    b = index_run(runs / "20261129T010000Z-smoke-cpu", db)
    (vb,) = b.verdicts
    assert vb.overall == "REGRESSION" and vb.worse > 0 and vb.geomean_tput_pct < -20
    index_run(runs / "20261129T010000Z-smoke-cpu", db)  # re-indexing replaces, never duplicates
    rows = list_runs(db)
    assert [r.run_id for r in rows] == ["20261129T010000Z-smoke-cpu", "20261128T010000Z-smoke-cpu"]
    assert rows[0].verdicts == b.verdicts
    assert rows[1].patches == a.patches and rows[1].vllm_versions == a.vllm_versions  # read back as written
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] == 2
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert list_runs(db, matrix="other") == []
    assert previous_run(db, "20261129T010000Z-smoke-cpu").run_id == "20261128T010000Z-smoke-cpu"
    assert previous_run(db, "20261128T010000Z-smoke-cpu") is None
    assert find_run(db, "nope") is None


def test_history_command(runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["history", "--runs", str(runs), "--scan"]) == 0
    out = capsys.readouterr().out
    assert "indexed 2 run(s)" in out
    assert "20261129T010000Z-smoke-cpu" in out and "20261128T010000Z-smoke-cpu" in out
    assert "patched vs baseline: REGRESSION" in out
    assert "patched: synthetic-gate-delay" in out  # the patches column, read back from the index
    assert main(["history", "--runs", str(runs), "--matrix", "nope"]) == 0
    assert "no runs indexed" in capsys.readouterr().out


def test_history_markdown_and_json(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The forms a CI job summary and a script read: tonight's verdict (the newest run) right above the previous
    night's, each with its vLLM; the same rows as JSON. The indexing notes go to stderr, out of the way."""
    assert main(["history", "--runs", str(runs), "--scan", "--markdown"]) == 0
    out, err = capsys.readouterr()
    assert "indexed 2 run(s)" in err
    lines = out.splitlines()
    assert lines[:2] == ["| run | created | vLLM | status | patched vs baseline |", "|---|---|---|---|---|"]
    tonight, before = lines[2], lines[3]
    assert tonight.startswith("| `20261129T010000Z-smoke-cpu` | 2026-11-29 01:00 | 0.32.0 | complete | **REGRESSION**, "
                              "tput -")
    assert before.startswith("| `20261128T010000Z-smoke-cpu` | 2026-11-28 01:00 | 0.32.0 | complete | **")
    assert len(lines) == 4
    assert main(["history", "--runs", str(runs), "--matrix", "smoke-cpu", "--limit", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["run_id"] == "20261129T010000Z-smoke-cpu" and row["vllm_versions"] == {"baseline": "0.32.0",
                                                                                     "patched": "0.32.0"}
    (v,) = row["verdicts"]
    assert (v["candidate"], v["baseline"], v["overall"]) == ("patched", "baseline", "REGRESSION")
    assert row["patches"]["patched"][0]["name"] == "synthetic-gate-delay"
    assert main(["history", "--runs", str(runs), "--matrix", "nope", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == "No runs indexed."


def test_compare_same_arm_across_runs(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = runs / "20261128T010000Z-smoke-cpu", runs / "20261129T010000Z-smoke-cpu"
    out = tmp_path / "cmp"
    rc = main(["compare", str(a), str(b), "--label-a", "last-night", "--label-b", "tonight", "--out", str(out),
               "--fail-on-regression"])
    assert rc == 1  # tonight's patched arm is half as fast as last night's
    for arm in ("baseline", "patched"):
        assert (out / arm / "report.md").is_file() and (out / arm / "report.html").is_file()
    summary = (out / "summary.md").read_text()
    assert "**patched@tonight vs patched@last-night: REGRESSION**" in summary
    assert "baseline@tonight vs baseline@last-night: EQUIVALENT" in summary \
        or "baseline@tonight vs baseline@last-night: INCONCLUSIVE" in summary
    assert "POSSIBLE" not in summary and "composite -" in summary
    assert "significant regression(s)" in summary and "▼" in summary
    md = (out / "patched" / "report.md").read_text()
    assert "# smoke-cpu: patched@last-night vs patched@tonight" in md
    assert "order: independent runs" in md  # never paired across runs
    manifest = json.loads((out / "patched" / "manifest.json").read_text())
    assert manifest["compare"]["a"]["run"] == a.name and manifest["compare"]["b"]["arm"] == "patched"
    assert manifest["job_counts"] == {"ok": 18, "failed": 0, "missing": 0}
    # the merged directory is a run directory: `suite report` re-renders it
    assert main(["report", str(out / "patched")]) == 0
    capsys.readouterr()
    # without --fail-on-regression the regression is reported, exit 0; a high --min-effect ignores it
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c2"), "--arm", "patched"]) == 0
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c3"), "--arm", "patched",
                 "--fail-on-regression", "--min-effect", "1000"]) == 0
    assert "No significant regression with |Δ| ≥ 1000%" in (tmp_path / "c3" / "summary.md").read_text()


def test_compare_cross_arm_and_refusals(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = runs / "20261128T010000Z-smoke-cpu"
    out = tmp_path / "x"
    # arm X of run A vs arm Y of run B (here the same run: baseline vs patched, like the run's own report)
    assert main(["compare", str(a), str(a), "--arm", "baseline", "--arm", "patched", "--out", str(out)]) == 0
    assert (out / "baseline-vs-patched" / "report.html").is_file()
    assert "patched@20261128T010000Z vs baseline@20261128T010000Z" in (out / "summary.md").read_text()
    # the same statistics as the run's own report: identical verdict counts and throughput geomean
    (own,) = load_run(a).summaries
    (merged,) = load_run(out / "baseline-vs-patched").summaries
    assert (merged.counts, merged.geomean_throughput_pct, merged.overall) == \
        (own.counts, own.geomean_throughput_pct, own.overall)
    assert merged.evaluation.composite.estimate_pct == pytest.approx(own.evaluation.composite.estimate_pct)
    # run ids resolve through the history index
    index_run(a)
    index_run(runs / "20261129T010000Z-smoke-cpu")
    assert main(["compare", "20261128T010000Z-smoke-cpu", "20261129T010000Z-smoke-cpu", "--runs", str(runs),
                 "--arm", "baseline", "--out", str(tmp_path / "ids")]) == 0
    capsys.readouterr()
    # another matrix, an unknown arm, the same side twice: one clear error, exit 2
    other = build_run_dir(tmp_path / "other")
    RunStore(other).update_manifest(matrix=json.loads((other / "manifest.json").read_text())["matrix"]
                                    | {"name": "other"})
    assert main(["compare", str(a), str(other), "--out", str(tmp_path / "o")]) == 2
    assert "is matrix 'smoke-cpu'" in capsys.readouterr().err
    assert main(["compare", str(a), str(a), "--arm", "nope", "--out", str(tmp_path / "n")]) == 2
    assert "no arm 'nope'" in capsys.readouterr().err
    assert main(["compare", str(a), str(a), "--arm", "patched", "--out", str(tmp_path / "s")]) == 2
    assert "give different --label-a/--label-b" in capsys.readouterr().err
