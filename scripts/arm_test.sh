#!/usr/bin/env bash
# Cross-builds the kernel and GGUF unit tests for aarch64 (Debian's g++-aarch64-linux-gnu) and runs
# them under qemu-user. The kernel tests compare every SIMD kernel with its scalar reference on
# each Highway target the build compiles and the (emulated) CPU supports. This script prints
# those targets and fails unless NEON, SVE and SVE2 are among them, runs the per-target kernel
# tests once more per extra SVE vector length (Highway has targets specialised for 128- and
# 256-bit SVE) and once on a Cortex-A53 (no dot product extension), and ends with one ctest run
# of every kernel and GGUF test at qemu's default CPU.
#
#   scripts/setup.sh --arm            once: cross compiler, arm64 libraries, qemu-user
#   scripts/arm_test.sh [CTEST_ARGS...]
#
# Env: TANDEM_ARM_BUILD   build directory (default: build-arm)
#      TANDEM_ARM_VLS     extra SVE vector lengths in bytes for the kernel tests (default "16 32";
#                         empty to skip)
#      TANDEM_ARM_HWY_DISABLE  Highway targets to leave out of the build, e.g. "SVE SVE2 SVE_256
#                         SVE2_128" for a build with NEON and the scalar fallback (default: none;
#                         compiled into every object as HWY_DISABLED_TARGETS)
#      JOBS               parallel build and test jobs (default: nproc)
# Tests find ../shared/testdata through the compiled-in source path, which qemu-user reads as is.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_ARM_BUILD:-$ROOT/build-arm}
JOBS=${JOBS:-$(nproc)}
VLS=${TANDEM_ARM_VLS-16 32}
TRIPLE=aarch64-linux-gnu
TOOLCHAIN=$ROOT/cmake/$TRIPLE.cmake
QEMU=(qemu-aarch64 -L "/usr/$TRIPLE")
TARGETS=(test_kernels test_gguf)
# ctest names: kernel tests carry the "kernels." prefix; the GGUF suites start with Gguf or
# (parameterised) .../SharedGguf.
CTEST_REGEX='^kernels\.|^Gguf|/SharedGguf\.'
# The kernel tests that run once per SIMD target (ForEachTarget in tests/kernels/test_util.h).
PER_TARGET_FILTER='*KernelsSimdVsRef.*:KernelsSimdF32.*:KernelsOps.*'

log() { echo "[arm] $*" >&2; }

for tool in "$TRIPLE-g++" qemu-aarch64; do
  command -v "$tool" >/dev/null || {
    log "error: $tool not found; run scripts/setup.sh --arm"
    exit 1
  }
done

# Highway's target bits on Arm (hwy/detect_targets.h).
declare -A HWY_BIT=([SVE2_128]=24 [SVE_256]=25 [SVE2]=26 [SVE]=27 [NEON]=28)
DISABLED=0
REQUIRED=(NEON SVE SVE2)
for name in ${TANDEM_ARM_HWY_DISABLE:-}; do
  [[ -n "${HWY_BIT[$name]:-}" ]] || {
    log "error: TANDEM_ARM_HWY_DISABLE: unknown target $name (known: ${!HWY_BIT[*]})"
    exit 2
  }
  DISABLED=$((DISABLED | (1 << HWY_BIT[$name])))
  for i in "${!REQUIRED[@]}"; do [[ ${REQUIRED[$i]} != "$name" ]] || unset 'REQUIRED[i]'; done
done
CXXFLAGS_HWY=
if [[ $DISABLED -ne 0 ]]; then
  # With all attainable targets compiled, Highway's portable fallback (HWY_SCALAR with GCC 12)
  # is tested too: the kernel tests expect at least two targets.
  CXXFLAGS_HWY=$(printf -- '-DHWY_DISABLED_TARGETS=0x%xLL -DHWY_COMPILE_ALL_ATTAINABLE' "$DISABLED")
  log "building without Highway targets: ${TANDEM_ARM_HWY_DISABLE}"
fi

GEN=()
[[ -f "$BUILD/CMakeCache.txt" ]] || { command -v ninja >/dev/null && GEN=(-G Ninja); }
# Configured on every run (a second or two) so that a change of TANDEM_ARM_HWY_DISABLE applies.
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" \
  -DCMAKE_BUILD_TYPE=Release -DTANDEM_BENCH=OFF -DCMAKE_CXX_FLAGS="$CXXFLAGS_HWY" >/dev/null
# Only what the tests need: the kernels, the GGUF reader/writer and the two test executables.
TARGET_ARGS=()
for t in "${TARGETS[@]}"; do TARGET_ARGS+=(--target "$t"); done
cmake --build "$BUILD" -j "$JOBS" "${TARGET_ARGS[@]}"

# run_kernels LABEL QEMU_CPU GTEST_FILTER: runs test_kernels under qemu on that CPU ("" for qemu's
# default, "max" with 512-bit SVE) and prints the Highway targets its per-target tests iterate
# over (KernelsTypes.TargetsUnderTest prints them) on stdout.
KERNEL_TESTS=$BUILD/tests/kernels/test_kernels
run_kernels() {
  local label=$1 cpu=$2 filter=$3 out rc env=()
  [[ -z "$cpu" ]] || env=("QEMU_CPU=$cpu")
  set +e
  out=$(env "${env[@]}" "${QEMU[@]}" "$KERNEL_TESTS" --gtest_brief=1 \
    --gtest_filter="KernelsTypes.TargetsUnderTest${filter:+:$filter}" 2>&1)
  rc=$?
  set -e
  [[ $rc -eq 0 ]] || {
    printf '%s\n' "$out" >&2
    log "error: kernel tests failed under qemu ($label)"
    return 1
  }
  local line
  line=$(sed -n 's/^SIMD targets tested on this CPU: *//p' <<<"$out")
  log "$label: targets tested: $line; $(grep -m1 '^\[  PASSED  \]' <<<"$out")"
  echo "${line%% (dispatch default*}"
}

TESTED=$(run_kernels "qemu default CPU" "" "")
for need in "${REQUIRED[@]}"; do
  [[ " $TESTED " == *" $need "* ]] || {
    log "error: Highway target $need is not among the tested targets ($TESTED)"
    exit 1
  }
done

# The per-target kernel tests again at each extra SVE vector length (qemu's default is 512 bits;
# 128 bits adds SVE2_128, 256 bits adds SVE_256).
[[ " ${REQUIRED[*]} " == *" SVE"* ]] || VLS=""
for vl in $VLS; do
  run_kernels "SVE $((vl * 8))-bit" "max,sve-default-vector-length=$vl" "$PER_TARGET_FILTER" \
    >/dev/null
done

# The prefill tile kernels use sdot where the CPU has the dot product extension, as qemu's
# default CPU does: the per-target tests once more on a CPU without it (the emulated path).
run_kernels "Cortex-A53 (no dotprod)" "cortex-a53" "$PER_TARGET_FILTER" >/dev/null

log "kernel and GGUF tests (targets: $TESTED; qemu default CPU)"
cd "$BUILD"
ctest --output-on-failure -j "$JOBS" -R "$CTEST_REGEX" "$@"
