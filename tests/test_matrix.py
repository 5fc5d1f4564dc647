from __future__ import annotations

from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix import load_matrix, parse_matrix
from tests.conftest import REPO, run_suite

MINIMAL = """\
name: t
model:
  id: some/model
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [a, -b]}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
"""


def test_minimal_matrix_defaults_and_patch_refs():
    m = parse_matrix(MINIMAL)
    assert m.baseline_arm == "baseline"
    assert [(p.name, p.reverse) for p in m.arms["patched"].patches] == [("a", False), ("b", True)]
    assert m.serve[0].prompts_for(4) == 12
    assert m.serve[0].prompts_for(1) == 3
    assert m.runtime.kind == "local"


@pytest.mark.parametrize("path", sorted((REPO / "matrices").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_matrices_validate(path: Path):
    m = load_matrix(path)
    assert m.arms


def test_unknown_field_names_file_line_and_field(tmp_path):
    bad = MINIMAL.replace("  - {isl: 128", "  - {isl: 128, colour: red")
    f = tmp_path / "m.yaml"
    f.write_text(bad)
    with pytest.raises(MatrixError) as exc:
        load_matrix(f)
    assert f"{f}:8: serve[0].colour: unknown field" in str(exc.value)


def test_wrong_type_points_at_the_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MINIMAL.replace('baseline: {vllm: "0.32.0"}', "baseline: {vllm: [1]}"))
    with pytest.raises(MatrixError, match=rf"{f}:5: arms.baseline.vllm: "):
        load_matrix(f)


def test_yaml_syntax_error_has_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MINIMAL + "serve: [\n")
    with pytest.raises(MatrixError, match=rf"{f}:\d+: YAML syntax"):
        load_matrix(f)


def test_impossible_point_is_refused():
    with pytest.raises(MatrixError, match="exceeds model.max_model_len"):
        parse_matrix(MINIMAL.replace("isl: 128", "isl: 4000"))


@pytest.mark.parametrize("value", ["0", "-3", "'x3'", "'3y'"])
def test_bad_num_prompts(value):
    with pytest.raises(MatrixError, match="num_prompts"):
        parse_matrix(MINIMAL.replace("num_prompts: 3x", f"num_prompts: {value}"))


def test_unknown_baseline_and_empty_matrix():
    with pytest.raises(MatrixError, match="baseline 'nope' is not one of the arms"):
        parse_matrix(MINIMAL + "baseline: nope\n")
    with pytest.raises(MatrixError, match="nothing to measure"):
        parse_matrix(MINIMAL.split("serve:")[0])


def test_cli_validate_reports_file_line_without_traceback(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(MINIMAL.replace("concurrency: [1, 4]", "concurrency: [1, 1]"))
    proc = run_suite("validate", str(f))
    assert proc.returncode == 2
    assert f"{f}:8: serve[0].concurrency: concurrency values must be distinct" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = run_suite("validate", str(REPO / "matrices" / "smoke-cpu.yaml"))
    assert ok.returncode == 0, ok.stderr
