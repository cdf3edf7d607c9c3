#!/usr/bin/env python3
"""Writes the environment-variable tables of docs/configuration.md from
python/ringcomm/config.py (SETTINGS, GPU_SETTINGS, DEBUG_SETTINGS; defaults
read from the built module's native Config), between the two marker lines.

    python scripts/gen_config_docs.py           # rewrite docs/configuration.md
    python scripts/gen_config_docs.py --check   # exit 1 if it differs from what would be written
    python scripts/gen_config_docs.py --print   # the tables alone, to stdout

Needs ringcomm importable (the built package, e.g. an editable install).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "configuration.md")


def render(page_text):
    """page_text with the part between the markers replaced by the tables."""
    from ringcomm import config

    begin, end = config.TABLE_BEGIN, config.TABLE_END
    if page_text.count(begin) != 1 or page_text.count(end) != 1 or page_text.index(begin) > page_text.index(end):
        raise SystemExit(f"{PAGE}: expected one line {begin!r} and, after it, one line {end!r}")
    head, rest = page_text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n\n" + config.markdown_table() + "\n" + end + tail


def main(argv):
    if argv == ["--print"]:
        from ringcomm import config
        sys.stdout.write(config.markdown_table())
        return 0
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    with open(PAGE, encoding="utf-8") as f:
        current = f.read()
    wanted = render(current)
    if argv == ["--check"]:
        if wanted != current:
            print(f"{PAGE} is not what python/ringcomm/config.py gives; run: python scripts/gen_config_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        with open(PAGE, "w", encoding="utf-8") as f:
            f.write(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
