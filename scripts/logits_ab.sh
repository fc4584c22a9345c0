#!/usr/bin/env bash
# Logits and hidden states of a model on the first 300 tokens of WikiText-2 test, from two tandem
# binaries: byte-for-byte comparison. Usage: logits_ab.sh OLD_TANDEM NEW_TANDEM MODEL...
set -euo pipefail
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OLD=$1; NEW=$2; shift 2
TXT=${TANDEM_SHARED:-$(dirname "$0")/../../shared}/data/wikitext-2/test.txt
for M in "$@"; do
  ids=$(head -c 4000 "$TXT" | "$NEW" tokenize -m "$M" --json | python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['ids'][:300])))")
  n=$(tr ',' '\n' <<<"$ids" | wc -l)
  for side in old new; do
    bin=$OLD; [[ $side == new ]] && bin=$NEW
    "$bin" logits -m "$M" --ids "$ids" --out $TMP/l-$side.f32 --hidden $TMP/h-$side.f32 -t 2 2>/dev/null
  done
  cmp $TMP/l-old.f32 $TMP/l-new.f32 && cmp $TMP/h-old.f32 $TMP/h-new.f32 &&
    echo "$(basename "$M"): $n positions, logits $(stat -c %s $TMP/l-new.f32) B and hidden $(stat -c %s $TMP/h-new.f32) B identical"
done
