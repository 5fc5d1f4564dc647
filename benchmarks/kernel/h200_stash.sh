#!/usr/bin/env bash
# Device call 1 (run from the repo root on the GPU machine): keep the first carried part of the wheels where
# the next call finds it (the machine stays warm between back-to-back calls), and say what the machine is.
set -euo pipefail
STASH=${STASH:-$HOME/h200-stash}
mkdir -p "$STASH"
cp .cache/h200/part1/* "$STASH"/
ls -l "$STASH"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
