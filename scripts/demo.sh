#!/usr/bin/env bash
# The main job, end to end on one machine: install the dependencies, fetch the default model,
# build Release, make the default pair (cloud = Gemma 3 270M Q4_K_M, edge = the same model at
# Q2_K), start `tandem serve` with the cloud model on 127.0.0.1, run `tandem run --mode route`
# with the edge model on a prompt (the answer streams with the cloud's tokens in colour, then
# the stats), and stop the server.
#   scripts/demo.sh ["prompt" [N_TOKENS [extra tandem-run flags...]]]
# Env: TANDEM_BUILD (default build), JOBS (default nproc), TANDEM_DEMO_PORT (default: a free one).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
PROMPT=${1:-Q: What is the capital of France?
A: Paris.
Q: What is the largest planet in the solar system?
A:}
N=${2:-48}
shift $(($# > 2 ? 2 : $#))

"$ROOT/scripts/setup.sh" >&2
"$ROOT/scripts/fetch_model.sh" >/dev/null
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target tandem >&2
mapfile -t PAIR < <("$ROOT/scripts/make_pair.sh")
CLOUD=${PAIR[0]}
EDGE=${PAIR[1]}

PORT=${TANDEM_DEMO_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
LOG=$(mktemp -t tandem-serve.XXXXXX.log)
"$BUILD/tandem" serve -m "$CLOUD" --host 127.0.0.1 --port "$PORT" -t 1 2>"$LOG" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.1
done
echo "cloud: $(basename "$CLOUD") on http://127.0.0.1:$PORT   edge: $(basename "$EDGE")" >&2
"$BUILD/tandem" run -m "$EDGE" --cloud "http://127.0.0.1:$PORT" --mode route -t 1 \
  -p "$PROMPT" -n "$N" --temp 0 "$@"
