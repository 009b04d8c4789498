#!/usr/bin/env bash
# The main job: install (scripts/setup.sh: a virtual environment from the lock), compile
# SmolLM2-135M for this CPU with a small search budget, then generate from a prompt with the
# compiled artifact (streaming). Arguments go to `kiln generate` (e.g. --prompt "..."
# --max-new-tokens 48). KILN_BUDGET and KILN_OUT change the budget and the
# artifact folder; the tuning database (~/.cache/kiln) makes a second run re-measure nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$(realpath -m "${KILN_VENV:-.venv}")/bin:$PATH"
out=${KILN_OUT:-build/smollm2-cpu}
kiln compile smollm2 --out "$out" --budget "${KILN_BUDGET:-2m}" --max-seq 256
exec kiln generate "$out" "$@"
