#!/usr/bin/env bash
# The H200 side of a GPU run (docs/gpu-h200.md). Run from the repository root on the device machine:
#   scripts/gpu/h200.sh receive              # move the carried bundle parts (.gpu/bundle/*) to $GPU_ROOT/parts
#   scripts/gpu/h200.sh install              # check and unpack the bundle: vLLM 0.26.0 + wheels in $GPU_ROOT/site
#   scripts/gpu/h200.sh restore              # unpack a carried run archive (.gpu/run.tar.xz) into $GPU_ROOT/runs
#   scripts/gpu/h200.sh start MATRIX [ARGS]  # `suite run MATRIX ARGS` in its own session (outlives this call);
#                                            # a later stretch: start MATRIX --resume /root/gpu/runs/<run>
#   scripts/gpu/h200.sh wait SECONDS         # follow the run's log until it ends or SECONDS pass
#   scripts/gpu/h200.sh collect              # the run directory (no server logs over 1 MB) -> $OUT/run.tar.xz
#   scripts/gpu/h200.sh stop                 # end the run (suite's own Ctrl-C path: servers stopped for real)
# The machine has Python 3.12 with torch 2.11.0 and no network; vLLM comes from the bundle, the suite from
# this working tree (copied to $GPU_ROOT/src at start, so a later call's fresh copy never changes a running one).
set -euo pipefail
GPU_ROOT=${GPU_ROOT:-/root/gpu}
SITE=$GPU_ROOT/site
RUNS=$GPU_ROOT/runs
LOG=$GPU_ROOT/suite.log
PY=${PYTHON:-python3}

env_for_suite() {
  export PYTHONPATH="$GPU_ROOT/src:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
}

case "${1:-}" in
  receive)
    mkdir -p "$GPU_ROOT/parts"
    found=0
    for f in .gpu/bundle/*; do [ -f "$f" ] && cp "$f" "$GPU_ROOT/parts/" && found=$((found + 1)); done
    echo "h200: received $found file(s); parts now: $(ls "$GPU_ROOT/parts" | tr '\n' ' ')"
    ;;
  install)
    t0=$(date +%s)
    cd "$GPU_ROOT/parts"
    cat part-* | sha256sum -c <(sed 's/bundle.tar.xz/-/' SHA256) >/dev/null || { echo "h200: bundle sha256 mismatch (parts: $(ls))"; exit 1; }
    rm -rf "$GPU_ROOT/bundle" "$SITE" && mkdir -p "$GPU_ROOT/bundle" "$SITE"
    cat part-* | xz -d -T0 | tar -C "$GPU_ROOT/bundle" -xf -
    # the small wheels first, then vLLM and the cuteDSL libraries over them (the order docs/gpu-h200.md gives)
    # a wheel is a zip: unpacked as `pip install --target --no-deps` would (its .data/purelib|platlib moved up),
    # so no pip version's tag rules can refuse one that the bundle chose for this machine
    "$PY" - "$SITE" "$GPU_ROOT"/bundle/whl/*.whl <<'PY'
import shutil, sys, zipfile
from pathlib import Path
site = Path(sys.argv[1])
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for sub in ("purelib", "platlib"):
            if (data / sub).is_dir():
                shutil.copytree(data / sub, site, dirs_exist_ok=True)
        shutil.rmtree(data)
print(f"h200: {len(sys.argv) - 2} wheels unpacked into {site}")
PY
    cp -a "$GPU_ROOT"/bundle/vllm/. "$SITE"/
    cp -a "$GPU_ROOT"/bundle/cutlass-libs/. "$SITE"/
    rm -rf "$GPU_ROOT/bundle"
    # bytecode once, here, on all cores: else every server's first import compiles vLLM's ~2,000 modules
    # (the API server and its EngineCore both pay it, once per arm overlay)
    "$PY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || echo "h200: compileall reported errors (kept going)"
    env_for_suite
    "$PY" - <<'PY'
import importlib.metadata as md, torch, vllm, pydantic
print(f"h200: vllm {md.version('vllm')} from {vllm.__file__}; torch {torch.__version__}; cuda {torch.cuda.is_available()}; "
      f"pydantic {pydantic.__version__}")
PY
    echo "h200: installed in $(( $(date +%s) - t0 )) s"
    ;;
  restore)
    mkdir -p "$RUNS"
    tar -C "$RUNS" -xJf .gpu/run.tar.xz
    echo "h200: runs now: $(ls "$RUNS" | tr '\n' ' ')"
    ;;
  start)
    shift
    mkdir -p "$GPU_ROOT/src" "$RUNS"
    rm -rf "$GPU_ROOT/src" && mkdir -p "$GPU_ROOT/src"
    cp -a suite matrices patches "$GPU_ROOT/src/"
    mkdir -p "$GPU_ROOT/models"
    env_for_suite
    # matrices name their model relative to the matrix file (../models/...): run from the copy
    cd "$GPU_ROOT/src"
    ln -sfn "$GPU_ROOT/models" models
    setsid "$PY" -m suite run "$@" --out "$RUNS" >"$LOG" 2>&1 < /dev/null &
    echo $! >"$GPU_ROOT/suite.pid"
    echo "h200: suite run started (pid $(cat "$GPU_ROOT/suite.pid")), log $LOG"
    ;;
  wait)
    limit=${2:-540}
    t0=$(date +%s)
    pid=$(cat "$GPU_ROOT/suite.pid")
    shown=0
    while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      n=$(wc -l <"$LOG"); [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$LOG" && shown=$n
      sleep 5
    done
    n=$(wc -l <"$LOG"); [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$LOG"
    if kill -0 "$pid" 2>/dev/null; then echo "h200: still running after ${limit} s"; else echo "h200: suite run ended"; fi
    nvidia-smi --query-gpu=memory.used,utilization.gpu,clocks.sm --format=csv,noheader || true
    ;;
  collect)
    : "${OUT:?collect writes to \$OUT}"
    run=$(ls -td "$RUNS"/*/ 2>/dev/null | head -1)
    [ -n "$run" ] || { echo "h200: no run directory under $RUNS"; exit 1; }
    cp "$LOG" "$run/suite.log" 2>/dev/null || true
    # raw results, manifest, reports, probe and session logs; compile caches and overlays stay behind
    tar -C "$(dirname "$run")" --exclude='*/cache' --exclude='*/overlays' --exclude='*/probe/site' --exclude='*.pt.trace.json.gz' \
        -cJf "$OUT/run.tar.xz" "$(basename "$run")"
    ls -la "$OUT"
    ;;
  stop)
    pid=$(cat "$GPU_ROOT/suite.pid")
    kill -TERM "$pid" 2>/dev/null || true   # suite turns SIGTERM into its Ctrl-C path
    for _ in $(seq 1 240); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader || true
    ;;
  *)
    sed -n '2,10p' "$0"; exit 2 ;;
esac
