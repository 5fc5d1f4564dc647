"""History: an SQLite index of finished runs (stdlib sqlite3), one row per run and one per candidate verdict.

The index is derived data: every value is recomputed from a run directory (manifest + raw results) by
`index_run` (through `suite.analysis`, the same values the report shows), so it can be rebuilt at any time (`suite history --scan runs/`). By default it lives beside the
runs it indexes: ``<runs dir>/history.sqlite`` (override with ``--db`` or ``SUITE_HISTORY_DB``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.analysis import load_run
from suite.errors import SuiteError
from suite.patches import AppliedPatch
from suite.records import utc_now
from suite.stats import Verdict

DB_NAME = "history.sqlite"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    path          TEXT NOT NULL,
    matrix        TEXT NOT NULL,
    created       TEXT,
    finished      TEXT,
    status        TEXT,
    baseline      TEXT,
    arms          TEXT NOT NULL,   -- JSON list
    vllm_versions TEXT NOT NULL,   -- JSON {arm: version}
    images        TEXT NOT NULL,   -- JSON {arm: image}
    patches       TEXT NOT NULL,   -- JSON {arm: [{name, sha256, reverse}]}
    jobs_ok       INTEGER,
    jobs_failed   INTEGER,
    jobs_missing  INTEGER,
    points        INTEGER,
    host          TEXT,
    suite_version TEXT,
    indexed       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS verdicts (
    run_id            TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    candidate         TEXT NOT NULL,
    baseline          TEXT NOT NULL,
    overall           TEXT NOT NULL,
    better            INTEGER NOT NULL,
    worse             INTEGER NOT NULL,
    not_significant   INTEGER NOT NULL,
    unreliable        INTEGER NOT NULL,
    geomean_tput_pct  REAL,             -- geometric-mean output throughput Δ% over points
    PRIMARY KEY (run_id, candidate)
);
CREATE INDEX IF NOT EXISTS runs_matrix_created ON runs(matrix, created);
"""


def default_db(runs_dir: Path | None = None) -> Path:
    env = os.environ.get("SUITE_HISTORY_DB")
    if env:
        return Path(env)
    return (runs_dir or Path("runs")) / DB_NAME


@contextmanager
def connect(db: Path) -> Iterator[sqlite3.Connection]:
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise SuiteError(f"{db}: history schema version {version}, this suite reads {SCHEMA_VERSION}")
        conn.executescript(SCHEMA)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        with conn:
            yield conn
    except sqlite3.DatabaseError as exc:
        raise SuiteError(f"{db}: {exc}") from None
    finally:
        conn.close()


@dataclass(frozen=True)
class VerdictRow:
    candidate: str
    baseline: str
    overall: str
    better: int
    worse: int
    not_significant: int
    unreliable: int
    geomean_tput_pct: float | None


@dataclass(frozen=True)
class RunRow:
    run_id: str
    path: str
    matrix: str
    created: str | None
    finished: str | None
    status: str | None
    baseline: str | None
    arms: list[str]
    vllm_versions: dict[str, str | None]  # per arm
    images: dict[str, str]  # per arm that ran from an image
    patches: dict[str, list[AppliedPatch]]  # per arm: the references it got (name, sha256, reverse)
    jobs_ok: int | None
    jobs_failed: int | None
    jobs_missing: int | None
    points: int | None
    verdicts: list[VerdictRow]


def index_run(run_dir: Path, db: Path | None = None) -> RunRow:
    """(Re)index one run directory: insert or replace its row and its verdict rows; returns what was stored."""
    run_dir = Path(run_dir).resolve()
    run = load_run(run_dir)
    m = run.manifest
    counts = m.job_counts
    summaries = run.summaries
    row = RunRow(
        run_id=run_dir.name,
        path=str(run_dir),
        matrix=m.matrix.name or run_dir.name,
        created=m.created,
        finished=m.finished,
        status=m.status,
        baseline=run.baseline if run.arms else None,
        arms=run.arms,
        vllm_versions={a: i.vllm_version for a, i in m.arms.items()},
        images={a: i.image for a, i in m.arms.items() if i.image},
        patches={a: [AppliedPatch(name=p.name, sha256=p.sha256, reverse=p.reverse) for p in i.patches]
                 for a, i in m.arms.items()},
        jobs_ok=counts.ok if counts else None,
        jobs_failed=counts.failed if counts else None,
        jobs_missing=counts.missing if counts else None,
        points=len(run.points),
        verdicts=[VerdictRow(s.candidate, s.baseline, s.word, s.counts[Verdict.BETTER], s.counts[Verdict.WORSE],
                             s.counts[Verdict.NOT_SIGNIFICANT], s.counts[Verdict.UNRELIABLE],
                             s.geomean_throughput_pct) for s in summaries],
    )
    db = db or default_db(run_dir.parent)
    with connect(db) as conn:
        conn.execute("DELETE FROM runs WHERE run_id = ?", (row.run_id,))
        conn.execute(
            "INSERT INTO runs (run_id, path, matrix, created, finished, status, baseline, arms, vllm_versions, "
            "images, patches, jobs_ok, jobs_failed, jobs_missing, points, host, suite_version, indexed) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.run_id, row.path, row.matrix, row.created, row.finished, row.status, row.baseline,
             json.dumps(row.arms), json.dumps(row.vllm_versions), json.dumps(row.images), json.dumps(_patches_json(row.patches)),
             row.jobs_ok, row.jobs_failed, row.jobs_missing, row.points, m.host.hostname,
             m.suite_version, utc_now()))
        conn.executemany(
            "INSERT INTO verdicts (run_id, candidate, baseline, overall, better, worse, not_significant, "
            "unreliable, geomean_tput_pct) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(row.run_id, v.candidate, v.baseline, v.overall, v.better, v.worse, v.not_significant, v.unreliable,
              v.geomean_tput_pct) for v in row.verdicts])
    return row


def _patches_json(patches: dict[str, list[AppliedPatch]]) -> dict[str, list[dict[str, object]]]:
    """The index's column: per arm, each reference's name, sha256 and direction."""
    return {a: [p.model_dump(mode="json", include={"name", "sha256", "reverse"}) for p in ps]
            for a, ps in patches.items()}


def scan(runs_dir: Path, db: Path | None = None) -> list[RunRow]:
    """Index every run directory directly under ``runs_dir`` (those holding a manifest.json)."""
    rows = []
    for d in sorted(p for p in Path(runs_dir).iterdir() if (p / "manifest.json").is_file()):
        rows.append(index_run(d, db or default_db(Path(runs_dir))))
    return rows


def _row(conn: sqlite3.Connection, r: sqlite3.Row) -> RunRow:
    verdicts = [VerdictRow(v["candidate"], v["baseline"], v["overall"], v["better"], v["worse"],
                           v["not_significant"], v["unreliable"], v["geomean_tput_pct"])
                for v in conn.execute("SELECT * FROM verdicts WHERE run_id = ? ORDER BY candidate", (r["run_id"],))]
    return RunRow(r["run_id"], r["path"], r["matrix"], r["created"], r["finished"], r["status"], r["baseline"],
                  json.loads(r["arms"]), json.loads(r["vllm_versions"]), json.loads(r["images"]),
                  {a: [AppliedPatch.model_validate(p) for p in ps] for a, ps in json.loads(r["patches"]).items()},
                  r["jobs_ok"], r["jobs_failed"], r["jobs_missing"], r["points"],
                  verdicts)


def list_runs(db: Path, matrix: str | None = None, limit: int | None = None) -> list[RunRow]:
    """Runs newest first, optionally of one matrix."""
    if not db.is_file():
        return []
    sql = "SELECT * FROM runs" + (" WHERE matrix = ?" if matrix else "") + " ORDER BY created DESC, run_id DESC"
    params: tuple[Any, ...] = (matrix,) if matrix else ()
    if limit:
        sql += " LIMIT ?"
        params += (limit,)
    with connect(db) as conn:
        return [_row(conn, r) for r in conn.execute(sql, params).fetchall()]


def find_run(db: Path, run_id: str) -> RunRow | None:
    if not db.is_file():
        return None
    with connect(db) as conn:
        r = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return _row(conn, r) if r else None


def previous_run(db: Path, run_id: str) -> RunRow | None:
    """The newest complete run of the same matrix created before ``run_id`` (last night's)."""
    cur = find_run(db, run_id)
    if cur is None:
        return None
    for r in list_runs(db, cur.matrix):
        if r.run_id != run_id and (r.created or "") < (cur.created or "") and r.status == "complete":
            return r
    return None
