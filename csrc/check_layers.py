#!/usr/bin/env python3
"""Checks that the native core's layers include only headers of the layers below them.

    python csrc/check_layers.py [CSRC_DIR] [--stamp FILE]

Every file under CSRC_DIR (default: the folder of this script) belongs to one
layer (LAYERS below, by path); every `#include "..."` in it must name a header
of the same layer or of one it depends on (ALLOWED). The build runs this before
it compiles any layer (csrc/CMakeLists.txt), so an upward include fails the
build with the file, the line and the rule it breaks. Exit status 0 when the
tree keeps the rules (then --stamp FILE is written, for the build's bookkeeping),
1 when it does not. Angle-bracket includes (the standard library, pybind11,
CUDA, nccl.h) are not the core's and are not checked.

The layers and their libraries (one static library each, csrc/CMakeLists.txt):

    common      csrc/include/ringcomm/ (but copy.h, reducer.h), csrc/common/
    reduce      csrc/reduce/cpu/, csrc/include/ringcomm/{copy,reducer}.h
    transport   csrc/transport/ (but its CUDA parts)
    algo        csrc/algo/                 (on common only: abstract links)
    comm        csrc/comm/ (but comm/cuda/)
    bindings    csrc/bindings/ (but bindings/cuda/)  -> ringcomm._C
    testing     csrc/testing/                         -> ringcomm._C_testing

and the CUDA part of a layer (common/cuda, reduce/cuda, transport/nccl with
transport/cuda_ipc/cuda, comm/cuda, bindings/cuda), built only with CUDA, sits
on its layer and on the CUDA parts below; no CPU part includes a CUDA part,
so that a build without CUDA compiles.
"""
import argparse
import os
import re
import sys

# (path prefix relative to csrc/, layer); the first prefix that matches wins,
# so the more specific prefixes come first.
LAYERS = [
    ("include/ringcomm/copy.h", "reduce"),
    ("include/ringcomm/reducer.h", "reduce"),
    ("include/ringcomm/", "common"),
    ("common/cuda/", "common_cuda"),
    ("common/", "common"),
    ("reduce/cuda/", "reduce_cuda"),
    ("reduce/cpu/", "reduce"),
    ("transport/nccl/", "transport_cuda"),
    ("transport/cuda_ipc/cuda/", "transport_cuda"),
    ("transport/", "transport"),
    ("algo/", "algo"),
    ("comm/cuda/", "comm_cuda"),
    ("comm/", "comm"),
    ("bindings/cuda/", "bindings_cuda"),
    ("bindings/", "bindings"),
    ("testing/", "testing"),
]

# Layer -> the layers it depends on directly; a layer may include its own
# headers and those of every layer it reaches through these.
DEPENDS = {
    "common": [],
    "common_cuda": ["common"],
    "reduce": ["common"],
    "reduce_cuda": ["reduce", "common_cuda"],
    "transport": ["common", "reduce"],
    "transport_cuda": ["transport", "reduce_cuda"],
    "algo": ["common"],
    "comm": ["common", "reduce", "transport", "algo"],
    "comm_cuda": ["comm", "transport_cuda"],
    "bindings": ["comm"],
    "bindings_cuda": ["bindings", "comm_cuda"],
    "testing": ["bindings"],
}


def allowed(layer):
    """The layers `layer` may include: itself and everything below it."""
    seen, todo = set(), [layer]
    while todo:
        cur = todo.pop()
        if cur not in seen:
            seen.add(cur)
            todo.extend(DEPENDS[cur])
    return seen


def layer_of(rel):
    for prefix, layer in LAYERS:
        if rel == prefix or rel.startswith(prefix):
            return layer
    return None


SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def resolve(csrc, including_rel, name):
    """The path (relative to csrc/) an `#include "name"` finds, the way the
    build's include path (csrc/include, csrc) and the includer's folder do;
    None when it names no file of csrc/."""
    here = os.path.dirname(including_rel)
    for base in (here, "include", ""):
        rel = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if not rel.startswith("../") and os.path.isfile(os.path.join(csrc, rel)):
            return rel
    return None


def check(csrc):
    """The list of violations: strings 'file:line: message'."""
    problems = []
    for dirpath, dirnames, filenames in os.walk(csrc):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, csrc).replace(os.sep, "/")
            layer = layer_of(rel)
            if layer is None:
                problems.append(f"csrc/{rel}:1: the file is in no layer (add its folder to LAYERS in "
                                f"csrc/check_layers.py and give it a library in csrc/CMakeLists.txt)")
                continue
            ok = allowed(layer)
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    name = m.group(1)
                    target = resolve(csrc, rel, name)
                    if target is None:
                        problems.append(f'csrc/{rel}:{lineno}: #include "{name}" names no file of csrc/ '
                                        f"(use <...> for headers from outside the core)")
                        continue
                    owner = layer_of(target)
                    if owner not in ok:
                        problems.append(
                            f'csrc/{rel}:{lineno}: #include "{name}": layer {layer} may include only '
                            f"{', '.join(sorted(ok))}, but csrc/{target} is in layer {owner} "
                            f"(above it, or not among its dependencies)")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csrc", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--stamp", help="file to write when the check passes")
    args = p.parse_args(argv)
    problems = check(args.csrc)
    if problems:
        if args.stamp and os.path.exists(args.stamp):
            os.remove(args.stamp)  # no stale "ok" for the build to trust
        print("ringcomm layer check failed (rules: csrc/check_layers.py):", file=sys.stderr)
        for line in problems:
            print("  " + line, file=sys.stderr)
        return 1
    if args.stamp:
        with open(args.stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
