"""The model an arm serves (`suite.served_model.ServedModel`): vLLM's model flags read from serve_args as vLLM
reads them, the defaults the suite supplies, the server's argv, job hashes that did not move when the flags left
the model block, and run records of either form read back the same way."""

from __future__ import annotations

import pytest

from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.records import MatrixRecord
from suite.served_model import (
    DEFAULT_MAX_MODEL_LEN,
    ServedModel,
    flag_values,
    human_readable_int,
    map_flag_values,
    without_flags,
)
from suite.sessions import server_argv_tail


@pytest.mark.parametrize("args, want", [
    ([], None),
    (["--max-model-len", "4096"], ["4096"]),
    (["--max-model-len=4096"], ["4096"]),
    (["--max_model_len", "4096"], ["4096"]),
    (["--max_model_len=1k", "--dtype", "bfloat16", "--max-model-len", "2K"], ["2K"]),  # the last copy wins
    (["--max-model-len.x", "1"], None),  # a dotted JSON key is another argument
    (["--max-model-len"], []),  # no value: refused by the matrix
])
def test_a_flags_value_is_read_as_vllm_reads_it(args, want):
    assert flag_values(args, "--max-model-len") == want


def test_several_served_names_are_one_flag_and_the_first_is_the_clients():
    args = ["--served-model-name", "a", "b", "--dtype", "bfloat16"]
    assert flag_values(args, "--served-model-name") == ["a", "b"]
    model = ServedModel.resolve("org/m", args)
    assert model.served_name == "a" and model.tokenizer == "org/m"
    assert without_flags(args, ["--served-model-name"]) == ["--dtype", "bfloat16"]


@pytest.mark.parametrize("value, n", [("2048", 2048), ("4k", 4000), ("4K", 4096), ("25.6k", 25600), ("1m", 10**6),
                                      ("1M", 2**20)])
def test_human_readable_lengths_are_vllms(value, n):
    assert human_readable_int(value) == n


def test_the_defaults_are_the_suites_as_before():
    model = ServedModel.resolve("org/m", ["--dtype", "bfloat16"])
    assert (model.served_name, model.tokenizer, model.max_model_len, model.load_format, model.dummy) == (
        "org/m", "org/m", DEFAULT_MAX_MODEL_LEN, "auto", False)
    assert model.server_defaults() == (["--served-model-name", "org/m"], ["--max-model-len", "2048"])
    given = ServedModel.resolve("org/m", ["--served-model-name", "x", "--max-model-len", "4K", "--load-format",
                                          "DUMMY"])
    assert given.server_defaults() == ([], []) and given.max_model_len == 4096 and given.dummy
    assert given.model_args() == ["--load-format", "dummy"]


def test_map_flag_values_rewrites_both_forms():
    args = ["--tokenizer", "./a", "--tokenizer=./b", "--dtype", "x"]
    assert map_flag_values(args, "--tokenizer", str.upper) == ["--tokenizer", "./A", "--tokenizer=./B", "--dtype", "x"]


MATRIX = """\
name: h
model: {id: org/model}
serve_args: [--dtype, bfloat16%s]
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", serve_args: [--max-num-seqs, "8"%s]}
serve:
  - {isl: 64, osl: 16, concurrency: [1], num_prompts: 8}
"""


def test_the_server_gets_each_model_flag_once():
    m = parse_matrix(MATRIX % ("", ""))
    plan = build_plan(m)
    assert server_argv_tail(m, "baseline", plan, 8000) == [
        "org/model", "--served-model-name", "org/model", "--host", "127.0.0.1", "--port", "8000",
        "--max-model-len", "2048", "--dtype", "bfloat16"]
    m = parse_matrix(MATRIX % (", --max-model-len, 4k, --served-model-name, s", ""))
    tail = server_argv_tail(m, "patched", build_plan(m), 8000)
    assert tail == ["org/model", "--host", "127.0.0.1", "--port", "8000", "--dtype", "bfloat16", "--max-model-len",
                    "4k", "--served-model-name", "s", "--max-num-seqs", "8"]


def test_job_hashes_are_those_of_the_model_blocks_old_fields():
    """Hashes the suite planned for these matrices while the flags were the model block's fields (served_name:
    served, tokenizer: org/tok, max_model_len: 4096, load_format: dummy; an arm's own model with served_name o,
    max_model_len 256): written with the flags in serve_args, the jobs hash the same, so such a run resumes."""
    m = parse_matrix(MATRIX % (", --served-model-name, served, --tokenizer, org/tok, --max-model-len, '4096', "
                               "--load-format, dummy", ""))
    assert sorted({(j.arm, j.hash) for j in build_plan(m).jobs}) == [("baseline", "9225f99e4df38f81"),
                                                                     ("patched", "3a986ae323a4613e")]
    own = parse_matrix("""\
name: h
model: {id: org/model}
serve_args: [--max-model-len, "512"]
arms:
  baseline: {vllm: "0.32.0"}
  own: {vllm: "0.32.0", model: {id: org/other}, serve_args: [--served-model-name, o, --max-model-len, "256"]}
serve:
  - {isl: 64, osl: 16, concurrency: [1], num_prompts: 8}
""")
    assert sorted({(j.arm, j.hash) for j in build_plan(own).jobs}) == [("baseline", "0a3fe6b6ef56967d"),
                                                                       ("own", "729d5e71984b3328")]
    # an arm's own length hashes with that arm only
    longer = parse_matrix(MATRIX % ("", ', --max-model-len, "4096"'))
    plain = parse_matrix(MATRIX % ("", ""))
    hashes = {name: {j.arm: j.hash for j in build_plan(x).jobs} for name, x in (("longer", longer), ("plain", plain))}
    assert hashes["longer"]["baseline"] == hashes["plain"]["baseline"]
    assert hashes["longer"]["patched"] != hashes["plain"]["patched"]


def test_records_of_either_form_read_as_the_same_model():
    """A run recorded before the flags moved (the model block's fields) and one after (serve_args) read back as
    the same served model; the A/A arm serves the baseline's."""
    old = MatrixRecord.model_validate({
        "model": {"id": "org/m", "served_name": "s", "tokenizer": "org/tok", "max_model_len": 4096,
                  "load_format": "dummy"},
        "serve_args": ["--dtype", "bfloat16"], "arms": {"baseline": {}, "own": {"model": {"id": "org/o"}}}})
    new = MatrixRecord.model_validate({
        "model": {"id": "org/m"},
        "serve_args": ["--dtype", "bfloat16", "--served-model-name", "s", "--tokenizer", "org/tok",
                       "--max-model-len", "4096", "--load-format", "dummy"],
        "arms": {"baseline": {"serve_args": []}, "own": {"model": {"id": "org/o"}, "serve_args": ["--tokenizer",
                                                                                                   "org/o"]}}})
    for record in (old, new):
        base = record.model_of("baseline")
        assert (base.id, base.served_name, base.tokenizer, base.max_model_len, base.dummy) == (
            "org/m", "s", "org/tok", 4096, True)
        assert record.model_of("baseline.aa") == base and record.model_of() == base
        assert record.model_of("own").id == "org/o" and record.model_of("own").tokenizer == "org/o"
    # a record is read as it is: a length vLLM would have refused keeps the default
    odd = MatrixRecord.model_validate({"model": {"id": "m"}, "serve_args": ["--max-model-len", "auto"]})
    assert odd.model_of().max_model_len == DEFAULT_MAX_MODEL_LEN
    # the old fields ride back out exactly as they were read (the report's resolved matrix)
    assert old.model_dump(mode="json", exclude_unset=True)["model"] == {
        "id": "org/m", "served_name": "s", "tokenizer": "org/tok", "max_model_len": 4096, "load_format": "dummy"}
