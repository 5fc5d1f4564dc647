"""Generate a tiny MoE model locally: random weights and a locally trained tokenizer.

It is a real Mixtral-architecture checkpoint that real vLLM loads and serves on the CPU (its router gate
is a real ``GateLinear``), so the whole pipeline runs without a hub or a GPU.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

TINY_MOE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
_WORDS = (
    "the a an of to and in is it that for on with as was by at be this are from or have not but what "
    "all were when we there can more if no out so said up one about than them into could time only new "
    "some these two may first then do any like my now over such our man me even most made after also "
    "did many before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three expert router gate token batch kernel decode prefill tensor"
).split()
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 25))]
        nums = [str(rng.randint(0, 999)) for _ in range(rng.randint(0, 3))]
        lines.append(" ".join(words + nums) + rng.choice([".", "?", "!", " ="]))
    # digits, arithmetic and GSM8K's answer marker so the tokenizer covers accuracy prompts
    lines += [f"Question: {a} + {b} = {a + b}. #### {a + b}" for a in range(50) for b in range(0, 50, 7)]
    return lines


GENERATOR_VERSION = 3
# `vllm bench latency` feeds random token ids below 10,000: the embedding is padded past the tokenizer's
# vocabulary so every tool of vLLM's runs on the tiny model.
MIN_MODEL_VOCAB = 10240


def is_tiny_moe(path: Path) -> bool:
    if not (all((path / f).is_file() for f in TINY_MOE_FILES) and any(path.glob("*.safetensors"))):
        return False
    try:
        meta = json.loads((path / "suite-tiny-moe.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == GENERATOR_VERSION


def generate_tiny_moe(
    out_dir: str | Path,
    *,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_experts: int = 8,
    top_k: int = 2,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write a tiny Mixtral-style MoE (bf16, random weights) and its BPE tokenizer to ``out_dir``."""
    out = Path(out_dir)
    if is_tiny_moe(out) and not force:
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<unk>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)

    torch.manual_seed(seed)
    config = MixtralConfig(
        vocab_size=max(len(fast), MIN_MODEL_VOCAB),
        hidden_size=hidden_size,
        intermediate_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # the CPU attention backend needs head_dim >= 32
        num_local_experts=num_experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = MixtralForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # padded ids never win a greedy step: their logits are 0, real tokens' max is > 0
        model.lm_head.weight[len(fast):] = 0
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "suite-tiny-moe.json").write_text(
        json.dumps({"generator": "suite.models.generate_tiny_moe", "version": GENERATOR_VERSION, "seed": seed,
                    "synthetic": True, "tokenizer_vocab": len(fast)}, indent=2)
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
