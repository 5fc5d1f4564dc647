"""Whether an arm differs from the baseline only by its patch: the arms' software as each run recorded it
(`suite.records.ArmSoftware`, collected in each arm's own environment; every file of its vllm package in
`suite.records.VllmFiles`), compared file by file and version by version.

A router-gate change is measured as the difference between two arms, so anything else that differs between
them (another torch, Triton, FlashInfer or AITER, a vLLM file no patch set writes, a native extension built
otherwise: an overlay made from an older installation, an image rebuilt on another base) is measured with it.
vLLM's own A/B experiments check "identical dependency versions and native-extension hashes" across arms; here
every such difference is a ``software`` warning naming it, and the files the patch sets of either arm write are
the differences expected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from suite.quality.finding import Finding
from suite.records import SOFTWARE_PACKAGES, ArmSoftware, PackageInfo, VllmFiles, is_native

MAX_NAMED = 10  # files named in one finding; the rest counted (every file: the arms' vllm-files.json)


@dataclass(frozen=True)
class VersionDiff:
    """One version that differs: what (``torch``, ``torch's CUDA``, ``Python``), the baseline's, the arm's."""

    what: str
    baseline: str
    arm: str


@dataclass(frozen=True)
class SoftwareDiff:
    """An arm's software against the baseline's. ``missing``: why they could not be compared (None: compared);
    ``unrecorded``: neither arm recorded any (a run from before the suite did). Compared: the versions that
    differ, the differing files a patch set of either arm writes (``patched``, expected), the other differing
    files of the vllm tree (``files``) and native extensions (``native``), and ``tree`` when the trees differ
    with no per-file manifest to say where."""

    arm: str
    baseline: str
    missing: str | None = None
    unrecorded: bool = False
    versions: tuple[VersionDiff, ...] = ()
    patched: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    native: tuple[str, ...] = ()
    tree: bool = False
    n_files: int = 0  # files of the arm's vllm tree

    @property
    def beyond_patch(self) -> bool:
        """Compared, and something other than the patch sets' files differs."""
        return bool(self.versions or self.files or self.native or self.tree)


def _package(info: PackageInfo | None, other: PackageInfo | None) -> str:
    if info is None:
        return "not installed"
    same_dist = other is not None and other.distribution == info.distribution
    return info.label() if same_dist or info.distribution is None else f"{info.distribution} {info.label()}"


def version_diffs(base: ArmSoftware, arm: ArmSoftware) -> list[VersionDiff]:
    """The packages (distribution and version), torch's CUDA / HIP / build and Python that differ."""
    out = []
    for name, label in SOFTWARE_PACKAGES.items():
        a, b = base.package(name), arm.package(name)
        if (a and (a.distribution, a.version)) != (b and (b.distribution, b.version)):
            out.append(VersionDiff(label, _package(a, b), _package(b, a)))
    for what, a_, b_ in (("torch's CUDA", base.torch_cuda, arm.torch_cuda), ("torch's HIP", base.torch_hip, arm.torch_hip),
                         ("torch's build (git)", base.torch_git, arm.torch_git), ("Python", base.python, arm.python)):
        if a_ != b_:
            out.append(VersionDiff(what, a_ or "none", b_ or "none"))
    return out


def differing_files(base: dict[str, str], arm: dict[str, str]) -> list[str]:
    """Paths whose sha256 differs, or that one tree has and the other not, sorted."""
    return sorted(p for p in base.keys() | arm.keys() if base.get(p) != arm.get(p))


def compare_software(arm: str, baseline: str, mine: ArmSoftware | None, theirs: ArmSoftware | None,
                     my_files: VllmFiles | None = None, their_files: VllmFiles | None = None) -> SoftwareDiff:
    """An arm's recorded software against the baseline's: file by file where both per-file manifests are there,
    else by the trees' digests and the native extensions' hashes the records carry."""
    if mine is None and theirs is None:
        return SoftwareDiff(arm, baseline, missing="not recorded", unrecorded=True)
    for who, rec in ((f"the baseline's ({baseline})", theirs), (f"{arm}'s", mine)):
        if rec is None:
            return SoftwareDiff(arm, baseline, missing=f"{who} not recorded")
        if rec.error is not None:
            return SoftwareDiff(arm, baseline, missing=f"{who} not recorded: {rec.error}")
    assert mine is not None and theirs is not None
    expected = set(mine.patched) | set(theirs.patched)
    if my_files is not None and their_files is not None:
        differ = differing_files(their_files.files, my_files.files)
        tree = False
    else:  # the digests say whether the trees differ; the records' native hashes say which of those differ
        differ = differing_files(theirs.native, mine.native)
        tree = mine.vllm_digest != theirs.vllm_digest and not differ
    native = tuple(p for p in differ if is_native(p))
    return SoftwareDiff(arm, baseline, versions=tuple(version_diffs(theirs, mine)),
                        patched=tuple(p for p in differ if p in expected and not is_native(p)),
                        files=tuple(p for p in differ if p not in expected and not is_native(p)), native=native,
                        tree=tree, n_files=mine.vllm_files)


def named(paths: Iterable[str], limit: int = MAX_NAMED) -> str:
    """"vllm/a.py, vllm/b.py (and 3 more)"."""
    paths = list(paths)
    more = f" (and {len(paths) - limit} more)" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def beyond_patch(d: SoftwareDiff) -> list[str]:
    """Every difference from the baseline beyond the patch sets' files, in words (plain text), one per kind."""
    parts = [f"{v.what} {v.arm} (the baseline's {v.baseline})" for v in d.versions]
    if d.files:
        parts.append(f"{len(d.files)} vLLM file{'s' if len(d.files) != 1 else ''} no patch set writes: {named(d.files)}")
    if d.native:
        parts.append(f"native extension{'s' if len(d.native) != 1 else ''} {named(d.native)}")
    if d.tree:
        parts.append("its vLLM tree (another digest; no per-file manifest says where)")
    return parts


def _count(n: int, noun: str) -> str:
    """"1 vLLM file differs", "3 vLLM files differ"."""
    return f"{n} {noun} differs" if n == 1 else f"{n} {noun}s differ"


def software_findings(diffs: Iterable[SoftwareDiff]) -> list[Finding]:
    """``software`` (warning, about the whole arm): each kind of difference from the baseline beyond the patch
    sets' files, named; and an arm whose software could not be compared (neither arm recorded: no finding)."""
    messages: list[tuple[str, str]] = []
    for d in diffs:
        if d.missing is not None:
            if not d.unrecorded:
                messages.append((d.arm, f"software not compared with the baseline's: {d.missing}"))
            continue
        if d.versions:
            messages.append((d.arm, "another version than the baseline's: " + "; ".join(
                f"{v.what} {v.arm} (the baseline's {v.baseline})" for v in d.versions)))
        if d.files:
            messages.append((d.arm, f"{_count(len(d.files), 'vLLM file')} from the baseline's that no patch set of "
                                    f"either arm writes: {named(d.files)}"))
        if d.native:
            messages.append((d.arm, f"{_count(len(d.native), 'native extension')} from the baseline's: "
                                    f"{named(d.native)}"))
        if d.tree:
            messages.append((d.arm, "its vLLM tree differs from the baseline's (another digest), and no per-file "
                                    "manifest says where"))
    return [Finding("software", arm, None, None, "warning", message) for arm, message in messages]
