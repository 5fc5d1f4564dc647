"""Dummy-weight models: `--load-format dummy` in serve_args, `model.generate`, the Gemma 4 generator, fetch and the
report.

Nothing here starts vLLM: the matrix checks, the exact argv, the generated directory (read back by
transformers as vLLM would), `suite fetch` and the report text run for real."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from suite.errors import SuiteError
from suite.fixtures import gemma4
from suite.matrix_load import load_matrix
from suite.plan import build_plan
from suite.runtime.preflight import TOKENIZER_PATTERNS, plan_fetch
from suite.sessions import server_argv_tail
from suite.stages.latency.run import latency_command
from tests.conftest import run_suite
from tests.test_matrix_errors import error_of, write
from tests.test_report import make_run

MATRIX = """\
name: g4
model:
  id: {id}
{extra}runtime: {{kind: local}}
serve_args: [--dtype, bfloat16, --max-model-len, "4096"{load_format}{serve_args}]
arms:
  baseline: {{vllm: "0.26.0"}}
  patched: {{vllm: "0.26.0"{arm}}}
serve:
  - {{isl: 128, osl: 32, concurrency: [1], num_prompts: 3x}}
latency:
  - {{input_len: 128, output_len: 64, batch_size: [1]}}
{tail}"""


def text(id: str = "./g4-model", load_format: str | None = "dummy", generate: str | None = "gemma4-26b-a4b-6l",
         serve_args: str = "", arm: str = "", tail: str = "") -> str:
    extra = f"  generate: {generate}\n" if generate else ""
    return MATRIX.format(id=id, extra=extra, load_format=f", --load-format, {load_format}" if load_format else "",
                         serve_args=serve_args, arm=arm, tail=tail)




def line_of(body: str, needle: str) -> int:
    return next(i for i, line in enumerate(body.splitlines(), 1) if needle in line)


# ------------------------------------------------------------------------------------------------ matrix


def test_dummy_and_generate_are_accepted_and_resolved(tmp_path):
    m = load_matrix(write(tmp_path, text()))
    served = m.model_of()
    assert served.load_format == "dummy" and served.dummy and served.generate == "gemma4-26b-a4b-6l"
    assert served.id == m.model.id == str(tmp_path / "g4-model")  # resolved like any local model
    plain = load_matrix(write(tmp_path, text(id="org/model", load_format=None, generate=None)))
    assert plain.model_of().load_format == "auto" and plain.model_of().model_args() == []
    # a model with real weights dumps as before the generator existed
    assert plain.model.model_dump() == {"id": "org/model"}
    dummy_hub = load_matrix(write(tmp_path, text(id="org/model", generate=None)))
    assert dummy_hub.model_of().model_args() == ["--load-format", "dummy"]
    # vLLM's other formats are vLLM's to check; vLLM lowercases the name
    other = load_matrix(write(tmp_path, text(id="org/model", load_format="SafeTensors", generate=None)))
    assert other.model_of().load_format == "safetensors" and not other.model_of().dummy


@pytest.mark.parametrize("body, needle, msg", [
    (text(load_format=None), "generate:", "model.generate: gemma4-26b-a4b-6l writes a config and a tokenizer, no "
     "weights: every arm that serves it needs [--load-format, dummy] in serve_args (arm baseline has --load-format "
     "auto)"),
    (text(load_format="auto"), "generate:", "needs [--load-format, dummy]"),
    (text(serve_args=", --load_format=auto"), "generate:", "needs [--load-format, dummy]"),  # the last one counts
    (text(arm=", serve_args: [--load-format, auto]"), "generate:", "(arm patched has --load-format auto)"),
    (text(id="org/model"), "generate:", "local directory"),
    (text(generate="gemma5"), "generate:", "unknown generator 'gemma5'"),
    (text(serve_args=", --hf-overrides, '{}'"), "serve_args:", "--hf-overrides is set by the generator"),
    (text(arm=", serve_args: [--hf_overrides.x, '1']"), "patched:", "arms.patched.serve_args: --hf-overrides is set"),
    (text(tail="accuracy: {lm_eval_args: [--tasks, gsm8k, --limit, \"8\"]}\n"), "accuracy:", "random weights"),
    (text(generate=None, id="org/model", tail="accuracy: {lm_eval_args: [--limit, \"8\"]}\n"), "accuracy:", "random weights"),
])
def test_refusals_name_the_file_and_line(tmp_path, body, needle, msg):
    path = write(tmp_path, body)
    err = error_of(path)
    assert f"{path}:{line_of(body, needle)}:" in err, err
    assert msg in err, err


def test_real_weights_with_accuracy_and_own_hf_overrides_stay_allowed(tmp_path):
    body = text(id="org/model", load_format=None, generate=None, serve_args=", --hf-overrides, '{}'",
                tail="accuracy: {lm_eval_args: [--limit, \"8\"]}\n")
    assert load_matrix(write(tmp_path, body)).accuracy is not None


# ------------------------------------------------------------------------------------------------ argv


def test_serve_and_latency_argv_carry_the_model_flags_once(tmp_path):
    m = load_matrix(write(tmp_path, text()))
    plan = build_plan(m)
    for arm in plan.arms:
        tail = server_argv_tail(m, arm, plan, 8000)
        assert tail.count("--load-format") == 1 and tail[tail.index("--load-format") + 1] == "dummy"
        assert tail.count("--hf-overrides") == 1
        assert json.loads(tail[tail.index("--hf-overrides") + 1]) == gemma4.HF_OVERRIDES
    job = next(j for j in plan.jobs if j.kind == "latency")
    cmd = latency_command(vllm="vllm", model=m.model.id, tokenizer=m.model.id, max_model_len=4096,
                          params=job.params, engine_args=["--dtype", "bfloat16"], output_json=Path("o.json"),
                          model_args=m.model_of().model_args())
    assert cmd.count("--load-format") == 1 and cmd[cmd.index("--load-format") + 1] == "dummy"
    assert cmd.count("--hf-overrides") == 1
    plain = load_matrix(write(tmp_path, text(id="org/model", load_format=None, generate=None)))
    assert "--load-format" not in server_argv_tail(plain, "baseline", build_plan(plain), 8000)


def test_dry_run_shows_the_flags(tmp_path):
    proc = run_suite("run", "--dry-run", str(write(tmp_path, text())), timeout=120)
    assert proc.returncode == 0, proc.stderr
    server = [line for line in proc.stdout.splitlines() if "server:" in line]
    assert server and all(line.count("--load-format dummy") == 1 for line in server)
    assert not (tmp_path / "g4-model").exists()  # a dry run writes nothing


# ------------------------------------------------------------------------------------------------ generator


def test_config_matches_the_spec():
    cfg = gemma4.text_config(30)
    assert cfg["architectures"] == ["Gemma4ForCausalLM"] and cfg["model_type"] == "gemma4_text"
    expect = {"hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
              "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "intermediate_size": 2112,
              "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8, "sliding_window": 1024,
              "attention_k_eq_v": True, "final_logit_softcapping": 30.0, "vocab_size": 262_144,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "enable_moe_block": True,
              "hidden_size_per_layer_input": 0}
    assert {k: cfg[k] for k in expect} == expect
    assert "per_layer_config" not in cfg
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 5
    assert set(cfg["rope_parameters"]) == {"sliding_attention", "full_attention"}
    six = gemma4.text_config(6)
    assert six["num_hidden_layers"] == 6 and six["layer_types"][-1] == "full_attention"
    assert {k: v for k, v in six.items() if k not in ("num_hidden_layers", "layer_types")} == \
        {k: v for k, v in cfg.items() if k not in ("num_hidden_layers", "layer_types")}


def test_generated_small_vocab_loads_and_round_trips(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = gemma4.generate("gemma4-26b-a4b-6l", tmp_path / "m", vocab_size=4096)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 6 and cfg["vocab_size"] == 4096 and cfg["num_experts"] == 128
    assert gemma4.generated_by(out) == "gemma4-26b-a4b-6l"
    assert not [p for p in tmp_path.iterdir() if p.name != "m"]  # no temporary directory left behind
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == 4096
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(4096) for _ in range(300)] + [1, 10, 11, 100, 2, 20, 3, 30, 0]
        rng.shuffle(ids)
        assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
        assert tok(tok.decode(ids))["input_ids"] == ids  # no BOS added: prompts keep their length
    assert tok.apply_chat_template([{"role": "user", "content": "w5 w6"}], tokenize=False).split() == ["w5", "w6"]
    config = transformers.AutoConfig.from_pretrained(str(out))
    config.update(gemma4.HF_OVERRIDES)  # what vLLM does with --hf-overrides
    assert (config.head_dim, config.global_head_dim, config.num_global_key_value_heads) == (256, 512, 2)
    assert config.num_experts == 128 and config.top_k_experts == 8 and config.enable_moe_block


def test_real_vocab_is_small_on_disk_and_round_trips(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = gemma4.generate("gemma4-26b-a4b", tmp_path / "m")
    assert sum(p.stat().st_size for p in out.iterdir()) < 20e6
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == 262_144
    rng = random.Random(1)
    ids = [rng.randrange(262_144) for _ in range(2000)] + [262_143, 0, 1, 2, 3]
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 30


def test_ensure_model_generates_once_and_keeps_what_is_there(tmp_path):
    m = load_matrix(write(tmp_path, text()))
    out = gemma4.ensure_model(m.model)
    assert out == tmp_path / "g4-model" and (out / "tokenizer.json").is_file()
    stamp = (out / "config.json").stat().st_mtime_ns
    assert gemma4.ensure_model(m.model) == out and (out / "config.json").stat().st_mtime_ns == stamp
    other = load_matrix(write(tmp_path, text(generate="gemma4-26b-a4b")))
    with pytest.raises(SuiteError, match="was generated as 'gemma4-26b-a4b-6l'"):
        gemma4.ensure_model(other.model)
    assert gemma4.ensure_model(load_matrix(write(tmp_path, text(id="org/m", generate=None))).model) is None


def test_generate_when_another_process_won_keeps_its_directory(tmp_path, monkeypatch):
    first = gemma4.generate("gemma4-26b-a4b-6l", tmp_path / "m", vocab_size=64)
    # a second writer that finds the directory already renamed into place: its own copy is dropped
    assert gemma4.generate("gemma4-26b-a4b-6l", first, vocab_size=64) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ------------------------------------------------------------------------------------------------ fetch


def test_fetch_generates_the_directory(tmp_path):
    f = write(tmp_path, text())
    downloads, notes = plan_fetch(load_matrix(f))
    assert downloads == [] and "generated here by model.generate: gemma4-26b-a4b-6l" in notes[0]
    proc = run_suite("fetch", "--dry-run", str(f), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "g4-model").exists()
    proc = run_suite("fetch", str(f), timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = tmp_path / "g4-model"
    assert json.loads((model / "config.json").read_text())["num_hidden_layers"] == 6
    assert (model / "tokenizer.json").is_file() and (model / "tokenizer_config.json").is_file()
    assert "weights: dummy" in proc.stdout.replace("\n", " ")
    downloads, notes = plan_fetch(load_matrix(f))  # now it is there: a local directory like any other
    assert downloads == [] and "nothing to fetch (weights: dummy" in notes[0]


def test_fetch_of_a_dummy_hub_model_takes_no_weights(tmp_path):
    [d] = plan_fetch(load_matrix(write(tmp_path, text(id="org/model", generate=None))))[0]
    assert d.allow_patterns == TOKENIZER_PATTERNS and not d.weights
    assert not any("safetensors" in p or p.endswith((".bin", ".pt")) for p in d.allow_patterns)


# ------------------------------------------------------------------------------------------------ report


def test_report_says_the_weights_were_dummy(tmp_path):
    from suite.report import build_report

    body = """\
name: rep
model: {id: ./m, generate: gemma4-26b-a4b}
serve_args: [--load-format, dummy]
arms:
  baseline: {vllm: "0.26.0"}
  patched: {vllm: "0.26.0"}
serve:
  - {isl: 64, osl: 16, concurrency: [2, 4], num_prompts: 8}
repeats: %(repeats)d
order: %(order)s
"""
    root = make_run(tmp_path, lambda arm, c, r: (100.0 + r, 1.0), matrix_text=body)
    report = build_report(root).read_text()
    line = ("weights: **dummy** (`--load-format dummy`, real-shape config `gemma4-26b-a4b`): timings are real, "
            "outputs are not a model's")
    assert report.count(line) == 2  # the header and the provenance
    plain = make_run(tmp_path / "plain", lambda arm, c, r: (100.0 + r, 1.0))
    assert "weights: **dummy**" not in build_report(plain).read_text()


def test_run_prepares_the_model_and_records_dummy_weights_in_the_manifest(tmp_path, monkeypatch):
    from rich.console import Console

    import suite.runner as runner
    from suite.runtime.base import ArmEnv, RuntimeBase

    class FakeRuntime(RuntimeBase):  # prepares arms without an overlay; the base's preflight and arm_info
        kind = "local"

        def prepare_arm(self, arm, spec):
            assert (tmp_path / "g4-model" / "config.json").is_file()  # written before any arm is prepared
            return ArmEnv(arm=arm, vllm_version=spec.vllm)

    monkeypatch.setattr(runner, "make_runtime", lambda matrix, cache_root: FakeRuntime())
    ctx = runner.prepare(write(tmp_path, text()), tmp_path / "runs", None, Console(quiet=True))
    weights = ctx.store.manifest().weights
    assert weights.load_format == "dummy" and weights.generate == "gemma4-26b-a4b-6l"
    assert weights.model_args[:2] == ["--load-format", "dummy"]
    assert "outputs are not a model's" in weights.note
