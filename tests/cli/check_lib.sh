# Sourced by the shell tests here: a scratch folder removed on exit ($TMP), and named checks
# counted in $pass and $fail (`check NAME CONDITION-COMMAND...`; `check_summary` prints the
# counts and is the script's exit status).
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
check() {
  local name=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $name"
  fi
}
check_summary() {
  echo "$1: $pass passed, $fail failed"
  [[ $fail -eq 0 ]]
}
