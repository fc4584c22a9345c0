#!/usr/bin/env bash
# Makes the routers that ship in routers/ (docs/router.md, "Routers that ship"), each from its
# pair's training data only (docs/eval.md, the split), with the commands printed as they run:
#   scripts/make_routers.sh [qwen|gemma ...]     (default: both)
#     qwen   Qwen2.5-Coder 0.5B -> 1.5B Instruct: CommonsenseQA *train* items 0-1199 asked as
#            chat turns (5 shots, answers "The answer is (X) TEXT.": the form docs/eval.md chose
#            for the 0.5B alone), teacher-forced on the item's reference answer in that form;
#            label fixes (the 0.5B's token is wrong, the 1.5B's right)
#            -> routers/qwen2.5-coder-0.5b-csqa-choice-fixes.gguf
#     gemma  Gemma 3 270M Q2_K -> Q4_K_M: LAMBADA passages 0-2575 on their last word; label
#            fixes -> routers/gemma-3-270m-q2_k-lambada-fixes.gguf
# Traces go to $OUT (default eval-out/routers; a trace there is resumed). Env: TANDEM_BUILD
# (default build), THREADS (default 2), QWEN_ITEMS (default 1200).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
OUT=${OUT:-$ROOT/eval-out/routers}
T=${THREADS:-2}
QWEN_ITEMS=${QWEN_ITEMS:-1200}
TANDEM=$BUILD/tandem
PAIRS=("$@")
[[ ${#PAIRS[@]} -gt 0 ]] || PAIRS=(qwen gemma)
mkdir -p "$OUT" "$ROOT/routers"

say_run() {
  echo "+ $*" >&2
  "$@"
}

for pair in "${PAIRS[@]}"; do
  mapfile -t FILES < <("$ROOT/scripts/make_pair.sh" "$pair")
  CLOUD=${FILES[0]}
  EDGE=${FILES[1]}
  case $pair in
    qwen)
      trace=$OUT/qwen-csqa-train-choice-0-$((QWEN_ITEMS - 1)).trace
      say_run "$TANDEM" router collect --task csqa-train --chat --chat-answer choice --shots 5 \
        --chunks "$QWEN_ITEMS" \
        -m "$EDGE" --cloud-model "$CLOUD" --top-k 8 -t "$T" --out "$trace"
      say_run "$TANDEM" router train --traces "$trace" --label fixes --hidden 16 --seed 1 \
        --cloud-name "Qwen2.5 Coder 1.5B Instruct GGUF (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)" \
        --out "$ROOT/routers/qwen2.5-coder-0.5b-csqa-choice-fixes.gguf"
      ;;
    gemma)
      trace=$OUT/gemma-lambada-0-2575.trace
      say_run "$TANDEM" router collect --task lambada --chunk-offset 0 --chunks 2576 -m "$EDGE" \
        --cloud-model "$CLOUD" --top-k 8 -t "$T" --out "$trace"
      say_run "$TANDEM" router train --traces "$trace" --label fixes --hidden 16 --seed 1 \
        --cloud-name "Gemma 3 270m (gemma-3-270m-q4_k_m.gguf)" \
        --out "$ROOT/routers/gemma-3-270m-q2_k-lambada-fixes.gguf"
      ;;
    *)
      echo "make_routers.sh: unknown pair '$pair' (qwen or gemma)" >&2
      exit 2
      ;;
  esac
done
