"""Rank-side building blocks: inputs, numpy references, comparisons, and the collective
matrix that every world size runs.

Every rank derives every rank's input from (case seed, rank, element index) with a
counter-based hash, so each rank can compute the reference of a case without
communicating, and can compute just the slice it needs. Values are chosen so that
every result is exact in every dtype (small integers for floating types, the full
range for integer types, whose SUM/PROD wrap like numpy), except floating-point AVG on
world sizes that are not powers of two, which is compared with a tolerance.

Functions here run inside rank processes and return failure strings instead of
raising, so one spawned group checks hundreds of cases.
"""

from __future__ import annotations

import time
import zlib
from typing import Callable, List, Optional, Sequence

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
ALL_OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
BIG = 100003  # a prime above 100000
COUNTS = (0, 1, 7, 1000, BIG)

REDUCING = ("all_reduce", "reduce_scatter", "reduce")
PRIMITIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
              "scatter", "gather", "all_to_all")


def ops_for(dtype: str) -> Sequence[str]:
    if dtype == "bool":
        return ("min", "max", "band", "bor")
    if dtype in FLOAT_DTYPES:
        return ("sum", "prod", "min", "max", "avg")
    return ALL_OPS


def unsupported_ops(dtype: str) -> Sequence[str]:
    return tuple(op for op in ALL_OPS if op not in ops_for(dtype))


def ref_np_dtype(dtype: str):
    """numpy dtype holding reference values (bfloat16 values live in float32)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


def containers_for(dtype: str) -> Sequence[str]:
    return ("torch",) if dtype == "bfloat16" else ("numpy", "torch")


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


# --------------------------------------------------------------------------- inputs

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _hash(seed: int, rank: int, start: int, stop: int) -> np.ndarray:
    """splitmix64 of (seed, rank, index) for indices [start, stop); uint64."""
    with np.errstate(over="ignore"):
        x = np.arange(start, stop, dtype=np.uint64)
        x = x * np.uint64(0x9E3779B97F4A7C15) + np.uint64(
            (seed * 0xBF58476D1CE4E5B9 + (rank + 1) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _small_ints(h: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return (h % np.uint64(hi - lo + 1)).astype(np.int64) + lo


def gen(dtype: str, op: Optional[str], seed: int, rank: int, start: int, stop: int) -> np.ndarray:
    """Input values of `rank` for elements [start, stop), in ref_np_dtype(dtype)."""
    h = _hash(seed, rank, start, stop)
    if dtype == "bool":
        return (h & np.uint64(1)).astype(bool)
    if dtype in INT_DTYPES:
        bits = np.dtype(dtype).itemsize * 8
        u = h if bits == 64 else h & np.uint64((1 << bits) - 1)
        return u.astype(np.dtype(f"uint{bits}")).view(np.dtype(dtype))
    # Floating point: small integers keep every partial result exact in every dtype.
    if op == "prod":
        v = _small_ints(h, -2, 2)
    elif op in ("min", "max", None):
        v = _small_ints(h, -200, 200)
    else:  # sum, avg
        v = _small_ints(h, -8, 8)
    return v.astype(ref_np_dtype(dtype))


def reference(op: str, stack: np.ndarray, dtype: str, world_size: int) -> np.ndarray:
    """Reduce the inputs of all ranks (axis 0) the way ringcomm must."""
    dt = ref_np_dtype(dtype)
    if op in ("sum", "avg"):
        s = np.add.reduce(stack, axis=0, dtype=dt)  # integers wrap like numpy
        if op == "sum":
            return s
        if dtype in INT_DTYPES:  # C division: truncate toward zero, after the wrapping sum
            s64 = s.astype(np.int64)
            q = np.abs(s64) // world_size * np.sign(s64)
            return q.astype(dt)
        exact = np.add.reduce(stack.astype(np.float64), axis=0) / world_size
        return exact.astype(dt)
    fn = {"prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    return fn.reduce(stack, axis=0, dtype=dt if op == "prod" else None).astype(dt)


def tolerance(dtype: str, op: Optional[str], world_size: int):
    """(rtol, atol) or None for an exact comparison."""
    if op == "avg" and dtype in FLOAT_DTYPES and world_size & (world_size - 1):
        return {"float16": (4e-3, 4e-3), "bfloat16": (2e-2, 2e-2),
                "float32": (1e-6, 1e-6), "float64": (1e-12, 1e-12)}[dtype]
    return None


# ----------------------------------------------------------------------- containers

def shape_for(n: int, variant: int):
    """A shape with n elements; multi-dimensional for some n and variants."""
    if n == 0 and variant % 3 == 1:
        return (3, 0)
    if n == 1000:
        return [(1000,), (10, 100), (5, 20, 10)][variant % 3]
    if n and n % 7 == 0 and variant % 2:
        return (7, n // 7)
    return (n,)


def make_buf(values: np.ndarray, dtype: str, container: str, shape=None):
    """A contiguous numpy array / torch CPU tensor of `dtype` holding `values`."""
    shape = values.shape if shape is None else shape
    arr = np.ascontiguousarray(values.astype(ref_np_dtype(dtype)).reshape(shape))
    if container == "numpy":
        assert dtype != "bfloat16"
        return arr
    import torch

    t = torch.from_numpy(arr.copy())
    if dtype == "bfloat16":
        t = t.to(torch.bfloat16)
    return t.contiguous()


def empty_buf(n: int, dtype: str, container: str, shape=None, fill=0):
    """A buffer of n elements filled with `fill` (garbage-free, so stale data shows)."""
    shape = (n,) if shape is None else shape
    return make_buf(np.full(n, fill).astype(ref_np_dtype(dtype)), dtype, container, shape)


def flat_view(buf):
    """A 1-D view sharing memory with a contiguous buffer."""
    return buf.reshape(-1) if isinstance(buf, np.ndarray) else buf.view(-1)


def to_np(buf) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1).copy()
    import torch

    t = buf.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy().copy()


def compare(got, expected: np.ndarray, tol=None) -> Optional[str]:
    g = to_np(got)
    e = np.asarray(expected).reshape(-1)
    if g.shape != e.shape:
        return f"result has {g.size} elements, expected {e.size}"
    if tol is None:
        ok = g == e.astype(g.dtype)
    else:
        ok = np.isclose(g.astype(np.float64), e.astype(np.float64), rtol=tol[0], atol=tol[1])
    bad = np.flatnonzero(~ok)
    if bad.size == 0:
        return None
    i = int(bad[0])
    return (f"{bad.size}/{g.size} elements wrong; first at [{i}]: got {g[i]!r}, "
            f"expected {e[i]!r}" + (f" (tolerance {tol})" if tol else ""))


# ------------------------------------------------------------------------- calling

class Caller:
    """Calls a primitive in one of several equivalent ways, rotating per call:
    module function with comm=, Communicator method, module function on the default
    communicator, and async (module or method) followed by wait()."""

    def __init__(self, comm, allow_default: bool = True):
        self.comm = comm
        self.allow_default = allow_default
        self.i = 0

    def op(self, name: Optional[str]):
        """ReduceOp member or its string, alternating."""
        import ringcomm

        if name is None:
            return None
        return getattr(ringcomm.ReduceOp, name.upper()) if self.i % 2 == 0 else name

    def __call__(self, prim: str, *args, **kw) -> str:
        import ringcomm

        variant = self.i % 5
        self.i += 1
        if variant == 2 and not self.allow_default:
            variant = 0
        if variant == 0:
            getattr(ringcomm, prim)(*args, comm=self.comm, **kw)
            return "module"
        if variant == 1:
            getattr(self.comm, prim)(*args, **kw)
            return "method"
        if variant == 2:
            getattr(ringcomm, prim)(*args, **kw)
            return "default-comm"
        if variant == 3:
            work = getattr(ringcomm, prim)(*args, comm=self.comm, async_op=True, **kw)
        else:
            work = getattr(self.comm, prim)(*args, async_op=True, **kw)
        if not isinstance(work, ringcomm.Work):
            raise AssertionError(f"async_op=True returned {type(work).__name__}, not Work")
        work.wait(timeout=60.0) if variant == 3 else work.wait()
        if not work.is_completed():
            raise AssertionError("Work.is_completed() is False after wait() returned")
        if work.exception() is not None:
            raise AssertionError(f"Work.exception() is {work.exception()!r} after success")
        return "async-module" if variant == 3 else "async-method"


# -------------------------------------------------------------------------- cases

def _case_all_reduce(comm, call, dtype, op, n, container, variant, seed):
    ws, r = comm.world_size, comm.rank
    stack = np.stack([gen(dtype, op, seed, q, 0, n) for q in range(ws)])
    x = make_buf(stack[r], dtype, container, shape_for(n, variant))
    how = call("all_reduce", x, op=call.op(op))
    return how, compare(x, reference(op, stack, dtype, ws), tolerance(dtype, op, ws))


def _case_reduce_scatter(comm, call, dtype, op, k, container, variant, seed, inplace):
    ws, r = comm.world_size, comm.rank
    lo, hi = r * k, (r + 1) * k
    inp = make_buf(gen(dtype, op, seed, r, 0, ws * k), dtype, container,
                   (ws, k) if variant % 2 else (ws * k,))
    part = np.stack([gen(dtype, op, seed, q, lo, hi) for q in range(ws)])
    if inplace:
        out = flat_view(inp)[lo:hi]
    else:
        out = empty_buf(k, dtype, container, shape_for(k, variant), fill=1)
    how = call("reduce_scatter", out, inp, op=call.op(op))
    return how, compare(out, reference(op, part, dtype, ws), tolerance(dtype, op, ws))


def _case_reduce(comm, call, dtype, op, n, container, variant, seed, root):
    ws, r = comm.world_size, comm.rank
    stack = np.stack([gen(dtype, op, seed, q, 0, n) for q in range(ws)])
    x = make_buf(stack[r], dtype, container, shape_for(n, variant))
    how = call("reduce", x, dst=root, op=call.op(op))
    if r == root:
        return how, compare(x, reference(op, stack, dtype, ws), tolerance(dtype, op, ws))
    err = compare(x, stack[r])
    return how, err and f"non-dst rank's x was modified: {err}"


def _case_all_gather(comm, call, dtype, k, container, variant, seed, inplace):
    ws, r = comm.world_size, comm.rank
    expected = np.concatenate([gen(dtype, None, seed, q, 0, k) for q in range(ws)])
    out = empty_buf(ws * k, dtype, container, (ws, k) if variant % 2 else (ws * k,), fill=1)
    if inplace:
        inp = flat_view(out)[r * k:(r + 1) * k]
        inp[...] = make_buf(expected[r * k:(r + 1) * k], dtype, container)
    else:
        inp = make_buf(expected[r * k:(r + 1) * k], dtype, container, shape_for(k, variant))
    how = call("all_gather", out, inp)
    return how, compare(out, expected)


def _case_broadcast(comm, call, dtype, n, container, variant, seed, root):
    r = comm.rank
    x = make_buf(gen(dtype, None, seed, r, 0, n), dtype, container, shape_for(n, variant))
    how = call("broadcast", x, src=root)
    return how, compare(x, gen(dtype, None, seed, root, 0, n))


def _case_scatter(comm, call, dtype, k, container, variant, seed, root):
    ws, r = comm.world_size, comm.rank
    inp = None
    if r == root:
        inp = make_buf(gen(dtype, None, seed, root, 0, ws * k), dtype, container,
                       (ws, k) if variant % 2 else (ws * k,))
    out = empty_buf(k, dtype, container, shape_for(k, variant), fill=1)
    how = call("scatter", out, inp, src=root)
    return how, compare(out, gen(dtype, None, seed, root, r * k, (r + 1) * k))


def _case_gather(comm, call, dtype, k, container, variant, seed, root):
    ws, r = comm.world_size, comm.rank
    inp = make_buf(gen(dtype, None, seed, r, 0, k), dtype, container, shape_for(k, variant))
    out = None
    if r == root:
        out = empty_buf(ws * k, dtype, container, (ws, k) if variant % 2 else (ws * k,), fill=1)
    how = call("gather", out, inp, dst=root)
    if r != root:
        return how, None
    return how, compare(out, np.concatenate([gen(dtype, None, seed, q, 0, k) for q in range(ws)]))


def _case_all_to_all(comm, call, dtype, k, container, variant, seed):
    ws, r = comm.world_size, comm.rank
    inp = make_buf(gen(dtype, None, seed, r, 0, ws * k), dtype, container,
                   (ws, k) if variant % 2 else (ws * k,))
    out = empty_buf(ws * k, dtype, container, (ws * k,) if variant % 2 else (ws, k), fill=1)
    how = call("all_to_all", out, inp)
    expected = np.concatenate([gen(dtype, None, seed, q, r * k, (r + 1) * k) for q in range(ws)])
    return how, compare(out, expected)


def collective_matrix(comm, prims: Sequence[str] = PRIMITIVES,
                      dtypes: Sequence[str] = DTYPES, counts: Sequence[int] = COUNTS,
                      big_dtypes: Optional[Sequence[str]] = None,
                      allow_default: bool = True, tag: str = "") -> List[str]:
    """Run every primitive x dtype x op x count; return failure strings.

    Counts are element counts for all_reduce/broadcast/reduce and per-rank block sizes
    for the others. Containers (numpy/torch), in-place/out-of-place, shapes, roots and
    calling styles rotate over the cases so that each dtype meets each of them.
    `big_dtypes` limits the counts above 10000 to some dtypes (None: all).
    """
    import ringcomm

    failures: List[str] = []
    call = Caller(comm, allow_default)
    ws = comm.world_size
    i = 0
    for prim in prims:
        for dtype in dtypes:
            for op in (ops_for(dtype) if prim in REDUCING else (None,)):
                for n in counts:
                    if n > 10000 and big_dtypes is not None and dtype not in big_dtypes:
                        continue
                    i += 1
                    conts = containers_for(dtype)
                    container = conts[i % len(conts)]
                    variant = i // 2
                    root = (i // 3) % ws
                    inplace = (i // 2) % 2 == 1
                    seed = seed_of(tag, prim, dtype, op, n, i)
                    desc = (f"{tag}{prim} dtype={dtype} op={op} count={n} {container} "
                            f"variant={variant % 6}")
                    if prim in ("reduce", "broadcast", "scatter", "gather"):
                        desc += f" root={root}"
                    if prim in ("reduce_scatter", "all_gather"):
                        desc += " in-place" if inplace else " out-of-place"
                    try:
                        if prim == "all_reduce":
                            how, err = _case_all_reduce(comm, call, dtype, op, n, container, variant, seed)
                        elif prim == "reduce_scatter":
                            how, err = _case_reduce_scatter(comm, call, dtype, op, n, container, variant, seed, inplace)
                        elif prim == "reduce":
                            how, err = _case_reduce(comm, call, dtype, op, n, container, variant, seed, root)
                        elif prim == "all_gather":
                            how, err = _case_all_gather(comm, call, dtype, n, container, variant, seed, inplace)
                        elif prim == "broadcast":
                            how, err = _case_broadcast(comm, call, dtype, n, container, variant, seed, root)
                        elif prim == "scatter":
                            how, err = _case_scatter(comm, call, dtype, n, container, variant, seed, root)
                        elif prim == "gather":
                            how, err = _case_gather(comm, call, dtype, n, container, variant, seed, root)
                        elif prim == "all_to_all":
                            how, err = _case_all_to_all(comm, call, dtype, n, container, variant, seed)
                        else:
                            raise AssertionError(f"unknown primitive {prim}")
                    except ringcomm.RingcommError as e:
                        failures.append(f"{desc}: raised {type(e).__name__}: {first_line(e)}")
                        failures.append("stopping this matrix: the communicator is unusable now")
                        return failures
                    except Exception as e:
                        failures.append(f"{desc}: raised {type(e).__name__}: {first_line(e)}")
                        continue
                    if err:
                        failures.append(f"{desc} via {how}: {err}")
    return failures


def p2p_and_barrier(comm, tag: str = "") -> List[str]:
    """send/recv (blocking, and isend/irecv around the ring) of several sizes, and barrier."""
    r, ws = comm.rank, comm.world_size
    fails: List[str] = []
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (0, 1, 1000, 300007):
        seed = seed_of(tag, "p2p", n)
        if ws >= 2:
            got = np.full(n, -1, np.int32)
            sw, rw = comm.isend(gen("int32", None, seed, r, 0, n), nxt), comm.irecv(got, prv)
            sw.wait()
            rw.wait()
            if not np.array_equal(got, gen("int32", None, seed, prv, 0, n)):
                fails.append(f"{tag}isend/irecv of {n} int32 from rank {prv}: wrong data")
        if ws >= 2 and r in (0, 1):
            x = np.arange(n, dtype=np.float64) * (r + 1)
            if r == 0:
                comm.send(x, 1)
            elif r == 1:
                comm.recv(x, 0)
                if not np.array_equal(x, np.arange(n, dtype=np.float64)):
                    fails.append(f"{tag}send/recv of {n} float64 from rank 0: wrong data")
    for _ in range(3):
        comm.barrier()
    return fails


def first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[:limit] + "..."


def within(seconds: float, fn: Callable[[], bool], interval: float = 0.001) -> bool:
    """Poll fn() until it is true or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while True:
        if fn():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def run_primitive_case(comm, prim, call, dtype, op, n, cont, variant, seed, root, in_place=False):
    """One case of `prim` through `call` (the _case_* helpers above); returns its error or None.
    `in_place` asks reduce_scatter / all_gather for their in-place form."""
    if prim == "all_reduce":
        return _case_all_reduce(comm, call, dtype, op, n, cont, variant, seed)[1]
    if prim == "reduce_scatter":
        return _case_reduce_scatter(comm, call, dtype, op, n, cont, variant, seed, in_place)[1]
    if prim == "reduce":
        return _case_reduce(comm, call, dtype, op, n, cont, variant, seed, root)[1]
    if prim == "all_gather":
        return _case_all_gather(comm, call, dtype, n, cont, variant, seed, in_place)[1]
    if prim == "broadcast":
        return _case_broadcast(comm, call, dtype, n, cont, variant, seed, root)[1]
    if prim == "scatter":
        return _case_scatter(comm, call, dtype, n, cont, variant, seed, root)[1]
    if prim == "gather":
        return _case_gather(comm, call, dtype, n, cont, variant, seed, root)[1]
    if prim == "all_to_all":
        return _case_all_to_all(comm, call, dtype, n, cont, variant, seed)[1]
    raise ValueError(f"unknown primitive {prim!r}")
