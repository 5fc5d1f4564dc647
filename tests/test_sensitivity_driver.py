"""The sensitivity benchmark's driver (benchmarks/sensitivity/run.py): the two-arm matrix it derives from the
demo's is one the suite accepts and keeps the demo's design, and `--tally` reads a stored run's words (it
was broken for a while once the manifest was typed, and nothing noticed)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

from suite.matrix_load import load_matrix
from tests.conftest import REPO, load_script
from tests.test_evidence import EVIDENCE, unpack


def driver() -> ModuleType:
    return load_script(REPO / "benchmarks" / "sensitivity" / "run.py", "sensitivity_run")


def test_the_derived_matrix_is_the_demos_design_with_two_arms(tmp_path):
    raw = driver().derive_matrix(REPO / "matrices" / "smoke-cpu.yaml", 150, None)
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    m = load_matrix(path)
    demo = load_matrix(REPO / "matrices" / "smoke-cpu.yaml")
    assert list(m.arms) == ["baseline", "gate-150us"]
    assert m.arms["gate-150us"].env == {"SUITE_GATE_DELAY_US": "150"}
    assert [p.name for p in m.arms["gate-150us"].patches] == ["synthetic-gate-delay"]
    assert (m.order, m.blocks, m.verdict, m.serve_args) == (demo.order, demo.blocks, demo.verdict, demo.serve_args)
    assert not m.aa and m.accuracy is None
    assert Path(m.model.id).is_absolute()


def test_tally_reads_a_stored_runs_words(tmp_path):
    run = unpack(EVIDENCE / "h200-gemma4-quiet8-20261202", tmp_path / "h200-gemma4-quiet8-20261202")
    rows = {r["candidate"]: r for r in driver().outcome_of(run)}
    # two rounds (1 df): the composite at its share of alpha no longer excludes 0, nor does any point alone
    assert rows["ll-bf16"]["outcome"] == "INCONCLUSIVE" and rows["ll-bf16"]["estimate_pct"] > 0
    assert rows["slowed-gate"]["outcome"] == "REGRESSION" and rows["slowed-gate"]["delay_us"] == 1.5  # µs, not a whole number
    assert "baseline.aa (A/A control)" in rows


def test_tally_of_a_path_without_runs_is_an_error_not_an_empty_table(tmp_path, monkeypatch, capsys):
    """A mistyped run directory used to print an empty table and exit 0."""
    run = driver()
    for arg, why in ((tmp_path / "nowhere", "no such directory"), (tmp_path, "holds no run")):
        monkeypatch.setattr("sys.argv", ["run.py", "--tally", str(arg)])
        with pytest.raises(SystemExit) as exc:
            run.main()
        assert exc.value.code == 2 and why in capsys.readouterr().err


def test_redecide_reproduces_each_runs_own_words_and_says_where_a_design_needs_more(tmp_path):
    """`--tally … --spending S` re-decides a stored run at its matrix's looks under another alpha spending, through
    the runner's own look (suite.sequential.evaluate_look). Under the spending it ran with it must give back the
    words and stopping points the runner wrote; where a design would have gone past the stored rounds it says so
    instead of deciding on rounds that were never measured."""
    run = driver()
    for name, word, sets in (("h100-abba-20261205", "INCONCLUSIVE", 4),
                             ("h200-interleaved-precompile-20261205", "IMPROVEMENT", 3)):
        root = unpack(EVIDENCE / name, tmp_path / name)
        (row,) = run.redecide(root, "obrien-fleming")
        assert (row["candidate"], row["outcome"], row["rounds"]) == ("ll-bf16", word, sets), name
        (pocock,) = run.redecide(root, "pocock")
        if word == "IMPROVEMENT":  # decided at its first look: Pocock's first boundary is the looser one
            assert (pocock["outcome"], pocock["rounds"]) == (word, sets), name
    # the runner stopped this one on the composite alone (before the per-point family): after 2 rounds its points
    # are undecided, so the family's stopping rule would have gone on
    abba = unpack(EVIDENCE / "h200-abba-20261203", tmp_path / "h200-abba-20261203")
    (row,) = run.redecide(abba, "obrien-fleming")
    assert (row["outcome"], row["rounds"]) == ("needs more sets", None)
    cut = unpack(EVIDENCE / "h200-interleaved-20261203", tmp_path / "cut")  # stopped by hand after its look at 2
    (row,) = run.redecide(cut, "obrien-fleming")
    assert (row["outcome"], row["rounds"]) == ("needs more sets", None)
    fixed = unpack(EVIDENCE / "h200-probe-20261201", tmp_path / "fixed")  # repeats: 1, no looks taken
    assert {r["outcome"] for r in run.redecide(fixed, "pocock")} == {"not a sequential run"}
