#!/usr/bin/env bash
# Makes the default model pair and prints both paths on stdout, cloud first, one per line:
#   cloud = Gemma 3 270M Q4_K_M (scripts/fetch_model.sh)
#   edge  = the same model taken to Q2_K by `tandem quantize` (a Q3_K/Q4_0/Q5_0 mix: Gemma's rows
#           of 640 fall back), cached beside it as gemma-3-270m-q2_k.gguf
# Env: TANDEM_BUILD (default build; needs build/tandem), TANDEM_CACHE.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
CLOUD=$("$ROOT/scripts/fetch_model.sh")
EDGE=$(dirname "$CLOUD")/gemma-3-270m-q2_k.gguf
if [[ ! -s "$EDGE" ]]; then
  echo "[make_pair] quantizing the edge model: $EDGE" >&2
  if ! "$BUILD/tandem" quantize "$CLOUD" "$EDGE.tmp" Q2_K >"$EDGE.log" 2>&1; then
    cat "$EDGE.log" >&2
    exit 1
  fi
  tail -n 3 "$EDGE.log" >&2  # the summary; the per-tensor fallbacks are in $EDGE.log
  mv "$EDGE.tmp" "$EDGE"
fi
echo "$CLOUD"
echo "$EDGE"
