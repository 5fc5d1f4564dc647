"""The run directory: atomic writes, the manifest (provenance) and per-job records (resume).

Layout::

    runs/<utc>-<matrix>/
      manifest.json                          schema, suite version, host, resolved matrix, arms, patches
      <arm>/server-<n>.log                   server log of session n
      <arm>/vllm-files.json                  every file of the arm's vllm package and its sha256 (its software)
      <arm>/serve/<point>/rep-<r>.json       raw `vllm bench serve` result, as the tool wrote it
      <arm>/serve/<point>/rep-<r>.job.json   job record: hash, status, command, timings, error
      <arm>/accuracy/<task>/rep-0/...        raw lm-eval output
      report.md

Every file is written to a temporary name in the same directory and renamed into place, so a kill at any
moment leaves either the old file or the new one, never a truncated one. The records themselves (the
manifest, job records, ...) are the models of :mod:`suite.records`.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from suite import __version__
from suite.errors import SuiteError
from suite.plan import KINDS, Job, Plan
from suite.records import (
    SCHEMA_VERSION,
    JobCounts,
    JobNotes,
    JobRecord,
    Manifest,
    SlurmLedger,
    Stretch,
    VllmFiles,
    utc_now,
)

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE)", re.I)
REDACTED = "<redacted>"
# a server log: the line a runtime writes before each server start in it (a restart appends to the same log)
SERVER_START_MARK = "--- suite: vllm serve started "


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file, then a rename), with the mode a plain ``open``
    would give (0666 less the umask: mkstemp's 0600 kept every report and result from a team's other users)."""
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise SuiteError(f"cannot write {path}: {exc.strerror}; the file there before is unchanged "
                             "(free space, or pass --out / --resume on another filesystem)") from None
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_text(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, REDACTED)
    return text


def secret_values(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    return [v for k, v in env.items() if SECRET_NAME.search(k) and v]


@dataclass(frozen=True)
class ArmDirs:
    """Where one arm's processes keep their files in a run: the run directory (an arm's container mounts it
    whole, and its name is the run id) and the arm's cache (HOME; vLLM's, inductor's and Triton's caches)."""

    run: Path
    cache: Path

    @classmethod
    def in_run(cls, run: Path, arm: str, group: int | None = None) -> ArmDirs:
        """The arm's directories in the run directory ``run`` (one that need not exist: a dry run's). A GPU group
        after the first (GPU groups in runtime.gpus: rounds at once) gets a cache of its own: two servers of one arm
        compiling at the same time never write one cache."""
        return cls(run, run / arm / ("cache" if not group else f"cache-group-{group}"))


_MANIFEST_LOCK = threading.RLock()


@dataclass(frozen=True)
class RunStore:
    root: Path

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, out_base: Path, matrix_name: str) -> RunStore:
        """A new run directory under ``out_base``, named by the time and the matrix. Its path is absolute: every
        path the run hands to a tool starts from it, and a tool in a container (the docker runtime mounts the
        run directory at its host path) has another working directory, so `--out runs`, the default, would have
        sent `vllm bench serve`'s result file nowhere the host sees."""
        out_base = out_base.resolve()
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        root = out_base / f"{stamp}-{matrix_name}"
        n = 1
        while root.exists():
            n += 1
            root = out_base / f"{stamp}-{matrix_name}-{n}"
        root.mkdir(parents=True)
        return cls(root)

    @classmethod
    def open(cls, run_dir: Path) -> RunStore:
        """An existing run directory, after checking that this suite can read what it holds."""
        path = run_dir / "manifest.json"
        if not path.is_file():
            raise SuiteError(f"{run_dir}: not a run directory (no manifest.json)")
        try:
            version = read_json(path).get("schema_version")
        except (OSError, json.JSONDecodeError, AttributeError) as exc:
            raise SuiteError(f"{path}: unreadable manifest: {exc}") from None
        if version != SCHEMA_VERSION:
            raise SuiteError(f"{run_dir}: written with run-directory schema {version!r}; this suite "
                             f"{__version__} reads schema {SCHEMA_VERSION} (use the suite version that wrote it)")
        return cls(run_dir.resolve())  # absolute, as `create` makes it: a resumed run's tools see the same paths

    # ------------------------------------------------------------------ manifest
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def manifest(self) -> Manifest:
        try:
            return Manifest.model_validate(read_json(self.manifest_path))
        except FileNotFoundError:
            raise SuiteError(f"{self.root}: not a run directory (no manifest.json)") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise SuiteError(f"{self.manifest_path}: unreadable manifest: {exc}") from None
        except ValidationError as exc:
            raise SuiteError(f"{self.manifest_path}: not a manifest this suite reads: "
                             + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None

    def write_manifest(self, manifest: Manifest) -> None:
        atomic_write_json(self.manifest_path, manifest.dump())

    def update_manifest(self, **fields: Any) -> Manifest:
        """Set top-level fields (the manifest's own types, or their JSON) and write the manifest back whole; one
        update at a time (rounds on GPU groups run in threads of one process)."""
        with _MANIFEST_LOCK:
            manifest = Manifest.model_validate(self.manifest().dump() | fields)
            self.write_manifest(manifest)
        return manifest

    def begin_stretch(self, stretch: Stretch, **fields: Any) -> Manifest:
        """A run (or a resume) starts executing: its stretch is added; the first stretch's start stays the
        run's."""
        m = self.manifest()
        return self.update_manifest(started=m.started or stretch.started, stretches=[*m.stretches, stretch],
                                    **fields)

    def end_stretch(self, finished: str | None = None, **fields: Any) -> Manifest:
        """The stretch ends (complete, interrupted or failed): its end is the run's last end."""
        m = self.manifest()
        finished = finished or utc_now()
        ended = [s.model_copy(update={"finished": finished}) for s in m.stretches[-1:]]
        return self.update_manifest(finished=finished, stretches=[*m.stretches[:-1], *ended], **fields)

    # ------------------------------------------------------------------ paths
    def arm_dir(self, arm: str) -> Path:
        return self.root / arm

    def job_dir(self, job: Job) -> Path:
        return self.arm_dir(job.arm) / job.kind / job.point

    def job_stem(self, job: Job) -> str:
        return job.key.rsplit("/", 1)[1]

    def result_path(self, job: Job) -> Path:
        """Where the raw tool output of a job goes (a file, or a directory for lm-eval)."""
        if KINDS[job.kind].result_dir:
            return self.job_dir(job) / self.job_stem(job)
        return self.job_dir(job) / f"{self.job_stem(job)}.json"

    def record_path(self, job: Job) -> Path:
        return self.job_dir(job) / f"{self.job_stem(job)}.job.json"

    def log_path(self, job: Job) -> Path:
        return self.job_dir(job) / f"{self.job_stem(job)}.log"

    def server_log(self, arm: str, session: int, attempt: int = 0) -> Path:
        suffix = f"-restart{attempt}" if attempt else ""
        return self.arm_dir(arm) / f"server-{session}{suffix}.log"

    def session_dir(self, arm: str, kind: str, session: int) -> Path:
        """Per-session scratch of a stage (e.g. profiler traces of one server lifetime)."""
        return self.arm_dir(arm) / kind / f"session-{session}"

    def precompile_log(self, arm: str, group: int | None = None) -> Path:
        """The log of the arm's unmeasured precompile servers (matrix precompile: one per stretch, appended; a
        GPU group after the first has its own)."""
        return self.arm_dir(arm) / ("precompile.log" if not group else f"precompile-group-{group}.log")

    def server_record_path(self, arm: str, session: int, attempt: int = 0) -> Path:
        """The start record of one server (attempt: its restarts): when it became healthy, its command."""
        return self.server_log(arm, session, attempt).with_suffix(".json")

    def vllm_files_path(self, arm: str) -> Path:
        """The arm's per-file manifest of its vllm package (`VllmFiles`), beside its `ArmSoftware` record."""
        return self.arm_dir(arm) / "vllm-files.json"

    def software_probe_path(self, arm: str) -> Path:
        """Where the arm's software probe writes its raw answer (read, then removed) and logs."""
        return self.arm_dir(arm) / "software-probe.json"

    def vllm_files(self, arm: str) -> VllmFiles | None:
        """The arm's per-file manifest; None when the run has none (a run before it was recorded, a failed
        collection) or it cannot be read."""
        try:
            return VllmFiles.model_validate(read_json(self.vllm_files_path(arm)))
        except (OSError, json.JSONDecodeError, ValidationError):
            return None

    def write_vllm_files(self, arm: str, files: VllmFiles) -> None:
        atomic_write_json(self.vllm_files_path(arm), files.model_dump(mode="json"))

    def slurm_ledger_path(self) -> Path:
        """Every Slurm submission of the run (suite.runtime.slurm.driver keeps it)."""
        return self.root / "slurm" / "jobs.json"

    def slurm_ledger(self) -> SlurmLedger | None:
        """The run's Slurm submissions; None when the run has none (no ledger file). A ledger that is not JSON
        or not of the ledger's shape is an error naming the file and what is wrong."""
        path = self.slurm_ledger_path()
        try:
            raw = read_json(path)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise SuiteError(f"{path}: unreadable Slurm job ledger: {exc}") from None
        try:
            return SlurmLedger.model_validate(raw)
        except ValidationError as exc:
            raise SuiteError(f"{path}: not a Slurm job ledger this suite reads: {_why(exc)}") from None

    def write_slurm_ledger(self, ledger: SlurmLedger) -> None:
        atomic_write_json(self.slurm_ledger_path(), ledger.dump())

    def arm_dirs(self, arm: str, group: int | None = None) -> ArmDirs:
        return ArmDirs.in_run(self.root, arm, group)

    # ------------------------------------------------------------------ job records
    def record(self, job: Job) -> JobRecord | None:
        """The job's record; None when missing, unreadable or of another schema (the job then runs again)."""
        return read_record(self.record_path(job))

    def is_done(self, job: Job) -> bool:
        rec = self.record(job)
        return bool(rec and rec.ok and rec.hash == job.hash and self.result_path(job).exists())

    def write_record(self, job: Job, status: Literal["ok", "failed"], notes: JobNotes | None = None,
                     **fields: Any) -> JobRecord:
        """A job's record: the fields every record has, and the stage's own ``notes`` beside them."""
        rec = JobRecord(schema_version=SCHEMA_VERSION, job=job, hash=job.hash, status=status, written=utc_now(),
                        **(notes.fields() if notes is not None else {}), **fields)
        self.put_record(rec)
        return rec

    def put_record(self, rec: JobRecord) -> None:
        """Write a record as it is (its job names the path): the fields it was given, its job whole."""
        dump = (rec.model_dump(mode="json", exclude_unset=True, by_alias=True)  # by_alias: GpuState's names
                | {"job": rec.job.model_dump(mode="json")})
        atomic_write_json(self.record_path(rec.job), dump)

    def job_counts(self, plan: Plan) -> JobCounts:
        """ok / failed / missing over the plan's jobs (missing: no record, or one planned differently)."""
        counts = JobCounts(ok=0, failed=0, missing=0)
        for job in plan.jobs:
            rec = self.record(job)
            if rec is None or rec.hash != job.hash:
                counts.missing += 1
            elif rec.ok:
                counts.ok += 1
            else:
                counts.failed += 1
        return counts

    def point_records(self, job: Job) -> list[JobRecord]:
        """Every readable record of ``job``'s kind and point, of every arm, round and tag (in path order)."""
        return [rec for path in sorted(self.root.glob(f"*/{job.kind}/{job.point}/*.job.json"))
                if (rec := read_record(path))]

    def records(self) -> list[JobRecord]:
        """Every readable job record of the run, of this schema (in path order)."""
        return [rec for path in sorted(self.root.glob("*/*/*/*.job.json")) if (rec := read_record(path))]


def ok_jobs(records: Iterable[JobRecord], kind: str) -> list[Job]:
    """The jobs of one kind whose record says they ended ok, in the records' order."""
    return [rec.job for rec in records if rec.job.kind == kind and rec.ok]


@dataclass(frozen=True)
class Unreadable:
    """A stored result of an ok job that its reader could not take: the file (relative to the run) and why."""

    path: str
    error: str


M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class StoredResults(Generic[M]):
    """The stored results of one job kind read as a typed shape: those that validated, with their jobs (in the
    records' order), and those that did not, so that a section can say which files it left out and why."""

    found: list[tuple[Job, M]]
    unreadable: list[Unreadable]


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where}: {first['msg']}{more}"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return f"not JSON ({exc})"


def load_results(store: RunStore, records: Iterable[JobRecord], kind: str, shape: type[M]) -> StoredResults[M]:
    """Every ok job's stored result of a kind, validated as ``shape``; a file that is missing, is not JSON or
    is not of the shape is listed in ``unreadable`` with the reason, never dropped without a word."""
    found: list[tuple[Job, M]] = []
    unreadable: list[Unreadable] = []
    for job in ok_jobs(records, kind):
        path = store.result_path(job)
        try:
            found.append((job, shape.model_validate(read_json(path))))
        except (OSError, json.JSONDecodeError, ValidationError) as exc:
            unreadable.append(Unreadable(path.relative_to(store.root).as_posix(), _why(exc)))
    return StoredResults(found, unreadable)


def read_record(path: Path) -> JobRecord | None:
    """A job record file; None when it is missing, unreadable, of another schema or not a record."""
    if not path.is_file():
        return None
    try:
        raw = read_json(path)
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        return JobRecord.model_validate(raw)
    except ValidationError:
        return None


# The docker runtime (suite/runtime/docker/) imports these records from here; its files are being reworked
# elsewhere, and its import moves to suite.records after that.
from suite.records import ArmRuntimeInfo, GpuState, ImageInfo  # noqa: E402, F401
