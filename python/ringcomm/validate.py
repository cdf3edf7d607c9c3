"""Argument and record validation: one place that turns what a caller, the
environment or a peer handed over into the value ringcomm uses, or refuses it.

Arguments (index, indices, real, choice, timeout_seconds, store) raise the
builtin TypeError (wrong kind of value) or ValueError (right kind, out of
range), naming the argument, before anything reaches the native core: never
a pybind11 signature dump, an AttributeError, or a silent conversion
(int(0.7) == 0, float("5") == 5.0).

Records (record and the field validators text, integer, boolean, hex_text,
optional, list_of, pair, one_of) check what a peer published in the store as
JSON. Those bytes are as untrusted as bytes from a socket: whatever they are,
record() returns the checked values or raises ringcomm.RingcommError, never
any other exception.

    PEER = {"host": validate.text(255), "pid": validate.integer(1, 2**22),
            "tcp": validate.optional(validate.pair(validate.text(64), validate.integer(1, 65535)))}
    info = validate.record(store.get(key), rank, PEER)
"""
import json
import math
import numbers
import operator
import re
import sys
from datetime import timedelta

from ringcomm.errors import RingcommError

# The longest timeout any wait takes. Deadlines are steady_clock::now() plus
# the timeout in nanoseconds (int64: ~292 years from the clock's epoch, which
# a huge timeout overflows into a deadline in the past), and torch's stores
# take a timedelta that they turn into milliseconds and then nanoseconds
# (timedelta(days=1e6) makes a TCPStore time out at once). 30 days is longer
# than any job waits for a peer and leaves both conversions far from overflow.
MAX_TIMEOUT_S = 30 * 24 * 3600.0

# The largest record record() parses: a peer record is a few hundred bytes
# (a split's rank list of 65536 ranks is ~400 KB); anything bigger is garbage
# that should not cost a parse.
MAX_RECORD_BYTES = 1 << 20


def show(value, limit=40, json_terms=False):
    """A short, safe description of a value for an error message (never
    raises, never prints megabytes). json_terms: null / true / false."""
    if value is None:
        return "null" if json_terms else "None"
    if isinstance(value, bool):
        return ("true" if value else "false") if json_terms else repr(value)
    if isinstance(value, int):
        if value.bit_length() > 128:
            return f"an integer of {value.bit_length()} bits"
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(str(value))
        return f"a string of {len(value)} characters starting {str(value[:limit // 2])!r}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            data = bytes(value[: limit // 2])
            return f"{type(value).__name__} of {len(value)} bytes starting {data!r}"
        except Exception:  # noqa: BLE001 - an exotic memoryview
            return type(value).__name__
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys" if json_terms else f"a dict of {len(value)} items"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = "?"
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(value).__name__} {text}"


def _got(value):
    """What an argument error says it got: the type, then the value."""
    if value is None or isinstance(value, (list, dict, bytes, bytearray, memoryview)):
        return show(value)
    if isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__} {show(value)}"
    return show(value)


def _is_bool(value):
    """bool, numpy.bool_ (no bool subclass; it had __index__ before numpy 2)
    and bool tensors / 0-d arrays (which have __index__)."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        return True
    return str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


# -- arguments ------------------------------------------------------------------

def _check_range(v, name, lo, hi, bound_text, value_text):
    """ValueError unless lo <= v <= hi (either bound may be None)."""
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        got = value_text(v)
        if hi is None:
            raise ValueError(f"{name} must be at least {bound_text(lo)}, got {got}")
        if lo is None:
            raise ValueError(f"{name} must be at most {bound_text(hi)}, got {got}")
        raise ValueError(f"{name} must be between {bound_text(lo)} and {bound_text(hi)}, got {got}")


def index(value, name, lo=None, hi=None):
    """`value` as a Python int: anything with __index__ (int, numpy and 0-d
    torch integers), not bool, float, str or None. With lo / hi (inclusive)
    the range is checked too (ValueError)."""
    if _is_bool(value) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, got {_got(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {_got(value)}") from None
    _check_range(v, name, lo, hi, str, show)
    return v


# A rank argument's range: a C int.
RANK_MIN, RANK_MAX = -(2**31), 2**31 - 1


def plain_rank(value):
    """Whether a rank argument is a plain int in range (rank_arg passes it as it is)."""
    return type(value) is int and RANK_MIN <= value <= RANK_MAX


def rank_arg(value, name):
    """A rank argument (root, src, dst, peer) as the native calls take it, a C
    int: TypeError for 1.5, "0" or True. Its range is the native call check's
    (csrc/comm/call_check.h), the one place that rule lives."""
    if plain_rank(value):
        return value  # the common case, with one look (send/recv pay this per call)
    return index(value, name, RANK_MIN, RANK_MAX)


def indices(values, name, lo=None, hi=None):
    """A list of ints from an iterable of integers (each as index(); the
    error names name[i]). A str or a mapping is refused (TypeError)."""
    if isinstance(values, (str, bytes, bytearray, dict)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of integers, got {_got(values)}")
    return [index(v, f"{name}[{i}]", lo, hi) for i, v in enumerate(values)]


def real(value, name, lo=None, hi=None):
    """`value` as a finite Python float: int, float, numpy numbers; not bool,
    str or None (TypeError); nan, inf or outside [lo, hi] (ValueError)."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {_got(value)}")
    try:
        v = float(value)
    except OverflowError:  # an int (or Fraction) beyond a double's range
        v = math.inf if value > 0 else -math.inf
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {show(value)}")
    g = "{:g}".format
    _check_range(v, name, lo, hi, g, g)
    return v


def choice(value, name, choices):
    """`value` if it is one of the strings `choices` (TypeError for a non-str,
    ValueError for another string)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(choices)}; got {_got(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {show(value)}")
    return value


def timeout_seconds(value, name="timeout", *, allow_zero=False):
    """Seconds (a float) from a number (int, float, numpy number) or a
    datetime.timedelta: TypeError for a str, a bool or anything else;
    ValueError for nan, inf, a negative value, 0 (unless allow_zero: a wait
    that only polls) and anything above MAX_TIMEOUT_S (30 days)."""
    if isinstance(value, timedelta):
        v = value.total_seconds()
    elif _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or a datetime.timedelta, got {_got(value)}")
    else:
        try:
            v = float(value)
        except OverflowError:
            v = math.inf if value > 0 else -math.inf
    bound = "at least 0" if allow_zero else "positive"
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero) or v > MAX_TIMEOUT_S:
        raise ValueError(f"{name} must be a finite number of seconds, {bound} and at most "
                         f"{MAX_TIMEOUT_S:.0f} (30 days), got {show(value)}")
    return v


_STORE_METHODS = ("set", "get", "wait", "check")


def store(obj, name="store"):
    """`obj` if it can serve as the rendezvous store: a torch.distributed.Store,
    or any object with callable set, get, wait and check (TypeError otherwise)."""
    dist = sys.modules.get("torch.distributed")  # no torch import just for a check
    store_type = getattr(dist, "Store", None) if dist is not None else None
    if store_type is not None and isinstance(obj, store_type):
        return obj
    missing = [m for m in _STORE_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"{name} must be a torch.distributed.Store or an object with set, get, wait and "
                        f"check methods; got {_got(obj)} (no {', '.join(missing)})")
    return obj


# -- records from the store -----------------------------------------------------

class _Malformed(Exception):
    """A field that does not match its validator (turned into RingcommError by record())."""

    def __init__(self, where, expected, got, shown=None):
        super().__init__(expected)
        self.where = where  # "" or "[1]" / "[3][0]": the position inside the key's value
        self.expected = expected
        self.got = got
        self.shown = shown


class Field:
    """A validator for one value of a record: check() returns the value
    (possibly normalised) or raises _Malformed. `expected` describes what it
    accepts, for the error message."""

    expected = "a value"

    def check(self, value):
        raise NotImplementedError

    def _bad(self, value, where="", shown=None):
        raise _Malformed(where, self.expected, value, shown)

    def __repr__(self):
        return f"<ringcomm.validate field: {self.expected}>"


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Text(Field):
    def __init__(self, max_len, pattern, allow_empty):
        self.max_len = index(max_len, "max_len", 1)
        if pattern is not None and not isinstance(pattern, (str, re.Pattern)):
            raise TypeError(f"text(): pattern must be a str or a compiled regular expression, got {_got(pattern)}")
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.allow_empty = bool(allow_empty)
        lo = 0 if allow_empty else 1
        self.expected = f"a string of {lo} to {self.max_len} characters without control characters"
        if self.pattern is not None:
            self.expected += f" matching {self.pattern.pattern!r}"

    def check(self, value):
        if not isinstance(value, str) or len(value) > self.max_len or (not value and not self.allow_empty):
            self._bad(value)
        if _CONTROL.search(value):
            self._bad(value)
        try:
            value.encode("utf-8")  # a JSON "\ud800" escape decodes to a lone surrogate
        except UnicodeEncodeError:
            self._bad(value, shown="a string with a lone surrogate (not UTF-8)")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            self._bad(value)
        return value


class _Integer(Field):
    def __init__(self, lo, hi):
        self.lo = index(lo, "lo")
        self.hi = index(hi, "hi", self.lo)
        self.expected = f"an integer between {self.lo} and {self.hi}"

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            self._bad(value)
        return value


class _Boolean(Field):
    expected = "true or false"

    def check(self, value):
        if not isinstance(value, bool):
            self._bad(value)
        return value


class _Hex(Field):
    def __init__(self, nbytes):
        self.nbytes = index(nbytes, "nbytes", 1)
        self._re = re.compile(f"[0-9a-fA-F]{{{2 * self.nbytes}}}")
        self.expected = f"{2 * self.nbytes} hex digits ({self.nbytes} bytes)"

    def check(self, value):
        if not isinstance(value, str) or len(value) != 2 * self.nbytes or not self._re.fullmatch(value):
            self._bad(value)
        return value


class _Optional(Field):
    def __init__(self, inner):
        self.inner = _field(inner, "optional()")
        self.expected = f"null or {self.inner.expected}"

    def check(self, value):
        if value is None:
            return None
        try:
            return self.inner.check(value)
        except _Malformed as e:
            if e.where:
                raise  # the value had the right shape; say which part is wrong
            raise _Malformed("", self.expected, value, e.shown) from None


class _ListOf(Field):
    def __init__(self, inner, max_len):
        self.inner = _field(inner, "list_of()")
        self.max_len = index(max_len, "max_len", 0)
        self.expected = f"a list of at most {self.max_len} items, each {self.inner.expected}"

    def check(self, value):
        if not isinstance(value, list) or len(value) > self.max_len:
            self._bad(value)
        out = []
        for i, item in enumerate(value):
            try:
                out.append(self.inner.check(item))
            except _Malformed as e:
                raise _Malformed(f"[{i}]{e.where}", e.expected, e.got, e.shown) from None
        return out


class _Pair(Field):
    def __init__(self, first, second):
        self.items = (_field(first, "pair()"), _field(second, "pair()"))
        self.expected = f"a list of 2 items: {self.items[0].expected}, then {self.items[1].expected}"

    def check(self, value):
        if not isinstance(value, list) or len(value) != 2:
            self._bad(value)
        out = []
        for i, (v, item) in enumerate(zip(self.items, value)):
            try:
                out.append(v.check(item))
            except _Malformed as e:
                raise _Malformed(f"[{i}]{e.where}", e.expected, e.got, e.shown) from None
        return out


class _OneOf(Field):
    def __init__(self, values):
        if not values:
            raise ValueError("one_of() needs at least one value")
        for v in values:
            if v is not None and not isinstance(v, (str, int, float, bool)):
                raise TypeError(f"one_of(): {v!r} is not a JSON scalar")
        self.values = values
        self.expected = "one of " + ", ".join(show(v, json_terms=True) for v in values)

    def check(self, value):
        # Exact types: 1 == 1.0 == True in Python, but not in a record.
        for v in self.values:
            if type(value) is type(v) and value == v:
                return value
        self._bad(value)


def _field(v, where):
    if not isinstance(v, Field):
        raise TypeError(f"{where}: expected a field validator (text(), integer(), ...), got {v!r}")
    return v


def text(max_len, pattern=None, allow_empty=False):
    """A string of at most max_len characters (at least 1 unless allow_empty),
    with no control characters and no lone surrogates; with `pattern` (a
    regular expression, str or compiled) the whole string must match it."""
    return _Text(max_len, pattern, allow_empty)


def integer(lo, hi):
    """An integer (not a bool, not a float such as 3.0) in [lo, hi]."""
    return _Integer(lo, hi)


def boolean():
    """true or false (not 0 / 1)."""
    return _Boolean()


def hex_text(nbytes):
    """Exactly 2 * nbytes hex digits (what bytes.fromhex turns into nbytes bytes)."""
    return _Hex(nbytes)


def optional(v):
    """null, or a value `v` accepts. In a schema, the key may also be absent:
    record() then leaves it out of the result."""
    return _Optional(v)


def list_of(v, max_len):
    """A list of at most max_len items, each accepted by `v`."""
    return _ListOf(v, max_len)


def pair(v1, v2):
    """A list of exactly 2 items: the first accepted by v1, the second by v2."""
    return _Pair(v1, v2)


def one_of(*values):
    """One of the given JSON scalars (str, int, float, bool, None), type and value equal."""
    return _OneOf(values)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise _Duplicate(k)
        d[k] = v
    return d


class _Duplicate(Exception):
    pass


def _reject_constant(name):
    raise _NotJson(f"{name} is not JSON")


class _NotJson(Exception):
    pass


def record(raw, rank, schema, max_bytes=MAX_RECORD_BYTES):
    """The record `rank` published in the store, checked against `schema`.

    `raw` is what store.get returned (bytes; a Python store may return the
    str it was given). It must be UTF-8 JSON of at most max_bytes holding an
    object; each key of `schema` (a dict: key -> field validator) must be
    present (unless its validator is optional()) and valid. Keys the schema
    does not name are ignored and left out of the result. Returns a new dict
    of the schema's keys. Raises ringcomm.RingcommError for anything
    malformed, and only that, whatever `raw` is.
    """
    if not isinstance(schema, dict):
        raise TypeError(f"schema must be a dict of key -> field validator, got {type(schema).__name__}")
    for key, v in schema.items():
        _field(v, f"schema key {key!r}")
    who = f"ringcomm: the record rank {rank} published in the store is malformed"

    if isinstance(raw, str):
        if len(raw) > max_bytes:  # each character is at least one UTF-8 byte
            raise RingcommError(f"{who}: {len(raw)} characters, more than the {max_bytes} bytes a record may have")
        data = raw
    elif isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw)
        except Exception as e:  # noqa: BLE001 - a memoryview of an exotic format
            raise RingcommError(f"{who}: unreadable bytes ({type(e).__name__})") from None
        if len(raw) > max_bytes:
            raise RingcommError(f"{who}: {len(raw)} bytes, more than the {max_bytes} a record may have")
        try:
            data = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RingcommError(f"{who}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    else:
        raise RingcommError(f"{who}: expected bytes or str from the store, got {type(raw).__name__}")

    try:
        obj = json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise RingcommError(f"{who}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except _Duplicate as e:
        raise RingcommError(f"{who}: key {show(e.args[0])} appears twice") from None
    except _NotJson as e:
        raise RingcommError(f"{who}: not JSON ({e})") from None
    except RecursionError:
        raise RingcommError(f"{who}: not JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise RingcommError(f"{who}: not JSON ({str(e)[:80]})") from None

    if not isinstance(obj, dict):
        raise RingcommError(f"{who}: expected a JSON object, got {show(obj, json_terms=True)}")
    out = {}
    for key, v in schema.items():
        if key not in obj:
            if isinstance(v, _Optional):
                continue
            raise RingcommError(f"{who}: key {key!r}: expected {v.expected}, got nothing (the key is missing)")
        try:
            out[key] = v.check(obj[key])
        except _Malformed as e:
            got = e.shown if e.shown is not None else show(e.got, json_terms=True)
            raise RingcommError(f"{who}: key {key!r}{e.where}: expected {e.expected}, got {got}") from None
    return out


__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_TIMEOUT_S",
    "Field",
    "boolean",
    "choice",
    "hex_text",
    "index",
    "indices",
    "integer",
    "list_of",
    "one_of",
    "optional",
    "pair",
    "real",
    "show",
    "record",
    "store",
    "text",
    "timeout_seconds",
]
