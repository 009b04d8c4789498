#!/usr/bin/env bash
# One GPU-machine call: per-kernel diagnostics of the CUDA backend on small lowered models, then
# the side-by-side bench (arguments go to `kiln bench gpu`). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/kiln
export PYTHONPATH=/tmp/pkg:/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout "${DEBUG_TIMEOUT:-150}" python3 scripts/gpu_debug.py ${DEBUG_MODELS:-lowered/tiny2_f32 lowered/tiny2_bf16} \
  2>&1 | grep -v Warning | tee "$out/debug.log" | tail -40
timeout "${BENCH_TIMEOUT:-300}" python3 -m kiln.cli bench gpu "$@" --json "$out/bench.json" 2>&1 \
  | tee "$out/bench.log" | tail -12
