#!/usr/bin/env bash
# Quantizes the default model (or $1) into every type tandem can make and measures each against
# the original: WikiText-2 perplexity (first N chunks of 512 tokens), mean KL divergence and top-1
# agreement versus the original's logits, and file size. Prints a markdown table on stdout.
# Usage: scripts/quant_sweep.sh [MODEL.gguf] ; env CHUNKS (default 20), THREADS (2), OUT_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TANDEM=${TANDEM:-./build/tandem}
BASE=${1:-$(bash scripts/fetch_model.sh)}
CHUNKS=${CHUNKS:-20}
THREADS=${THREADS:-2}
TEXT=${TEXT:-../shared/data/wikitext-2/test.txt}
OUT_DIR=${OUT_DIR:-${TANDEM_CACHE:-$HOME/.cache/tandem}/quant-sweep}
TYPES=${TYPES:-"Q8_0 Q6_K Q5_K_M Q5_1 Q5_0 Q4_K_M Q4_K_S Q4_1 Q4_0 Q3_K_L Q3_K_M Q3_K_S Q2_K"}
mkdir -p "$OUT_DIR"
[[ -x $TANDEM ]] || { echo "build first: $TANDEM not found" >&2; exit 1; }

row() {  # row LABEL MODEL
  local json
  json=$("$TANDEM" perplexity -m "$2" -f "$TEXT" -c 512 --chunks "$CHUNKS" -t "$THREADS" \
    --kl-base "$BASE" --json 2>/dev/null)
  python3 - "$1" "$2" "$json" <<'PY'
import json, os, sys
label, path, d = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
size = os.path.getsize(path) / 2**20
print(f"| {label} | {size:.1f} | {d['ppl']:.3f} ± {d['ppl_se']:.3f} | {d['kl']:.5f} ± {d['kl_se']:.5f} "
      f"| {100*d['top1']:.1f} ± {100*d['top1_se']:.1f} |")
PY
}

echo "| type | MiB | PPL (wikitext-2, $CHUNKS×512) | mean KL vs original | top-1 agreement % |"
echo "|---|---|---|---|---|"
row "original Q4_K_M" "$BASE"
for t in $TYPES; do
  out="$OUT_DIR/gemma-3-270m-$t.gguf"
  [[ -f $out ]] || "$TANDEM" quantize "$BASE" "$out" "$t" -t "$THREADS" >/dev/null 2>&1
  row "$t" "$out"
done
