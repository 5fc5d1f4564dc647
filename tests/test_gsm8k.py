"""The synthetic GSM8K-format generator: format, arithmetic, determinism, labelling."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from suite.fixtures.gsm8k import (
    MANIFEST,
    SYNTHETIC_MARKER,
    answer_value,
    is_synthetic_dataset,
    synthetic_problems,
    write_synthetic_gsm8k,
)
from suite.stages.accuracy.run import lm_eval_task_yaml

CALC = re.compile(r"<<([^=>]+)=(-?\d+)>>(-?\d+)")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_files_have_gsm8k_fields_and_counts(tmp_path: Path) -> None:
    out = write_synthetic_gsm8k(tmp_path / "d", n_test=30, n_train=12, seed=3)
    assert out == tmp_path / "d"
    test, train = _rows(out / "test.jsonl"), _rows(out / "train.jsonl")
    assert (len(test), len(train)) == (30, 12)
    for row in test + train:
        assert set(row) == {"question", "answer"}
        assert row["question"].endswith("?")
        assert re.search(r"\n#### -?\d+$", row["answer"])


def test_worked_steps_are_correct_arithmetic(tmp_path: Path) -> None:
    for row in synthetic_problems(120, seed=11):
        steps = CALC.findall(row["answer"])
        assert len(steps) >= 2
        for expr, value, shown in steps:
            assert re.fullmatch(r"[\d+\-*/]+", expr)
            assert eval(expr) == int(value) == int(shown)  # noqa: S307 - digits and operators only
        assert answer_value(row["answer"]) == steps[-1][1]
        assert int(answer_value(row["answer"])) >= 0


def test_lm_eval_filters_extract_the_answer() -> None:
    """lm-eval's own gsm8k.yaml regexes find the reference number in our answers."""
    conf = yaml.safe_load(lm_eval_task_yaml("gsm8k").read_text())
    regexes = {f["name"]: f["filter"][0]["regex_pattern"] for f in conf["filter_list"]}
    for row in synthetic_problems(30, seed=1):
        strict = re.findall(regexes["strict-match"], row["answer"])
        assert strict and strict[0] == answer_value(row["answer"])
        flexible = [m[0] or m[1] for m in re.findall(regexes["flexible-extract"], row["answer"])]
        assert flexible[-1] == answer_value(row["answer"])


def test_deterministic_per_seed_and_train_test_disjoint(tmp_path: Path) -> None:
    a = write_synthetic_gsm8k(tmp_path / "a", n_test=25, n_train=25, seed=7)
    b = write_synthetic_gsm8k(tmp_path / "b", n_test=25, n_train=25, seed=7)
    c = write_synthetic_gsm8k(tmp_path / "c", n_test=25, n_train=25, seed=8)
    for name in ("test.jsonl", "train.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() != (c / name).read_bytes()
    test_q = {r["question"] for r in _rows(a / "test.jsonl")}
    train_q = {r["question"] for r in _rows(a / "train.jsonl")}
    assert len(test_q) == 25 and len(train_q) == 25 and not test_q & train_q


def test_labelled_synthetic(tmp_path: Path) -> None:
    out = write_synthetic_gsm8k(tmp_path, n_test=5, n_train=2, seed=0)
    assert is_synthetic_dataset(out)
    assert "NOT the GSM8K dataset" in (out / SYNTHETIC_MARKER).read_text()
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["synthetic"] is True and manifest["seed"] == 0 and manifest["n_test"] == 5
    assert not is_synthetic_dataset(tmp_path / "elsewhere")


def test_rejects_bad_counts(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_synthetic_gsm8k(tmp_path, n_test=0)
