#!/usr/bin/env bash
# Time per answer against the network round trip (docs/results.md), on the default pair: a
# `tandem serve` with the cloud model pinned to core 1 and `tandem eval` (the device) pinned to
# core 0, one thread each, a loopback delay proxy in the eval adding the round trip. Meant for a
# quiet machine: nothing else may run, or the wall-clock figures are noise.
#   scripts/rtt_figures.sh [gsm8k|lambada ...]      (default: both)
#     gsm8k    the first 6 GSM8K test items, 3 shots, answers up to 256 tokens
#     lambada  LAMBADA passages 2576-2625 (the reported half's first 50), zero-shot
# For each round trip (0, 20, 100, 200 ms): local, cloud, route at a 7% target (confidence) and
# speculative (drafts of 4), each blocking and pipelined  -> $OUT/rtt-TASK-RTT{,-blocking};
# and route at 100 ms without sync-ahead, blocking and pipelined -> $OUT/rtt-TASK-100-nosync*
# Env: TANDEM_BUILD (default build), OUT (default eval-out).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TANDEM=${TANDEM_BUILD:-$ROOT/build}/tandem
OUT=${OUT:-$ROOT/eval-out}
TASKS=("$@")
[[ ${#TASKS[@]} -gt 0 ]] || TASKS=(gsm8k lambada)
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh" gemma)
CLOUD=${PAIR[0]}
EDGE=${PAIR[1]}
mkdir -p "$OUT"
source "$ROOT/scripts/serve_lib.sh"
trap stop_cloud EXIT
CLOUD_CPU=1 start_cloud "$TANDEM" "$CLOUD" 1 "$OUT/serve-rtt.log"

set -x
for task in "${TASKS[@]}"; do
  case $task in
    gsm8k) SELECT=(--limit 6 --shots 3) ;;
    lambada) SELECT=(--items 2576-2625) ;;
    *)
      echo "unknown task '$task' (gsm8k, lambada)" >&2
      exit 2
      ;;
  esac
  for rtt in 0 20 100 200; do
    taskset -c 0 "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" "${SELECT[@]}" \
      --modes local,cloud,route,speculative --rates 0.07 --policy confidence --target-gain 0.2 \
      --draft 4 --pipeline --rtt-ms "$rtt" --no-plots -t 1 --out "$OUT/rtt-$task-$rtt"
    taskset -c 0 "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" "${SELECT[@]}" \
      --modes route,speculative --rates 0.07 --policy confidence --target-gain 0.2 --draft 4 --no-pipeline \
      --rtt-ms "$rtt" --no-plots -t 1 --out "$OUT/rtt-$task-$rtt-blocking"
  done
  # Item 2 of issue 24: does a route event wait behind a sync-ahead push? Route at 100 ms
  # without pushes, blocking and pipelined, against the runs above.
  for how in --no-pipeline --pipeline; do
    taskset -c 0 "$TANDEM" eval --task "$task" -m "$EDGE" --cloud "$URL" "${SELECT[@]}" \
      --modes route --rates 0.07 --policy confidence --target-gain 0.2 "$how" --no-sync-ahead \
      --rtt-ms 100 --no-plots -t 1 --out "$OUT/rtt-$task-100-nosync$how"
  done
done
