"""The manual (README.md and docs/*.md) against the repository and the code:

- every relative markdown link (there and in benchmarks/README.md, fuzz/README.md)
  names a file that exists (and a heading of it, where it has an #anchor);
- the two command blocks are where .ci/run's awk finds them;
- docs/configuration.md's tables are what scripts/gen_config_docs.py writes from
  python/ringcomm/config.py, and every RINGCOMM_* variable the code reads is in them;
- docs/algorithms.md's table of algorithm names is what the native parser
  (csrc/comm/algo_choice.cpp) accepts, op by op;
- every path-like mention in the docs names something that exists
  (scripts/check_paths.py).
"""
import importlib.util
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# Pages whose links are checked too (they link into docs/).
LINKED = PAGES + [ROOT / "benchmarks" / "README.md", ROOT / "fuzz" / "README.md"]
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter", "gather",
               "all_to_all", "barrier")


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _prose(text):
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


def test_pages_exist():
    names = {p.name for p in PAGES[1:]}
    for page in ("usage.md", "errors.md", "configuration.md", "algorithms.md", "gpus.md", "performance.md",
                 "parallel.md", "security.md", "torch_backend.md", "frameworks.md"):
        assert page in names, f"docs/{page} is missing (found: {sorted(names)})"


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    links = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8")))
    for target in links:
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if ROOT in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{anchor} (has: {sorted(_anchors(dest))})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES[1:] if f"](docs/{p.name})" not in readme]
    assert not missing, f"README.md links no docs page {missing}"


@pytest.mark.parametrize("marker", ["test-command", "main-command"])
def test_command_blocks_as_ci_expects(marker):
    """.ci/run takes the test command with awk from the line after the fence that
    follows the marker; the same awk (read from .ci/run) must find a one-line
    command in a block of its own for both markers."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    m = re.search(r"awk '(/<!-- test-command -->/[^']*)' README\.md", ci)
    assert m, ".ci/run no longer extracts the test command with awk '/<!-- test-command -->/...' README.md"
    program = m.group(1).replace("test-command", marker)
    out = subprocess.run(["awk", program, "README.md"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         check=True).stdout
    cmd = out.rstrip("\n")
    assert cmd and "\n" not in cmd and not cmd.startswith("```"), f"awk found {out!r} after <!-- {marker} -->"
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("\n")
    i = lines.index(f"<!-- {marker} -->")
    assert lines[i + 1] == "```" and lines[i + 2] == cmd and lines[i + 3] == "```", (
        f"README.md: <!-- {marker} --> must be followed by a ``` fence, the one-line command and a closing "
        f"fence; found {lines[i + 1:i + 4]}")


def test_configuration_page_is_generated():
    gen = _script("gen_config_docs")
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert gen.render(current) == current, (
        "docs/configuration.md differs from python/ringcomm/config.py's settings; run: "
        "python scripts/gen_config_docs.py")


def _variables_read():
    """Every RINGCOMM_* variable ringcomm's code reads from the environment."""
    read = set()
    pattern = re.compile(r"(?:environ\.get\(|environ\[|getenv\(|_env_\w+\(|_raw\()\s*\"(RINGCOMM_[A-Z0-9_]+)\"")
    files = [p for p in (ROOT / "python" / "ringcomm").rglob("*.py") if "bench" not in p.parts]
    files += list((ROOT / "csrc").rglob("*.cpp")) + list((ROOT / "csrc").rglob("*.h"))
    for p in files:
        read |= set(pattern.findall(p.read_text(encoding="utf-8", errors="replace")))
    from ringcomm import cuda_ipc
    return read | set(cuda_ipc._ENV.values())


def test_every_variable_read_is_documented():
    from ringcomm import config
    documented = {s.name for s in config.SETTINGS + config.GPU_SETTINGS + config.DEBUG_SETTINGS}
    read = _variables_read()
    assert "RINGCOMM_TIMEOUT" in read and "RINGCOMM_NCCL_LIBRARY" in read, f"the scan found only {sorted(read)}"
    assert not read - documented, (f"read but not in config.py's settings (so not in docs/configuration.md): "
                                   f"{sorted(read - documented)}")
    assert not documented - read, f"in config.py's settings but read nowhere: {sorted(documented - read)}"


def _algo_table():
    text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- algo-names -->\n(.*?)<!-- end algo-names -->", text, flags=re.S)
    assert m, "docs/algorithms.md has no table between <!-- algo-names --> and <!-- end algo-names -->"
    table = {}
    for row in m.group(1).strip().split("\n")[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].strip("`")
        table[name] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


def test_algorithm_table_matches_the_parser():
    from ringcomm import _C, config
    table = _algo_table()
    assert set(table) == set(config.ALGOS), (f"docs/algorithms.md names {sorted(table)}, "
                                             f"python/ringcomm/config.py ALGOS {sorted(config.ALGOS)}")
    wrong = []
    for name, ops in table.items():
        _C.check_algo(name)  # every name alone is accepted
        for op in COLLECTIVES:
            try:
                _C.check_algo(f"{op}:{name}")
                accepted = True
            except ValueError:
                accepted = False
            if accepted != (op in ops):
                wrong.append(f"{op}:{name} is {'accepted' if accepted else 'refused'} by the parser, "
                             f"but the table says {op} {'lacks' if accepted else 'has'} {name}")
    assert not wrong, "docs/algorithms.md against csrc/comm/algo_choice.cpp:\n" + "\n".join(wrong)
    with pytest.raises(ValueError):
        _C.check_algo("all_reduce:no_such_algorithm")  # the parser refuses what it lacks


def test_doc_paths_exist():
    check = _script("check_paths")
    stale = check.stale([str(p) for p in LINKED])
    assert not stale, "path-like mentions of nothing (scripts/check_paths.py):\n" + "\n".join(
        f"{f}:{n}: {m}" for f, n, m in stale)
