#!/usr/bin/env bash
# Installs every Debian package tandem needs to build, test and fuzz. Idempotent: packages that are
# already installed are skipped, and `apt-get update` runs only when something is missing.
#
#   scripts/setup.sh          host toolchain and libraries
#   scripts/setup.sh --arm    also the arm64 cross toolchain, the arm64 libraries and qemu-user
#
# Needs root (or sudo). Exits non-zero, naming the packages, when an install fails.
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake ninja-build pkg-config git
  libhwy-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libcpp-httplib-dev libssl-dev libboost-dev
  haproxy curl ccache gnuplot-nox openssl
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3 python3-pip python3-venv
  chromium chromium-driver
)
# The arm64 libraries the cross build of the kernels and their tests links or finds at configure
# time (scripts/arm_test.sh, cmake/aarch64-linux-gnu.cmake); nlohmann-json and CLI11 are arch-all.
ARM_PACKAGES=(
  g++-aarch64-linux-gnu qemu-user
  libhwy-dev:arm64 libpcre2-dev:arm64 libfmt-dev:arm64 libssl-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64
)

log() { echo "[setup] $*" >&2; }

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=(sudo); else
    log "error: not root and no sudo; install these packages by hand: ${PACKAGES[*]}"
    exit 1
  fi
fi

# Prints the packages of "$@" that are not installed. A name without :arch means the native
# architecture (or arch all): once arm64 is added, dpkg lists both libhwy-dev:amd64 and :arm64.
missing_packages() {
  local p name arch native
  native=$(dpkg --print-architecture)
  for p in "$@"; do
    name=${p%%:*}
    arch=$native
    [[ "$p" == *:* ]] && arch=${p#*:}
    if ! dpkg-query -W -f='${Architecture} ${Status}\n' "$name" 2>/dev/null |
      grep -Eq "^($arch|all) install ok installed$"; then
      echo "$p"
    fi
  done
}

apt_install() {
  local missing
  mapfile -t missing < <(missing_packages "$@")
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "all ${#@} packages already installed"
    return 0
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq
  if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    log "error: apt-get install failed for: ${missing[*]}"
    exit 1
  fi
  mapfile -t missing < <(missing_packages "$@")
  if [[ ${#missing[@]} -ne 0 ]]; then
    log "error: still missing after install: ${missing[*]}"
    exit 1
  fi
}

setup_arm() {
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "adding the arm64 architecture"
    "${SUDO[@]}" dpkg --add-architecture arm64
  fi
  apt_install "${ARM_PACKAGES[@]}"
  log "arm64: $(aarch64-linux-gnu-g++ --version | head -1); run tests with" \
    "qemu-aarch64 -L /usr/aarch64-linux-gnu ./test"
}

# Python packages for the tests (the official `openai` client talks to `tandem serve`; Selenium
# drives Debian's chromium through Debian's chromedriver for the `tandem ui` browser test), in a
# virtual environment of their own under the tandem cache so nothing system-wide changes.
VENV=${TANDEM_CACHE:-$HOME/.cache/tandem}/venv
PY_PACKAGES=(openai selenium)
setup_python() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  local p missing=()
  for p in "${PY_PACKAGES[@]}"; do
    "$VENV/bin/python" -c "import $p" 2>/dev/null || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "pip installing into $VENV: ${missing[*]}"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${missing[@]}"
  fi
}

main() {
  local arm=0 arg
  for arg in "$@"; do
    case "$arg" in
      --arm) arm=1 ;;
      -h | --help)
        sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
        return 0
        ;;
      *)
        log "error: unknown argument '$arg' (expected --arm or --help)"
        return 2
        ;;
    esac
  done
  apt_install "${PACKAGES[@]}"
  setup_python
  if [[ $arm -eq 1 ]]; then setup_arm; fi
  log "done"
}

main "$@"
