#!/usr/bin/env bash
# The default pair's routing figures (docs/results.md, "The paper's pair"): Qwen2.5-Coder 0.5B
# Instruct on the device, 1.5B Instruct in the cloud (a `tandem serve` on 127.0.0.1), items asked
# as chat turns with 5 shots and answered "The answer is (X) TEXT." (--chat-answer choice: the
# form docs/eval.md chose on CommonsenseQA train for the 0.5B alone). Each stage resumes from its
# item logs.
#   scripts/qwen_figures.sh [STAGE...]
#     choose   CommonsenseQA *train* items 2400-2599 (never traced for the router): local, cloud,
#              the shipped router and confidence at 7% -- where the router's controller target
#              is read against its realised share                       -> $OUT/choose-csqa
#     csqa     CommonsenseQA dev, all 1,221 items: local, cloud, route at $RATES for the shipped
#              router and for $POLICIES                                  -> $OUT/csqa-dev
#     arc-challenge, arc-easy
#              the ARC dev files, all items, the same runs as csqa (the router trained on
#              CommonsenseQA train, applied as it ships)                -> $OUT/TASK-dev
#     choose-lambada
#              LAMBADA *training* passages 0-199, the 0.5B alone, asked plain (the passage) and
#              as a chat turn: which form the lambada stage uses     -> $OUT/choose-lambada-*
#     lambada  LAMBADA's held-out half, passages 2576-5152, zero-shot and plain: local, cloud,
#              route at $RATES for $POLICIES (no router: the one trained for this pair on
#              passages 0-2575 validated below the heuristics, docs/router.md)
#                                                                        -> $OUT/lambada-heldout
# Env: TANDEM_BUILD (default build), OUT (default eval-out/qwen), THREADS (default 2; the cloud
# gets the same), RATES (default 0.07: the heuristics' target shares), ROUTER_RATES (the shipped
# router's, default RATES), POLICIES (default confidence; "," for none), MODES (default
# local,cloud,route: a run already in the out folder is kept, so a stage may be split and its
# report rebuilt from the item logs by running it again with every rate and policy).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
OUT=${OUT:-$ROOT/eval-out/qwen}
T=${THREADS:-2}
RATES=${RATES:-0.07}
ROUTER_RATES=${ROUTER_RATES:-$RATES}
POLICIES=${POLICIES:-confidence}
MODES=${MODES:-local,cloud,route}
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(choose csqa)
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh" qwen)
CLOUD=${PAIR[0]}
EDGE=${PAIR[1]}
TANDEM=$BUILD/tandem
ROUTER=$ROOT/routers/qwen2.5-coder-0.5b-csqa-choice-fixes.gguf
mkdir -p "$OUT"

source "$ROOT/scripts/serve_lib.sh"
trap stop_cloud EXIT
start_cloud "$TANDEM" "$CLOUD" "$T" "$OUT/serve.log"

# pair_eval TASK OUTDIR [more flags]: the device model against the cloud, greedy, the command
# printed as it runs.
pair_eval() {
  local task=$1 out=$2
  shift 2
  echo "+ tandem eval --task $task -m $EDGE --cloud $URL -t $T --out $out $*" >&2
  "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" -t "$T" --out "$out" "$@"
}

# qwen_eval TASK OUTDIR [more flags]: in the pair's chat form (LAMBADA is asked plain instead,
# docs/eval.md).
qwen_eval() {
  local task=$1 out=$2
  shift 2
  pair_eval "$task" "$out" --chat --chat-answer choice --shots 5 "$@"
}

for stage in "${STAGES[@]}"; do
  case $stage in
    choose)
      qwen_eval csqa-train "$OUT/choose-csqa" --items 2400-2599 --modes local,cloud,route \
        --policy confidence --rates 0.07 --router "$ROUTER@0.07"
      ;;
    csqa)
      qwen_eval csqa "$OUT/csqa-dev" --modes "$MODES" --policy "$POLICIES" \
        --rates "$RATES" --router "$ROUTER@$ROUTER_RATES"
      ;;
    arc-challenge | arc-easy)
      qwen_eval "$stage" "$OUT/$stage-dev" --modes "$MODES" --policy "$POLICIES" \
        --rates "$RATES" --router "$ROUTER@$ROUTER_RATES"
      ;;
    choose-lambada)
      pair_eval lambada "$OUT/choose-lambada-plain" --items 0-199 --modes local
      pair_eval lambada "$OUT/choose-lambada-chat" --items 0-199 --modes local --chat
      ;;
    lambada)
      pair_eval lambada "$OUT/lambada-heldout" --items 2576-5152 --modes "$MODES" \
        --policy "$POLICIES" --rates "$RATES"
      ;;
    *)
      echo "qwen_figures.sh: unknown stage '$stage'" >&2
      exit 2
      ;;
  esac
done
