"""Property tests of the matrix loader: whatever the text, it loads or raises MatrixError with `file:line:`.

Never a traceback: not for random text, random bytes in a file, YAML-shaped junk, valid matrices with one
field made wrong, or unknown keys anywhere. Bounded example counts keep the module well under 20 s.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from suite.errors import MatrixError
from suite.matrix import Matrix
from suite.matrix_load import load_matrix, parse_matrix

SRC = "m.yaml"
LINE = re.compile(rf"^{re.escape(SRC)}:(\d+): \S")
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID = {
    "name": "props",
    "model": {"id": "some/model"},
    "arms": {"baseline": {"vllm": "0.32.0"}, "patched": {"vllm": "0.32.0", "patches": ["a", "-b"]}},
    "serve": [{"isl": 128, "osl": 32, "concurrency": [1, 4], "num_prompts": "3x"}],
    "repeats": 2,
    "serve_args": ["--max-model-len", "2048"],  # last: its list items follow the points' in the dump
}


def outcome(text: str, source: str = SRC) -> Matrix | MatrixError:
    """Load; only a Matrix or a MatrixError may come out (anything else fails the test with its traceback)."""
    try:
        return parse_matrix(text, source=source)
    except MatrixError as exc:
        return exc


def assert_located(exc: MatrixError, text: str) -> list[int]:
    msg = str(exc)
    assert msg, "empty error message"
    first = LINE.match(msg)
    assert first, f"error does not start with {SRC}:LINE: -> {msg!r}"
    lines = [int(m.group(1)) for m in re.finditer(rf"^{re.escape(SRC)}:(\d+): ", msg, re.M)]
    n_lines = text.count("\n") + 1
    for n in lines:
        assert 1 <= n <= n_lines + 1, (n, n_lines, msg)
    return lines


@FAST
@given(st.text(max_size=400))
@example("[" * 600 + "]" * 600)
@example("a: " + "{a: " * 600 + "}" * 600)
@example("ok: 1\n\x00")
@example("--- a\n--- b\n")
@example("? [a]\n: b")
@example("serve: &x [*x]\nname: a")
@example("name: x\x85y")
def test_any_text_loads_or_is_a_located_error(text):
    result = outcome(text)
    if isinstance(result, MatrixError):
        assert_located(result, text)
    else:
        assert isinstance(result, Matrix)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=300))
@example(b"name: x\n\xff\xfe\n")
@example(b"\x00\x01\x02")
def test_any_file_bytes_load_or_are_a_located_error(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.yaml"
        path.write_bytes(data)
        try:
            load_matrix(path)
        except MatrixError as exc:
            assert re.match(rf"^{re.escape(str(path))}:\d+: \S", str(exc)), str(exc)


# YAML-shaped junk: nested mappings and lists of scalars, with keys from the real schema mixed in
KEYS = st.sampled_from(["name", "model", "id", "arms", "baseline", "vllm", "patches", "serve", "isl", "osl",
                        "concurrency", "num_prompts", "runtime", "kind", "port", "repeats", "env", "order",
                        "accuracy", "latency", "serve_args", "max_model_len", "zzz"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(KEYS, inner, max_size=5)), max_leaves=25)


@FAST
@given(st.dictionaries(KEYS, JUNK, max_size=8), st.sampled_from([None, True]))
def test_yaml_shaped_junk_loads_or_is_a_located_error(data, flow):
    text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True)
    result = outcome(text)
    if isinstance(result, MatrixError):
        assert_located(result, text)


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False)


# Paths into VALID and values of the wrong kind for them
FIELDS = [("name",), ("model",), ("model", "id"), ("serve_args",), ("serve_args", 1), ("arms",), ("arms", "baseline"),
          ("arms", "baseline", "vllm"), ("arms", "patched", "patches"), ("serve",), ("serve", 0),
          ("serve", 0, "isl"), ("serve", 0, "concurrency"), ("serve", 0, "num_prompts"), ("repeats",)]
WRONG = st.one_of(st.none(), st.integers(-5, 0), st.text(max_size=6), st.lists(st.integers(-2, 2), max_size=3),
                  st.dictionaries(st.text(max_size=4), st.integers(), max_size=2), st.floats(allow_nan=False))


def _set(data, path, value):
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


@FAST
@given(st.sampled_from(FIELDS), WRONG)
def test_one_wrong_field_is_reported_at_its_line(path, value):
    import copy

    data = copy.deepcopy(VALID)
    _set(data, path, value)
    text = _dump(data)
    result = outcome(text)
    if isinstance(result, MatrixError):
        assert_located(result, text)


@FAST
@given(st.sampled_from([(), ("model",), ("arms", "baseline"), ("serve", 0), ("runtime",)]),
       st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True))
@example((), "no")  # YAML 1.1 reads a bare no as false: the dump quotes the key ('no': 1)
def test_unknown_key_is_reported_at_its_own_line(where, key):
    import copy

    data = copy.deepcopy(VALID)
    data["runtime"] = {"kind": "local"}
    node = data
    for part in where:
        node = node[part]
    if key in node or (not where and key in Matrix.model_fields) or key in _fields_of(where):
        return
    node[key] = 1
    text = _dump(data)
    result = outcome(text)
    assert isinstance(result, MatrixError), text
    want = [i + 1 for i, line in enumerate(text.splitlines()) if re.match(rf"^\s*(- )?'?{key}'?: 1$", line)]
    assert len(want) == 1, text
    assert f"{SRC}:{want[0]}: " in str(result) and "unknown field" in str(result), (str(result), text)


def _fields_of(where: tuple) -> set[str]:
    from suite.matrix_blocks import ArmSpec, ModelSpec, RuntimeSpec
    from suite.matrix_jobs import ServePoint

    model = {(): Matrix, ("model",): ModelSpec, ("arms", "baseline"): ArmSpec, ("serve", 0): ServePoint,
             ("runtime",): RuntimeSpec}[where]
    return set(model.model_fields)


@FAST
@given(st.integers(1, 4096), st.integers(1, 4096), st.integers(16, 8192), st.integers(0, 3))
def test_point_feasibility_is_decided_and_located(isl, osl, max_len, index):
    import copy

    data = copy.deepcopy(VALID)
    data["serve_args"] = ["--max-model-len", str(max_len)]
    data["serve"] = [{"isl": 1, "osl": 1, "concurrency": 1} for _ in range(index)]
    data["serve"].append({"isl": isl, "osl": osl, "concurrency": [1]})
    text = _dump(data)
    result = outcome(text)
    if isl + osl <= max_len:
        assert isinstance(result, Matrix), result
        assert result.serve[index].isl == isl
    else:
        assert isinstance(result, MatrixError)
        lines = text.splitlines()
        point_line = [i + 1 for i, line in enumerate(lines) if line.startswith("- ")][index]
        assert str(result).startswith(f"{SRC}:{point_line}: serve[{index}]: isl + osl = {isl + osl} exceeds"), \
            (str(result), text)
