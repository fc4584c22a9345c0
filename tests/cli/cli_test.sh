#!/usr/bin/env bash
# End-to-end checks of the `tandem` command-line contract (DESIGN.md §6) on the testdata files:
# JSON shapes, output file sizes, exit codes and error messages for bad input.
# Usage: cli_test.sh TANDEM_BINARY SHARED_DIR
set -uo pipefail
TANDEM=$1
SHARED=$2
TD=$SHARED/testdata
source "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
for f in "$TD/tokenizers/ggml-vocab-llama-spm.gguf" "$TD/models/synth-llama-Q4_K.gguf"; do
  [[ -f $f ]] || { echo "missing reference file $f"; exit 1; }
done
py() { python3 -c "$@"; }

# tokenize: vocab-only file, BOS as the vocab says, --no-bos, --parse-special, stdin.
out=$("$TANDEM" tokenize -m "$TD/tokenizers/ggml-vocab-llama-spm.gguf" -p " Hello" --json)
check "tokenize json" py "import json,sys; d=json.loads(sys.argv[1]); assert d=={'ids':[1,29871,15043],'pieces':['<s>',' ','\u2581Hello'.replace('\u2581',' ')]} or d['ids']==[1,29871,15043], d" "$out"
out=$("$TANDEM" tokenize -m "$TD/tokenizers/ggml-vocab-llama-spm.gguf" -p "Hello" --no-bos --json)
check "tokenize --no-bos" py "import json,sys; d=json.loads(sys.argv[1]); assert d['ids'][0]!=1 and len(d['ids'])==len(d['pieces']), d" "$out"
out=$(printf 'Hello' | "$TANDEM" tokenize -m "$TD/tokenizers/ggml-vocab-qwen3.gguf" --json)
check "tokenize stdin" py "import json,sys; d=json.loads(sys.argv[1]); assert d['ids']==[9707], d" "$out"
out=$("$TANDEM" tokenize -m "$TD/tokenizers/ggml-vocab-qwen3.gguf" -p "<|im_start|>" --parse-special --json)
check "tokenize --parse-special" py "import json,sys; d=json.loads(sys.argv[1]); assert d['ids']==[151644], d" "$out"

# logits: file sizes [n_ids x n_vocab] and [n_ids x n_embd] float32.
"$TANDEM" logits -m "$TD/models/synth-llama-Q4_K.gguf" --ids 5,6,7 --out "$TMP/l.f32" --hidden "$TMP/h.f32" 2>/dev/null
check "logits size" [ "$(stat -c %s "$TMP/l.f32")" == $((3 * 2048 * 4)) ]
check "hidden size" [ "$(stat -c %s "$TMP/h.f32")" == $((3 * 256 * 4)) ]

# generate --json: text, ids, tok_s.
out=$("$TANDEM" generate -m "$TD/models/synth-llama-Q4_K.gguf" -p "Hello" -n 5 --temp 0 --json 2>/dev/null)
check "generate json" py "import json,sys; d=json.loads(sys.argv[1]); assert len(d['ids'])<=5 and isinstance(d['text'],str) and d['tok_s']>=0, d" "$out"

# bench --json shape (tiny sizes).
out=$("$TANDEM" bench -m "$TD/models/synth-llama-Q4_K.gguf" -p 16 -n 4 -r 1 -t 1 --json 2>/dev/null)
check "bench json" py "import json,sys; d=json.loads(sys.argv[1]); assert d['pp']['n']==16 and d['tg']['n']==4 and d['pp']['tok_s']>0 and d['type_k']=='f32', d" "$out"

# An f16 KV cache (llama.cpp's -ctk/-ctv): same shapes, other logits than the f32 cache's.
out=$("$TANDEM" bench -m "$TD/models/synth-llama-Q4_K.gguf" -p 16 -n 4 -r 1 -t 1 -ctk f16 --cache-type-v f16 --json 2>/dev/null)
check "bench -ctk f16 json" py "import json,sys; d=json.loads(sys.argv[1]); assert d['type_k']=='f16' and d['type_v']=='f16', d" "$out"
"$TANDEM" logits -m "$TD/models/synth-llama-Q4_K.gguf" --ids 5,6,7,8,9 --out "$TMP/l32.f32" 2>/dev/null
"$TANDEM" logits -m "$TD/models/synth-llama-Q4_K.gguf" --ids 5,6,7,8,9 --out "$TMP/l16.f32" -ctk f16 -ctv f16 2>/dev/null
check "logits -ctk f16 size" [ "$(stat -c %s "$TMP/l16.f32")" == $((5 * 2048 * 4)) ]
differ() { ! cmp -s "$1" "$2"; }
check "logits -ctk f16 differ" differ "$TMP/l32.f32" "$TMP/l16.f32"

# Errors: non-zero exit, message on stderr naming the problem, nothing on stdout.
expect_error() {  # expect_error NAME PATTERN CMD...
  local name=$1 pattern=$2
  shift 2
  local so se rc
  so=$("$@" 2>"$TMP/err")
  rc=$?
  se=$(cat "$TMP/err")
  check "$name: exit code" [ "$rc" -ne 0 ]
  check "$name: stdout empty" [ -z "$so" ]
  check "$name: message" grep -q -- "$pattern" <<<"$se"
}
expect_error "missing model" "cannot open" "$TANDEM" generate -m "$TMP/nope.gguf" -p hi -n 1
printf 'not a gguf file at all, definitely not' >"$TMP/bad.gguf"
expect_error "bad magic" "expected magic" "$TANDEM" tokenize -m "$TMP/bad.gguf" -p hi --json
head -c 100000 "$TD/models/synth-llama-Q4_K.gguf" >"$TMP/trunc.gguf"
expect_error "truncated" "trunc\|end of file\|file ends" "$TANDEM" generate -m "$TMP/trunc.gguf" -p hi -n 1
expect_error "bad ids" "not a non-negative token id" "$TANDEM" logits -m "$TD/models/synth-llama-Q4_K.gguf" --ids 1,x --out "$TMP/x"
expect_error "id out of range" "outside the vocabulary" "$TANDEM" logits -m "$TD/models/synth-llama-Q4_K.gguf" --ids 1,99999 --out "$TMP/x"
expect_error "vocab-only model" "missing required tensor\|missing tensor" "$TANDEM" generate -m "$TD/tokenizers/ggml-vocab-llama-spm.gguf" -p hi -n 1
expect_error "unknown flag" "" "$TANDEM" generate --no-such-flag
expect_error "bad cache type" "expected f32 or f16" "$TANDEM" generate -m "$TD/models/synth-llama-Q4_K.gguf" -p hi -n 1 -ctk q8_0
# The routing flags are defined once (src/cli/edge_flags.h): a bad value gets one refusal from
# every command that takes the flag, eval lists run's device flags, and eval and router collect
# read the same data folder by default.
same_refusal() {  # same_refusal FLAG VALUE COMMAND...: exit code 2, one message naming FLAG
  local flag=$1 value=$2 first="" msg rc
  shift 2
  for cmd in "$@"; do
    # shellcheck disable=SC2086  # each COMMAND is its words
    timeout 60 "$TANDEM" $cmd "$flag" "$value" >/dev/null 2>"$TMP/err"
    rc=$?
    msg=$(head -1 "$TMP/err")
    check "$cmd $flag $value: exit code" [ "$rc" -eq 2 ]
    check "$cmd $flag $value: names the flag" grep -q -- "$flag" <<<"$msg"
    [[ -n $first ]] || first=$msg
    check "$cmd $flag $value: same message" [ "$msg" == "$first" ]
  done
}
device_cmds=("run -p hi" "ui" "eval --task csqa")
same_refusal --cloud-timeout 0 "${device_cmds[@]}" "router collect --out $TMP/x.trace"
same_refusal --threads x "${device_cmds[@]}" "router collect --out $TMP/x.trace"
same_refusal --sync-every 0 "${device_cmds[@]}"
same_refusal --route-span 0 "${device_cmds[@]}"
same_refusal --cache-type-k q8_0 "${device_cmds[@]}"
same_refusal --target-gain 2 "${device_cmds[@]}"
eval_help=$("$TANDEM" eval --help)
run_help=$("$TANDEM" run --help)
for flag in -m --cloud --cloud-api --api-key --insecure --ca-file --cloud-timeout --target-gain \
  --route-span --draft --no-sync-ahead --sync-every -c --cache-type-k --cache-type-v -t -s; do
  check "eval --help lists $flag" grep -q -- " $flag[ ,]" <<<"$eval_help"
  check "run --help lists $flag" grep -q -- " $flag[ ,]" <<<"$run_help"
done
check "--target-gain defaults to 0.2" grep -q -- "--target-gain FLOAT:FLOAT in \[0 - 1\]=0.2$" <<<"$eval_help"
check "run --target-gain defaults to 0.2" grep -q -- "--target-gain FLOAT:FLOAT in \[0 - 1\]=0.2$" <<<"$run_help"
data_default() { "$TANDEM" "$@" --help | grep -o -- "--data TEXT=[^ ]*"; }
eval_data=$(data_default eval)
check "eval --data has a default" [ -n "$eval_data" ]
check "eval and router collect: one data folder" [ "$eval_data" == "$(data_default router collect)" ]
collect_help=$("$TANDEM" router collect --help)
for flag in --insecure --ca-file --cloud-model; do
  check "router collect --help lists $flag" grep -q -- " $flag[ ,]" <<<"$collect_help"
done
cloud_model_help() { grep -- " --cloud-model TEXT" <<<"$1"; }
check "eval and router collect: one --cloud-model" \
  [ "$(cloud_model_help "$eval_help")" == "$(cloud_model_help "$collect_help")" ]

for cmd in tokenize logits generate bench run ui eval; do
  check "$cmd --help" "$TANDEM" "$cmd" --help >/dev/null
done

# --pair: a known pair's model in the command's role; an unknown name and -m with --pair refused;
# every command that loads a model names the default pair in --help.
out=$(TANDEM_CACHE=$TMP "$TANDEM" tokenize --pair nosuch -p hi --json 2>&1)
rc=$?
check "--pair unknown exits 1" [ $rc -eq 1 ]
check "--pair unknown names the known pairs" grep -q "unknown model pair 'nosuch': expected one of qwen, gemma" <<<"$out"
out=$(TANDEM_CACHE=$TMP "$TANDEM" tokenize --pair gemma -p hi --json 2>&1)
check "--pair gemma reads the gemma pair's device file" grep -qF "$TMP/models/gemma-3-270m-q2_k.gguf" <<<"$out"
out=$(TANDEM_CACHE=$TMP "$TANDEM" serve --pair qwen --port 0 2>&1)
check "serve --pair reads the cloud file" grep -qF "$TMP/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" <<<"$out"
# An unknown $TANDEM_PAIR is refused by a command that needs the default model, and only there.
out=$(TANDEM_PAIR=bogus "$TANDEM" tokenize -m "$TD/tokenizers/ggml-vocab-qwen3.gguf" -p hi --json 2>&1)
check "unknown \$TANDEM_PAIR does not stop -m" grep -q '"ids":\[6023\]' <<<"$out"
out=$(env -u TANDEM_MODEL TANDEM_PAIR=bogus "$TANDEM" tokenize -p hi --json 2>&1)
rc=$?
check "unknown \$TANDEM_PAIR without -m exits 1" [ $rc -eq 1 ]
check "unknown \$TANDEM_PAIR is named" grep -q "^error: unknown model pair 'bogus'" <<<"$out"
"$TANDEM" tokenize --pair gemma -m x -p hi >/dev/null 2>&1
check "-m with --pair is a usage error" [ $? -eq 2 ]
for cmd in generate tokenize logits bench perplexity serve run ui eval; do
  check "$cmd --help names the default pair" bash -c "env -u TANDEM_MODEL -u TANDEM_PAIR '$TANDEM' $cmd --help | grep -q 'model of the default pair (qwen'"
done

# HumanEval runs model-written code: refused, in one line naming --allow-exec, unless asked for
# (before any model or data is read); --chat has no HumanEval form.
msg=$(env -u TANDEM_MODEL "$TANDEM" eval --task humaneval --out "$TMP/he" 2>&1)
rc=$?
check "eval --task humaneval without --allow-exec: exit code 1" [ "$rc" -eq 1 ]
check "eval --task humaneval without --allow-exec: one line" [ "$(wc -l <<<"$msg")" -eq 1 ]
check "eval --task humaneval without --allow-exec: names it" grep -q -- "--allow-exec" <<<"$msg"
check "eval --task humaneval without --allow-exec: nothing written" [ ! -e "$TMP/he" ]
msg=$("$TANDEM" eval --task humaneval --allow-exec --chat 2>&1)
check "eval --task humaneval --chat: refused" grep -q -- "--chat: humaneval" <<<"$msg"
check "eval --help documents --allow-exec" grep -q -- " --allow-exec " <<<"$eval_help"

# Routing settings that contradict each other are refused before any model is read, with the
# message the browser view gives for the same request (tandem/routing.h).
msg=$("$TANDEM" run -m "$TD/models/synth-llama-Q4_K.gguf" --cloud http://127.0.0.1:9 --policy random:0.1 --target-rate 0.3 -p hi 2>&1)
rc=$?
check "run --policy random:0.1 --target-rate 0.3: exit code 1" [ "$rc" -eq 1 ]
check "run --policy random:0.1 --target-rate 0.3: names the rule" grep -qF "the random policy's rate is given twice (random:0.1 and a target rate of 0.3): give one" <<<"$msg"
msg=$("$TANDEM" run -m "$TD/models/synth-llama-Q4_K.gguf" --cloud http://127.0.0.1:9 --policy always --target-rate 0.3 -p hi 2>&1)
check "run --policy always --target-rate: refused" grep -qF "the always policy takes neither a threshold nor a target rate" <<<"$msg"

check_summary cli_contract
