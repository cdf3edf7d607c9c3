"""The "ringcomm" torch.distributed backend: every dist.* collective against gloo.

Each rank runs every case twice, on the ringcomm default group and on a gloo
group over the same ranks, from the same inputs, and compares the results
(exactly: inputs are small integers, so every dtype and op is exact). One
spawned group per world size checks the whole matrix, sub-groups, futures,
functional collectives, DeviceMesh / DTensor, errors and re-initialisation.
"""

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest

import harness

WORLD_SIZES = (2, 3)
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("int8", "uint8", "int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
# Moved as bytes by the data-movement collectives (the core has no such dtype).
# gloo has no int16: its side runs int32 and the result is cast.
EXTRA_DTYPES = ("int16",)


def _ops(dtype):
    if dtype in FLOATS:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
    return ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


# ----------------------------------------------------------------- rank side

def _init_groups():
    """The ringcomm default group and a gloo group over the same ranks."""
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401  (registers the backend)

    ctx = harness.context()
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=60))
    return dist.group.WORLD, dist.new_group(backend="gloo")


def _values(seed, n, dtype, rank):
    """Small integers of `dtype` (so every reduction is exact), one stream per (seed, rank)."""
    import torch

    g = torch.Generator().manual_seed(seed * 1009 + rank)
    dt = getattr(torch, dtype)
    if dtype == "bool":
        return torch.randint(0, 2, (n,), generator=g).bool()
    lo = 0 if dtype == "uint8" else -3
    x = torch.randint(lo, 4, (n,), generator=g)
    if dtype.startswith("complex"):
        return torch.complex(x.float(), torch.randint(-3, 4, (n,), generator=g).float()).to(dt)
    return x.to(dt)


class _Checker:
    """Runs each case on both groups and records the differences."""

    def __init__(self, rc, gloo):
        import torch

        self.torch = torch
        self.rc, self.gloo = rc, gloo
        self.fails = []
        self.count = 0

    def same(self, name, fn, tol=None, ref_fn=None):
        """fn(group) -> tensor or list of tensors; both groups must agree.

        ref_fn (default fn) computes gloo's side, for dtypes gloo lacks: its
        results are cast to the dtype ringcomm's have.
        """
        self.count += 1
        try:
            got = fn(self.rc)
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            self.fails.append(f"{name}: ringcomm raised {type(e).__name__}: {str(e).splitlines()[0]}")
            return
        try:
            ref = (ref_fn or fn)(self.gloo)
        except Exception as e:  # noqa: BLE001
            self.fails.append(f"{name}: gloo raised {type(e).__name__}: {str(e).splitlines()[0]}")
            return
        got = got if isinstance(got, (list, tuple)) else [got]
        ref = ref if isinstance(ref, (list, tuple)) else [ref]
        if len(got) != len(ref):
            self.fails.append(f"{name}: {len(got)} results, gloo {len(ref)}")
        for i, (a, b) in enumerate(zip(got, ref)):
            if a is None and b is None:
                continue
            b = b.to(a.dtype)
            if a.dtype != b.dtype or a.shape != b.shape:
                self.fails.append(f"{name}[{i}]: got {a.dtype} {tuple(a.shape)}, gloo {b.dtype} {tuple(b.shape)}")
            elif tol is not None and a.is_floating_point():
                if not self.torch.allclose(a.double(), b.double(), rtol=tol, atol=tol):
                    self.fails.append(f"{name}[{i}]: got {a.flatten()[:6].tolist()}, gloo {b.flatten()[:6].tolist()}")
            elif not self.torch.equal(a, b):
                bad = (a != b).nonzero()[:3].flatten().tolist()
                self.fails.append(f"{name}[{i}]: differs at {bad}: got {a.flatten()[:6].tolist()}, "
                                  f"gloo {b.flatten()[:6].tolist()}")

    def check(self, name, ok, detail=""):
        self.count += 1
        if not ok:
            self.fails.append(f"{name}: {detail}")

    def raises(self, name, fn, exc, words):
        self.count += 1
        try:
            fn()
        except exc as e:
            msg = str(e)
            missing = [w for w in words if w not in msg]
            if missing:
                self.fails.append(f"{name}: {type(e).__name__} {msg!r} does not mention {missing}")
            return
        except Exception as e:  # noqa: BLE001
            self.fails.append(f"{name}: raised {type(e).__name__} ({e}), expected {exc.__name__}")
            return
        self.fails.append(f"{name}: did not raise")


def _reductions(c, rank, ws):
    import torch
    import torch.distributed as dist

    def op_of(name):
        return getattr(dist.ReduceOp, name)

    for dtype in DTYPES:
        for op in _ops(dtype):
            tol = 1e-2 if op == "AVG" and dtype in ("float16", "bfloat16") else (1e-6 if op == "AVG" else None)
            for n, async_op in ((7, False), (1000, True)):
                def all_reduce(g, n=n, dtype=dtype, op=op, async_op=async_op):
                    x = _values(1, n, dtype, rank)
                    w = dist.all_reduce(x, op=op_of(op), group=g, async_op=async_op)
                    if async_op:
                        w.wait()
                    return x
                c.same(f"all_reduce {dtype} {op} n={n} async={async_op}", all_reduce, tol)

            def reduce_scatter_tensor(g, dtype=dtype, op=op):
                x = _values(2, 5 * ws, dtype, rank)
                out = torch.empty(5, dtype=x.dtype)
                dist.reduce_scatter_tensor(out, x, op=op_of(op), group=g)
                return out
            c.same(f"reduce_scatter_tensor {dtype} {op}", reduce_scatter_tensor, tol)

    for dtype in ("float32", "int32", "bool"):
        for op in _ops(dtype):
            def reduce(g, dtype=dtype, op=op):
                x = _values(3, 11, dtype, rank)
                dist.reduce(x, dst=ws - 1, op=op_of(op), group=g)
                return x if rank == ws - 1 else None
            c.same(f"reduce {dtype} {op}", reduce)

            def reduce_scatter(g, dtype=dtype, op=op):
                xs = [_values(4 + r, 6, dtype, rank) for r in range(ws)]
                out = torch.empty(6, dtype=xs[0].dtype)
                dist.reduce_scatter(out, xs, op=op_of(op), group=g)
                return out
            c.same(f"reduce_scatter {dtype} {op}", reduce_scatter)

    # Large (pipelined ring paths), non-contiguous tensors, complex, coalesced.
    def big_all_reduce(g):
        x = _values(5, 300007, "float32", rank)
        dist.all_reduce(x, group=g)
        return x
    c.same("all_reduce float32 n=300007", big_all_reduce)

    # gloo reduces non-contiguous tensors as if they were dense (wrong
    # elements): the expectation is computed here from every rank's input.
    def strided(r):
        return _values(6, 40, "float64", r).reshape(5, 8)
    base = strided(rank)
    view = base.t()[::2]
    dist.all_reduce(view, op=dist.ReduceOp.MAX)
    expected = strided(rank)
    expected.t()[::2] = torch.stack([strided(r).t()[::2] for r in range(ws)]).amax(0)
    c.check("all_reduce MAX on a non-contiguous view", torch.equal(base, expected), f"{base} != {expected}")

    def complex_all_reduce(g):
        x = _values(7, 9, "complex64", rank)
        dist.all_reduce(x, group=g)
        return x
    c.same("all_reduce complex64 SUM", complex_all_reduce)

    def coalesced(g):
        xs = [_values(8, 5, "float32", rank), _values(9, 3, "float32", rank)]
        dist.all_reduce_coalesced(xs, group=g)
        return xs
    c.same("all_reduce_coalesced", coalesced)

    def big_reduce_scatter(g):
        x = _values(10, 40009 * ws, "bfloat16", rank)
        out = torch.empty(40009, dtype=torch.bfloat16)
        dist.reduce_scatter_tensor(out, x, group=g)
        return out
    c.same("reduce_scatter_tensor bfloat16 n=40009", big_reduce_scatter)


def _data_movement(c, rank, ws):
    import torch
    import torch.distributed as dist

    for dtype in DTYPES + EXTRA_DTYPES:
        ref_dtype = "int32" if dtype == "int16" else dtype
        for async_op in (False, True):
            tag = f"{dtype} async={async_op}"

            def same(name, fn):
                c.same(name, fn, ref_fn=lambda g: fn(g, dtype=ref_dtype))

            def finish(w, async_op=async_op):
                if async_op:
                    w.wait()

            def broadcast(g, dtype=dtype):
                x = _values(20, 13, dtype, rank)
                finish(dist.broadcast(x, src=1, group=g, async_op=async_op))
                return x
            same(f"broadcast {tag}", broadcast)

            def all_gather(g, dtype=dtype):
                x = _values(21, 4, dtype, rank)
                outs = [torch.empty_like(x) for _ in range(ws)]
                finish(dist.all_gather(outs, x, group=g, async_op=async_op))
                return outs
            same(f"all_gather {tag}", all_gather)

            def all_gather_into_tensor(g, dtype=dtype):
                x = _values(22, 6, dtype, rank).reshape(2, 3)
                out = torch.empty(2 * ws, 3, dtype=x.dtype)
                finish(dist.all_gather_into_tensor(out, x, group=g, async_op=async_op))
                return out
            same(f"all_gather_into_tensor {tag}", all_gather_into_tensor)

            def scatter(g, dtype=dtype):
                out = _values(23, 5, dtype, rank)
                ins = [_values(24 + r, 5, dtype, rank) for r in range(ws)] if rank == 0 else None
                finish(dist.scatter(out, ins, src=0, group=g, async_op=async_op))
                return out
            same(f"scatter {tag}", scatter)

            def gather(g, dtype=dtype):
                x = _values(25, 3, dtype, rank)
                outs = [torch.empty_like(x) for _ in range(ws)] if rank == ws - 1 else None
                finish(dist.gather(x, outs, dst=ws - 1, group=g, async_op=async_op))
                return outs if outs is not None else []
            same(f"gather {tag}", gather)

            def all_to_all_single(g, dtype=dtype):
                x = _values(26, 4 * ws, dtype, rank).reshape(2 * ws, 2)
                out = torch.empty_like(x)
                finish(dist.all_to_all_single(out, x, group=g, async_op=async_op))
                return out
            same(f"all_to_all_single equal {tag}", all_to_all_single)

            # Uneven splits: rank r sends (r + p) % 3 rows to rank p.
            def all_to_all_uneven(g, dtype=dtype):
                ins = [(rank + p) % 3 for p in range(ws)]
                outs = [(p + rank) % 3 for p in range(ws)]
                x = _values(27, 3 * sum(ins), dtype, rank).reshape(sum(ins), 3)
                out = torch.empty(sum(outs), 3, dtype=x.dtype)
                finish(dist.all_to_all_single(out, x, outs, ins, group=g, async_op=async_op))
                return out
            same(f"all_to_all_single uneven {tag}", all_to_all_uneven)

            def all_to_all(g, dtype=dtype):
                ins = [_values(28 + p, 3, dtype, rank) for p in range(ws)]
                outs = [torch.empty(3, dtype=ins[0].dtype) for p in range(ws)]
                finish(dist.all_to_all(outs, ins, group=g, async_op=async_op))
                return outs
            same(f"all_to_all {tag}", all_to_all)

            # gloo wants equal blocks: uneven ones are checked against the
            # inputs, which every rank can compute (rank p sends block q of
            # 1 + (p + q) % 3 elements to rank q).
            ins = [_values(28 + p, 1 + (rank + p) % 3, dtype, rank) for p in range(ws)]
            outs = [torch.empty(1 + (p + rank) % 3, dtype=ins[0].dtype) for p in range(ws)]
            try:
                finish(dist.all_to_all(outs, ins, group=c.rc, async_op=async_op))
                expected = [_values(28 + rank, 1 + (p + rank) % 3, dtype, p) for p in range(ws)]
                c.check(f"all_to_all uneven {tag}", all(torch.equal(a, b) for a, b in zip(outs, expected)),
                        f"got {outs}, expected {expected}")
            except Exception as e:  # noqa: BLE001
                c.check(f"all_to_all uneven {tag}", False, f"raised {type(e).__name__}: {e}")

            def send_recv(g, dtype=dtype):
                x = _values(29, 17, dtype, rank)
                y = torch.empty_like(x)
                ops = [dist.P2POp(dist.isend, x, (rank + 1) % ws, g),
                       dist.P2POp(dist.irecv, y, (rank - 1) % ws, g)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
                return y
            same(f"batch_isend_irecv ring {tag}", send_recv)

    # Blocking send / recv between ranks 0 and 1, large (many FIFO segments).
    def blocking_p2p(g):
        x = _values(30, 200003, "float32", rank)
        if rank == 0:
            dist.send(x, dst=1, group=g)
            dist.recv(x, src=1, group=g)
        elif rank == 1:
            y = torch.empty_like(x)
            dist.recv(y, src=0, group=g)
            dist.send(x, dst=0, group=g)
            x = y
        return x
    c.same("send/recv float32 n=200003", blocking_p2p)

    # Non-contiguous outputs (expectations computed here, see above).
    x = _values(31, 12, "int64", rank).reshape(3, 4)
    dist.broadcast(x.t(), src=0)
    base = torch.zeros(ws, 8, dtype=torch.int64)
    dist.all_gather([base[r, ::2] for r in range(ws)], _values(32, 4, "int64", rank))
    ok = torch.equal(x, _values(31, 12, "int64", 0).reshape(3, 4)) and all(
        torch.equal(base[r, ::2], _values(32, 4, "int64", r)) and not base[r, 1::2].any() for r in range(ws))
    c.check("broadcast / all_gather into non-contiguous tensors", ok, f"{x} {base}")
    y = torch.zeros(4, 6)
    if rank < 2:
        ops = [dist.P2POp(dist.isend, torch.full((4, 3), rank + 1.0), 1 - rank),
               dist.P2POp(dist.irecv, y[:, ::2], 1 - rank)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.check("irecv into a non-contiguous tensor",
                torch.equal(y[:, ::2], torch.full((4, 3), 2.0 - rank)) and not y[:, 1::2].any(), str(y))

    def objects(g):
        objs = [None] * ws
        dist.all_gather_object(objs, {"rank": rank, "data": list(range(rank + 2))}, group=g)
        lst = [{"from": rank}, "x" * (rank + 1)]
        dist.broadcast_object_list(lst, src=ws - 1, group=g)
        return [torch.tensor([hash(repr(objs)) % 1000003, hash(repr(lst)) % 1000003])]
    c.same("all_gather_object / broadcast_object_list", objects)

    def empty(g):
        x = torch.empty(0)
        dist.all_reduce(x, group=g)
        out = torch.empty(0)
        dist.all_gather_into_tensor(out, torch.empty(0), group=g)
        return [x, out]
    c.same("zero-element tensors", empty)

    c.same("barrier", lambda g: [dist.barrier(group=g), torch.ones(1)][1])


def _futures_groups_errors(c, rank, ws):
    import torch
    import torch.distributed as dist

    import ringcomm

    rc = c.rc

    # A future completes without anyone calling wait() (DDP relies on it).
    x = torch.full((1000,), float(rank + 1))
    fut = dist.all_reduce(x, async_op=True).get_future()
    seen = []
    chained = fut.then(lambda f: seen.append(f.value()[0].sum().item()) or f.value()[0] * 2)
    deadline = time.monotonic() + 30
    while not chained.done() and time.monotonic() < deadline:
        time.sleep(0.005)
    total = ws * (ws + 1) / 2
    c.check("get_future completes without wait()", chained.done() and seen == [1000 * total],
            f"done={chained.done()} seen={seen}")
    if chained.done():
        c.check("the chained future's value", torch.equal(chained.value(), torch.full((1000,), 2 * total)),
                str(chained.value()[:3]))
    w = dist.all_reduce(torch.ones(3), async_op=True)
    w.wait()
    c.check("a waited Work's future is already done", w.get_future().done() and w.is_completed())
    # A future asked for before wait(): done when wait() returns (the one-native-Work fast path).
    y = torch.full((7,), float(rank))
    w = dist.all_reduce(y, async_op=True)
    f = w.get_future()
    c.check("async all_reduce wait()", w.wait() is True and w.is_completed() and w.is_success(), "")
    c.check("a future asked for before wait() is done when wait() returns",
            f.done() and torch.equal(f.value()[0], torch.full((7,), ws * (ws - 1) / 2)), str(f.done()))
    # The blocking fast path's Work, as the group returns it to torch.
    backend = rc._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    z = torch.ones(4)
    bw = backend.allreduce([z], opts)
    bf = bw.get_future()
    c.check("a blocking all_reduce's Work", bw.is_completed() and bw.is_success() and bw.exception() is None
            and bw.wait() is True and bw.result()[0] is z and bf.done() and bf.value()[0] is z
            and torch.equal(z, torch.full((4,), float(ws))), str(z))

    # Futures of p2p works that complete out of issue order.
    if ws >= 2 and rank < 2:
        peer = 1 - rank
        a, b = torch.zeros(5), torch.full((5,), float(rank))
        if rank == 0:
            w_recv = dist.irecv(a, src=peer)
            w_send = dist.isend(b, dst=peer)
        else:
            w_send = dist.isend(b, dst=peer)
            w_recv = dist.irecv(a, src=peer)
        futs = [w_recv.get_future(), w_send.get_future()]
        torch.futures.wait_all(futs)
        c.check("isend/irecv futures", torch.equal(a, torch.full((5,), float(peer))), str(a))
        # Futures asked for before wait(), then wait(): done when it returns;
        # a recv from any source names its sender; tags apart.
        a2, b2 = torch.zeros(3), torch.full((3,), float(10 + rank))
        ws_, wr_ = dist.isend(b2, dst=peer, tag=5), dist.irecv(a2, src=None, tag=5)
        fs, fr = ws_.get_future(), wr_.get_future()
        ok = ws_.wait() and wr_.wait()
        c.check("isend/irecv: futures done when wait() returns", ok and fs.done() and fr.done()
                and fr.value()[0] is a2 and torch.equal(a2, torch.full((3,), float(10 + peer))), str(a2))
        c.check("irecv from any source: source_rank()", wr_._source_rank() == peer, str(wr_._source_rank()))
        # A tag beyond int64 is refused with a clear error (the Communicator's check), not converted.
        try:
            backend.send([b2], peer, 2**70)
            c.check("a tag beyond int64 is refused", False, "no error")
        except (ValueError, OverflowError, TypeError) as e:
            c.check("a tag beyond int64 is refused", "tag" in str(e), str(e))

    # Sub-groups (new_group) against gloo sub-groups of the same ranks.
    layouts = [[0, 1]] + ([[1, 2], [2, 0], [0, 1, 2]] if ws == 3 else [[1, 0]])
    for ranks in layouts:
        sub_rc = dist.new_group(ranks)
        sub_gloo = dist.new_group(ranks, backend="gloo")
        if rank not in ranks:
            continue
        c.check(f"new_group {ranks} backend", dist.get_backend(sub_rc) == "ringcomm", dist.get_backend(sub_rc))
        sub = _Checker(sub_rc, sub_gloo)

        def sub_all_reduce(g):
            x = _values(40, 9, "int32", rank)
            dist.all_reduce(x, op=dist.ReduceOp.BXOR, group=g)
            return x
        sub.same(f"new_group {ranks} all_reduce", sub_all_reduce)

        def sub_broadcast(g, src=ranks[-1]):
            x = _values(41, 9, "float32", rank)
            dist.broadcast(x, src=src, group=g)  # a global rank
            return x
        sub.same(f"new_group {ranks} broadcast from global rank {ranks[-1]}", sub_broadcast)

        def sub_gather(g, dst=ranks[-1]):
            x = _values(42, 4, "int64", rank)
            outs = [torch.empty_like(x) for _ in ranks] if rank == dst else None
            dist.gather(x, outs, dst=dst, group=g)
            return outs or []
        sub.same(f"new_group {ranks} gather", sub_gather)

        def sub_all_gather(g):
            x = _values(43, 3, "float64", rank)
            out = torch.empty(3 * len(ranks), dtype=x.dtype)
            dist.all_gather_into_tensor(out, x, group=g)
            return out
        sub.same(f"new_group {ranks} all_gather_into_tensor", sub_all_gather)
        c.fails += sub.fails
        c.count += sub.count

    # Errors: clear, raised before anything is sent, and the group still works.
    premul = dist._make_nccl_premul_sum(2.0)
    c.raises("PREMUL_SUM", lambda: dist.all_reduce(torch.ones(2), op=premul), ValueError, ["PREMUL_SUM"])
    c.raises("PREMUL_SUM reduce_scatter_tensor",
             lambda: dist.reduce_scatter_tensor(torch.ones(1), torch.ones(ws), op=premul), ValueError, ["PREMUL_SUM"])
    c.raises("all_reduce int16", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), TypeError, ["int16"])
    c.raises("AVG on bool", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG),
             ValueError, ["AVG", "bool"])
    c.raises("wrong output count", lambda: dist.all_gather([torch.ones(2)] * (ws + 1), torch.ones(2)),
             ValueError, [str(ws)])
    c.raises("all_gather_into_tensor size", lambda: dist.all_gather_into_tensor(torch.ones(ws + 1), torch.ones(1)),
             ValueError, [])
    c.raises("bad splits", lambda: dist.all_to_all_single(torch.ones(ws), torch.ones(ws), [ws] + [0] * (ws - 1),
                                                          [1] * (ws + 1)), ValueError, ["split"])
    x = torch.ones(4)
    dist.all_reduce(x)
    c.check("the group works after refused calls", torch.equal(x, torch.full((4,), float(ws))), str(x))

    # Identity and the communicator underneath.
    c.check("getBackendName", rc.name() == "ringcomm" and dist.get_backend() == "ringcomm", rc.name())
    c.check("group name", rc.group_name == dist.distributed_c10d._world.pg_names[rc] and rc.group_desc,
            f"{rc.group_name!r} {rc.group_desc!r}")
    c.check("rank / size", (rc.rank(), rc.size()) == (rank, ws))
    comm = rc.communicator
    c.check("communicator", isinstance(comm, ringcomm.Communicator) and comm.world_size == ws, repr(comm))


def _functional_and_mesh(c, rank, ws):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def functional(g):
        x = _values(50, 4 * ws, "float32", rank)
        a = funcol.all_reduce(x, "sum", g)
        b = funcol.all_gather_tensor(x, 0, g)
        s = funcol.reduce_scatter_tensor(x, "max", 0, g)
        t = funcol.all_to_all_single(x, None, None, g)
        u = funcol.broadcast(x, ws - 1, g)
        return [funcol.wait_tensor(v) for v in (a, b, s, t, u)]
    c.same("functional collectives", functional)

    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("dp",))
    c.check("DeviceMesh group backend", dist.get_backend(mesh.get_group()) == "ringcomm",
            dist.get_backend(mesh.get_group()))
    gloo_mesh = DeviceMesh.from_group(c.gloo, "cpu", mesh_dim_names=("dp",))

    def dtensor(m):
        full = _values(51, 6 * ws, "float64", 0).reshape(2 * ws, 3)  # same on every rank
        d = distribute_tensor(full, m, [Shard(0)])
        local = d.to_local() * (rank + 1)
        gathered = d.redistribute(m, [Replicate()]).to_local()
        mean = funcol.all_reduce(local, "avg", m)
        return [gathered, funcol.wait_tensor(mean)]
    got, ref = dtensor(mesh), dtensor(gloo_mesh)
    c.check("DeviceMesh / DTensor", all(torch.equal(a, b) for a, b in zip(got, ref)), f"{got} vs {ref}")


def _reinit(c, rank, ws):
    """destroy_process_group() then init again on the same store (torch reuses group names)."""
    import torch
    import torch.distributed as dist

    ctx = harness.context()
    dist.destroy_process_group()
    for attempt in range(2):
        dist.init_process_group("ringcomm", store=ctx.store, rank=rank, world_size=ws)
        x = torch.full((3,), float(rank + attempt))
        dist.all_reduce(x)
        expected = float(ws * (ws - 1) / 2 + ws * attempt)
        c.check(f"re-initialised group #{attempt}", torch.equal(x, torch.full((3,), expected)), str(x))
        dist.destroy_process_group()


def _everything(comm, parts):
    ctx = harness.context()
    rc, gloo = _init_groups()
    c = _Checker(rc, gloo)
    for part in parts:
        globals()[part](c, ctx.rank, ctx.world_size)
    if "_reinit" not in parts:
        import torch.distributed as dist

        dist.destroy_process_group()
    return c.fails if c.count else ["no checks ran"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collectives_match_gloo(world_size):
    parts = ["_reductions", "_data_movement", "_futures_groups_errors", "_functional_and_mesh", "_reinit"]
    harness.assert_no_failures(
        harness.run_ranks(_everything, world_size, (parts,), init=False, hard_timeout=150))


# ------------------------------------------------------- registration, no ranks

def test_registration():
    import torch.distributed as dist

    import ringcomm.torch_backend as tb

    assert dist.Backend("ringcomm") == "ringcomm"
    assert "RINGCOMM" in dist.Backend._plugins
    assert dist.Backend.backend_capability["ringcomm"] == ["cpu", "cuda"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo", "ringcomm must not take over cpu"
    assert dist.Backend.default_device_backend_map["cuda"] == "nccl", "ringcomm must not take over cuda"
    tb.register()  # idempotent


_TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
import ringcomm.torch_backend

dist.init_process_group("ringcomm")
rank, ws = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
x = torch.full((2,), float(rank + 1))
dist.all_reduce(x)
assert x.tolist() == [ws * (ws + 1) / 2] * 2, x
grads = [torch.empty_like(model.module.weight.grad) for _ in range(ws)]
dist.all_gather(grads, model.module.weight.grad)
assert all(torch.equal(g, grads[0]) for g in grads)
dist.destroy_process_group()
print(f"rank {rank} of {ws} ok")
"""


def test_torchrun(tmp_path):
    """init_process_group("ringcomm") from torchrun's environment (env:// rendezvous)."""
    script = tmp_path / "train.py"
    script.write_text(_TORCHRUN_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-port", str(harness.free_port()), str(script)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # torchrun and its workers
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within 120 s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{out[-3000:]}"
    assert "rank 0 of 2 ok" in out and "rank 1 of 2 ok" in out, out[-3000:]
