#!/usr/bin/env bash
# On the GPU machine (no registry there): install the carried wheels (.whl, see
# ../shared/gpu/fetch-wheels.sh), make this checkout importable as `kiln`, run the CUDA tests,
# then the side-by-side GPU bench. Logs go to $OUT (or ./out). Arguments go to `kiln bench gpu`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/kiln
export PYTHONPATH=/tmp/pkg:/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
KILN_TEST_LOWERED=$PWD/lowered timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log" | tail -15
timeout "${BENCH_TIMEOUT:-330}" python3 -m kiln.cli bench gpu "$@" --json "$out/bench.json" 2>&1 \
  | tee "$out/bench.log" | tail -20
