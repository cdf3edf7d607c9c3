"""Soak: thousands of random collectives on 3 ranks, on every transport, checked
against numpy, with open fds, shared segments and RSS measured flat.

Every rank draws the same sequence of calls from one shared seed (primitive, dtype,
reduce op, size, root, in-place, call style, async or not); each rank's data is
derived from (seed, op index, rank) by checks.gen's counter-based hash, so every rank
computes the reference of every call without communicating. Integers (and
integer-valued floats) must match exactly; sums and averages of non-integer floats,
and float averages over 3 ranks, within a tolerance. Asynchronous calls stay in
flight (up to 6 at once) and are waited in a random, rank-local order. Now and then
the ranks split off a communicator of 2 or 3 of them, use it once and close it.

Resources are read inside each rank: entries of /proc/self/fd, the ringcomm segments
mapped into the process (/proc/self/maps; the names are unlinked from /dev/shm once
every rank mapped them) and RSS after gc.collect() and malloc_trim(0). The baseline
is taken after a warm-up that makes the largest call of every primitive once, the
final figures after the last call; fds and mapped segments must be equal, RSS within
RSS_TOLERANCE_KIB. No ringcomm-* name of a segment the job's ranks mapped may be
left in /dev/shm afterwards (names of other jobs on the machine do not count).

    RINGCOMM_SOAK_OPS=<n>   random calls per transport (default DEFAULT_OPS)
    RINGCOMM_SOAK_SEED=<s>  the shared seed (default DEFAULT_SEED); a failure message
                            names the seed and op index that reproduce it

Run with `-s` to see the per-transport figures.
"""

import ctypes
import gc
import importlib.util
import os
import re
import time
import traceback

import numpy as np
import pytest

import checks
import harness
from checks import first_line

WORLD = 3
DEFAULT_OPS = 4000  # per transport; the CI-sized run
DEFAULT_SEED = 20240611
OPS = int(os.environ.get("RINGCOMM_SOAK_OPS", DEFAULT_OPS))
SEED = int(os.environ.get("RINGCOMM_SOAK_SEED", DEFAULT_SEED))
MAX_BYTES = 4 << 20  # the largest message (the whole buffer of one call)
MAX_INFLIGHT = 6
WARMUP_OPS = 150
# RSS may grow by this much from the end of the warm-up to the end of the run, both
# read after gc.collect() and malloc_trim(0), so freed buffers do not count. Measured
# on this machine: +1.2 to +1.7 MiB for 4000 calls, +2.0 for 12000, +2.4 for 20000,
# growing ever slower; and the same growth (malloc's bytes in use, mallinfo2) when
# the ringcomm calls are left out of the loop, so it is the test's own numpy work
# (varying sizes), not ringcomm. 8 MiB is several times that, and what a leak of
# 2 KiB per call (a small buffer, a Work with its references) would add over the 4000
# calls after the warm-up of the CI-sized run, as would the buffers of two of the
# largest calls (4 MiB each).
RSS_TOLERANCE_KIB = 8 * 1024

TRANSPORTS = {
    # "auto" is the default; said explicitly so that RINGCOMM_TEST_TRANSPORT=tcp in
    # pytest's environment does not turn this run into a second TCP run.
    "shm": {"RINGCOMM_TRANSPORT": "auto"},
    "tcp": {"RINGCOMM_TRANSPORT": "tcp"},
    "pull": {"RINGCOMM_TRANSPORT": "auto", "RINGCOMM_ALGO": "pull"},
}

KINDS = {  # primitive: weight
    "all_reduce": 18, "reduce_scatter": 9, "all_gather": 9, "broadcast": 9, "reduce": 8,
    "scatter": 7, "gather": 7, "all_to_all": 8, "send_recv": 10, "barrier": 5, "split": 0.5,
}


# ------------------------------------------------------------------ resources


def _malloc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_SEEN = set()  # in a rank: every ringcomm segment name it has had mapped


def _mapped_segments():
    """Names of the ringcomm segments mapped into this process (also once unlinked)."""
    with open("/proc/self/maps") as f:
        names = set(re.findall(r"/(ringcomm-[0-9a-f-]+)", f.read()))
    _SEEN.update(names)
    return names


def _resources():
    gc.collect()
    _malloc_trim()
    fds = len(os.listdir("/proc/self/fd"))
    mapped = _mapped_segments()
    try:
        shm = sorted(n for n in os.listdir("/dev/shm") if n.startswith("ringcomm-"))
    except FileNotFoundError:
        shm = []
    rss_kib = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return {"fds": fds, "mapped_segments": len(mapped), "shm_names": shm, "rss_kib": rss_kib}


# ------------------------------------------------------------------ the calls


def _real(seed, rank, start, stop):
    """Non-integer floats in [-1, 1) (float64), from the same hash as checks.gen."""
    h = checks._hash(seed, rank, start, stop)
    return (h >> np.uint64(11)).astype(np.float64) * (2.0 ** -52) - 1.0


def _values(dtype, op, seed, rank, start, stop, real):
    if real:
        return _real(seed, rank, start, stop).astype(checks.ref_np_dtype(dtype))
    return checks.gen(dtype, op, seed, rank, start, stop)


def _reference(op, stack, dtype, real):
    if not real:
        return checks.reference(op, stack, dtype, WORLD)
    exact = np.add.reduce(stack.astype(np.float64), axis=0)
    return exact / WORLD if op == "avg" else exact


def _tolerance(dtype, op, real):
    if real:  # 3 terms summed in some order, each step rounded once
        return {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}[dtype]
    return checks.tolerance(dtype, op, WORLD)


def _count(rng, itemsize):
    """Elements of a whole call: 0, 1, odd and small sizes mostly, up to MAX_BYTES."""
    c = rng.random()
    if c < 0.06:
        return 0
    if c < 0.12:
        return 1
    if c < 0.45:
        return int(rng.integers(2, 65))
    if c < 0.80:
        n = int(np.exp(rng.uniform(np.log(65), np.log(8192))))
    elif c < 0.96:
        n = int(np.exp(rng.uniform(np.log(8192), np.log(256 << 10)))) // itemsize
    else:
        n = int(np.exp(rng.uniform(np.log(256 << 10), np.log(MAX_BYTES)))) // itemsize
    if rng.random() < 0.5:
        n |= 1
    return max(n, 2)


def _draw(rng, dtypes, kind=None, big=False):
    """One call's description; every rank draws the same (the rng is shared)."""
    kinds = list(KINDS)
    if kind is None:
        w = np.array([KINDS[k] for k in kinds], float)
        kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
    dtype = dtypes[int(rng.integers(len(dtypes)))]
    itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    n = MAX_BYTES // itemsize if big else _count(rng, itemsize)
    ops = checks.ops_for(dtype)
    op = ops[int(rng.integers(len(ops)))]
    d = {
        "kind": kind, "dtype": dtype,
        "op": op if kind in ("all_reduce", "reduce_scatter", "reduce") else None,
        "n": n, "k": n // WORLD,
        "root": int(rng.integers(WORLD)),
        "async": bool(rng.random() < 0.35),
        "container": "torch" if dtype == "bfloat16" or rng.random() < 0.35 else "numpy",
        "inplace": bool(rng.random() < 0.3),
        "style": "module" if rng.random() < 0.3 else "method",
        "shape2d": bool(rng.random() < 0.3),
    }
    # non-integer floats (compared with a tolerance) for half of the float32/float64
    # sums and averages
    real = bool(rng.random() < 0.5)
    d["real"] = real and d["op"] in ("sum", "avg") and dtype in ("float32", "float64")
    if kind == "send_recv":
        d["p2p"] = ("pair", "pair", "ring", "sendrecv")[int(rng.integers(4))]
        src, off = int(rng.integers(WORLD)), int(rng.integers(1, WORLD))
        d["src"], d["dst"] = src, (src + off) % WORLD
        d["step"] = 1 if rng.random() < 0.5 else -1
    if kind == "split":
        members = [int(x) for x in rng.permutation(WORLD)[: int(rng.integers(2, WORLD + 1))]]
        d["members"] = members
    return d


def _describe(i, d):
    keys = ("kind", "p2p", "dtype", "op", "n", "root", "src", "dst", "step", "members",
            "async", "container", "inplace", "style", "shape2d", "real")
    return f"op #{i} " + " ".join(f"{k}={d[k]}" for k in keys if k in d and d[k] is not None)


def _issue(comm, d, seed, pending, fail, where):
    """Makes the call `d` on this rank. A blocking call is checked at once; an
    asynchronous one is appended to `pending` as (work, check)."""
    import ringcomm

    r, ws = comm.rank, comm.world_size
    kind, dtype, op, cont = d["kind"], d["dtype"], d["op"], d["container"]
    n, k, root, real = d["n"], d["k"], d["root"], d["real"]
    reduce_op = getattr(ringcomm.ReduceOp, op.upper()) if op and d["style"] == "method" else op
    tol = _tolerance(dtype, op, real) if op else None

    def vals(q, start, stop):
        return _values(dtype, op, seed, q, start, stop, real)

    def buf(values, shape=None):
        return checks.make_buf(values, dtype, cont, shape)

    def blocks(k_):  # a (ws, k) shape for a buffer of ws blocks, sometimes
        return (ws, k_) if d["shape2d"] else (ws * k_,)

    def call(name, *args, **kw):
        if d["style"] == "module":
            return getattr(ringcomm, name)(*args, comm=comm, async_op=d["async"], **kw)
        return getattr(comm, name)(*args, async_op=d["async"], **kw)

    checks_ = []
    if kind == "all_reduce":
        stack = np.stack([vals(q, 0, n) for q in range(ws)])
        shape = (n // 7, 7) if d["shape2d"] and n % 7 == 0 and n else None
        x = buf(stack[r], shape)
        w = call("all_reduce", x, op=reduce_op)
        checks_.append(lambda: checks.compare(x, _reference(op, stack, dtype, real), tol))
    elif kind == "reduce":
        stack = np.stack([vals(q, 0, n) for q in range(ws)])
        x = buf(stack[r])
        w = call("reduce", x, dst=root, op=reduce_op)
        if r == root:
            checks_.append(lambda: checks.compare(x, _reference(op, stack, dtype, real), tol))
        else:
            checks_.append(lambda: (lambda e: e and f"non-dst rank's x was modified: {e}")(
                checks.compare(x, stack[r])))
    elif kind == "reduce_scatter":
        inp = buf(vals(r, 0, ws * k), blocks(k))
        part = np.stack([vals(q, r * k, (r + 1) * k) for q in range(ws)])
        out = checks.flat_view(inp)[r * k:(r + 1) * k] if d["inplace"] else \
            checks.empty_buf(k, dtype, cont, fill=1)
        w = call("reduce_scatter", out, inp, op=reduce_op)
        checks_.append(lambda: checks.compare(out, _reference(op, part, dtype, real), tol))
    elif kind == "all_gather":
        expected = np.concatenate([vals(q, 0, k) for q in range(ws)])
        out = checks.empty_buf(ws * k, dtype, cont, blocks(k), fill=1)
        if d["inplace"]:
            inp = checks.flat_view(out)[r * k:(r + 1) * k]
            inp[...] = buf(expected[r * k:(r + 1) * k])
        else:
            inp = buf(vals(r, 0, k))
        w = call("all_gather", out, inp)
        checks_.append(lambda: checks.compare(out, expected))
    elif kind == "broadcast":
        x = buf(vals(r, 0, n))
        w = call("broadcast", x, src=root)
        checks_.append(lambda: checks.compare(x, vals(root, 0, n)))
    elif kind == "scatter":
        inp = buf(vals(root, 0, ws * k), blocks(k)) if r == root else None
        out = checks.empty_buf(k, dtype, cont, fill=1)
        w = call("scatter", out, inp, src=root)
        checks_.append(lambda: checks.compare(out, vals(root, r * k, (r + 1) * k)))
    elif kind == "gather":
        inp = buf(vals(r, 0, k))
        out = checks.empty_buf(ws * k, dtype, cont, blocks(k), fill=1) if r == root else None
        w = call("gather", out, inp, dst=root)
        if r == root:
            checks_.append(lambda: checks.compare(
                out, np.concatenate([vals(q, 0, k) for q in range(ws)])))
    elif kind == "all_to_all":
        inp = buf(vals(r, 0, ws * k), blocks(k))
        out = checks.empty_buf(ws * k, dtype, cont, (ws * k,), fill=1)
        w = call("all_to_all", out, inp)
        expected = np.concatenate([vals(q, r * k, (r + 1) * k) for q in range(ws)])
        checks_.append(lambda: checks.compare(out, expected))
    elif kind == "barrier":
        w = comm.barrier(async_op=d["async"])
    elif kind == "send_recv":
        w = None
        if d["p2p"] == "pair":
            src, dst = d["src"], d["dst"]
            if r == src:
                w = call("send", buf(vals(r, 0, n)), dst)
            elif r == dst:
                got = checks.empty_buf(n, dtype, cont, fill=1)
                w = call("recv", got, src)
                if isinstance(w, int) and not isinstance(w, bool):  # a blocking recv returns the source
                    if w != src:
                        fail(f"{where}: recv returned source {w}, expected {src}")
                    w = None
                checks_.append(lambda: checks.compare(got, vals(src, 0, n)))
        else:
            nxt, prv = (r + d["step"]) % ws, (r - d["step"]) % ws
            got = checks.empty_buf(n, dtype, cont, fill=1)
            if d["p2p"] == "ring":  # isend/irecv around the ring, both in flight
                sw = comm.isend(buf(vals(r, 0, n)), nxt)
                pending.append((sw, [], where + " (isend)"))
                w = comm.irecv(got, prv)
            else:
                comm.sendrecv(buf(vals(r, 0, n)), nxt, got, prv)
                w = None
            checks_.append(lambda: checks.compare(got, vals(prv, 0, n)))
    elif kind == "split":
        sub = comm.split(d["members"])
        w = None
        if sub is not None:  # one all_reduce on the new communicator, then close it
            try:
                _mapped_segments()  # its segments count as this job's
                x = np.full(1 + n % 1000, r + 1, np.int64)
                sub.all_reduce(x)
                want = sum(m + 1 for m in d["members"])
                checks_.append(lambda: None if (x == want).all() else
                               f"split all_reduce gave {x[:4]}..., expected {want}")
            finally:
                sub.close()
    else:
        raise AssertionError(f"unknown kind {kind}")
    if w is not None and not isinstance(w, ringcomm.Work):
        fail(f"{where}: async_op=True returned {type(w).__name__}, not Work")
        w = None
    if w is None:
        _run_checks(checks_, fail, where)
    else:
        pending.append((w, checks_, where))


def _run_checks(checks_, fail, where):
    for check in checks_:
        err = check()
        if err:
            fail(f"{where}: {err}")


def _wait(entry, fail):
    work, checks_, where = entry
    work.wait()
    if not work.is_completed():
        fail(f"{where}: Work.is_completed() is False after wait()")
    if work.exception() is not None:
        fail(f"{where}: Work.exception() is {work.exception()!r} after a successful wait()")
    _run_checks(checks_, fail, where)


def _soak(comm, n_ops, seed, label):
    """In a rank: the warm-up, then n_ops random calls; returns figures and failures."""
    import ringcomm

    if importlib.util.find_spec("torch") is not None:  # bfloat16 lives in torch tensors
        dtypes = checks.DTYPES
    else:
        dtypes = tuple(d for d in checks.DTYPES if d != "bfloat16")
    r = comm.rank
    shared = np.random.default_rng([seed, 0])  # the same on every rank
    local = np.random.default_rng([seed, 1, r])  # this rank's wait order
    fails = []
    counts = {}
    out = {"fails": fails, "counts": counts, "pull_enabled": comm.pull_enabled,
           "transports": comm.transports, "ops": 0, "label": label}
    out["res_start"] = _resources()
    pending = []
    t0 = time.monotonic()

    def drain(fraction=1.0):
        """Wait for all (or some) calls in flight, in a random order."""
        order = [int(j) for j in local.permutation(len(pending))]
        take = order if fraction >= 1.0 else order[: max(1, int(len(order) * fraction))]
        for j in take:
            current[0] = pending[j][2] + " (wait)"
            _wait(pending[j], fails.append)
        for j in sorted(take, reverse=True):
            pending.pop(j)

    current = [None]  # the call being issued or waited for

    def run(i, d):
        where = f"[{label} seed={seed}] {_describe(i, d)}"
        current[0] = where
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
        _issue(comm, d, checks.seed_of(seed, i), pending, fails.append, where)
        out["ops"] += 1
        if len(pending) >= int(local.integers(1, MAX_INFLIGHT + 1)):
            drain(1.0 if local.random() < 0.5 else 0.5)

    i = 0
    try:
        # Warm-up: the largest call of each primitive once, then random calls.
        for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                     "scatter", "gather", "all_to_all", "send_recv", "split"):
            run(i, _draw(shared, dtypes, kind, big=True))
            i += 1
        while i < WARMUP_OPS:
            run(i, _draw(shared, dtypes))
            i += 1
        drain()
        comm.barrier()
        out["res_warm"] = _resources()
        out["t_warm"] = time.monotonic() - t0
        out["rss_trend_kib"] = []  # RSS at each tenth of the run, after the warm-up
        marks = {WARMUP_OPS + n_ops * j // 10 for j in range(1, 10)}
        while i < WARMUP_OPS + n_ops:
            run(i, _draw(shared, dtypes))
            i += 1
            if i in marks:
                out["rss_trend_kib"].append(_resources()["rss_kib"])
        drain()
        comm.barrier()
    except ringcomm.RingcommError as e:
        fails.append(f"{current[0]}: raised {type(e).__name__}: {first_line(e)}; "
                     "stopped (the communicator is unusable now)")
    except Exception as e:  # noqa: BLE001  (a test bug or a bad argument check)
        fails.append(f"{current[0]}: raised {type(e).__name__}: {first_line(e)}\n"
                     + traceback.format_exc())
    else:
        out["elapsed"] = time.monotonic() - t0
        out["res_end"] = _resources()
    out["seen_segments"] = sorted(_SEEN)
    return out


def _left_in_dev_shm(before, ours, wait_s=2.0):
    """ringcomm-* names of this job's segments (`ours`: mapped by its ranks) that are
    in /dev/shm now, not before, and still after wait_s. Other jobs on this machine
    may leave theirs at any time: those do not count."""
    new = (set(_resources()["shm_names"]) - set(before)) & set(ours)
    deadline = time.monotonic() + wait_s
    while new and time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            new &= set(os.listdir("/dev/shm"))
        except FileNotFoundError:
            new = set()
    return sorted(new)


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_soak(transport):
    shm_before = _resources()["shm_names"]
    t0 = time.monotonic()
    hard_timeout = 60 + OPS * 0.02  # a CI-sized group takes about 12 s here
    results = harness.run_ranks(_soak, WORLD, (OPS, SEED, transport), env=TRANSPORTS[transport],
                                comm_timeout=30.0, hard_timeout=hard_timeout)
    wall = time.monotonic() - t0
    fails = [list(out["fails"]) for out in results]
    expect_tcp = transport == "tcp"
    for r, out in enumerate(results):
        want = ["self" if q == r else ("tcp" if expect_tcp else "shm") for q in range(WORLD)]
        if out["transports"] != want:
            fails[r].append(f"transports are {out['transports']}, expected {want}")
    print(f"\n[{transport}] seed={SEED}: {results[0]['ops']} calls per rank "
          f"({WARMUP_OPS} warm-up + {OPS}) in {wall:.1f}s wall (spawn included); "
          f"rank loop {results[0].get('elapsed', float('nan')):.1f}s; "
          f"pull_enabled={results[0]['pull_enabled']}")
    print(f"[{transport}] calls by kind (rank 0): {results[0]['counts']}")
    print(f"[{transport}] mismatches and errors: {sum(len(f) for f in fails)}")
    for r, out in enumerate(results):
        if "res_end" not in out:
            print(f"[{transport}] rank {r}: no final figures (the run stopped early)")
            continue
        s, w, e = out["res_start"], out["res_warm"], out["res_end"]
        print(f"[{transport}] rank {r}: fds {s['fds']} -> {w['fds']} (warm) -> {e['fds']}; "
              f"mapped segments {s['mapped_segments']} -> {w['mapped_segments']} -> "
              f"{e['mapped_segments']}; /dev/shm ringcomm-* (any job's) {len(s['shm_names'])} -> "
              f"{len(w['shm_names'])} -> {len(e['shm_names'])}; RSS {s['rss_kib'] / 1024:.1f} -> "
              f"{w['rss_kib'] / 1024:.1f} -> {e['rss_kib'] / 1024:.1f} MiB "
              f"(+{(e['rss_kib'] - w['rss_kib']) / 1024:.2f} MiB after the warm-up; at each tenth, calls in flight: "
              + " ".join(f"{(t - w['rss_kib']) / 1024:+.2f}" for t in out["rss_trend_kib"]) + ")")
        if e["fds"] != w["fds"]:
            fails[r].append(f"open fds {w['fds']} after the warm-up, {e['fds']} at the end")
        if e["mapped_segments"] != w["mapped_segments"]:
            fails[r].append(f"mapped ringcomm segments {w['mapped_segments']} after the warm-up, "
                            f"{e['mapped_segments']} at the end")
        if e["rss_kib"] - w["rss_kib"] > RSS_TOLERANCE_KIB:
            fails[r].append(f"RSS grew by {(e['rss_kib'] - w['rss_kib']) / 1024:.1f} MiB after the "
                            f"warm-up (tolerance {RSS_TOLERANCE_KIB / 1024:.0f} MiB)")
        if out["ops"] != WARMUP_OPS + OPS:
            fails[r].append(f"ran {out['ops']} of {WARMUP_OPS + OPS} calls")
    ours = set().union(*(out.get("seen_segments", ()) for out in results))
    leaked = _left_in_dev_shm(shm_before, ours)
    print(f"[{transport}] this job's segments (mapped by its ranks): {len(ours)}; left in "
          f"/dev/shm after the job: {leaked or 'none'}")
    if leaked:
        fails[0].append(f"the job left these in /dev/shm: {leaked}")
    harness.assert_no_failures(fails)
    if transport == "pull" and not all(out["pull_enabled"] for out in results):
        pytest.skip("single-copy pulls are off on this machine (comm.pull_enabled is False): "
                    f"the pull run used the FIFOs ({results[0]['ops']} calls, no mismatch)")
