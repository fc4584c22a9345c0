#!/usr/bin/env bash
# A/B of two tandem builds on this machine, alternating so that drift hits both (docs/benchmarks.md,
# "Check after the restructuring of issue 23"): `tandem bench` (prefill 512, decode 128, 2
# threads, 3 repetitions) and scripts/bench_serve.py at 1 and 32 sessions (10 s windows, 2 reps),
# twice each. Meant for a quiet machine.
#   scripts/ab_issue23.sh BEFORE/tandem AFTER/tandem OUT_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BEFORE=$1 AFTER=$2 OUT=$3
mkdir -p "$OUT"
MODEL=$("$ROOT/scripts/make_pair.sh" gemma | head -1)
set -x
for round in 1 2; do
  for side in before after; do
    bin=$BEFORE
    [[ $side == after ]] && bin=$AFTER
    "$bin" bench -m "$MODEL" -p 512 -n 128 -t 2 -r 3 --json >"$OUT/bench-$side-$round.json"
    python3 "$ROOT/scripts/bench_serve.py" --tandem "$bin" --model "$MODEL" --seconds 10 --reps 2 \
      --sessions 1,32 --contexts 64 --json >"$OUT/serve-$side-$round.json"
  done
done
