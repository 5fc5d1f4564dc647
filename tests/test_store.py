"""The run directory: the store owns every path and refuses files of another schema."""

from __future__ import annotations

import json

import pytest

from suite.errors import SuiteError
from suite.plan import Job
from suite.records import SCHEMA_VERSION
from suite.store import RunStore


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


def test_a_stages_notes_are_declared_and_land_in_its_record(tmp_path):
    """What a stage says about a job is a type of its own: unknown fields are refused where the stage builds
    them, and the runner's write puts them in the record, read back typed (the client), None fields left out."""
    from pydantic import ValidationError

    from suite.records import ClientRecord, DeviceStates
    from suite.stages.latency.run import LatencyNotes
    from suite.stages.serve.run import ServeNotes
    from suite.stages.serve.warmup import WarmShape, WarmupRecord

    store = RunStore(tmp_path)
    job = _job()
    warm = WarmupRecord(shapes=[WarmShape(shape={"--max-concurrency": "4"}, prompts=8, concurrency=4, wall_s=1.5,
                                          completed=8)], prefix_cache_reset=True, wall_s=1.6)
    notes = ServeNotes(command=["vllm", "bench", "serve"], prefix_cache_reset=True,
                       client=ClientRecord(mode="persistent", wall_s=2.0, client_cpu_util=0.4), warmup=warm)
    rec = store.write_record(job, "ok", notes, seconds=2.5,
                             device=DeviceStates(before=[{"clocks.sm": "1980 MHz"}], after=None))
    raw = json.loads(store.record_path(job).read_text())
    assert raw["command"] == ["vllm", "bench", "serve"] and raw["prefix_cache_reset"] is True
    assert "sized" not in raw  # None: not written
    assert raw["warmup"]["shapes"][0]["concurrency"] == 4 and raw["warmup"]["wall_s"] == 1.6
    back = store.record(job)
    assert back is not None and back == rec
    assert back.client is not None and back.client.client_cpu_util == 0.4
    assert raw["device"]["before"] == [{"clocks.sm": "1980 MHz"}]  # nvidia-smi's own name, as earlier runs stored
    assert back.device is not None and back.device.before is not None
    assert back.device.before[0].clocks_sm == "1980 MHz"
    with pytest.raises(ValidationError, match="extra_forbidden"):
        LatencyNotes(command=["vllm"], dropped=["--port"])  # a misspelt field is an error, not a silent extra


def test_the_recorded_verdict_block_reads_as_the_verdict_spec_it_was_dumped_from(tmp_path):
    """The manifest's matrix keeps the declared primary test as the VerdictSpec the matrix held: dumped with the
    matrix, read back typed, and written back as the same JSON (a key the record left out stays out)."""
    from suite.matrix_load import parse_matrix
    from suite.records import PlanRecord, new_manifest
    from suite.verdict import VerdictSpec

    matrix = parse_matrix(
        "name: m\nmodel: {id: x}\nrepeats: auto\norder: abba\n"
        "verdict: {target_pct: 2.0, looks: [2, 4, 6], points: [isl8-osl4-c1-n4]}\n"
        "arms: {A: {vllm: '0.11.0'}, B: {vllm: '0.11.0'}}\n"
        "serve:\n  - {isl: 8, osl: 4, concurrency: [1], num_prompts: 4}\n")
    dump = matrix.model_dump(mode="json")
    store = RunStore(tmp_path)
    store.write_manifest(new_manifest("m.yaml", dump, PlanRecord()))
    stored = json.loads(store.manifest_path.read_text())["matrix"]["verdict"]
    assert stored == dump["verdict"]
    verdict = store.manifest().matrix.verdict
    assert isinstance(verdict, VerdictSpec) and verdict == matrix.verdict
    assert verdict.points == ("isl8-osl4-c1-n4",) and verdict.looks == (2, 4, 6)

    older = {"max_rounds": 4}  # a record without the keys a later suite declares
    store.update_manifest(matrix=store.manifest().matrix.model_dump(mode="json", exclude_unset=True)
                          | {"verdict": older})
    assert store.manifest().matrix.verdict.looks == (2, 4)
    assert json.loads(store.manifest_path.read_text())["matrix"]["verdict"] == {"looks": [2, 4]}  # as it reads


def test_results_and_reports_get_the_mode_a_plain_open_would(tmp_path):
    """Atomic writes go through mkstemp, whose 0600 left the H100 run's reports (2026-12-05) and every result
    unreadable to a team's other users on a shared filesystem: the file gets 0666 less the umask, as open()."""
    import os
    import stat

    from suite.store import atomic_write_json, atomic_write_text, umask

    before = os.umask(0o027)
    try:
        assert umask() == 0o027
        atomic_write_text(tmp_path / "report.md", "# r\n")
        atomic_write_json(tmp_path / "rep-0.json", {"a": 1})
        os.umask(0o002)
        atomic_write_text(tmp_path / "report.md", "# r again\n")  # replaced: the new file's mode
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "rep-0.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o664
    assert (tmp_path / "report.md").read_text() == "# r again\n" and not list(tmp_path.glob(".*.tmp"))
