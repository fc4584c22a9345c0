#!/usr/bin/env bash
# Takes the screenshots of docs/ui.md with the browser test's own script, against the real
# default pair: cloud = Gemma 3 270M Q4_K_M under `tandem serve -t 1`, edge = its Q2_K
# (scripts/make_pair.sh), and a few-shot completion prompt (the model is a base model).
#   scripts/ui_screenshots.sh [OUT_DIR (default docs/ui)]
# Env: TANDEM_BUILD (default build). Needs chromium, chromium-driver and the venv's selenium
# (scripts/setup.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
OUT=${1:-$ROOT/docs/ui}
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh" gemma)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$ROOT/tests/server/run_python.sh" "$ROOT/tests/ui/test_ui_browser.py" "$BUILD/tandem" \
  "${PAIR[1]}" "${PAIR[0]}" "$TMP" --docs
mkdir -p "$OUT"
for f in "$TMP"/docs-*.png "$TMP"/cloud-down.png; do
  cp "$f" "$OUT/$(basename "$f" | sed 's/^docs-//')"
done
echo "screenshots in $OUT" >&2
