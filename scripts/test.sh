#!/usr/bin/env bash
# Install (scripts/setup.sh: a virtual environment from the lock), then run the whole test suite
# in it. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=$(realpath -m "${KILN_VENV:-.venv}")
export PATH="$venv/bin:$PATH"      # the `kiln` command, for tests that run it
exec "$venv/bin/python" -m pytest -q "$@"
