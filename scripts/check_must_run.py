#!/usr/bin/env python3
"""Fails when a test that must run in CI was skipped, not run, failed or is missing.

    scripts/check_must_run.py CTEST_LOG [LIST]      LIST defaults to tests/must_run.txt

CTEST_LOG is the output of a ctest run (what scripts/test.sh prints). Each pattern of LIST must
match the name of at least one test in the log, and each test it matches must have passed.
Exit 0 when all do; 1 naming every pattern and test that did not, 2 for a bad command line.
"""
import pathlib
import re
import sys

# "  12/501 Test  #44: RealModel.Foo ......................   Passed    1.23 sec"
# "  13/501 Test  #45: UiBrowser.RouteSliderFallback ........***Skipped   0.02 sec"
RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(\*{3})?([A-Za-z ]+?)\s+[\d.]+ sec")


def results(log_text):
    out = {}
    for line in log_text.splitlines():
        m = RESULT.match(line)
        if m:
            out[m.group(1)] = m.group(3).strip()
    return out


def patterns(list_text):
    for line in list_text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(__file__).resolve().parent.parent
    log_text = pathlib.Path(argv[1]).read_text(errors="replace")
    list_path = pathlib.Path(argv[2]) if len(argv) == 3 else root / "tests" / "must_run.txt"
    seen = results(log_text)
    problems = []
    checked = 0
    for pattern in patterns(list_path.read_text()):
        regex = re.compile(pattern)
        matched = {name: status for name, status in seen.items() if regex.search(name)}
        if not matched:
            problems.append(f"{pattern}: no test of that name ran (missing from the build?)")
        for name, status in sorted(matched.items()):
            checked += 1
            if status != "Passed":
                problems.append(f"{name}: {status} (it must run and pass in CI)")
    if problems:
        print(f"must-run tests ({list_path}): {len(problems)} problem(s)", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"must-run tests: all {checked} matched tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
