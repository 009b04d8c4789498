#!/usr/bin/env bash
# The main job: install, lower SmolLM2 to Kiln's IR and print the reference interpreter's greedy
# continuation of a prompt. Extra arguments go to `kiln reference` (e.g. --prompt "...").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec kiln reference smollm2 "$@"
