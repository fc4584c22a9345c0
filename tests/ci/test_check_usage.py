#!/usr/bin/env python3
"""scripts/check_usage.py: the public headers' usage blocks compile, and a planted one that calls
a function the header does not have fails, naming its header."""
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_usage.py"
CXX = sys.argv[1] if len(sys.argv) > 1 else "c++"


def check(root):
    return subprocess.run([sys.executable, str(SCRIPT), "--cxx", CXX, "--root", str(root)],
                          capture_output=True, text=True)


def main():
    r = check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 of " not in r.stdout, r.stdout  # some headers have usage blocks
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "include", pathlib.Path(tmp) / "include")
        bad = pathlib.Path(tmp) / "include/tandem/planted.h"
        bad.write_text("// A planted header.\n//\n//   tandem::no_such_function(42);\n"
                       "#pragma once\nnamespace tandem {}\n")
        r = check(tmp)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "planted.h: its usage block does not compile" in r.stderr, r.stderr
        assert "no_such_function" in r.stderr, r.stderr
    print("check_usage: the real headers pass, a planted wrong usage fails")


if __name__ == "__main__":
    main()
