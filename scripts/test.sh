#!/usr/bin/env bash
# Configures (once) and builds tandem, then runs the whole test suite with ctest.
#
#   scripts/test.sh [CTEST_ARGS...]        e.g. scripts/test.sh -L gguf     scripts/test.sh -R Vocab
#
# Env: TANDEM_BUILD          build directory (default: build)
#      TANDEM_CMAKE_ARGS     extra arguments for the first configure (e.g. -DTANDEM_SANITIZE=ON)
#      TANDEM_BUILD_TARGETS  targets to build (default: all)
#      JOBS                  parallel build and test jobs (default: nproc)
# Tests that need the real default model look for it via TANDEM_MODEL or the cache of
# scripts/fetch_model.sh and are skipped when it is absent.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
JOBS=${JOBS:-$(nproc)}

if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release ${TANDEM_CMAKE_ARGS:-}
fi
TARGETS=()
for t in ${TANDEM_BUILD_TARGETS:-}; do TARGETS+=(--target "$t"); done
cmake --build "$BUILD" -j "$JOBS" "${TARGETS[@]}"
cd "$BUILD"
ctest --output-on-failure -j "$JOBS" "$@"
