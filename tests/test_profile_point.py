"""The profile block names its point as the report names one (``point: "1024/64 c4"``): parsing, the retired
fields' messages (isl, osl, concurrency, seed, warmup_prompts), the same job params and commands from a migrated
matrix as from the old one, and stored runs whose records hold the old params still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_jobs import DEFAULT_PROFILE_POINT, PointLabel, ProfileSpec
from suite.matrix_load import parse_matrix
from suite.plan import build_plan
from suite.records import JobRecord
from suite.stages.profile.run import bench_params
from suite.stages.profile.spec import ProfileParams, profile_points
from suite.stages.serve.run import serve_command
from tests.conftest import REPO, load_script

HEAD = "name: m\nmodel: {id: x}\narms: {a: {vllm: '0.32.0'}, b: {vllm: '0.32.0'}}\n"
FAMILIES = ProfileSpec().families


def matrix(profile: str):
    return parse_matrix(HEAD + profile)


def error(profile: str) -> list[str]:
    with pytest.raises(MatrixError) as exc:
        matrix(profile)
    return str(exc.value).splitlines()


# ------------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize("written, point", [
    ('"128/64 c4"', PointLabel(128, 64, 4)),
    ("1024/64 c8", PointLabel(1024, 64, 8)),  # YAML reads it as text unquoted too
    ('" 32/16 c1 "', PointLabel(32, 16, 1)),
    ('"0128/064 c04"', PointLabel(128, 64, 4)),
])
def test_a_point_is_written_as_the_report_names_one(written, point):
    spec = matrix(f"profile: {{point: {written}}}\n").profile
    assert spec.shape == point and spec.point == str(point)  # kept as the report writes it


def test_the_label_is_the_reports_own():
    """The report's point label (`suite.report_verdict.point_labels`, a run of several ISL/OSL) is the same
    text, read back as the same point."""
    from types import SimpleNamespace

    from suite.report_verdict import point_labels

    points = {pid: SimpleNamespace(params=SimpleNamespace(isl=i, osl=o, concurrency=c))
              for pid, (i, o, c) in {"p1": (1024, 64, 4), "p2": (128, 64, 8)}.items()}
    labels = point_labels(SimpleNamespace(points=points))
    assert labels == {"p1": "1024/64 c4", "p2": "128/64 c8"}
    assert [PointLabel.parse(t) for t in labels.values()] == [PointLabel(1024, 64, 4), PointLabel(128, 64, 8)]


def test_a_matrix_without_a_point_profiles_the_old_default():
    assert matrix("profile: {}\n").profile.point == DEFAULT_PROFILE_POINT == "128/64 c4"


def test_a_point_need_not_be_a_serve_point():
    m = matrix("serve:\n  - {isl: 128, osl: 64, concurrency: 8}\nprofile: {point: 1024/64 c4}\n")
    assert [p.model_dump(include={"isl", "osl", "concurrency"}) for _, p in profile_points(m)] == [
        {"isl": 1024, "osl": 64, "concurrency": 4}]


WHAT = ('is not a point: write it as the report names one, "ISL/OSL cC" (e.g. "128/64 c4": the input length / '
        'the output length, then c and the concurrency)')


@pytest.mark.parametrize("written, said", [
    ('"128/64"', f'"128/64" {WHAT}'),
    ('"128x64 c4"', f'"128x64 c4" {WHAT}'),
    ('"128/64 C4"', f'"128/64 C4" {WHAT}'),
    ('"128 / 64 c4"', f'"128 / 64 c4" {WHAT}'),
    ('"c4 128/64"', f'"c4 128/64" {WHAT}'),
    ("128", f"128 (not text) {WHAT}"),
    ("[128, 64, 4]", f"[128, 64, 4] (not text) {WHAT}"),
    ('"0/64 c4"', '"0/64 c4": ISL must be > 0'),
    ('"128/0 c4"', '"128/0 c4": OSL must be > 0'),
    ('"128/64 c0"', '"128/64 c0": the concurrency must be > 0'),
    ('"128/64 c100000"', '"128/64 c100000": the concurrency 100,000 is beyond the limit 65,536'),
])
def test_a_bad_point_is_refused_at_its_line_saying_what_to_write(written, said):
    assert error(f"profile:\n  num_prompts: 8\n  point: {written}\n") == [f"<matrix>:6: profile.point: {said}"]


# ------------------------------------------------------------------------------------------------ retired


def test_the_old_point_fields_say_the_point_to_write():
    said = ('retired: the profiled point is one field, written as the report names a point: write point: '
            '"1024/64 c8" in place of isl, osl and concurrency')
    assert error("profile:\n  isl: 1024\n  osl: 64\n  concurrency: 8\n") == [
        f"<matrix>:5: profile.isl: {said}", f"<matrix>:6: profile.osl: {said}",
        f"<matrix>:7: profile.concurrency: {said}"]


@pytest.mark.parametrize("given, said", [
    ("{osl: 32}", '"128/32 c4" in place of osl (isl 128 and concurrency 4: the defaults it had)'),
    ("{concurrency: 1, isl: 256}", '"256/64 c1" in place of isl and concurrency (osl 64: the defaults it had)'),
])
def test_one_old_point_field_alone_says_the_defaults_that_complete_it(given, said):
    lines = error(f"profile: {given}\n")
    assert lines and all(line.endswith(f"write point: {said}") for line in lines), lines


@pytest.mark.parametrize("seed, said", [
    (0, ""),
    (7, " (this matrix's seed 7 is no longer taken: the window uses seed 0)"),
])
def test_the_old_seed_says_the_window_uses_seed_0(seed, said):
    assert error(f'profile: {{point: "128/64 c4", seed: {seed}}}\n') == [
        "<matrix>:4: profile.seed: retired: the profiled window's prompts use seed 0, the same requests for every "
        f"arm: delete it{said}"]


@pytest.mark.parametrize("block, said", [
    ('{point: "32/16 c4", warmup_prompts: 4}', "(4 requests at concurrency 4): delete it"),
    ('{point: "32/16 c4", warmup_prompts: 2}', "(4 requests at concurrency 4): delete it (this matrix's 2 requests "
                                               "become 4)"),
    ("{warmup_prompts: 0}", "(4 requests at concurrency 4): delete it (a window without a warm-up is no longer "
                            "taken)"),
    ('{point: "32/16 c8", warmup_prompts: 8}', "(8 requests at concurrency 8): delete it"),
    ("{concurrency: 8, warmup_prompts: 3}", "(8 requests at concurrency 8): delete it (this matrix's 3 requests "
                                            "become 8)"),
])
def test_the_old_warmup_count_says_the_warmup_is_one_request_per_slot(block, said):
    lines = [line for line in error(f"profile: {block}\n") if ".warmup_prompts: " in line]
    assert lines == ["<matrix>:4: profile.warmup_prompts: retired: the warm-up before the profiled window is one "
                     f"request per concurrency slot, at the window's shape {said}"]


# ------------------------------------------------------------------------------------------------ same jobs

# old profile blocks, what their messages say to write, and the params the old ProfileSpec dumped (the job's
# params and so its hash: num_prompts and warmup_prompts None, the concurrency)
MIGRATED = [
    ("{isl: 128, osl: 64, concurrency: 1}", '{point: "128/64 c1"}',
     {"isl": 128, "osl": 64, "concurrency": 1, "num_prompts": None}),
    ("{isl: 1024, osl: 64, concurrency: 4}", '{point: "1024/64 c4"}',
     {"isl": 1024, "osl": 64, "concurrency": 4, "num_prompts": None}),
    ("{}", "{}", {"isl": 128, "osl": 64, "concurrency": 4, "num_prompts": None}),
    ("{osl: 16, num_prompts: 12, seed: 0, warmup_prompts: 4}", '{point: "128/16 c4", num_prompts: 12}',
     {"isl": 128, "osl": 16, "concurrency": 4, "num_prompts": 12}),
]


@pytest.mark.parametrize("old, new, dumped", MIGRATED)
def test_a_migrated_matrix_plans_the_old_params_commands_and_hashes(old, new, dumped):
    if old != "{}":  # the old block is refused saying the point that the new one writes
        point = f'"{dumped["isl"]}/{dumped["osl"]} c{dumped["concurrency"]}"'
        said = [line for line in error(f"profile: {old}\n") if "write point:" in line]
        assert said and all(f"write point: {point} in place of" in line for line in said)
        assert f"point: {point}" in new
    plan = build_plan(matrix(f"profile: {new}\n"))
    jobs = [j for j in plan.jobs if j.kind == "profile"]
    assert [j.arm for j in jobs] == ["a", "b"] and {j.point for j in jobs} == {"decode-window"}
    for job in jobs:
        assert isinstance(job.params, ProfileParams)
        # the old ProfileSpec's dump, key for key: the job hash (which covers it) is the old one
        assert job.params.model_dump(mode="json") == {**dumped, "warmup_prompts": None, "seed": 0,
                                                      "families": FAMILIES}
        params, c = job.params, dumped["concurrency"]
        assert (params.warmup_prompts_or_default, params.num_prompts_or_default) == (c, dumped["num_prompts"] or c)
        bench = bench_params(params, 5)
        assert (bench.isl, bench.osl, bench.concurrency, bench.num_prompts, bench.seed, bench.num_warmups,
                bench.request_rate, bench.random_range_ratio) == (dumped["isl"], dumped["osl"], c, 5, 0, 0, None, 0)


# ------------------------------------------------------------------------------------------------ stored runs

STAGES = REPO / "docs" / "evidence" / "h200-stages-20261202"  # the stored run with a profile job per arm


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    unpack = load_script(REPO / "scripts" / "evidence_reports.py", "evidence_reports").unpack
    return unpack(STAGES, tmp_path_factory.mktemp("stages") / STAGES.name)


def test_a_stored_profile_record_loads_as_it_was_written(stored):
    for arm in ("baseline", "ll-bf16"):
        raw = json.loads((stored / arm / "profile" / "decode-window" / "rep-0.job.json").read_text())
        record = JobRecord.model_validate(raw)
        assert isinstance(record.job.params, ProfileParams)
        assert record.job.params.model_dump(mode="json") == raw["job"]["params"]  # every field, as stored
        assert record.job.model_dump(mode="json") == raw["job"]


def test_the_stored_runs_matrix_migrated_makes_its_params_and_commands(stored):
    """The stored run's profile block (isl 128, osl 64, concurrency 1, seed 0, no counts) written as
    ``point: "128/64 c1"``: the same params as its records hold, and the same bench flags as its warm-up and
    window ran with."""
    manifest = json.loads((stored / "manifest.json").read_text())
    old = manifest["matrix"]["profile"]
    assert (old["seed"], old["warmup_prompts"], old["num_prompts"]) == (0, None, None)
    point = PointLabel(old["isl"], old["osl"], old["concurrency"])
    m = matrix(f'profile: {{point: "{point}"}}\n')
    [(_, params)] = profile_points(m)
    raw = json.loads((stored / "baseline" / "profile" / "decode-window" / "rep-0.job.json").read_text())
    assert params == JobRecord.model_validate(raw).job.params
    for phase, n, ran in zip(("warmup", "window"), (params.warmup_prompts_or_default, params.num_prompts_or_default),
                             raw["commands"], strict=True):
        cmd = serve_command(vllm="vllm", base_url="http://h", served_name="s", tokenizer="t",
                            params=bench_params(params, n), result_dir=Path("r"), result_filename="f")
        flags = cmd[cmd.index("--dataset-name"):cmd.index("--result-dir")]
        assert ran[ran.index("--dataset-name"):ran.index("--result-dir")] == flags, phase


def test_an_older_record_with_its_own_seed_and_warmup_count_still_loads():
    """Records written while the block had a seed and a warm-up count keep them (their hash covers them)."""
    params = {"isl": 32, "osl": 16, "concurrency": 4, "num_prompts": None, "warmup_prompts": 2, "seed": 7,
              "families": {"gate delay": "suite_gate_delay"}}
    job = JobRecord.model_validate({"schema_version": 1, "hash": "h", "status": "ok", "job": {
        "kind": "profile", "arm": "a", "session": 1, "point": "decode-window", "params": params, "hash": "h"}}).job
    assert job.params.model_dump(mode="json") == params
    assert (job.params.warmup_prompts_or_default, bench_params(job.params, 4).seed) == (2, 7)
