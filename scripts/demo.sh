#!/usr/bin/env bash
# The main job, end to end on one machine: install the dependencies, fetch the default model,
# build Release, make the default pair (cloud = Gemma 3 270M Q4_K_M, edge = the same model at
# Q2_K), start `tandem serve` with the cloud model on 127.0.0.1, and answer a few-shot prompt
# twice with the edge model: alone (`--mode local`), then routed (`--mode route`) at a 7% target
# cloud share, the paper's operating point (the answer streams with the cloud's tokens in colour,
# then the stats). On the default prompt one or two cloud tokens turn the edge's wrong answer
# right. Then the server stops.
#   scripts/demo.sh ["prompt" [N_TOKENS [extra tandem-run flags...]]]
# Env: TANDEM_BUILD (default build), JOBS (default nproc), TANDEM_DEMO_PORT (default: a free one).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
PROMPT=${1:-Q: What is the capital of France?
A: Paris.
Q: What is the largest planet in the solar system?
A: Jupiter.
Q: Who wrote Romeo and Juliet?
A:}
N=${2:-24}
shift $(($# > 2 ? 2 : $#))

"$ROOT/scripts/setup.sh" >&2
"$ROOT/scripts/fetch_model.sh" >/dev/null
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target tandem >&2
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh")
CLOUD=${PAIR[0]}
EDGE=${PAIR[1]}

source "$ROOT/scripts/serve_lib.sh"
LOG=$(mktemp -t tandem-serve.XXXXXX.log)
trap 'stop_cloud; rm -f "$LOG"' EXIT
start_cloud "$BUILD/tandem" "$CLOUD" 1 "$LOG" "${TANDEM_DEMO_PORT:-}"
echo "cloud: $(basename "$CLOUD") on $URL   edge: $(basename "$EDGE")" >&2
echo "--- the edge model alone (--mode local):" >&2
"$BUILD/tandem" run -m "$EDGE" --mode local -t 1 -p "$PROMPT" -n "$N" --temp 0 2>/dev/null
echo >&2
# Route mode at a 7% target share, unless the extra flags choose a mode, threshold or target.
MODE=(--mode route)
SHARE=(--target-rate 0.07)
for flag in "$@"; do
  [[ $flag == --mode* ]] && MODE=()
  [[ $flag == --threshold* || $flag == --target-rate* || $flag == --mode* ]] && SHARE=()
done
echo "--- with the cloud (${MODE[*]} ${SHARE[*]} $*; cloud tokens in colour on a terminal):" >&2
"$BUILD/tandem" run -m "$EDGE" --cloud "$URL" "${MODE[@]}" "${SHARE[@]}" -t 1 \
  -p "$PROMPT" -n "$N" --temp 0 "$@"
