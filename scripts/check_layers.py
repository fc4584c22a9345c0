#!/usr/bin/env python3
"""Fails on an #include that goes up or sideways against the layer table (src/layers.txt).

    scripts/check_layers.py [--root DIR] [--table FILE]

Reads every .h/.cpp/.cc file under DIR/src and DIR/include (default: this repository) and each
quoted #include in it. An include of "X/..." from a file of layer L is allowed when X is L, or
L may include X; an include of "tandem/H" when L is the owner of H or may include it. Layers
marked only-public may include only their own files and include/tandem/. A public header
(include/tandem/) includes no outside library: its <...> includes are the standard library's
(no '/' or '.' in the name), so that no third-party type reaches its callers through it; nor does
it declare an outside library's namespace at file scope (a forward declaration such as
`namespace boost::asio { class io_context; }`) or alias one: only tandem's and std's. The
table's `known` lines list today's breaks: a break not listed fails, and so does a listed one
that is gone.
Exit 0 when the tree follows the table, 1 naming each break, 2 for a bad table.
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ANGLE_INCLUDE = re.compile(r'^\s*#\s*include\s*<([^>]+)>')
# Comments and string and character literals, blanked before namespaces are looked for.
NOT_CODE = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
# A brace, or a namespace opened (`namespace a::b {`) or aliased (`namespace x = a::b;`).
NAMESPACE_OR_BRACE = re.compile(
    r'[{}]|\bnamespace\s+([A-Za-z_]\w*(?:\s*::\s*(?:inline\s+)?[A-Za-z_]\w*)*)\s*'
    r'(?:\{|=\s*(?:::\s*)?([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*))')
OWN_NAMESPACES = {"tandem", "std"}


def outside_library(include):
    """Whether an <...> include names an outside library rather than the standard library."""
    return "/" in include or "." in include


def outside_namespaces(text):
    """The namespaces other than tandem's and std's that `text` opens at file scope (a forward
    declaration of an outside library's type) or aliases anywhere, as written."""
    code = NOT_CODE.sub(" ", text)
    found, depth = [], 0
    for m in NAMESPACE_OR_BRACE.finditer(code):
        if m.group(0) == "}":
            depth = max(0, depth - 1)
            continue
        if m.group(0) == "{":
            depth += 1
            continue
        name = re.sub(r"\s+", "", m.group(1)).replace("::inline", "::")
        if m.group(2):  # an alias: what it names counts, wherever it is
            target = re.sub(r"\s+", "", m.group(2))
            if target.split("::", 1)[0] not in OWN_NAMESPACES:
                found.append(name + " = " + target)
            continue
        if depth == 0 and name.split("::", 1)[0] not in OWN_NAMESPACES:
            found.append(name)
        depth += 1
    return found


class Table:
    def __init__(self, text):
        self.may = {}          # layer -> set of layers it may include
        self.owner = {}        # public header -> layer that implements it
        self.only_public = set()
        self.external = {}     # include prefix of an outside library -> layers that may use it
        self.known = set()     # (file, include)
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            kind, args = words[0], words[1:]
            if kind == "layer" and args:
                self.may[args[0]] = set(args[1:])
            elif kind == "public" and len(args) == 2:
                self.owner[args[0]] = args[1]
            elif kind == "only-public" and len(args) == 1:
                self.only_public.add(args[0])
            elif kind == "external" and len(args) >= 2:
                self.external[args[0]] = set(args[1:])
            elif kind == "known" and len(args) == 2:
                self.known.add((args[0], args[1]))
            else:
                raise ValueError(f"line {n}: cannot read '{line.strip()}'")
        for layer, allowed in self.may.items():
            for other in allowed:
                if other not in self.may:
                    raise ValueError(f"layer {layer} may include {other}, which is no layer")
        for header, layer in self.owner.items():
            if layer not in self.may:
                raise ValueError(f"public {header} is owned by {layer}, which is no layer")

    def reaches(self, layer, other):
        """Whether `layer` may include `other`, directly or through the layers it may include."""
        seen, todo = set(), [layer]
        while todo:
            cur = todo.pop()
            if cur == other:
                return True
            if cur in seen:
                continue
            seen.add(cur)
            todo.extend(self.may.get(cur, ()))
        return False

    def allows(self, layer, include):
        top = include.split("/", 1)[0]
        if top == include:
            return True  # a file next to this one
        if top == "tandem":
            owner = self.owner.get(include.split("/", 1)[1])
            return owner is not None and (layer == "include" or self.reaches(layer, owner) or
                                          layer in self.only_public)
        if top in self.external:
            return layer in self.external[top]
        if top == layer:
            return True
        if layer in self.only_public or layer == "include":
            return False
        return top in self.may and top in self.may.get(layer, set())


def layer_of(path, root):
    rel = path.relative_to(root).parts
    return "include" if rel[0] == "include" else rel[1]


def breaks(root, table):
    found = set()
    for top in ("src", "include"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".cc") or not path.is_file():
                continue
            layer = layer_of(path, root)
            if layer != "include" and layer not in table.may:
                found.add((str(path.relative_to(root)), f"(no layer '{layer}' in the table)"))
                continue
            text = path.read_text(errors="replace")
            if layer == "include":
                for name in outside_namespaces(text):
                    found.add((str(path.relative_to(root)), "namespace " + name))
            for line in text.splitlines():
                m = INCLUDE.match(line)
                if m and not table.allows(layer, m.group(1)):
                    found.add((str(path.relative_to(root)), m.group(1)))
                m = ANGLE_INCLUDE.match(line)
                if m and layer == "include" and outside_library(m.group(1)):
                    found.add((str(path.relative_to(root)), m.group(1)))
    return found


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    ap.add_argument("--table", type=pathlib.Path)
    args = ap.parse_args(argv[1:])
    table_path = args.table or args.root / "src" / "layers.txt"
    try:
        table = Table(table_path.read_text())
    except ValueError as e:
        print(f"{table_path}: {e}", file=sys.stderr)
        return 2
    found = breaks(args.root, table)
    new = sorted(found - table.known)
    gone = sorted(table.known - found)
    for f, inc in new:
        if inc.startswith("namespace "):
            print(f"{f}: declares {inc}, an outside library's: a public header names none "
                  "(src/layers.txt)", file=sys.stderr)
            continue
        print(f"{f}: includes \"{inc}\", which its layer may not (src/layers.txt)", file=sys.stderr)
    for f, inc in gone:
        print(f"{f}: the known break \"{inc}\" is gone: remove its line from {table_path.name}",
              file=sys.stderr)
    if new or gone:
        return 1
    print(f"layers: every include follows {table_path.name} ({len(table.known)} known breaks left)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
