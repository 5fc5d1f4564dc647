from __future__ import annotations

import re
from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_load import load_matrix, parse_matrix
from tests.conftest import REPO, run_suite

MINIMAL = """\
name: t
model:
  id: some/model
arms:
  baseline: {vllm: "0.32.0"}
  patched: {vllm: "0.32.0", patches: [a, -b]}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
"""


def test_minimal_matrix_defaults_and_patch_refs():
    m = parse_matrix(MINIMAL)
    assert m.baseline_arm == "baseline"
    assert [(p.name, p.reverse) for p in m.arms["patched"].patches] == [("a", False), ("b", True)]
    assert m.serve[0].prompts_for(4) == 12
    assert m.serve[0].prompts_for(1) == 3
    assert m.runtime.kind == "local"


SHIPPED = [*sorted((REPO / "matrices").glob("*.yaml")), *sorted((REPO / "benchmarks").glob("*/matrix.yaml")),
           REPO / "tests" / "data" / "report_run" / "matrix.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_matrices_validate(path: Path):
    """Every matrix the repository ships (matrices/, the benchmarks', the stored test run's) loads: a retired field
    is migrated everywhere it is written."""
    m = load_matrix(path)
    assert m.arms


def doc_matrices() -> list[tuple[str, str]]:
    """The whole matrices the user docs show (a ```yaml block with name:, model: and arms:; not a fragment), as
    (where, text)."""
    found = []
    for doc in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        for k, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", doc.read_text(), re.S | re.M)):
            if all(re.search(rf"^{key}:", block, re.M) for key in ("name", "model", "arms")):
                found.append((f"{doc.relative_to(REPO)}#{k}", block))
    return found


@pytest.mark.parametrize(("where", "text"), doc_matrices(), ids=[w for w, _ in doc_matrices()])
def test_the_docs_matrices_validate(where, text):
    """A matrix a page shows is one a user can copy: it validates (a retired field is migrated in the docs too)."""
    assert parse_matrix(text, source=where).arms


def test_unknown_field_names_file_line_and_field(tmp_path):
    bad = MINIMAL.replace("  - {isl: 128", "  - {isl: 128, colour: red")
    f = tmp_path / "m.yaml"
    f.write_text(bad)
    with pytest.raises(MatrixError) as exc:
        load_matrix(f)
    assert f"{f}:8: serve[0].colour: unknown field" in str(exc.value)


def test_wrong_type_points_at_the_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MINIMAL.replace('baseline: {vllm: "0.32.0"}', "baseline: {vllm: [1]}"))
    with pytest.raises(MatrixError, match=rf"{f}:5: arms.baseline.vllm: "):
        load_matrix(f)


def test_yaml_syntax_error_has_line(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MINIMAL + "serve: [\n")
    with pytest.raises(MatrixError, match=rf"{f}:\d+: YAML syntax"):
        load_matrix(f)


def test_impossible_point_is_refused():
    with pytest.raises(MatrixError, match=r"exceeds the default --max-model-len 2048 \(give a longer one in "
                                          r"serve_args\)"):
        parse_matrix(MINIMAL.replace("isl: 128", "isl: 4000"))
    with pytest.raises(MatrixError, match=r"exceeds --max-model-len 4000 in serve_args"):
        parse_matrix(MINIMAL.replace("isl: 128", "isl: 4000") + "serve_args: [--max-model-len=4k]\n")
    assert parse_matrix(MINIMAL.replace("isl: 128", "isl: 4000") + "serve_args: [--max_model_len, 4K]\n")


@pytest.mark.parametrize("value", ["0", "-3", "'x3'", "'3y'"])
def test_bad_num_prompts(value):
    with pytest.raises(MatrixError, match="num_prompts"):
        parse_matrix(MINIMAL.replace("num_prompts: 3x", f"num_prompts: {value}"))


@pytest.mark.parametrize(("extra", "message"), [
    ("together: 2\n", "together: 2 needs order: abba"),
    ("order: abba\ntogether: 2\nserve_args: [--port, \"8000\"]\n",
     "serve_args: --port 8000: up to 2 servers are alive at once \\(together: 2\\) and cannot share one port"),
    ("order: abba\ntogether: 2\nruntime: {kind: slurm}\n", "slurm runtime runs one session per batch job"),
    ("order: abba\ntogether: 0\n", "together: 1 to 8 servers alive at once, or all"),
    ("order: abba\ntogether: some\n", "together"),
])
def test_together_is_refused_where_it_cannot_run(extra, message):
    with pytest.raises(MatrixError, match=message):
        parse_matrix(MINIMAL + extra)
    assert parse_matrix(MINIMAL + "order: abba\ntogether: 2\n").together == 2


def test_unknown_baseline_and_empty_matrix():
    with pytest.raises(MatrixError, match="baseline 'nope' is not one of the arms"):
        parse_matrix(MINIMAL + "baseline: nope\n")
    with pytest.raises(MatrixError, match="nothing to measure"):
        parse_matrix(MINIMAL.split("serve:")[0])


def test_cli_validate_reports_file_line_without_traceback(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(MINIMAL.replace("concurrency: [1, 4]", "concurrency: [1, 1]"))
    proc = run_suite("validate", str(f))
    assert proc.returncode == 2
    assert f"{f}:8: serve[0].concurrency: concurrency values must be distinct" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = run_suite("validate", str(REPO / "matrices" / "smoke-cpu.yaml"))
    assert ok.returncode == 0, ok.stderr


GPU_MATRICES = ["gemma4.yaml", "gemma4-below-serving.yaml", "glm52-aiter-router-mi355x.yaml", "qwen38-fse-mi355x.yaml"]
MODEL_VARS = ("SUITE_GEMMA4_MODEL", "SUITE_GLM52_MODEL", "SUITE_QWEN38_FSE_MODEL")


def test_seed_matrices_use_the_seeds_models(monkeypatch, tmp_path):
    for var in MODEL_VARS:
        monkeypatch.delenv(var, raising=False)
    ids = {name: load_matrix(REPO / "matrices" / name).model.id for name in GPU_MATRICES}
    assert ids == {"gemma4.yaml": "google/gemma-4-26B-A4B-it", "gemma4-below-serving.yaml": "google/gemma-4-26B-A4B-it",
                   "glm52-aiter-router-mi355x.yaml": "amd/GLM-5.2-MXFP4",  # not zai-org: AMD publishes the MXFP4 build
                   "qwen38-fse-mi355x.yaml": "amd/Qwen3.8-2.4T-A95B-MoE-MXFP4"}
    # seed 002's checkpoint is custom: a local copy through the environment
    (tmp_path / "qwen").mkdir()
    monkeypatch.setenv("SUITE_QWEN38_FSE_MODEL", str(tmp_path / "qwen"))
    assert load_matrix(REPO / "matrices" / "qwen38-fse-mi355x.yaml").model.id == str(tmp_path / "qwen")


def test_qwen38_has_the_seeds_four_accuracy_rows(monkeypatch):
    """The seed's GSM8K table: Quark-MXFP4 with FSE off (another checkpoint), MoE-MXFP4 with FSE off, on
    before the change, on after it; the first is judged on accuracy alone."""
    monkeypatch.delenv("SUITE_QWEN38_QUARK_MODEL", raising=False)
    m = load_matrix(REPO / "matrices" / "qwen38-fse-mi355x.yaml")
    fse = {arm: {**m.env, **spec.env}["VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS"] for arm, spec in m.arms.items()}
    assert fse == {"before": "1", "after": "1", "fse-off": "0", "quark-fse-off": "0"}
    patches = {arm: [(p.name, p.reverse) for p in spec.patches] for arm, spec in m.arms.items()}
    assert patches == {"before": [("fse-fused-gate-dispatch", True)], "after": [], "fse-off": [], "quark-fse-off": []}
    assert m.baseline_arm == "before" and {spec.vllm for spec in m.arms.values()} == {"0.33.0"}
    models = {arm: m.model_of(spec).id for arm, spec in m.arms.items()}
    assert models["quark-fse-off"] == "amd/Qwen3.8-2.4T-A95B-Quark-MXFP4"
    assert {models[a] for a in ("before", "after", "fse-off")} == {m.model.id}
    assert not m.arms["quark-fse-off"].serving and m.accuracy is not None


@pytest.mark.parametrize("name", GPU_MATRICES)
def test_gpu_matrices_run_in_containers_without_prefix_caching(name):
    m = load_matrix(REPO / "matrices" / name)
    assert m.runtime.kind == "docker" and m.runtime.vendor in ("cuda", "rocm")
    assert "--no-enable-prefix-caching" in m.serve_args
    assert not any("prefix-caching" in a for spec in m.arms.values() for a in spec.serve_args)


def test_below_serving_matrix_runs_its_stages_in_the_arms_images():
    m = load_matrix(REPO / "matrices" / "gemma4-below-serving.yaml")
    assert m.runtime.kind == "docker" and m.latency and m.kernel and m.probe
    text = (REPO / "matrices" / "gemma4-below-serving.yaml").read_text()
    assert "pip install" not in text  # nothing vLLM-side is installed on the host


def test_a_local_model_path_that_does_not_exist_is_named_before_anything_runs(tmp_path):
    """A typo in a local model path: `suite validate` and `--dry-run` warn (the directory may be made later),
    `suite run` refuses before any arm is prepared (no image build, no server, no run directory)."""
    text = MINIMAL.replace("id: some/model", "id: ./modles/tiny-moe").replace(", patches: [a, -b]", "")
    matrix = tmp_path / "typo.yaml"
    matrix.write_text(text)
    want = f"model.id: {tmp_path / 'modles' / 'tiny-moe'} is no directory"
    ok = run_suite("validate", str(matrix))
    assert ok.returncode == 0 and "warning" in ok.stdout and want in ok.stdout, ok.stdout + ok.stderr
    dry = run_suite("run", str(matrix), "--dry-run")
    assert dry.returncode == 0 and f"warning: {want}" in dry.stdout, dry.stdout + dry.stderr
    run = run_suite("run", str(matrix), "--out", str(tmp_path / "runs"))
    assert run.returncode == 2 and want in run.stderr and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert not (tmp_path / "runs").exists()
    # a Hugging Face id, and a generated model's directory, are not paths that must exist
    assert "warning" not in run_suite("validate", str(REPO / "matrices" / "gemma4-h200.yaml")).stdout


def test_dry_run_client_trusts_remote_code_as_the_server_does(tmp_path):
    matrix = tmp_path / "trc.yaml"
    matrix.write_text(MINIMAL.replace(", patches: [a, -b]", "") + "serve_args: [--trust-remote-code]\n")
    dry = run_suite("run", str(matrix), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    clients = [line for line in dry.stdout.splitlines() if "] client: vllm bench serve" in line]
    assert clients and all(" --trust-remote-code" in line for line in clients), dry.stdout


OWN_MODEL = """\
name: own
model: {id: ./models/main}
serve_args: [--served-model-name, main, --max-model-len, "512"]
arms:
  baseline: {vllm: "0.32.0"}
  ckpt: {vllm: "0.32.0", model: {id: ./models/other}, serve_args: [--served-model-name, other, --max-model-len, "256"]}
serve:
  - {isl: 128, osl: 32, concurrency: [1], num_prompts: 2}
"""


def test_an_arm_serves_its_own_model_and_only_its_jobs_change(tmp_path):
    """Seed 002's reference row is another checkpoint: an arm names its own model. Its paths resolve against
    the matrix, its limits are checked, its jobs hash apart; the other arms' jobs hash as they did."""
    from suite.plan import build_plan

    for d in ("models/main", "models/other"):
        (tmp_path / d).mkdir(parents=True)
    path = tmp_path / "m.yaml"
    path.write_text(OWN_MODEL)
    m = load_matrix(path)
    assert m.model_of(m.arms["ckpt"]).id == str(tmp_path / "models" / "other")
    assert m.model_of(m.arms["baseline"]).id == str(tmp_path / "models" / "main")
    models = m.models_by_arm()
    assert [(a, v.served_name, v.max_model_len) for a, v in models.items()] == [("baseline", "main", 512),
                                                                               ("ckpt", "other", 256)]
    plain = tmp_path / "plain.yaml"
    plain.write_text(OWN_MODEL.replace(', model: {id: ./models/other}, serve_args: [--served-model-name, other, '
                                       '--max-model-len, "256"]', ""))
    with_own, without = build_plan(m).jobs, build_plan(load_matrix(plain)).jobs
    assert [j.hash for j in with_own if j.arm == "baseline"] == [j.hash for j in without if j.arm == "baseline"]
    assert [j.hash for j in with_own if j.arm == "ckpt"] != [j.hash for j in without if j.arm == "ckpt"]
    # its own limit: 128 + 32 fits 512 but not 256
    with pytest.raises(MatrixError, match=r"exceeds --max-model-len 150 in arms\.ckpt\.serve_args"):
        parse_matrix(OWN_MODEL.replace('"256"', '"150"'))
    # a typo in its path is named like the matrix model's
    (tmp_path / "models" / "other").rmdir()
    run = run_suite("run", str(path), "--out", str(tmp_path / "runs"))
    assert run.returncode == 2 and f"arms.ckpt.model.id: {tmp_path / 'models' / 'other'} is no directory" in run.stderr
    (tmp_path / "models" / "other").mkdir()
    dry = run_suite("run", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    servers = {line.split("]")[0].strip(" ["): line for line in dry.stdout.splitlines() if "] server:" in line}
    # the matrix's serve_args, then the arm's: vLLM takes the arm's name and length
    assert f"vllm serve {tmp_path / 'models' / 'other'} --host" in servers["ckpt"]
    assert servers["ckpt"].endswith("--served-model-name other --max-model-len 256")
    assert servers["baseline"].endswith("--served-model-name main --max-model-len 512")
    clients = [line for line in dry.stdout.splitlines() if "] client: vllm bench serve" in line]
    assert any("ckpt's model] client:" in c and "--model other" in c for c in clients), clients


def test_the_matrix_reference_is_the_schema_and_every_field_says_what_it_is():
    """docs/matrix.md is generated from the models `suite validate` checks with (one source): a field added or
    described differently without regenerating it fails here, and so does a field without a description."""
    from tests.conftest import load_script

    ref = load_script(REPO / "scripts" / "matrix_reference.py", "matrix_reference").reference()
    assert (REPO / "docs" / "matrix.md").read_text() == ref, "regenerate: python3 scripts/matrix_reference.py"
    undescribed = [line.split("`")[1] for line in ref.splitlines() if line.endswith("| — |")]
    assert undescribed == []


# The matrix's knobs: every field a matrix can give, the blocks and their fields (147 on 2026-12-06). A ceiling
# that only comes down: a new knob retires one that says the same (suite.matrix_retired), and a field retired
# lowers it.
MAX_FIELDS = 104


def test_the_schema_holds_no_more_knobs_than_its_ceiling():
    import typing

    from pydantic import BaseModel

    from suite.matrix import Matrix

    seen: list[type[BaseModel]] = []
    fields = 0
    todo: list[type[BaseModel]] = [Matrix]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for info in model.model_fields.values():
            fields += 1
            args = [info.annotation]
            while args:
                a = args.pop()
                if isinstance(a, type) and issubclass(a, BaseModel):
                    todo.append(a)
                args.extend(typing.get_args(a))
    assert fields <= MAX_FIELDS, f"{fields} fields: retire one for each you add (suite.matrix_retired)"
    assert fields >= MAX_FIELDS, f"{fields} fields: lower MAX_FIELDS to {fields}, so that it holds"
