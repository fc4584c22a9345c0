#!/usr/bin/env bash
# Runs a Python test with the interpreter of the tests' virtual environment (scripts/setup.sh
# makes it under the tandem cache, with the openai client); exits 77 (skipped) without it.
set -euo pipefail
PY=${TANDEM_PYTHON:-${TANDEM_CACHE:-$HOME/.cache/tandem}/venv/bin/python}
if [[ ! -x "$PY" ]] || ! "$PY" -c "import openai" 2>/dev/null; then
  echo "skipped: no Python with the openai package at $PY (run scripts/setup.sh)"
  exit 77
fi
exec "$PY" "$@"
