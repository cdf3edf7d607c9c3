#!/usr/bin/env python3
"""Writes python/ringcomm/_C.pyi, the type stubs of the native module, from the
built module itself: its functions and methods with the signatures pybind11
writes on the first line of each __doc__, classes with their properties (read
only where there is no setter) and static methods, enums, exceptions with their
bases, and module constants.

    python scripts/gen_stubs.py            # rewrite python/ringcomm/_C.pyi
    python scripts/gen_stubs.py --check    # exit 1 if it differs from what would be written
    python scripts/gen_stubs.py --print    # the stub to stdout

Run it with the interpreter that has the build (e.g. the editable install's
venv) after changing the bindings; run it on a build with CUDA compiled in (as
CI builds), since the GPU bindings exist only there. Defaults that are not
Python literals are written as `...`; a function whose __doc__ has no pybind11
signature gets `(*args, **kwargs)`.
"""
import ast
import enum
import importlib
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "python", "ringcomm", "_C.pyi")
MODULE = "ringcomm._C"
COMMAND = "python scripts/gen_stubs.py"
HEADER = (f"# Type stubs of {MODULE}, generated from the built module by scripts/gen_stubs.py: do not edit.\n"
          f"# After changing the bindings, regenerate them (on a build with CUDA, as CI builds): {COMMAND}\n")
# Attributes every pybind11 class or exception has; not part of the interface.
SKIPPED = {"__doc__", "__module__", "__dict__", "__weakref__", "_pybind11_conduit_v1_", "__members__",
           "__entries", "__getstate__", "__setstate__"}
DOTTED = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")


class Writer:
    def __init__(self):
        self.imports = set()
        self.lines = []

    # -- types -----------------------------------------------------------------
    def annotation(self, text):
        """A pybind11 type as the stub spells it: the module's own types by
        their bare names, others by their dotted names (their modules imported)."""
        text = text.strip().replace(MODULE + ".", "")

        def dotted(m):
            name = m.group(1)
            module = name.rsplit(".", 1)[0]
            try:
                importlib.import_module(module)
            except ImportError:
                return name
            self.imports.add(module)
            return name

        return DOTTED.sub(dotted, text)

    # -- signatures ------------------------------------------------------------
    @staticmethod
    def split_top(text, sep=","):
        """text split at `sep` outside brackets and quotes."""
        parts, depth, quote, cur = [], 0, None, ""
        for ch in text:
            if quote:
                quote = None if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch in "([{<":
                depth += 1
            elif ch in ")]}>":
                depth -= 1
            elif ch == sep and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            cur += ch
        if cur.strip():
            parts.append(cur)
        return [p.strip() for p in parts]

    def parameter(self, text, first, method):
        if text in ("*", "/") or text.startswith("*"):
            name, _, ann = text.partition(":")
            return name.strip() + (": " + self.annotation(ann) if ann.strip() else "")
        name, _, rest = text.partition(":")
        ann, eq, default = rest.partition("=")
        name = name.strip()
        if first and method and name in ("self", "arg0"):
            return "self"
        out = name + (": " + self.annotation(ann) if ann.strip() else "")
        if eq:
            default = default.strip()
            try:
                ast.literal_eval(default)
            except (ValueError, SyntaxError):
                default = "..."
            out += " = " + default
        return out

    def signature(self, name, doc, method):
        """'(params) -> ret' parsed from pybind11's first __doc__ line 'name(params) -> ret',
        or None when the doc has none."""
        first = (doc or "").strip().split("\n", 1)[0]
        if not first.startswith(name + "("):
            return None
        depth, end = 0, None
        for i, ch in enumerate(first[len(name):], len(name)):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        if end is None:
            return None
        params = self.split_top(first[len(name) + 1:end])
        ret = first[end + 1:].strip()
        if ret and not ret.startswith("->"):
            return None  # "name(args): prose", a hand-written doc, not pybind11's signature
        ret = self.annotation(ret[2:]) if ret.startswith("->") else None
        args = [self.parameter(p, i == 0, method) for i, p in enumerate(params)]
        if method and (not args or args[0] != "self"):
            args.insert(0, "self")
        return "(" + ", ".join(args) + ")" + (" -> " + ret if ret else "")

    @staticmethod
    def docstring(doc, name):
        """The prose of a __doc__ (its signature line and pybind11's overload list left out)."""
        if not doc:
            return None
        lines = doc.strip().split("\n")
        if lines[0].startswith(name + "("):
            lines = lines[1:]
        text = "\n".join(lines).strip()
        return text or None

    # -- output ----------------------------------------------------------------
    def emit(self, indent, text):
        self.lines.append("    " * indent + text if text else "")

    def emit_doc(self, indent, text):
        text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        body = text.split("\n")
        if len(body) == 1:
            self.emit(indent, f'"""{text}"""')
        else:
            self.emit(indent, '"""' + body[0])
            for line in body[1:]:
                self.emit(indent, line)
            self.emit(indent, '"""')

    def function(self, indent, name, obj, method, decorator=None):
        doc = getattr(obj, "__doc__", None) or ""
        overloads = re.findall(r"^\d+\. (" + re.escape(name) + r"\(.*)$", doc, flags=re.M)
        if "Overloaded function." in doc and overloads:
            self.imports.add("typing")
            for line in overloads:
                if decorator:
                    self.emit(indent, decorator)
                self.emit(indent, "@typing.overload")
                sig = self.signature(name, line, method) or ("(self, *args, **kwargs)" if method else "(*args, **kwargs)")
                self.emit(indent, f"def {name}{sig}: ...")
            return
        sig = self.signature(name, doc, method)
        prose = self.docstring(doc, name) if sig else None
        text_sig = getattr(obj, "__text_signature__", None)
        if sig is None and text_sig:
            # A plain CPython method with a signature line ("name(args)\n--\n\n" in its C doc).
            args = [a.strip() for a in text_sig.strip()[1:-1].split(",") if a.strip() and a.strip() != "/"]
            args = [a[1:] if a.startswith("$") else a for a in args]
            if method and (not args or args[0] != "self"):
                args.insert(0, "self")
            sig = "(" + ", ".join(args) + ")"
            prose = doc.strip() or None
        elif sig is None:
            # Not pybind11's format (a plain CPython method): its own "name(args): text" line, if any.
            m = re.match(re.escape(name) + r"\(([\w, ]*)\)", doc.strip())
            args = (["self"] if method else []) + ([a.strip() for a in m.group(1).split(",") if a.strip()]
                                                  if m else ["*args", "**kwargs"])
            sig = "(" + ", ".join(args) + ")"
            prose = doc.strip() or None
        if decorator:
            self.emit(indent, decorator)
        if prose:
            self.emit(indent, f"def {name}{sig}:")
            self.emit_doc(indent + 1, prose)
        else:
            self.emit(indent, f"def {name}{sig}: ...")

    def prop(self, indent, name, prop):
        getter_doc = getattr(prop.fget, "__doc__", None) or ""
        m = re.match(r"\(.*?\)\s*->\s*(.*)$", getter_doc.strip().split("\n", 1)[0])
        ann = self.annotation(m.group(1)) if m else "typing.Any"
        if not m:
            self.imports.add("typing")
        self.emit(indent, "@property")
        self.emit(indent, f"def {name}(self) -> {ann}: ...")
        if prop.fset is not None:
            self.emit(indent, f"@{name}.setter")
            self.emit(indent, f"def {name}(self, value: {ann}) -> None: ...")

    def python_enum(self, name, cls):
        """An enum.Enum subclass (pybind11's py::native_enum): its members and their values."""
        base = next(b for b in cls.__mro__[1:] if b.__module__ == "enum")
        self.imports.add("enum")
        self.emit(0, f"class {name}(enum.{base.__name__}):")
        for member in cls:
            self.emit(1, f"{member.name} = {member.value!r}")
        self.emit(0, "")

    def klass(self, name, cls):
        if issubclass(cls, enum.Enum):
            return self.python_enum(name, cls)
        bases = [b for b in cls.__bases__ if b.__name__ not in ("pybind11_object", "object")]
        base_names = [b.__name__ if b.__module__ in (MODULE, "builtins") else f"{b.__module__}.{b.__name__}"
                      for b in bases]
        self.emit(0, f"class {name}" + (f"({', '.join(base_names)})" if base_names else "") + ":")
        before = len(self.lines)
        doc = cls.__dict__.get("__doc__")
        if isinstance(doc, str) and doc.strip():
            self.emit_doc(1, doc.strip())
        members = getattr(cls, "__members__", None)
        if isinstance(members, dict):  # a pybind11 enum
            self.imports.add("typing")
            for member in members:
                self.emit(1, f"{member}: typing.ClassVar[{name}]")
        for attr, value in cls.__dict__.items():
            if attr in SKIPPED or (isinstance(members, dict) and attr in members):
                continue
            if isinstance(value, property):
                self.prop(1, attr, value)
            elif isinstance(value, staticmethod):
                self.function(1, attr, getattr(cls, attr), False, "@staticmethod")
            elif isinstance(value, classmethod):
                self.function(1, attr, getattr(cls, attr), True, "@classmethod")
            elif callable(value) and type(value).__name__ in ("instancemethod", "method_descriptor", "function",
                                                               "builtin_function_or_method"):
                self.function(1, attr, value, True)
            elif callable(value):
                continue  # slot wrappers CPython gives every class (no constructor, comparisons)
            elif type(value).__name__ == "getset_descriptor":  # a plain CPython type's attribute
                self.imports.add("typing")
                self.emit(1, "@property")
                self.emit(1, f"def {attr}(self) -> typing.Any:")
                self.emit_doc(2, (value.__doc__ or attr).strip())
            else:
                self.emit(1, f"{attr}: {type(value).__name__}")
        if len(self.lines) == before:
            self.emit(1, "...")
        self.emit(0, "")


def _exception_order(item):
    name, cls = item
    return (len(cls.__mro__), name)


def generate(module=None):
    """The stub text of `module` (default: ringcomm._C, imported)."""
    if module is None:
        module = importlib.import_module(MODULE)
    w = Writer()
    names = sorted(n for n in vars(module) if not (n.startswith("__") and n.endswith("__")))
    exceptions = [(n, getattr(module, n)) for n in names
                  if inspect.isclass(getattr(module, n)) and issubclass(getattr(module, n), BaseException)]
    classes = [(n, getattr(module, n)) for n in names
               if inspect.isclass(getattr(module, n)) and not issubclass(getattr(module, n), BaseException)]
    functions = [(n, getattr(module, n)) for n in names if callable(getattr(module, n))
                 and not inspect.isclass(getattr(module, n))]
    constants = [(n, getattr(module, n)) for n in names if not callable(getattr(module, n))
                 and not inspect.ismodule(getattr(module, n))]
    body = Writer()
    body.imports = w.imports
    for n, v in constants:
        body.emit(0, f"{n}: {type(v).__name__}")
    if constants:
        body.emit(0, "")
    for n, cls in sorted(exceptions, key=_exception_order):
        body.klass(n, cls)
    for n, cls in classes:
        body.klass(n, cls)
    for n, fn in functions:
        body.function(0, n, fn, False)
    doc = (module.__doc__ or "").strip()
    out = [HEADER, f'"""{doc}"""\n' if doc else ""]
    out += [f"import {m}\n" for m in sorted(w.imports)]
    text = "".join(out) + "\n" + "\n".join(body.lines).rstrip("\n") + "\n"
    return text


def main(argv):
    if argv not in ([], ["--check"], ["--print"]):
        print(__doc__, file=sys.stderr)
        return 2
    text = generate()
    if argv == ["--print"]:
        sys.stdout.write(text)
        return 0
    current = open(STUB, encoding="utf-8").read() if os.path.exists(STUB) else None
    if argv == ["--check"]:
        if current != text:
            print(f"{STUB} is not what the built module gives; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        with open(STUB, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
