#!/usr/bin/env bash
# Runs clang-tidy (the checks of .clang-tidy) on the C++ files a change touches, and fails on any
# finding in them. Findings in files the change did not touch are not reported: the tree is held
# to the checks file by file, as it is edited.
#
#   scripts/tidy_changed.sh [BASE]     files changed between BASE and the work tree (default
#                                      HEAD~1: the last commit, or for a merge commit everything
#                                      the merged branch brought in)
#   scripts/tidy_changed.sh --all DIR...   every source file under the given folders instead
#
# Env: TANDEM_BUILD      build directory holding compile_commands.json (default: build; CMake
#                        writes it at configure time, CMAKE_EXPORT_COMPILE_COMMANDS)
#      TANDEM_TIDY_DRY=1  only list the translation units that would run
#
# Which files: changed .cpp/.cc files under src/, include/, tests/, bench/ and fuzz/ that the build
# compiles, plus, for each changed header, one file that compiles it (its sibling .cpp, else the
# first compiled file that includes it); diagnostics are kept to the changed files themselves
# (clang-tidy's -line-filter), so an untouched .cpp compiled for a header's sake is not judged.
#
# Where BASE is not in the clone (a shallow CI checkout has no parent commit), there is no change
# to judge, so the script judges a fixed folder that is clean today instead: src/client, the
# module issue 23 holds up as the model. It says so on stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${TANDEM_BUILD:-$ROOT/build}
FALLBACK_DIRS=(src/client)
cd "$ROOT"

log() { echo "[tidy] $*" >&2; }

command -v clang-tidy >/dev/null || {
  log "error: clang-tidy is not installed (Debian package clang-tidy; scripts/setup.sh installs it)"
  exit 2
}
[[ -f "$BUILD/compile_commands.json" ]] || {
  log "error: no $BUILD/compile_commands.json: configure the build first (scripts/test.sh)"
  exit 2
}

# The files to judge, relative to the root, one per line.
changed_files() {
  if [[ ${1:-} == --all ]]; then
    shift
    find "$@" -type f \( -name '*.cpp' -o -name '*.cc' -o -name '*.h' \) | sort
    return
  fi
  local base=${1:-HEAD~1}
  if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
    log "no commit '$base' in this clone (shallow?): judging ${FALLBACK_DIRS[*]} instead"
    find "${FALLBACK_DIRS[@]}" -type f \( -name '*.cpp' -o -name '*.cc' -o -name '*.h' \) | sort
    return
  fi
  git diff --name-only --diff-filter=d "$base" -- 'src/*' 'include/*' 'tests/*' 'bench/*' \
    'fuzz/*' | grep -E '\.(cpp|cc|h)$' || true
}

mapfile -t FILES < <(changed_files "$@")
if [[ ${#FILES[@]} -eq 0 ]]; then
  log "no C++ file changed: nothing to judge"
  exit 0
fi

# The translation units to run (absolute paths from the compile database) and the -line-filter
# that keeps diagnostics to FILES.
mapfile -t UNITS < <(python3 - "$BUILD/compile_commands.json" "$ROOT" "${FILES[@]}" <<'EOF'
import json, pathlib, re, sys
db, root, files = sys.argv[1], pathlib.Path(sys.argv[2]).resolve(), sys.argv[3:]
compiled = {str(pathlib.Path(e["directory"], e["file"]).resolve()) for e in json.load(open(db))}
units = []
sources = [p for top in ("src", "include", "tests", "bench", "fuzz") if (root / top).is_dir()
           for p in sorted((root / top).rglob("*")) if p.suffix in (".cpp", ".cc", ".h")]
includes = {p: set(re.findall(r'^\s*#\s*include\s*"([^"]+)"', p.read_text(errors="replace"), re.M))
            for p in sources}
def spellings(path):
    # How a file is included: "layer/name.h" from src/, "tandem/name.h" from include/, or by
    # its name from a file next to it.
    rel = path.relative_to(root).parts
    return {"/".join(rel[1:]), rel[-1]} if rel[0] in ("src", "include") else {rel[-1]}
def unit_for_header(rel):
    path = (root / rel).resolve()
    for ext in (".cpp", ".cc"):
        if str(path.with_suffix(ext)) in compiled:
            return str(path.with_suffix(ext))
    # The first compiled file that includes it, directly or through other headers (breadth first).
    seen, level = {path}, [path]
    while level:
        names = set().union(*(spellings(h) for h in level))
        users = [p for p in sources if p not in seen and includes[p] & names]
        for p in users:
            if str(p.resolve()) in compiled:
                return str(p.resolve())
        seen.update(users)
        level = [p for p in users if p.suffix == ".h"]
    return None
for rel in files:
    full = str((root / rel).resolve())
    unit = full if full in compiled else unit_for_header(rel) if rel.endswith(".h") else None
    if unit is None:
        print(f"[tidy] {rel}: not compiled by this build, skipped", file=sys.stderr)
    elif unit not in units:
        units.append(unit)
print("\n".join(units))
EOF
)
if [[ ${#UNITS[@]} -eq 0 ]]; then
  log "none of the changed files is compiled by this build: nothing to judge"
  exit 0
fi
if [[ -n ${TANDEM_TIDY_DRY:-} ]]; then
  printf '%s\n' "${UNITS[@]#"$ROOT"/}"
  exit 0
fi
LINE_FILTER=$(python3 -c 'import json, sys; print(json.dumps([{"name": f} for f in sys.argv[1:]]))' \
  "${FILES[@]}")

log "${#FILES[@]} changed files, ${#UNITS[@]} translation units"
FAILED=0
for unit in "${UNITS[@]}"; do
  # --header-filter: headers are judged too (then cut to FILES by the line filter).
  if ! clang-tidy -p "$BUILD" --quiet --header-filter="^$ROOT/(src|include|tests|bench|fuzz)/" \
    --line-filter="$LINE_FILTER" "$unit" 2>/dev/null; then
    FAILED=$((FAILED + 1))
    log "findings in ${unit#"$ROOT"/} (or in a changed header it includes)"
  fi
done
if [[ $FAILED -gt 0 ]]; then
  log "$FAILED of ${#UNITS[@]} translation units have findings (.clang-tidy lists the checks)"
  exit 1
fi
log "clean: ${#UNITS[@]} translation units"
