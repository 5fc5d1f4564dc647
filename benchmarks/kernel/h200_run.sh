#!/usr/bin/env bash
# Device call 2 (run from the repo root on the GPU machine, after h200_stash.sh): rebuild the wheels, install
# them to a private target, and run `suite kernel` for the two gate variants with vLLM 0.33.0's kernels, in
# ROUNDS rounds (a round repeats both arm processes; a later round is skipped past SKIP_AFTER seconds).
# $OUT gets: kernel-r<N>.md per round, h200-results.tgz (every JSON and log), nvidia-smi.txt.
set -euo pipefail
STASH=${STASH:-$HOME/h200-stash}
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/h200}
OUT=${OUT:-$SCRATCH/out}
ROUNDS=${ROUNDS:-2}
SKIP_AFTER=${SKIP_AFTER:-330}
M=${M:-1,2,4,8,16,32}
B=.cache/h200
SITE=$SCRATCH/site
RES=$SCRATCH/results
[ -d "$STASH" ] || { echo "no $STASH: the machine is a fresh one; run h200_stash.sh first" >&2; exit 3; }
python3 benchmarks/kernel/make_h200_bundle.py assemble --from "$STASH" --from "$B/part2" --to "$SCRATCH/wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$SCRATCH"/wheels/*.whl
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import cutlass, cutlass.cute, quack, tvm_ffi; print("cuteDSL, quack, tvm_ffi import ok")'
mkdir -p "$OUT" "$RES"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/nvidia-smi.txt"
for r in $(seq 1 "$ROUNDS"); do
  if [ "$r" -gt 1 ] && [ "$SECONDS" -gt "$SKIP_AFTER" ]; then
    echo "round $r skipped: ${SECONDS}s used"; break
  fi
  echo "=== round $r (t=${SECONDS}s)"
  python3 -m suite.commands.kernel \
    --arm "baseline=$B/tree" --arm "patched=$B/tree" \
    --arm-args "baseline=--gate-factory benchmarks.kernel.h200_gates:frozen_branch_gate" \
    --arm-args "patched=--gate-factory benchmarks.kernel.h200_gates:dispatch_op_gate" \
    --hidden 2816 --experts 128 --m "$M" --trace-m 2048 --calls 50 --trials 101 --warmup 10 \
    --out "$RES/round$r" --cache-dir "$SCRATCH/kcache" || { tar -C "$RES" -czf "$OUT/h200-results.tgz" .; exit 1; }
  cp "$RES/round$r/kernel.md" "$OUT/kernel-r$r.md"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader >> "$OUT/nvidia-smi.txt"
tar -C "$RES" -czf "$OUT/h200-results.tgz" .
echo "done in ${SECONDS}s"
