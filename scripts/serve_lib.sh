# Sourced by the scripts that need a cloud on this machine (demo.sh, routing_figures.sh):
#   start_cloud TANDEM MODEL THREADS LOG [PORT]
# starts `TANDEM serve -m MODEL` on 127.0.0.1 (PORT, else a free one; pinned to core CLOUD_CPU
# when that is set), waits until /health
# answers (printing LOG and failing when the server dies first), and sets SERVER (its pid) and
# URL. The caller stops it: trap 'stop_cloud' EXIT.
start_cloud() {
  local tandem=$1 model=$2 threads=$3 log=$4
  local port=${5:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  # CLOUD_CPU=N pins the server to core N (taskset execs it, so SERVER is the server's pid).
  ${CLOUD_CPU:+taskset -c "$CLOUD_CPU"} "$tandem" serve -m "$model" --host 127.0.0.1 \
    --port "$port" -t "$threads" 2>"$log" &
  SERVER=$!
  URL=http://127.0.0.1:$port
  for _ in $(seq 1 300); do
    curl -sf "$URL/health" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.1
  done
  echo "the server on $URL did not answer /health within 30 s" >&2
  return 1
}

stop_cloud() {
  kill "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  return 0
}
