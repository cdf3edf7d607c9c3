"""Argument validation at every public entry point, and the record validator
for what peers publish in the store (issue 11: argument gaps; store data is
validated like socket data).

Each bad input is a row: what is called, the exception type expected exactly
(TypeError / ValueError, never a pybind11 signature dump or an
AttributeError), and a fragment the message must contain (the argument's
name, or the environment variable's). Everything runs in this process on a
world_size=1 communicator (a torch HashStore), so the whole file takes a
few seconds.
"""

import importlib.util
import math
import pathlib
import random
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

import ringcomm
from ringcomm import validate
from ringcomm.config import make_config
from ringcomm.errors import RingcommError

NAN, INF = float("nan"), float("inf")
RECORD_PREFIX = "ringcomm: the record rank 3 published in the store is malformed"


def _expect(fn, exc, fragment):
    with pytest.raises(Exception) as info:
        fn()
    e = info.value
    assert type(e) is exc, f"expected {exc.__name__}, got {type(e).__name__}: {e}"
    msg = str(e)
    assert fragment in msg, f"{fragment!r} is not in the message: {msg}"
    assert "incompatible function arguments" not in msg, msg
    return msg


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No inherited tuning: each case sees exactly the variables it sets."""
    import os

    for name in list(os.environ):
        if name.startswith("RINGCOMM_"):
            monkeypatch.delenv(name)


@pytest.fixture
def comm():
    c = ringcomm.Communicator(dist.HashStore(), "args", 0, 1, make_config(timeout=10))
    yield c
    c.close()


def _init(**overrides):
    kw = {"rank": 0, "world_size": 1, "store": dist.HashStore(), "timeout": 10.0}
    kw.update(overrides)
    c = ringcomm.init(**kw)
    c.close()
    ringcomm.finalize()
    return c


class DictStore:
    """Not a torch Store: any object with set/get/wait/check may serve."""

    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value

    def get(self, key):
        return self.data[key]

    def wait(self, keys, timeout=None):
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise RuntimeError(f"missing {missing}")

    def check(self, keys):
        return all(k in self.data for k in keys)


# -- init() ---------------------------------------------------------------------

INIT_BAD = [
    # (keyword overrides, exception, fragment)
    ({"rank": 0.7}, TypeError, "rank"),
    ({"rank": "0"}, TypeError, "rank"),
    ({"rank": True}, TypeError, "rank"),
    ({"rank": np.float64(0.0)}, TypeError, "rank"),
    ({"rank": 1}, ValueError, "rank"),
    ({"rank": -1}, ValueError, "rank"),
    ({"rank": 2 ** 70}, ValueError, "rank"),
    ({"world_size": 1.0}, TypeError, "world_size"),
    ({"world_size": "1"}, TypeError, "world_size"),
    ({"world_size": [1]}, TypeError, "world_size"),
    ({"world_size": 0}, ValueError, "world_size"),
    ({"world_size": 2 ** 31}, ValueError, "world_size"),
    ({"timeout": NAN}, ValueError, "timeout"),
    ({"timeout": INF}, ValueError, "timeout"),
    ({"timeout": -INF}, ValueError, "timeout"),
    ({"timeout": 1e300}, ValueError, "timeout"),
    ({"timeout": 10 ** 400}, ValueError, "timeout"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"timeout": -5}, ValueError, "timeout"),
    ({"timeout": validate.MAX_TIMEOUT_S + 1}, ValueError, "timeout"),
    ({"timeout": timedelta(0)}, ValueError, "timeout"),
    ({"timeout": timedelta(seconds=-1)}, ValueError, "timeout"),
    ({"timeout": timedelta(days=31)}, ValueError, "timeout"),
    ({"timeout": "5"}, TypeError, "timeout"),
    ({"timeout": b"5"}, TypeError, "timeout"),
    ({"timeout": True}, TypeError, "timeout"),
    ({"timeout": [5]}, TypeError, "timeout"),
    ({"store": "hello"}, TypeError, "store"),
    ({"store": 42}, TypeError, "store"),
    ({"store": object()}, TypeError, "store"),
    ({"store": {"set": 1}}, TypeError, "store"),
    ({"algo": 5}, TypeError, "algo"),
    ({"algo": b"ring"}, TypeError, "algo"),
    ({"algo": "fast"}, ValueError, "algo"),
    ({"transport": 1}, TypeError, "transport"),
    ({"transport": "ib"}, ValueError, "transport"),
]


@pytest.mark.parametrize("overrides, exc, fragment", INIT_BAD,
                         ids=[f"{k}={v!r}"[:40] for o, _, _ in INIT_BAD for k, v in o.items()])
def test_init_refuses(overrides, exc, fragment):
    _expect(lambda: _init(**overrides), exc, fragment)


@pytest.mark.parametrize("overrides", [
    {},
    {"rank": np.int64(0), "world_size": np.int32(1)},
    {"timeout": 5},
    {"timeout": np.float32(2.5)},
    {"timeout": timedelta(seconds=3)},
    {"timeout": validate.MAX_TIMEOUT_S},
    {"store": DictStore()},
    {"algo": "ring", "transport": "shm"},
], ids=["defaults", "numpy ints", "int timeout", "numpy timeout", "timedelta", "30 days", "duck store", "algo"])
def test_init_accepts(overrides):
    c = _init(**overrides)
    assert (c.rank, c.world_size) == (0, 1)


def test_init_timeout_is_kept_exactly():
    c = _init(timeout=timedelta(milliseconds=1500))
    assert c.timeout == 1.5


# -- environment variables ------------------------------------------------------

ENV_BAD = [
    ("RINGCOMM_TIMEOUT", v) for v in ("nan", "inf", "-inf", "-1", "0", "1e300", "abc", "5s")
] + [
    ("RINGCOMM_ALGO", "fast"),
    ("RINGCOMM_TRANSPORT", "ib"),
] + [("RINGCOMM_PULL", v) for v in ("2", "-1", "yes", "0.5", "true")] + [
    ("RINGCOMM_PULL_MIN_BYTES", v) for v in ("-1", str(2 ** 63), "1.5", "lots")
] + [
    ("RINGCOMM_ONESHOT_MAX_BYTES", v) for v in (str(2 ** 40), "-1", str(2 ** 64), "1e3", "9" * 50, "0x10")
] + [
    ("RINGCOMM_SLOT_BYTES", v) for v in ("63", "100", "0", str(2 ** 31), "x", "-64")
] + [
    ("RINGCOMM_SLOTS", v) for v in ("2", "5000", "-3", "16.0")
] + [
    ("RINGCOMM_SPIN_US", v) for v in ("-1", "nan", "inf", "1e300", "fast")
] + [
    ("RINGCOMM_YIELD_US", v) for v in ("-0.5", "nan", "1e12")
] + [
    ("RINGCOMM_PLAN_CACHE", v) for v in ("-1", "4097", "off", "1.5")
] + [
    ("RINGCOMM_HOST_ID", "h" * 300),
    ("RINGCOMM_HOST_ID", "host\nid"),
    ("RINGCOMM_SOCKET_IFNAME", "a" * 16),
    ("RINGCOMM_SOCKET_IFNAME", "eth0,"),
    ("RINGCOMM_SOCKET_IFNAME", "eth 0"),
    ("RINGCOMM_SOCKET_IFNAME", "eth/0"),
    ("RINGCOMM_SOCKET_IFNAME", ".."),
]


@pytest.mark.parametrize("name, value", ENV_BAD, ids=[f"{n}={v[:20]}" for n, v in ENV_BAD])
def test_environment_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    _expect(lambda: _init(timeout=None), ValueError, name)


ENV_GOOD = [
    ("RINGCOMM_TIMEOUT", "2592000"),
    ("RINGCOMM_TIMEOUT", " 7.5 "),
    ("RINGCOMM_TIMEOUT", ""),
    ("RINGCOMM_ALGO", "oneshot"),
    ("RINGCOMM_PULL", "0"),
    ("RINGCOMM_PULL", "1"),
    ("RINGCOMM_PULL_MIN_BYTES", "0"),
    ("RINGCOMM_ONESHOT_MAX_BYTES", "0"),
    ("RINGCOMM_ONESHOT_MAX_BYTES", str(1 << 20)),
    ("RINGCOMM_SLOT_BYTES", "64"),
    ("RINGCOMM_SLOTS", "3"),
    ("RINGCOMM_SPIN_US", "0"),
    ("RINGCOMM_YIELD_US", "2.5"),
    ("RINGCOMM_PLAN_CACHE", "0"),
    ("RINGCOMM_PLAN_CACHE", "4096"),
    ("RINGCOMM_HOST_ID", "my-host/1"),
    ("RINGCOMM_SOCKET_IFNAME", "lo, eth0"),
]


@pytest.mark.parametrize("name, value", ENV_GOOD, ids=[f"{n}={v}" for n, v in ENV_GOOD])
def test_environment_accepted(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    make_config()


def test_environment_values_reach_the_config(monkeypatch):
    monkeypatch.setenv("RINGCOMM_TIMEOUT", "12.5")
    monkeypatch.setenv("RINGCOMM_PULL", "0")
    monkeypatch.setenv("RINGCOMM_SLOTS", "4")
    monkeypatch.setenv("RINGCOMM_SPIN_US", "0")
    monkeypatch.setenv("RINGCOMM_PLAN_CACHE", "0")
    cfg = make_config()
    assert (cfg.timeout_s, cfg.pull, cfg.nslots, cfg.spin_us, cfg.plan_cache_entries) == (12.5, False, 4, 0.0, 0)
    assert make_config(timeout=3).timeout_s == 3.0  # the keyword wins


# -- communicator methods -------------------------------------------------------

def _f32(n=4):
    return np.ones(n, np.float32)


COMM_BAD = [
    ("broadcast src=1.5", lambda c: c.broadcast(_f32(), 1.5), TypeError, "src"),
    ("broadcast src='0'", lambda c: c.broadcast(_f32(), "0"), TypeError, "src"),
    ("broadcast src=None", lambda c: c.broadcast(_f32(), None), TypeError, "src"),
    ("broadcast src=True", lambda c: c.broadcast(_f32(), True), TypeError, "src"),
    ("broadcast src=1", lambda c: c.broadcast(_f32(), 1), ValueError, "src"),
    ("broadcast src=-1", lambda c: c.broadcast(_f32(), -1), ValueError, "src"),
    ("broadcast src=2**31", lambda c: c.broadcast(_f32(), 2 ** 31), ValueError, "src"),
    ("broadcast src=2**70", lambda c: c.broadcast(_f32(), 2 ** 70), ValueError, "src"),
    ("module broadcast src=0.0", lambda c: ringcomm.broadcast(_f32(), 0.0, comm=c), TypeError, "src"),
    ("reduce dst=0.0", lambda c: c.reduce(_f32(), 0.0), TypeError, "dst"),
    ("reduce dst=2**31", lambda c: c.reduce(_f32(), 2 ** 31), ValueError, "dst"),
    ("scatter src=1.5", lambda c: c.scatter(_f32(), _f32(), 1.5), TypeError, "src"),
    ("gather dst='0'", lambda c: c.gather(_f32(), _f32(), "0"), TypeError, "dst"),
    ("send dst=1.5", lambda c: c.send(_f32(), 1.5), TypeError, "dst"),
    ("send dst=2**40", lambda c: c.send(_f32(), 2 ** 40), ValueError, "dst"),
    ("isend dst=0.5", lambda c: c.isend(_f32(), 0.5), TypeError, "dst"),
    ("recv src=1.5", lambda c: c.recv(_f32(), 1.5), TypeError, "src"),
    ("irecv src=-2", lambda c: c.irecv(_f32(), -2), ValueError, "src"),
    ("sendrecv dst=0.5", lambda c: c.sendrecv(_f32(), 0.5, _f32(), 0), TypeError, "dst"),
    ("sendrecv src=2**31", lambda c: c.sendrecv(_f32(), 0, _f32(), 2 ** 31), ValueError, "src"),
    ("split 3", lambda c: c.split(3), TypeError, "ranks"),
    ("split None", lambda c: c.split(None), TypeError, "ranks"),
    ("split '0'", lambda c: c.split("0"), TypeError, "ranks"),
    ("split [0.0]", lambda c: c.split([0.0]), TypeError, "ranks[0]"),
    ("split [0, '1']", lambda c: c.split([0, "1"]), TypeError, "ranks[1]"),
    ("split [1]", lambda c: c.split([1]), ValueError, "ranks"),
    ("split []", lambda c: c.split([]), ValueError, "ranks"),
    ("split [0, 0]", lambda c: c.split([0, 0]), ValueError, "ranks"),
]


@pytest.mark.parametrize("fn, exc, fragment", [r[1:] for r in COMM_BAD], ids=[r[0] for r in COMM_BAD])
def test_communicator_refuses(comm, fn, exc, fragment):
    _expect(lambda: fn(comm), exc, fragment)


def test_communicator_accepts_integer_likes(comm):
    x = _f32()
    comm.broadcast(x, np.int64(0))
    comm.reduce(x, np.uint8(0))
    comm.broadcast(x, torch.tensor(0))
    sub = comm.split(np.array([0]))
    assert (sub.rank, sub.world_size) == (0, 1)
    sub.close()


WAIT_BAD = [
    (NAN, ValueError), (INF, ValueError), (-1, ValueError), (-0.001, ValueError), (1e300, ValueError),
    (timedelta(days=-1), ValueError), (timedelta(days=31), ValueError),
    ("1", TypeError), (True, TypeError), (b"1", TypeError), ([1], TypeError),
]


@pytest.mark.parametrize("timeout, exc", WAIT_BAD, ids=[repr(t)[:30] for t, _ in WAIT_BAD])
def test_work_wait_refuses(comm, timeout, exc):
    w = comm.all_reduce(_f32(), async_op=True)
    try:
        _expect(lambda: w.wait(timeout), exc, "timeout")
    finally:
        w.wait()


@pytest.mark.parametrize("timeout", [None, 0, 0.0, 5, np.float64(1.0), timedelta(seconds=2)],
                         ids=["None", "0", "0.0", "5", "numpy", "timedelta"])
def test_work_wait_accepts(comm, timeout):
    w = comm.all_reduce(_f32(), async_op=True)
    w.wait()  # completed: wait(0) must then say True, not time out
    assert w.wait(timeout) is True


def test_work_api_refuses_bad_calls(comm):
    w = comm.all_reduce(_f32(), async_op=True)
    try:
        _expect(lambda: w.wait(1, 2), TypeError, "at most 1 argument")
        _expect(lambda: w.wait(1, timeout=2), TypeError, "at most 1 argument")
        _expect(lambda: w.wait(timeout_s=1), TypeError, "unexpected keyword")
        _expect(lambda: w.is_completed(1), TypeError, "")
        _expect(lambda: ringcomm.Work(), TypeError, "cannot create")
        _expect(lambda: type(w)(), TypeError, "cannot create")
    finally:
        assert w.wait(timeout=None) is True
    assert w.is_completed() and w.exception() is None and w.source_rank() == -1
    assert repr(w) == "<ringcomm.Work all_reduce completed>", repr(w)
    assert w.what == "all_reduce"
    with pytest.raises((AttributeError, TypeError)):
        w.extra = 1  # no dict: a Work holds nothing but its call


def test_work_seconds_rules():
    from ringcomm.work import seconds

    assert seconds(None) is None
    assert seconds(0) == 0.0
    assert seconds(timedelta(minutes=1)) == 60.0
    _expect(lambda: seconds(NAN, "wait timeout"), ValueError, "wait timeout")


def test_closed_communicator(comm):
    comm.close()
    assert (comm.rank, comm.world_size) == (0, 1)
    text = repr(comm)
    assert "closed" in text and "rank 0 of 1" in text
    _expect(lambda: comm.split([0]), RingcommError, "closed")
    _expect(lambda: comm.broadcast(_f32(), 0), RingcommError, "closed")
    _expect(lambda: comm.barrier(), RingcommError, "closed")


# -- validate's argument functions ----------------------------------------------

def test_index():
    assert validate.index(3, "n") == 3 and type(validate.index(np.int16(3), "n")) is int
    assert validate.index(torch.tensor(5), "n") == 5
    for bad in (3.0, "3", None, True, np.True_, torch.tensor(True), torch.tensor(1.5), [3]):
        msg = _expect(lambda: validate.index(bad, "count"), TypeError, "count")
        assert type(bad).__name__ in msg or bad is None
    _expect(lambda: validate.index(5, "n", 0, 4), ValueError, "between 0 and 4")
    _expect(lambda: validate.index(-1, "n", 0), ValueError, "at least 0")
    _expect(lambda: validate.index(9, "n", hi=8), ValueError, "at most 8")


def test_timeout_seconds():
    assert validate.timeout_seconds(2) == 2.0
    assert validate.timeout_seconds(timedelta(seconds=1.5)) == 1.5
    assert validate.timeout_seconds(0, allow_zero=True) == 0.0
    assert validate.timeout_seconds(validate.MAX_TIMEOUT_S) == 30 * 86400
    assert math.isclose(validate.timeout_seconds(np.float32(0.1)), 0.1, rel_tol=1e-6)
    for bad in (NAN, INF, 0, -1, validate.MAX_TIMEOUT_S * 2, 10 ** 400):
        _expect(lambda: validate.timeout_seconds(bad, "deadline"), ValueError, "deadline")
    for bad in ("5", True, None, np.True_, object()):
        _expect(lambda: validate.timeout_seconds(bad), TypeError, "timeout")


def test_store():
    s = dist.HashStore()
    assert validate.store(s) is s
    d = DictStore()
    assert validate.store(d) is d

    class NoCheck:
        def set(self, k, v): ...

        def get(self, k): ...

        def wait(self, keys, timeout=None): ...

        check = "not callable"

    msg = _expect(lambda: validate.store(NoCheck()), TypeError, "store")
    assert "check" in msg


# -- records from the store -----------------------------------------------------

def _load_fuzz_module():
    path = pathlib.Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_store_records.py"
    spec = importlib.util.spec_from_file_location("fuzz_store_records", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


FUZZ = _load_fuzz_module()
SCHEMA = FUZZ.SCHEMA
VALID = FUZZ.VALID


def _raw(**changes):
    rec = dict(VALID)
    for k, v in changes.items():
        if v is _DROP:
            rec.pop(k)
        else:
            rec[k] = v
    return FUZZ.json.dumps(rec).encode()


_DROP = object()


def test_valid_records_pass():
    expected = {k: VALID[k] for k in SCHEMA}
    assert validate.record(_raw(), 3, SCHEMA) == expected
    assert validate.record(_raw().decode(), 3, SCHEMA) == expected  # a store that returns str
    assert validate.record(bytearray(_raw()), 3, SCHEMA) == expected
    assert validate.record(memoryview(_raw()), 3, SCHEMA) == expected
    out = validate.record(_raw(ranks=_DROP, extra={"any": [1, 2]}), 3, SCHEMA)
    assert "ranks" not in out and "extra" not in out and "transport" not in out
    assert validate.record(_raw(ranks=None), 3, SCHEMA)["ranks"] is None
    assert validate.record(_raw(ranks=[]), 3, SCHEMA)["ranks"] == []
    assert validate.record(_raw(secret="AB" * 32), 3, SCHEMA)["secret"] == "AB" * 32
    assert validate.record(_raw(host="h" * 255, pid=1 << 22), 3, SCHEMA)["pid"] == 1 << 22


def _deep(n):
    return b"[" * n + b"]" * n


RECORD_BAD = [
    ("not UTF-8", b"\xff\xfe{}", "not UTF-8"),
    ("CESU surrogate bytes", b'{"host": "\xed\xa0\x80"}', "not UTF-8"),
    ("empty", b"", "not JSON"),
    ("text", b"hello", "not JSON"),
    ("truncated", _raw()[:-1], "not JSON"),
    ("trailing data", _raw() + b"x", "not JSON"),
    ("NaN", b'{"pid": NaN}', "not JSON"),
    ("Infinity", b'{"pid": -Infinity}', "not JSON"),
    ("deep nesting", _deep(100000), "not JSON"),
    ("5000-digit integer", b'{"pid": ' + b"1" * 5000 + b"}", "not JSON"),
    ("list", b"[1, 2]", "expected a JSON object"),
    ("string", b'"record"', "expected a JSON object"),
    ("null", b"null", "expected a JSON object"),
    ("number", b"3", "expected a JSON object"),
    ("duplicate key", b'{"pid": 1, "pid": 2}', "'pid' appears twice"),
    ("too big", _raw(host="h" * (2 << 20)), "more than"),
    ("missing pid", _raw(pid=_DROP), "key 'pid'"),
    ("missing secret", _raw(secret=_DROP), "key 'secret'"),
    ("pid as string", _raw(pid="42"), "key 'pid'"),
    ("pid true", _raw(pid=True), "key 'pid'"),
    ("pid 4.0", _raw(pid=4.0), "key 'pid'"),
    ("pid 0", _raw(pid=0), "key 'pid'"),
    ("pid too big", _raw(pid=(1 << 22) + 1), "key 'pid'"),
    ("pid 1e999", _raw().replace(b'"pid": 4242', b'"pid": 1e999'), "key 'pid'"),
    ("host too long", _raw(host="h" * 256), "key 'host'"),
    ("host huge", _raw(host="h" * 500000), "key 'host'"),
    ("host empty", _raw(host=""), "key 'host'"),
    ("host control", _raw(host="a\nb"), "key 'host'"),
    ("host NUL", _raw(host="a\x00b"), "key 'host'"),
    ("host lone surrogate", _raw(host="\ud800"), "key 'host'"),
    ("host list", _raw(host=["h"]), "key 'host'"),
    ("segment pattern", _raw(segment="/ringcomm-XYZ"), "key 'segment'"),
    ("segment trailing newline", _raw(segment=VALID["segment"] + "\n"), "key 'segment'"),
    ("segment prefix only", _raw(segment=VALID["segment"] + "0"), "key 'segment'"),
    ("tcp one item", _raw(tcp=["127.0.0.1"]), "key 'tcp'"),
    ("tcp three items", _raw(tcp=["127.0.0.1", 1, 2]), "key 'tcp'"),
    ("tcp port string", _raw(tcp=["127.0.0.1", "80"]), "key 'tcp'[1]"),
    ("tcp port 0", _raw(tcp=["127.0.0.1", 0]), "key 'tcp'[1]"),
    ("tcp port 65536", _raw(tcp=["127.0.0.1", 65536]), "key 'tcp'[1]"),
    ("tcp address int", _raw(tcp=[1, 80]), "key 'tcp'[0]"),
    ("tcp address with space", _raw(tcp=["1.2.3.4 x", 80]), "key 'tcp'[0]"),
    ("tcp object", _raw(tcp={"addr": "h", "port": 1}), "key 'tcp'"),
    ("secret short", _raw(secret="ab" * 31), "key 'secret'"),
    ("secret long", _raw(secret="ab" * 33), "key 'secret'"),
    ("secret not hex", _raw(secret="zz" * 32), "key 'secret'"),
    ("secret int", _raw(secret=123), "key 'secret'"),
    ("secret null", _raw(secret=None), "key 'secret'"),
    ("ranks negative", _raw(ranks=[0, -1]), "key 'ranks'[1]"),
    ("ranks string", _raw(ranks="0,1"), "key 'ranks'"),
    ("ranks nested", _raw(ranks=[[0]]), "key 'ranks'[0]"),
    ("ranks bool", _raw(ranks=[True]), "key 'ranks'[0]"),
    ("ranks too many", _raw(ranks=[0] * 65537), "key 'ranks'"),
]


@pytest.mark.parametrize("raw, fragment", [r[1:] for r in RECORD_BAD], ids=[r[0] for r in RECORD_BAD])
def test_malformed_records_raise_ringcomm_error_only(raw, fragment):
    msg = _expect(lambda: validate.record(raw, 3, SCHEMA), RingcommError, fragment)
    assert msg.startswith(RECORD_PREFIX), msg
    assert len(msg) < 400, f"the message should stay short: {len(msg)} characters"


@pytest.mark.parametrize("raw", [None, 5, 1.5, ["a"], {"host": "h"}], ids=repr)
def test_record_of_a_non_bytes_value(raw):
    _expect(lambda: validate.record(raw, 3, SCHEMA), RingcommError, "expected bytes or str")


def test_record_message_format():
    msg = _expect(lambda: validate.record(_raw(segment="nope"), 3, SCHEMA), RingcommError, "segment")
    assert msg.startswith(f"{RECORD_PREFIX}: key 'segment': expected a string of 1 to 64 characters")
    assert msg.endswith("got 'nope'")


def test_field_validators():
    def check(schema, value):
        return validate.record(FUZZ.json.dumps({"k": value}), 0, {"k": schema})["k"]

    def bad(schema, value):
        _expect(lambda: check(schema, value), RingcommError, "key 'k'")

    assert check(validate.boolean(), False) is False
    bad(validate.boolean(), 0)
    bad(validate.boolean(), "true")
    assert check(validate.one_of("shm", "tcp"), "tcp") == "tcp"
    assert check(validate.one_of(1, 2), 2) == 2
    bad(validate.one_of(1, 2), True)  # True == 1 in Python, not in a record
    bad(validate.one_of(1, 2), 1.0)
    bad(validate.one_of("shm", "tcp"), "SHM")
    assert check(validate.text(3, allow_empty=True), "") == ""
    bad(validate.text(3), "")
    bad(validate.text(3, pattern=r"[a-z]+"), "ab1")
    assert check(validate.pair(validate.boolean(), validate.optional(validate.integer(0, 1))), [True, None]) == [
        True, None]
    bad(validate.optional(validate.integer(0, 1)), 2)
    bad(validate.list_of(validate.integer(0, 9), 2), [1, 2, 3])
    assert check(validate.list_of(validate.pair(validate.text(4), validate.integer(0, 9)), 4), [["a", 1]]) == [
        ["a", 1]]
    msg = _expect(lambda: check(validate.list_of(validate.pair(validate.text(4), validate.integer(0, 9)), 4),
                                [["a", 1], ["b", 10]]), RingcommError, "key 'k'[1][1]")
    assert "expected an integer between 0 and 9, got 10" in msg
    with pytest.raises(TypeError):
        validate.record(b"{}", 0, {"k": int})  # a schema bug is the caller's, not the data's


def test_record_bounded_random_inputs():
    """The fuzz target (fuzz/fuzz_store_records.py) on a few thousand random
    byte strings and mutations of valid records, without atheris: anything
    but RingcommError fails the test, and most mutations must reach the
    field checks (not stop at the JSON parser)."""
    rng = random.Random(11)
    start = time.monotonic()
    data = [bytes([m]) + s for s in FUZZ.SEEDS for m in range(4)]
    counts = {"valid": 0, "field": 0, "total": 0}
    for i in range(4000):
        if time.monotonic() - start > 4.0 and i >= 500:
            break  # a loaded machine: what ran is still a fair sample
        if i % 4 == 0:
            raw = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        else:
            raw = FUZZ.mutate(rng.choice(data), 4096, rng.randrange(1 << 30))
            if rng.random() < 0.2:
                data.append(raw)
        try:
            FUZZ.target(raw)
            out = validate.record(raw[1:], 3, SCHEMA)
            counts["valid"] += 1
            assert set(out) <= set(SCHEMA)
        except RingcommError as e:
            counts["field"] += "key '" in str(e)
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{type(e).__name__} for input {raw[:200]!r}: {e}")
        counts["total"] += 1
    assert counts["total"] >= 500
    assert counts["valid"] > counts["total"] // 50, counts
    assert counts["field"] > counts["total"] // 10, counts


def test_gpu_path_checks_roots_and_its_settings_without_a_gpu(monkeypatch):
    """The GPU path's own argument checks (reached only with CUDA buffers) run on CPUs."""
    from ringcomm.cuda import GpuPath

    comm = ringcomm.init(rank=0, world_size=1, store=torch.distributed.HashStore())
    try:
        g = GpuPath(comm)
        for bad in (1.5, "0", True, None):
            with pytest.raises(TypeError, match="src"):
                validate.rank_arg(bad, "src")
        # the range is the native call check's, the one every communicator runs
        x = type("Buf", (), {"ptr": 1 << 20, "count": 4, "dtype": 2})()
        with pytest.raises(ValueError, match="dst 1 is out of range for a communicator of world size 1"):
            g._check("reduce", x, root=1)
        with pytest.raises(ValueError, match="src 0 is this rank"):
            g._check("recv", x, root=0)
        with pytest.raises(TypeError, match="algo must be a str"):
            g._algo(3)
        with pytest.raises(ValueError, match="not one of auto, nccl, ring"):
            g._algo("tree")
        monkeypatch.setenv("RINGCOMM_GPU_ALGO", "tree")
        with pytest.raises(ValueError, match="RINGCOMM_GPU_ALGO='tree'"):
            GpuPath(comm)
        monkeypatch.delenv("RINGCOMM_GPU_ALGO")
        for raw in ("12x", "-64", "100", str(1 << 31)):
            monkeypatch.setenv("RINGCOMM_GPU_CHUNK_BYTES", raw)
            with pytest.raises(ValueError, match="RINGCOMM_GPU_CHUNK_BYTES"):
                GpuPath(comm)
    finally:
        comm.close()


def test_process_group_built_directly_checks_its_arguments():
    from ringcomm.torch_backend.process_group import ProcessGroupRingcomm

    store = torch.distributed.HashStore()
    for rank, size, exc, word in ((0.7, 1, TypeError, "rank"), ("0", 1, TypeError, "rank"),
                                  (0, 1.0, TypeError, "size"), (0, 0, ValueError, "size"),
                                  (1, 1, ValueError, "rank"), (-1, 2, ValueError, "rank")):
        with pytest.raises(exc, match=word):
            ProcessGroupRingcomm(store, rank, size)
    with pytest.raises(TypeError, match="store"):
        ProcessGroupRingcomm("hello", 0, 1)
    pg = ProcessGroupRingcomm(store, 0, 1)
    pg.shutdown()
