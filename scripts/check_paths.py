#!/usr/bin/env python3
"""Every path-like mention (csrc/..., python/..., tests/..., docs/..., comm/...,
algo/..., transport/..., reduce/..., scripts/..., benchmarks/..., fuzz/...) in the
sources, tests and docs must name a file or folder that exists.

    python scripts/check_paths.py            # all of csrc/, python/, tests/, docs/, the READMEs
    python scripts/check_paths.py FILE...    # only these files

Prints one line per stale mention (file:line: mention) and exits 1 if there is
any. A mention resolves against the repository root, then csrc/ and
csrc/include/ (the include roots: a mention comm/NAME.h means csrc/comm/NAME.h),
python/, and the
folder of the file that names it; {a,b} alternatives and * globs are expanded.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIXES = ("csrc", "python", "tests", "docs", "comm", "algo", "transport", "reduce", "scripts",
            "benchmarks", "fuzz")
SCANNED = ("csrc", "python", "tests", "docs", "README.md", "benchmarks/README.md", "fuzz/README.md")
SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".py", ".pyi", ".md", ".txt", ".sh", ".toml",
            ".cmake")
# A mention starts at a known top folder that is not the tail of a longer path
# or word (so "ringcomm/comm/x.h" and "torch/csrc/..." are not mentions).
MENTION = re.compile(r"(?<![\w./\-])((?:%s)/[\w.{},*/\-]*[\w*}/])" % "|".join(PREFIXES))
BASES = ("", "csrc", "csrc/include", "python")
# Folders that builds and runs create (fuzz/build.sh and fuzz/run.sh write fuzz/out/).
GENERATED = ("fuzz/out",)


def expand(mention):
    """The paths a mention stands for: a/{b,c}.h is a/b.h and a/c.h."""
    m = re.search(r"\{([^{}]*)\}", mention)
    if not m:
        return [mention]
    out = []
    for alt in m.group(1).split(","):
        out += expand(mention[:m.start()] + alt + mention[m.end():])
    return out


def exists(path, here):
    for base in BASES + (here,):
        full = os.path.join(ROOT, base, path)
        if ("*" in path and glob.glob(full)) or os.path.exists(full):
            return True
    return False


def scan_files():
    for top in SCANNED:
        full = os.path.join(ROOT, top)
        if os.path.isfile(full):
            yield full
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__pycache__", "build"))]
            for f in sorted(filenames):
                if f.endswith(SUFFIXES):
                    yield os.path.join(dirpath, f)


def stale(files):
    """(file relative to the root, line number, mention) for every mention that names nothing."""
    out = []
    for path in files:
        here = os.path.relpath(os.path.dirname(os.path.abspath(path)), ROOT)
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                for m in MENTION.finditer(line):
                    mention = m.group(1).rstrip(".")
                    if mention.endswith("/"):
                        mention = mention.rstrip("/")
                    # "..." elides; {name} or {p.name} (no comma) is an f-string's placeholder.
                    if "..." in m.group(1) or re.search(r"\{[\w.\[\]]*\}", mention) or mention.startswith(GENERATED):
                        continue
                    if not all(exists(p, here) for p in expand(mention)):
                        out.append((os.path.relpath(path, ROOT), lineno, mention))
    return out


def main(argv):
    files = argv or list(scan_files())
    found = stale(files)
    for path, lineno, mention in found:
        print(f"{path}:{lineno}: {mention}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
