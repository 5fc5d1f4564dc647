"""Fast path not taken: an arm's server log says a kernel the router gate is routed to ran untuned or was
switched off (AITER's tuned-config misses, vLLM's own messages)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from suite.model_config import gate_shape, text_config
from suite.patches import AppliedPatch
from suite.quality.finding import Finding

# AITER, on a tuned-config lookup miss (it then runs its default kernel for that shape): aiter/tuned_gemm.py
# (bf16 a16w16: "shape is M:1, N:256, K:6144 dtype='torch.bfloat16' otype='torch.float32' ..., not found tuned
# config in /tmp/aiter_configs/bf16_tuned_gemm.csv, will use default config! using skinny solution:2"),
# aiter/ops/gemm_op_a8w8.py, gemm_op_a4w4.py, batched_gemm_op_{a8w8,bf16}.py ("not found tuned/padded config").
_AITER_MISS = re.compile(r"shape is (?:B:\d+, )?M:(\d+), N:(\d+), K:(\d+)(?P<rest>[^\n]*?)"
                         r"not found tuned(?:/padded)? config in (?P<where>[^\n]+?)(?:,| will|!|$)", re.M)
_BF16_OP = re.compile(r"dtype='?torch\.bfloat16|dtype is bf16|bf16_tuned_gemm")
# Other messages that say a kernel a router-gate fast path relies on was switched off or left untuned:
# (check name, pattern, what it means). Sources: aiter/fused_moe.py, aiter/ops/triton/utils/tuned_config_utils.py,
# vllm/_aiter_ops.py, vllm/model_executor/kernels/linear/cute_dsl/_ll_router_common.py,
# vllm/model_executor/layers/fused_moe/router/gate_linear.py (0.33.0).
_FAST_PATH_OFF = (
    (re.compile(r"cuteDSL \(CUTLASS Python\) not available, (?P<what>[^\n]+?) disabled"),
     "cuteDSL is not importable, so {what} is disabled (vLLM)"),
    (re.compile(r"Disabling ROCm BF16x3 router GEMM for (?P<what>\S+?):"),
     "the ROCm BF16x3 router GEMM was disabled for {what} (vLLM)"),
    (re.compile(r"ROCm BF16x3 router GEMM is enabled for (?P<what>\S+) but its weight split is missing"),
     "the ROCm BF16x3 router GEMM of {what} fell back to fp32 (vLLM)"),
    (re.compile(r"Could not read aiter CK GEMM configs from AITER_CONFIGS\.(?P<what>\w+)"),
     "vLLM could not read AITER's {what} tuned configs and treats every shape as untuned"),
    (re.compile(r"No tuned Triton config for kernel '(?P<what>[^']+)'"),
     "AITER has no tuned Triton config for kernel {what} and uses its fallback"),
    (re.compile(r"no tuned FlyDSL config for (?P<what>[^\n]+?), using untuned"),
     "AITER's fused MoE has no tuned FlyDSL config for {what}"),
)
FAST_PATH_EXAMPLES = 4  # shapes / messages named in one finding


def _patch_names(patches: Iterable[AppliedPatch]) -> list[str]:
    """The arm's patch sets as a matrix names them (a reversed one with its leading ``-``)."""
    return [("-" if p.reverse else "") + p.name for p in patches if p.name]


def aiter_untuned_shapes(log_text: str) -> dict[tuple[int, int], dict[str, Any]]:
    """(N, K) -> {"m": sorted M values, "bf16": a bf16 GEMM?, "where": config files named, "lines": count} for
    every AITER tuned-config miss in a server log (repeated per worker process: counted once per M)."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for m in _AITER_MISS.finditer(log_text):
        key = (int(m.group(2)), int(m.group(3)))
        entry = out.setdefault(key, {"m": set(), "bf16": False, "where": set(), "lines": 0})
        entry["m"].add(int(m.group(1)))
        entry["bf16"] = entry["bf16"] or bool(_BF16_OP.search(m.group(0)))
        entry["where"].add(m.group("where").strip().rsplit("/", 1)[-1])
        entry["lines"] += 1
    return {k: {**v, "m": sorted(v["m"]), "where": sorted(v["where"])} for k, v in out.items()}


def gate_shapes_from_config(config: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The router gate GEMM shapes (N, K) = (experts, hidden) a model's config.json implies
    (`suite.model_config.gate_shape`), plus (experts + shared experts, hidden) for a fused router+shared gate;
    [] when it names no experts."""
    try:
        gate = gate_shape(config)
    except ValueError:
        return []
    shapes = [(gate.experts, gate.hidden)]
    cfg = text_config(config)
    shared = next((cfg[k] for k in ("n_shared_experts", "num_shared_experts") if isinstance(cfg.get(k), int)), 0)
    if shared:
        shapes.append((gate.experts + shared, gate.hidden))
    return shapes


def _ms(values: Sequence[int]) -> str:
    shown = ", ".join(map(str, values[:8]))
    return shown + (f" … ({len(values)} sizes)" if len(values) > 8 else "")


def check_fast_path(arm: str, patches: Iterable[AppliedPatch], log_text: str, *,
                    gate_shapes: Iterable[tuple[int, int]] = ()) -> list[Finding]:
    """Fast path not taken: an arm's server log shows that a kernel the router gate is routed to ran untuned or
    was switched off. A patched arm may then have measured the old path (and equal the baseline for a reason
    that has nothing to do with the change); an arm without patch sets (stock vLLM, which may hold the change
    already: the fused-gate PR's `after` arm, whose 513-wide fused gate AITER's table misses) measured the fallback.

    - AITER's "not found tuned config" (it then runs its default kernel for that GEMM shape): with
      ``gate_shapes`` ((N, K) = (experts, hidden), see `gate_shapes_from_config`), misses of those shapes;
      without, misses of bf16 GEMMs (router gates are bf16 GEMMs; the quantized linear layers' misses are
      left out: they are the model's, not the gate's, and would be named in every run of an untuned model);
    - vLLM switching a router kernel off (cuteDSL missing: the ll-bf16 kernels are disabled; the ROCm BF16x3
      router GEMM disabled or falling back to fp32), vLLM unable to read AITER's tuned configs, AITER's
      Triton / fused-MoE kernels without a tuned config.

    An arm without patch sets is warned of AITER misses only for the model's known gate shapes (any bf16 miss
    would name every untuned model). One warning per cause; it never makes a cell unreliable (the numbers
    are what the arm measured)."""
    names = _patch_names(patches)
    if not log_text:
        return []
    if names:
        sets = ", ".join(names)
        old_path = (f"{arm}'s patch sets ({sets}) may not have reached their tuned path, so {arm} may have "
                    "measured the old one")
        off = f"{arm}'s patch sets ({sets}) may not have taken their fast path"
    else:
        old_path = f"{arm} (no patch sets) measured that default kernel, not a tuned one"
        off = f"{arm} (no patch sets) measured that fallback"
    findings = []
    wanted = {tuple(s) for s in gate_shapes}
    misses = aiter_untuned_shapes(log_text) if wanted or names else {}
    picked = {k: v for k, v in misses.items() if (k in wanted if wanted else v["bf16"])}
    if picked:
        shapes = sorted(picked, key=lambda k: (-len(picked[k]["m"]), k))
        shown = "; ".join(f"N:{n} K:{k} at M {_ms(picked[(n, k)]['m'])}" for n, k in shapes[:FAST_PATH_EXAMPLES])
        more = f"; and {len(shapes) - FAST_PATH_EXAMPLES} more shapes" if len(shapes) > FAST_PATH_EXAMPLES else ""
        what = "the router gate's GEMM" if wanted else f"{len(shapes)} bf16 GEMM shape{'s' if len(shapes) > 1 else ''}"
        files = sorted({f for k in shapes for f in picked[k]["where"]})
        findings.append(Finding(
            "fast-path-not-taken", arm, None, None, "warning",
            f"AITER found no tuned config for {what} ({shown}{more}; {', '.join(files)}) and ran its default "
            f"kernel there: {old_path} (tune the shapes, e.g. AITER_TUNE_GEMM=1 and AITER's gemm tuner)"))
    for pattern, meaning in _FAST_PATH_OFF:
        hits = list(dict.fromkeys(m.group("what").strip() for m in pattern.finditer(log_text)))
        if hits:
            shown = ", ".join(hits[:FAST_PATH_EXAMPLES]) + (
                f" and {len(hits) - FAST_PATH_EXAMPLES} more" if len(hits) > FAST_PATH_EXAMPLES else "")
            findings.append(Finding(
                "fast-path-not-taken", arm, None, None, "warning",
                f"{meaning.format(what=shown)}: {off}"))
    return findings
