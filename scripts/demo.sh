#!/usr/bin/env bash
# The main job, end to end: install the dependencies, fetch the default model, build Release and
# generate greedily with it.
#   scripts/demo.sh ["prompt" [N_TOKENS]]
# Env: TANDEM_BUILD (default build), JOBS (default nproc).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
PROMPT=${1:-The capital of France is}
N=${2:-16}

"$ROOT/scripts/setup.sh"
MODEL=$("$ROOT/scripts/fetch_model.sh")
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target tandem
"$BUILD/tandem" generate -m "$MODEL" -p "$PROMPT" -n "$N" --temp 0
