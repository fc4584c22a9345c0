#!/usr/bin/env python3
"""Compiles the usage block at the top of every public header (include/tandem/*.h).

A usage block is a run of comment lines indented by three spaces ("//   ...") in the header's
opening comment (before `#pragma once`) that names `tandem::`; tables and lists there name no
`tandem::` and are left alone. Each block becomes the body of a function in a translation unit
that includes its header (and the block's own #include lines, hoisted), and must compile with warnings as errors: an example that calls a
function that does not exist, or drifts from a signature, fails here (ctest: UsageBlocks).

Usage: check_usage.py [--cxx c++] [--include DIR]... [--root REPO]
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile


def usage_blocks(header: pathlib.Path):
    """The header's usage blocks, each as a list of code lines."""
    blocks, run = [], []
    for line in header.read_text().splitlines():
        if line.startswith("#pragma once"):
            break
        if line.startswith("//   "):
            run.append(line[5:])
            continue
        if any("tandem::" in r for r in run):
            blocks.append(run)
        run = []
    if any("tandem::" in r for r in run):
        blocks.append(run)
    return blocks


def translation_unit(header: pathlib.Path, blocks):
    parts = [f'#include "tandem/{header.name}"',
             "#include <cstdio>", "#include <string_view>", "#include <vector>"]
    parts += [line for block in blocks for line in block if line.startswith("#include")]
    for k, block in enumerate(blocks):
        parts.append(f"[[maybe_unused]] static void usage_{k}() {{")
        parts += ["  " + line for line in block if not line.startswith("#include")]
        parts.append("}")
    return "\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default="c++")
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("--root", default=".", help="the tree whose include/tandem/ is checked")
    args = ap.parse_args()
    root = pathlib.Path(args.root)
    headers = sorted((root / "include/tandem").glob("*.h"))
    failed, checked = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for header in headers:
            blocks = usage_blocks(header)
            if not blocks:
                continue
            checked += 1
            src = pathlib.Path(tmp) / f"usage_{header.stem}.cpp"
            src.write_text(translation_unit(header, blocks))
            cmd = [args.cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                   "-Wno-unused-variable", "-Wno-unused-but-set-variable", f"-I{root / 'include'}"]
            cmd += [f"-I{d}" for d in args.include] + [str(src)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                failed += 1
                print(f"{header}: its usage block does not compile:\n{src.read_text()}\n"
                      f"{r.stderr}", file=sys.stderr)
    print(f"usage blocks: {checked - failed} of {checked} headers compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
