"""One prompt count per round for a point sized by time: every arm of a round serves the same requests."""

from __future__ import annotations

import json

from suite.plan import Job
from suite.records import ClientRecord
from suite.stages.serve.run import ServeNotes
from suite.stages.serve.sizing import PointSize, point_size
from suite.store import RunStore

POINT = "isl128-osl32-c1-t3s"
PARAMS = {"isl": 128, "osl": 32, "concurrency": 1, "num_prompts": 4, "duration_s": 3.0, "seed": 0,
          "random_range_ratio": 0.0, "request_rate": None, "num_warmups": 1}


def _job(arm: str, repeat: int, tag: str = "", point: str = POINT) -> Job:
    return Job(kind="serve", arm=arm, session=0, point=point, repeat=repeat, tag=tag, params=PARAMS, hash="h")


def _measured(store: RunStore, job: Job, size: PointSize | None, completed: int, duration: float,
              started: str = "2026-12-04T10:00:00+00:00", ok: bool = True) -> None:
    """A finished run of the point: its raw result and its record (as the serve stage writes them)."""
    path = store.result_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"completed": completed, "duration": duration, "num_prompts": completed}))
    notes = ServeNotes(command=["vllm"], prefix_cache_reset=True, client=ClientRecord(mode="persistent", wall_s=1.0),
                       sized=size)
    store.write_record(job, "ok" if ok else "failed", notes, started=started)


def test_the_first_arm_of_a_round_sizes_from_its_warm_up(tmp_path):
    size = point_size(RunStore(tmp_path), _job("patched", 0), 0, 3.0, 1, warm_rate=5.1)
    assert size is not None and size.prompts == 16 and size.round == 0  # ceil(15.3)
    assert "patched session's warm-up" in size.basis and "5.1 requests/s" in size.basis
    assert point_size(RunStore(tmp_path), _job("patched", 0), 0, 3.0, 1, warm_rate=None) is None


def test_every_other_arm_of_the_round_reads_its_count_back(tmp_path):
    """The demo's round whose arms served 15 and 28 prompts: the second arm's own warm-up read twice the
    rate; it now serves the first arm's count, whatever block or tag it measures."""
    store = RunStore(tmp_path)
    first = point_size(store, _job("baseline", 2), 1, 3.0, 1, warm_rate=5.0)
    assert first is not None and first.prompts == 15
    _measured(store, _job("baseline", 2), first, 15, 1.4)
    for job in (_job("baseline.aa", 2), _job("patched", 3), _job("baseline", 2, "drift")):
        assert point_size(store, job, 1, 3.0, 1, warm_rate=9.3) == first
    other = point_size(store, _job("patched", 2, point="isl128-osl32-c4-t3s"), 1, 3.0, 4, warm_rate=9.3)
    assert other is not None and other.prompts == 28  # another point has a count of its own


def test_a_later_round_sizes_from_the_arms_measured_rates(tmp_path):
    """Round 1 takes the median over arms of round 0's measured rates (all of an arm's blocks together), not a
    warm-up's few requests; a failed run, a drift repeat and an unsized run do not count."""
    store = RunStore(tmp_path)
    r0 = PointSize(round=0, prompts=15, basis="warm-up")
    _measured(store, _job("baseline", 0), r0, 15, 1.5)
    _measured(store, _job("baseline", 1), r0, 15, 1.5)  # baseline: 30 / 3.0 s = 10/s
    _measured(store, _job("patched", 0), r0, 15, 1.25)
    _measured(store, _job("patched", 1), r0, 15, 1.75)  # patched: 30 / 3.0 s = 10/s
    _measured(store, _job("slowed", 0), r0, 15, 5.0)
    _measured(store, _job("slowed", 1), r0, 15, 5.0)  # slowed: 3/s
    _measured(store, _job("other", 1), r0, 15, 0.1, ok=False)
    _measured(store, _job("other", 1, "drift"), r0, 15, 0.1)
    _measured(store, _job("unsized", 0), None, 15, 0.1)
    size = point_size(store, _job("slowed", 2), 1, 3.0, 1, warm_rate=2.0)
    assert size is not None and size.prompts == 30 and size.round == 1  # 3 s x the median 10/s
    assert "round 0" in size.basis and "3 arms" in size.basis
    _measured(store, _job("slowed", 2), size, 30, 10.0)
    assert point_size(store, _job("baseline", 3), 1, 3.0, 1, warm_rate=99.0) == size
    # round 2 follows the latest round with runs: round 1, the slowed arm alone so far
    later = point_size(store, _job("baseline", 4), 2, 3.0, 1, warm_rate=99.0)
    assert later is not None and later.prompts == 9 and "round 1" in later.basis and "1 arm " in later.basis


def test_a_resumed_run_keeps_the_count_of_the_round_it_had_begun(tmp_path):
    """Counts live in the records, not in the process: a new process reads the round's count back."""
    size = PointSize(round=0, prompts=22, basis="the baseline session's warm-up at this shape: 7.3 requests/s")
    _measured(RunStore(tmp_path), _job("baseline", 0), size, 22, 2.0)
    back = point_size(RunStore(tmp_path), _job("patched", 1), 0, 3.0, 1, warm_rate=1.0)
    assert back == size
    raw = json.loads(RunStore(tmp_path).record_path(_job("baseline", 0)).read_text())
    assert raw["sized"] == {"round": 0, "prompts": 22, "basis": size.basis}
