#!/usr/bin/env bash
# Install (scripts/setup.sh: a virtual environment from the lock), then run the whole test suite
# in it. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# pytest imports the repository root (the kiln package) under its folder's name
if ! [[ $(basename "$PWD") =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
  echo "kiln: the tests run from a folder whose name is a Python identifier, not '$(basename "$PWD")'" \
       "(pytest imports the repository root, the kiln package, under that name); clone into kiln/" >&2
  exit 2
fi
bash scripts/setup.sh
venv=$(realpath -m "${KILN_VENV:-.venv}")
export PATH="$venv/bin:$PATH"      # the `kiln` command, for tests that run it
exec "$venv/bin/python" -m pytest -q "$@"
