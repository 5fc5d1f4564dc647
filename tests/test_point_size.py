"""A serving point's size is one field, num_prompts: a count, a multiple of its concurrency ('3x') or seconds ('60s':
sized by time, what duration_s was). The plan's jobs of a point sized by time are the ones duration_s planned."""

from __future__ import annotations

import pytest

from suite.errors import MatrixError
from suite.estimate import COSTS, point_seconds
from suite.matrix_load import parse_matrix
from suite.plan import build_plan

BASE = """\
name: t
model: {id: org/m}
arms:
  base: {vllm: "0.32.0"}
  cand: {vllm: "0.32.0"}
serve:
"""


def points(line: str) -> dict:
    return {j.point: j.params for j in build_plan(parse_matrix(BASE + line)).jobs if j.arm == "base"}


def test_num_prompts_is_a_count_a_multiple_or_seconds():
    assert {p: (s.num_prompts, s.duration_s) for p, s in points(
        "  - {isl: 64, osl: 16, concurrency: [1, 4], num_prompts: 24}\n").items()} == {
        "isl64-osl16-c1-n24": (24, None), "isl64-osl16-c4-n24": (24, None)}
    assert {p: (s.num_prompts, s.duration_s) for p, s in points(
        "  - {isl: 64, osl: 16, concurrency: [1, 4], num_prompts: 3x}\n").items()} == {
        "isl64-osl16-c1-n3": (3, None), "isl64-osl16-c4-n12": (12, None)}
    # seconds: the point sized by time (its id says its time); without a measured rate a round runs the default 3x
    timed = points("  - {isl: 64, osl: 16, concurrency: [1, 4], num_prompts: 60s}\n")
    assert {p: (s.num_prompts, s.duration_s) for p, s in timed.items()} == {
        "isl64-osl16-c1-t60s": (3, 60.0), "isl64-osl16-c4-t60s": (12, 60.0)}
    assert points('  - {isl: 64, osl: 16, concurrency: 2, num_prompts: " 2.5s "}\n')[
        "isl64-osl16-c2-t2.5s"].duration_s == 2.5


def test_a_point_sized_by_time_is_estimated_by_its_seconds():
    (params,) = points("  - {isl: 64, osl: 16, concurrency: 2, num_prompts: 90s}\n").values()
    assert point_seconds(params, COSTS["cuda"]) == 90.0 + COSTS["cuda"].job_overhead_s


@pytest.mark.parametrize(("value", "said"), [
    ("0s", "num_prompts 0s: a point sized by time lasts more than 0 s and at most 3,600 s"),
    ("3601s", "num_prompts 3601s: a point sized by time lasts more than 0 s"),
    ("60 sec", "a positive integer, a multiple of the concurrency like '3x', or seconds like '60s'"),
    ("1m", "seconds like '60s'"),
])
def test_a_size_that_is_none_is_refused_with_the_forms_it_takes(value, said):
    with pytest.raises(MatrixError, match="serve\\[0\\].num_prompts") as err:
        parse_matrix(BASE + f'  - {{isl: 64, osl: 16, concurrency: 2, num_prompts: "{value}"}}\n')
    assert said in str(err.value)


def test_duration_s_is_retired_with_the_line_to_write():
    with pytest.raises(MatrixError) as err:
        parse_matrix(BASE + "  - {isl: 64, osl: 16, concurrency: 2, duration_s: 3}\n")
    assert str(err.value) == (
        "<matrix>:7: serve[0].duration_s: retired: a point's size is one field, num_prompts, and seconds size it by "
        'time: write num_prompts: "3s" in place of duration_s: 3')
    # a point that gave both: duration_s sized it; its count ran only in a first round with no measured rate
    with pytest.raises(MatrixError) as err:
        parse_matrix(BASE + "  - {isl: 64, osl: 16, concurrency: [1, 4], duration_s: 2.5, num_prompts: 4x}\n")
    assert str(err.value) == (
        "<matrix>:7: serve[0].duration_s: retired: a point's size is one field, num_prompts, and seconds size it by "
        'time: write num_prompts: "2.5s" in place of duration_s: 2.5 and num_prompts: 4x (duration_s sized the '
        "point: the count was only what a first round with no measured request rate ran, which now runs 3x)")


# (key, arm, hash) of the jobs main planned with duration_s, before it became num_prompts in seconds (hub model ids:
# the hashes do not depend on the checkout's path)
PLANNED_WITH_DURATION_S = {
    # - {isl: 64, osl: 16, concurrency: [1, 4], duration_s: 3}
    "  - {isl: 64, osl: 16, concurrency: [1, 4], num_prompts: 3s}\n": [
        ("serve/isl64-osl16-c1-t3s/rep-0", "base", "b4d8b104a10c0aa4"),
        ("serve/isl64-osl16-c4-t3s/rep-0", "base", "4ceeaf0d63605488"),
        ("serve/isl64-osl16-c1-t3s/rep-0", "cand", "b4d8b104a10c0aa4"),
        ("serve/isl64-osl16-c4-t3s/rep-0", "cand", "4ceeaf0d63605488")],
    # - {isl: 64, osl: 16, concurrency: 2, duration_s: 2.5, num_prompts: 3x}
    "  - {isl: 64, osl: 16, concurrency: 2, num_prompts: 2.5s}\n": [
        ("serve/isl64-osl16-c2-t2.5s/rep-0", "base", "f0977ad2daed3b7e"),
        ("serve/isl64-osl16-c2-t2.5s/rep-0", "cand", "f0977ad2daed3b7e")],
}


@pytest.mark.parametrize("line", sorted(PLANNED_WITH_DURATION_S))
def test_a_point_sized_by_time_plans_the_jobs_duration_s_planned(line):
    jobs = build_plan(parse_matrix(BASE + line)).jobs
    assert [(j.key, j.arm, j.hash) for j in jobs] == PLANNED_WITH_DURATION_S[line]
