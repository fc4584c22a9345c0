#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time on a
# seed corpus made at run time from ../shared/testdata (nothing of it is committed).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     default 60; targets run in parallel, one per core
#
# Env: TANDEM_FUZZ_BUILD (default build-fuzz), TANDEM_SHARED_DIR (default ../shared),
#      FUZZ_TARGETS (default: every fuzz_* target that was built).
# The corpus grown by libFuzzer stays in $TANDEM_FUZZ_BUILD/corpus/<target> for the next run;
# crashes go to $TANDEM_FUZZ_BUILD/artifacts/<target>/ and make the script exit non-zero.
set -euo pipefail

SECONDS_PER_TARGET=${1:-60}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_FUZZ_BUILD:-$ROOT/build-fuzz}
SHARED=${TANDEM_SHARED_DIR:-$ROOT/../shared}
JOBS=${JOBS:-$(nproc)}

log() { echo "[fuzz] $*" >&2; }

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON -DTANDEM_TESTS=OFF -DTANDEM_BENCH=OFF >&2
fi
# Every fuzz_* target the configuration defines (fuzz_tokenizer appears once its source lands).
cmake --build "$BUILD" -j "$JOBS" --target make_gguf_seeds fuzz_gguf >&2
if grep -q '^fuzz_tokenizer:' <(cmake --build "$BUILD" --target help 2>/dev/null | sed 's/^\.\.\. //;s/:.*$/:/'); then
  cmake --build "$BUILD" -j "$JOBS" --target fuzz_tokenizer >&2
fi

# ---- seed corpora ---------------------------------------------------------------------------------
for t in fuzz_api fuzz_ui_request fuzz_trace; do
  if grep -q "^$t:" <(cmake --build "$BUILD" --target help 2>/dev/null | sed 's/^\.\.\. //;s/:.*$/:/'); then
    cmake --build "$BUILD" -j "$JOBS" --target "$t" >&2
  fi
done

SEEDS=$BUILD/seeds
rm -rf "$SEEDS"
mkdir -p "$SEEDS/fuzz_gguf" "$SEEDS/fuzz_tokenizer" "$SEEDS/fuzz_api" "$SEEDS/fuzz_trace"
# fuzz_api inputs: one byte that picks the route (fuzz/fuzz_api.cpp's kRoutes), then the body.
# Valid requests of each kind, near misses, and the hostile shapes: nested, huge, duplicate keys,
# invalid UTF-8.
python3 - "$SEEDS/fuzz_api" <<'PY'
import sys, pathlib
out = pathlib.Path(sys.argv[1])
deep = "[" * 5000 + '"hi"' + "]" * 5000
bodies = {
    0: ['{"prompt":"Once upon","max_tokens":4,"stop":["a","bc"],"temperature":0,"logprobs":2,"echo":true}',
        '{"prompt":[1,2,3],"max_tokens":3,"stream":true,"temperature":0.7,"seed":4294967295}',
        '{"prompt":' + deep + '}', '{"prompt":"hi","max_tokens":9.3e18}',
        '{"prompt":"hi","prompt":[1,2],"max_tokens":1}', '{"prompt":"' + "<" * 12000 + '"}'],
    1: ['{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true,"logprobs":true,"top_logprobs":2}',
        '{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}',
        '{"messages":[{"role":"user","content":' + deep + '}]}'],
    2: ['{"prompt":["a",5,"b"],"n_predict":3,"n_probs":2,"return_tokens":true}', '{"prompt":[[1,2]],"stream":true}'],
    3: ['{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":4,"ignore_eos":true},"stream":true,"return_logprob":true,"logprob_start_len":0,"top_logprobs_num":2}',
        '{"text":"hello","sampling_params":' + "{\"a\":" * 3000 + "1" + "}" * 3000 + '}'],
    4: ['{"content":"hello <start_of_turn> world","with_pieces":true}', '{"content":"' + "<" * 12000 + '"}'],
    5: ['{"tokens":[1,2,3]}', '{"tokens":[1e9,-1]}'],
    6: ['{"protocol":1}', '{"protocol":2}'],
    7: ['{"expected_pos":0,"append":[1,2,3],"generate":{"n":4,"temperature":0.7,"top_p":0.9,"seed":1},"top_n":2}',
        '{"expected_pos":3,"verify":{"draft":[5,6,7]}}', '{"expected_pos":3,"rewind_to":3,"append":[4]}',
        '{"expected_pos":1.5,"append":[1e9]}', '{"expected_pos":0,"append":' + deep + '}',
        '{"expected_pos":0,"append":[1,2],"generate":{"n":2},"queue":true}',
        '{"expected_pos":3,"expected_hash":"fd1f0f4381eb0395","append":[4],"generate":{"n":1}}',
        '{"expected_pos":3,"rewind_to":3,"expected_hash":"FD1F0F4381EB0395","append":[4]}',
        '{"expected_pos":3,"expected_hash":12}'],
    8: ['{"from_pos":0}', '{"from_pos":-1}', '{"from_pos":2,"x":1}', '{"from_pos":' + deep + '}'],
}
n = 0
for route, items in bodies.items():
    for body in items:
        (out / f"seed{n:03d}").write_bytes(bytes([route]) + body.encode())
        n += 1
(out / f"seed{n:03d}").write_bytes(bytes([0]) + b'{"prompt":"\xff\xfe\xc3(","max_tokens":2}')
(out / f"seed{n+1:03d}").write_bytes(bytes([0]) + b'{"prompt":"' + bytes([0xC3, 0x28, 0xA0, 0xA1]) + b'"}')
PY
# tandem ui's POST /api/generate bodies: valid ones and near misses.
mkdir -p "$SEEDS/fuzz_ui_request"
n=0
for body in '{"prompt":"The capital of France is","mode":"route","policy":"confidence","threshold":0.5,"n_predict":64,"temp":0,"continue":false}' \
  '{"prompt":"Q: 2+2?\nA:","mode":"route","policy":"entropy","target_rate":0.25}' \
  '{"prompt":"x","policy":"random","target_rate":1}' '{"prompt":"","mode":"cloud"}' \
  '{"prompt":"x","threshold":0.5,"target_rate":0.5}' '{"prompt":"x","n_predict":1e9,"temp":-1}' '[1,2]'; do
  printf '%s' "$body" >"$SEEDS/fuzz_ui_request/seed$n.json"
  n=$((n + 1))
done
shopt -s nullglob
GGUFS=("$SHARED"/testdata/models/*.gguf "$SHARED"/testdata/tokenizers/*.gguf)
[[ ${#GGUFS[@]} -gt 0 ]] || log "warning: no GGUF under $SHARED/testdata; synthetic seeds only"
"$BUILD/fuzz/make_gguf_seeds" "$SEEDS/fuzz_gguf" "${GGUFS[@]}"
# Tokenizer seeds: llama.cpp's tokenizer test inputs, one case per file.
python3 - "$SEEDS/fuzz_tokenizer" "$SHARED"/testdata/tokenizers/*.inp <<'PY'
import sys, pathlib
out = pathlib.Path(sys.argv[1]); n = 0
for inp in sys.argv[2:]:
    for case in pathlib.Path(inp).read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n"):
        if case.strip("\n") or case:
            (out / f"case{n:04d}.txt").write_text(case, encoding="utf-8"); n += 1
PY
# Router trace seeds (format in src/router/trace.h): one and two small sequences, in versions 1
# and 2 (version 2 records carry the outcome).
mkdir -p "$SEEDS/fuzz_trace"
python3 - "$SEEDS/fuzz_trace" <<'PY'
import struct, sys, pathlib
out = pathlib.Path(sys.argv[1])
def fnv(b):
    h = 0xcbf29ce484222325
    for x in b: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return h
n_embd, top_k = 4, 2
def head(version):
    return (b"TNDMTRACE\0\0\0" + struct.pack("<IIIIQII", version, n_embd, top_k, 50, 0x1234, 0, 5)
            + b"synth")
def seq(sid, n, version):
    b = struct.pack("<IQI", 0x31514553, sid, n)
    for i in range(n):
        b += struct.pack("<iiiiffffff", i, 3, 4, 3, -0.5, -1.0, -2.0, 1.5, 0.3, 0.2)
        if version >= 2:
            b += struct.pack("<f", 0.25 * i if i % 3 else float("nan"))
        b += struct.pack("<I", 0)
        b += struct.pack("<%df" % (top_k + n_embd), *([-0.5, -1.5] + [0.1 * i] * n_embd))
    return b + struct.pack("<Q", fnv(b))
for v in (1, 2):
    (out / f"one-v{v}.trace").write_bytes(head(v) + seq(0, 2, v))
    (out / f"two-v{v}.trace").write_bytes(head(v) + seq(0, 1, v) + seq(7, 3, v))
PY
log "seeds: $(ls "$SEEDS/fuzz_gguf" | wc -l) GGUF files, $(ls "$SEEDS/fuzz_tokenizer" | wc -l) texts"

# ---- run ----------------------------------------------------------------------------------------
if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a TARGETS <<<"$FUZZ_TARGETS"
else
  TARGETS=()
  for t in "$BUILD"/fuzz/fuzz_*; do [[ -x "$t" ]] && TARGETS+=("$(basename "$t")"); done
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
declare -A PIDS
for t in "${TARGETS[@]}"; do
  mkdir -p "$BUILD/corpus/$t" "$BUILD/artifacts/$t"
  log "running $t for ${SECONDS_PER_TARGET}s"
  (cd "$ROOT" && "$BUILD/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -max_len=16384 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$BUILD/artifacts/$t/" "$BUILD/corpus/$t" "$SEEDS/$t" \
    >"$BUILD/$t.log" 2>&1) &
  PIDS[$t]=$!
done
failed=()
for t in "${TARGETS[@]}"; do
  if wait "${PIDS[$t]}"; then
    log "$t: ok — $(grep -E '^stat::number_of_executed_units' "$BUILD/$t.log" | awk '{print $2}') runs," \
      "corpus $(ls "$BUILD/corpus/$t" | wc -l) files"
  else
    failed+=("$t")
    log "$t: FAILED; the end of its log ($BUILD/$t.log):"
    tail -n 60 "$BUILD/$t.log" >&2
    log "reproduce: $BUILD/fuzz/$t $BUILD/artifacts/$t/<crash file>"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  log "failed: ${failed[*]}"
  exit 1
fi
log "all ${#TARGETS[@]} fuzz targets ran ${SECONDS_PER_TARGET}s without a finding"
