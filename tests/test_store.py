"""The run directory: the store owns every path and refuses files of another schema."""

from __future__ import annotations

import json

import pytest

from suite.errors import SuiteError
from suite.plan import Job
from suite.store import SCHEMA_VERSION, RunStore


def _job() -> Job:
    return Job(kind="serve", arm="baseline", session=0, point="isl8-osl4-c1-n1", repeat=1, tag="drift",
               params={"isl": 8, "osl": 4, "concurrency": 1, "num_prompts": 1, "random_range_ratio": 0.0,
                       "request_rate": None, "num_warmups": 0, "seed": 0}, hash="abc")


def test_open_refuses_another_schema(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(SuiteError, match=rf"schema {SCHEMA_VERSION + 1}.*reads schema {SCHEMA_VERSION}"):
        RunStore.open(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    assert RunStore.open(tmp_path).root == tmp_path


def test_record_of_another_schema_is_not_done(tmp_path):
    store = RunStore(tmp_path)
    job = _job()
    store.write_record(job, "ok")
    store.result_path(job).write_text("{}")
    assert store.is_done(job) and len(store.records()) == 1
    rec = json.loads(store.record_path(job).read_text())
    store.record_path(job).write_text(json.dumps(rec | {"schema_version": SCHEMA_VERSION - 1}))
    assert not store.is_done(job) and store.records() == []


def test_paths_keep_the_tag(tmp_path):
    store = RunStore(tmp_path)
    job = _job()
    assert store.result_path(job) == tmp_path / "baseline" / "serve" / "isl8-osl4-c1-n1" / "rep-1-drift.json"
    assert store.record_path(job).name == "rep-1-drift.job.json"
    assert store.session_dir("baseline", "profile", 2) == tmp_path / "baseline" / "profile" / "session-2"
