"""A model's own config (its ``config.json``) and the router gate's shape it implies: `gate_shape`.

The gate is the ``hidden x experts`` GEMM that scores the routed experts. Its shape is the model's: ``hidden_size``
and the routed experts under the key the model family uses, as vLLM's model code reads them
(``vllm/model_executor/models/``): ``num_experts`` (Gemma 4, Qwen2/3-MoE, OLMoE, ...), ``num_local_experts``
(Mixtral, GPT-OSS, Llama 4, ...), ``n_routed_experts`` (DeepSeek V2/V3, GLM-4 MoE, ...), ``moe_num_experts``
(ERNIE 4.5, ...); DBRX's ``d_model`` and ``ffn_config.moe_num_experts``. A multimodal checkpoint (Gemma 4's
``Gemma4ForConditionalGeneration``, Llama 4) keeps them in its ``text_config``.

Standard library only, importing nothing of the suite: the kernel bench reads the config with it in the arm's
own environment, where an image carries this file beside the bench as ``kernel_model_config.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HIDDEN_KEYS = ("hidden_size", "d_model")
EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "ffn_config.moe_num_experts")
TEXT_CONFIG = "text_config"


@dataclass(frozen=True)
class GateShape:
    """The router gate's shape: ``hidden`` (its input size) x ``experts`` (its output size, the routed experts)."""

    hidden: int
    experts: int


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a config that describes the language model: its ``text_config`` when it has one."""
    text = config.get(TEXT_CONFIG)
    return text if isinstance(text, Mapping) else config


def _value(config: Mapping[str, Any], key: str) -> int | None:
    """A positive int at ``key`` (dotted: nested), else None (absent, null, or not a count)."""
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    return next((v for k in keys if (v := _value(config, k)) is not None), None)


def gate_shape(config: Mapping[str, Any], model: str = "the model") -> GateShape:
    """The router gate's shape a model's config implies (the config itself, or its ``text_config``). Raises
    ValueError naming ``model`` and the keys tried when it names no routed experts (a dense model has no gate;
    Gemma 4 builds none with ``enable_moe_block: false``)."""
    cfg = text_config(config)
    hidden, experts = _first(cfg, HIDDEN_KEYS), _first(cfg, EXPERTS_KEYS)
    if cfg.get("enable_moe_block") is False:
        experts = None
    if hidden is None or experts is None:
        missing = " and no ".join(what for what, v in (("input size", hidden), ("routed experts", experts)) if v is None)
        off = "; enable_moe_block is false (vLLM builds no router)" if cfg.get("enable_moe_block") is False else ""
        raise ValueError(
            f"{model}: its config gives no router gate shape, no {missing} (keys tried"
            f"{f' in its {TEXT_CONFIG}' if cfg is not config else ''}: {', '.join(HIDDEN_KEYS)} for the input size; "
            f"{', '.join(EXPERTS_KEYS)} for the routed experts)"
            f"{off}; a dense model has no router gate to time")
    return GateShape(hidden=hidden, experts=experts)


def local_config(model: str) -> dict[str, Any] | None:
    """The ``config.json`` of a model given as a local directory; None for a hub id, or when it is unreadable."""
    path = Path(model) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def read_config(model: str) -> dict[str, Any]:
    """A model's ``config.json``, as its server would find it: a local directory's, else the hub's (through
    huggingface_hub: its cache first; HF_HUB_OFFLINE and HF_HOME honoured). Raises ValueError naming the model."""
    if Path(model).is_dir():
        config = local_config(model)
        if config is None:
            raise ValueError(f"{model}: no readable config.json in the model's directory")
        return config
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(model, "config.json")
        config = json.loads(Path(path).read_text())
    except Exception as exc:  # the hub client raises many kinds; each is one line naming the model
        raise ValueError(f"{model}: its config.json could not be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{model}: its config.json is not a JSON object")
    return config
