#!/usr/bin/env bash
# The routing figures of docs/results.md and docs/router.md, on the default pair (cloud Gemma 3 270M Q4_K_M, edge
# the same at Q2_K), through the real system: a `tandem serve` with the cloud model on
# 127.0.0.1 and `tandem eval` decoding on the device side. Each stage resumes from its logs.
#   scripts/routing_figures.sh [STAGE...]     (default: all of them, in this order)
#     all       LAMBADA: local and cloud on all 5,153 passages          -> $OUT/lambada-all
#     routers   traces of LAMBADA passages 0-2575 and of WikiText-2 validation; three routers:
#               lambada-fixes, wikitext-fixes (never saw LAMBADA), wikitext-kl (for text)
#     heldout   LAMBADA passages 2576-5152: local, cloud, route at six shares for confidence,
#               entropy, margin and both -fixes routers, speculative   -> $OUT/lambada-heldout
#     tasks     the LAMBADA router on CommonsenseQA dev and ARC-Challenge: cloud, and route at
#               2% and 7%, for agreement with the cloud's answers      -> $OUT/tasks-{csqa,arc-challenge}
#     gain      the target-rate controller's gain, chosen on WikiText-2 validation chunks 64-79
#               (wikitext-kl trained on 0-63): a sweep            -> $OUT/gain-valid-G
#     wikitext  WikiText-2 test, all 606 chunks: log-likelihood gap recovered by the
#               heuristics and wikitext-kl (trained on validation only) -> $OUT/wikitext-test
#     mc        CommonsenseQA dev, ARC-Easy, ARC-Challenge, PIQA, five shots: local, cloud,
#               route at five shares for confidence and wikitext-fixes, speculative
#                                                                        -> $OUT/mc-TASK
#   The routers of docs/benchmarks.md's experiments (train on validation text and task train
#   splits only; reported on the WikiText-2 test file and the tasks' dev sets):
#     csqa-router   traces of 4,000 CommonsenseQA train items; csqa-disagree (label disagree),
#                   mixed (disagree, those and the WikiText-2 validation trace together)
#     outcome       8 validation chunks with the outcome label; outcome8-{outcome-25,kl,disagree}
#                   on 32 test chunks from 303                          -> $OUT/wikitext-outcome
#     http          64 validation chunks traced over HTTP (top-20 KL); wikitext-kl-http
#     task-routers  csqa-disagree and mixed next to confidence at 1, 2, 7% on CommonsenseQA dev,
#                   ARC-Easy and ARC-Challenge                         -> $OUT/routers-TASK
#     text-routers  wikitext-kl, -kl-http, mixed and csqa-disagree on the WikiText-2 test file
#                                                                      -> $OUT/wikitext-routers
# Env: TANDEM_BUILD (default build), OUT (default eval-out), THREADS (default 2).
# The split (docs/eval.md): passages 0-2575 train routers and choose settings (the rates below
# were chosen on them); 2576-5152 are only reported.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
OUT=${OUT:-$ROOT/eval-out}
T=${THREADS:-2}
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(all routers gain heldout tasks wikitext mc)
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh" gemma)
CLOUD=${PAIR[0]}
EDGE=${PAIR[1]}
TANDEM=$BUILD/tandem
mkdir -p "$OUT"

source "$ROOT/scripts/serve_lib.sh"
# The server starts with the first stage that asks it (wikitext and router collect read both
# models from files).
URL=
need_cloud() {
  [[ -n $URL ]] && return 0
  trap stop_cloud EXIT
  start_cloud "$TANDEM" "$CLOUD" "$T" "$OUT/serve.log"
}

# Controller targets. The controller holds a share of every generated token, and each LAMBADA
# answer also generates the token that ends its word. On passages 0-999 (training half) at a
# 3.5% target, the LAMBADA router realised 6.46% of answer tokens (1.84x: it almost never routes
# the word-ending token, which it never saw in training), the WikiText router 3.27% and, at 4%,
# the confidence policy 4.0% (passages 0-599). So the heuristics and the WikiText router run at
# the shares reported, and the LAMBADA router at those shares / 1.84. Every row shows its
# realised share of answer tokens and the oracle at that share.
RATES=0.01,0.02,0.05,0.07,0.1,0.2
MC_RATES=0.02,0.05,0.07,0.1,0.2
LAMBADA_ROUTER_RATES=0.0055,0.011,0.027,0.038,0.054,0.109

set -x  # each command, with every setting, on stderr
for stage in "${STAGES[@]}"; do
  case $stage in
    all)
      need_cloud
      "$TANDEM" eval --task lambada -m "$EDGE" --cloud "$URL" --modes local,cloud \
        --no-sync-ahead -t "$T" --out "$OUT/lambada-all"
      ;;
    routers)
      "$TANDEM" router collect --task lambada --chunk-offset 0 --chunks 2576 -m "$EDGE" \
        --cloud-model "$CLOUD" --top-k 8 -t "$T" --out "$OUT/lambada-0-2575.trace"
      "$TANDEM" router train --traces "$OUT/lambada-0-2575.trace" --label fixes --hidden 16 \
        --seed 1 --out "$OUT/lambada-fixes.gguf" --json >"$OUT/lambada-fixes.json"
      "$TANDEM" router collect --task wikitext-valid --chunks 64 -m "$EDGE" \
        --cloud-model "$CLOUD" --top-k 8 -t "$T" --out "$OUT/wikitext-valid64.trace"
      "$TANDEM" router train --traces "$OUT/wikitext-valid64.trace" --label fixes --hidden 16 \
        --seed 1 --out "$OUT/wikitext-fixes.gguf" --json >"$OUT/wikitext-fixes.json"
      "$TANDEM" router train --traces "$OUT/wikitext-valid64.trace" --label kl --hidden 32 \
        --weight-decay 0.05 --min-position 256 --seed 1 --out "$OUT/wikitext-kl.gguf" \
        --json >"$OUT/wikitext-kl.json"
      ;;
    heldout)
      # The held-out half's local and cloud answers are those of the full run (same passages,
      # greedy): seeded from its logs when present, asked again otherwise.
      need_cloud
      mkdir -p "$OUT/lambada-heldout"
      for run in local cloud; do
        if [[ -s "$OUT/lambada-all/items-$run.jsonl" && ! -e "$OUT/lambada-heldout/items-$run.jsonl" ]]; then
          cp "$OUT/lambada-all/items-$run.jsonl" "$OUT/lambada-heldout/items-$run.jsonl"
        fi
      done
      "$TANDEM" eval --task lambada -m "$EDGE" --cloud "$URL" --items 2576-5152 \
        --modes local,cloud,route,speculative --rates "$RATES" \
        --policy confidence,entropy,margin \
        --router "$OUT/lambada-fixes.gguf@$LAMBADA_ROUTER_RATES" \
        --router "$OUT/wikitext-fixes.gguf@$RATES" \
        --target-gain 0.2 --draft 4 --no-sync-ahead -t "$T" --out "$OUT/lambada-heldout"
      ;;
    tasks)
      need_cloud
      for task in csqa arc-challenge; do
        "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" --shots 5 --modes cloud,route \
          --rates 0.02,0.07 --router "$OUT/lambada-fixes.gguf" --target-gain 0.2 \
          --no-sync-ahead -t "$T" --out "$OUT/tasks-$task"
      done
      ;;
    gain)
      # The gain every other stage pins (0.2) is the smallest of these with which every policy
      # keeps >= 95% of its 256-token windows within a point of the 2%, 7% and 20% targets.
      for g in 0.002 0.02 0.05 0.1 0.2 0.5; do
        "$TANDEM" eval --task wikitext-valid -m "$EDGE" --cloud-model "$CLOUD" --chunks 16 \
          --chunk-tokens 512 --chunk-offset 64 --router "$OUT/wikitext-kl.gguf" \
          --rates 0.02,0.07,0.2 --target-gain "$g" -t "$T" --no-plots --out "$OUT/gain-valid-$g"
      done
      ;;
    wikitext)
      "$TANDEM" eval --task wikitext -m "$EDGE" --cloud-model "$CLOUD" --chunks 606 \
        --chunk-tokens 512 --chunk-offset 0 --router "$OUT/wikitext-kl.gguf" \
        --rates 0.02,0.05,0.07,0.1,0.2 --target-gain 0.2 -t "$T" --out "$OUT/wikitext-test"
      ;;
    mc)
      # The tasks' pair is level (docs/results.md), so these rows show agreement with the
      # cloud's answers; the router never saw a task item.
      need_cloud
      for task in csqa arc-easy arc-challenge piqa; do
        "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" --shots 5 \
          --modes local,cloud,route,speculative --rates "$MC_RATES" --policy confidence \
          --router "$OUT/wikitext-fixes.gguf@$MC_RATES" --target-gain 0.2 --draft 4 \
          --no-sync-ahead -t "$T" --out "$OUT/mc-$task"
      done
      ;;
    csqa-router)
      "$TANDEM" router collect --task csqa-train --chunks 4000 -m "$EDGE" --cloud-model "$CLOUD" \
        -t "$T" --out "$OUT/csqa4000.trace"
      "$TANDEM" router train --traces "$OUT/csqa4000.trace" --label disagree --hidden 32 \
        --weight-decay 0.05 --seed 1 --out "$OUT/csqa-disagree.gguf" --json \
        >"$OUT/csqa-disagree.json"
      "$TANDEM" router train --traces "$OUT/wikitext-valid64.trace" --traces "$OUT/csqa4000.trace" \
        --label disagree --hidden 32 --weight-decay 0.05 --min-position 256 --seed 1 \
        --out "$OUT/mixed.gguf" --json >"$OUT/mixed.json"
      ;;
    outcome)
      # 8 chunks: two edge continuations at every divergent position cost ~1 min a chunk.
      "$TANDEM" router collect --task wikitext-valid --chunks 8 --first-position 256 \
        --outcome-share 1 --outcome-tokens 16 -m "$EDGE" --cloud-model "$CLOUD" -t "$T" \
        --out "$OUT/outcome8.trace"
      for label in outcome:0.25 kl disagree; do
        name=outcome8-${label/:0./-}
        "$TANDEM" router train --traces "$OUT/outcome8.trace" --label "$label" --hidden 32 \
          --weight-decay 0.05 --seed 1 --out "$OUT/$name.gguf" --json >"$OUT/$name.json"
      done
      # The three on 32 test chunks, next to the heuristics of the same run.
      "$TANDEM" eval --task wikitext -m "$EDGE" --cloud-model "$CLOUD" --chunks 32 \
        --chunk-tokens 512 --chunk-offset 303 --router "$OUT/outcome8-outcome-25.gguf" \
        --router "$OUT/outcome8-kl.gguf" --router "$OUT/outcome8-disagree.gguf" \
        --rates 0.02,0.05,0.07,0.1,0.2 --target-gain 0.2 -t "$T" --out "$OUT/wikitext-outcome"
      ;;
    http)
      need_cloud
      "$TANDEM" router collect --task wikitext-valid --chunks 64 -m "$EDGE" --cloud "$URL" \
        --top-k 8 -t "$T" --out "$OUT/http-valid64.trace"
      "$TANDEM" router train --traces "$OUT/http-valid64.trace" --label kl --hidden 32 \
        --weight-decay 0.05 --min-position 256 --seed 1 --out "$OUT/wikitext-kl-http.gguf" \
        --json >"$OUT/wikitext-kl-http.json"
      ;;
    task-routers)
      # Route runs only; local, cloud and confidence at 2% and 7% are those of stage mc (the same
      # greedy answers), seeded from its logs once stage mc has finished them (results.json
      # names them). A half-written log would be resumed, and a resumed route run starts its
      # controller afresh, so its decisions would differ from an uninterrupted run's.
      need_cloud
      for task in csqa arc-easy arc-challenge; do
        mkdir -p "$OUT/routers-$task"
        for run in local cloud route-confidence-2% route-confidence-7%; do
          if grep -q "\"run\": *\"$run\"" "$OUT/mc-$task/results.json" 2>/dev/null &&
            [[ ! -e "$OUT/routers-$task/items-$run.jsonl" ]]; then
            cp "$OUT/mc-$task/items-$run.jsonl" "$OUT/routers-$task/items-$run.jsonl"
          fi
        done
        "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" --shots 5 --modes local,cloud,route \
          --rates 0.01,0.02,0.07 --policy confidence --router "$OUT/csqa-disagree.gguf" \
          --router "$OUT/mixed.gguf" --target-gain 0.2 --no-sync-ahead -t "$T" \
          --out "$OUT/routers-$task"
      done
      ;;
    text-routers)
      "$TANDEM" eval --task wikitext -m "$EDGE" --cloud-model "$CLOUD" --chunks 606 \
        --chunk-tokens 512 --chunk-offset 0 --router "$OUT/wikitext-kl.gguf" \
        --router "$OUT/wikitext-kl-http.gguf" --router "$OUT/mixed.gguf" \
        --router "$OUT/csqa-disagree.gguf" --rates 0.02,0.05,0.07,0.1,0.2 --target-gain 0.2 \
        -t "$T" --out "$OUT/wikitext-routers"
      ;;
    *)
      echo "unknown stage '$stage' (all, routers, gain, heldout, tasks, wikitext, mc, csqa-router, outcome, http, task-routers, text-routers)" >&2
      exit 2
      ;;
  esac
done
