"""python/ringcomm/_C.pyi is what scripts/gen_stubs.py writes from the built
module: regenerated here and compared, naming what the committed stub lacks,
has in excess, or spells differently. Regenerate with: python scripts/gen_stubs.py
"""
import ast
import enum
import importlib.util
import pathlib
import types

import pytest

from ringcomm import _C

ROOT = pathlib.Path(__file__).resolve().parent.parent
STUB = ROOT / "python" / "ringcomm" / "_C.pyi"
COMMAND = "python scripts/gen_stubs.py"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "scripts" / "gen_stubs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entries(text):
    """{qualified name: its source} for the module's and each class's definitions."""
    out = {}

    def add(name, node):
        src = ast.unparse(node)
        out[name] = out[name] + "\n" + src if name in out else src  # a property's setter, overloads

    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)})"
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(f"{node.name}.{member.name}", member)
                elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
                    add(f"{node.name}.{member.target.id}", member)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node.name, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            add(node.target.id, node)
    return out


def test_package_ships_stubs():
    assert STUB.is_file(), f"{STUB.relative_to(ROOT)} is missing; run: {COMMAND}"
    assert (STUB.parent / "py.typed").is_file(), "python/ringcomm/py.typed is missing (PEP 561 marker)"
    first = STUB.read_text(encoding="utf-8").split("\n", 2)[:2]
    assert any(COMMAND in line for line in first), f"the stub's header should name the command {COMMAND!r}"


def test_stub_matches_the_built_module():
    if not _C.build_info()["cuda"]:
        pytest.skip("the committed stub describes a build with CUDA compiled in (as CI builds); "
                    "this build has no GPU bindings to compare")
    wanted = _generator().generate(_C)
    committed = STUB.read_text(encoding="utf-8")
    if wanted == committed:
        return
    try:
        have = _entries(committed)
    except SyntaxError as e:
        pytest.fail(f"{STUB.relative_to(ROOT)} does not parse ({e}); run: {COMMAND}", pytrace=False)
    want = _entries(wanted)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    changed = sorted(n for n in set(want) & set(have) if want[n] != have[n])
    lines = [f"{STUB.relative_to(ROOT)} is not what the built module gives; run: {COMMAND}"]
    if missing:
        lines.append("missing from the stub: " + ", ".join(missing))
    if extra:
        lines.append("in the stub but not in the module: " + ", ".join(extra))
    for n in changed[:10]:
        lines.append(f"differs: {n}\n  module: {want[n]}\n  stub:   {have[n]}")
    if not (missing or extra or changed):
        lines.append("(the difference is in the header, docstrings or order)")
    pytest.fail("\n".join(lines), pytrace=False)


def test_generator_names_what_differs():
    """The comparison itself: a stub with one function removed and one added is reported as such."""
    gen = _generator()
    text = gen.generate(_C)
    entries = _entries(text)
    assert "check_algo" in entries and "Communicator.close" in entries and "Config.slot_bytes" in entries
    tampered = _entries(text.replace("def check_algo(", "def check_algorithm("))
    assert "check_algo" not in tampered and "check_algorithm" in tampered


def test_generator_on_a_small_module():
    """Enums, exceptions with their bases, constants and functions without a
    pybind11 signature, as a module of the next build may have them."""
    class Color(enum.IntEnum):
        RED = 1
        BLUE = 2

    class Failure(RuntimeError):
        pass

    def plain(a, b=2):
        """no pybind11 signature here"""

    mod = types.ModuleType("ringcomm._C", "a module")
    mod.Color, mod.Failure, mod.LIMIT, mod.plain = Color, Failure, 7, plain
    text = _generator().generate(mod)
    ast.parse(text)
    assert "class Color(enum.IntEnum):\n    RED = 1\n    BLUE = 2\n" in text, text
    assert "class Failure(RuntimeError):" in text and "LIMIT: int" in text, text
    assert "def plain(*args, **kwargs):" in text and "import enum" in text, text
