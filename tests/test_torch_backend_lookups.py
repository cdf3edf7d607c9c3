"""What torch asks of a backend beyond the collectives, on the "ringcomm" group.

Per-device lookups (`_device_types`, `_get_backend`, sequence numbers, the
object-collective device), profiler events as torch's backends record them,
gloo's monitored barrier (with its failure reports), sparse all_reduce (and
DDP with a sparse embedding) against gloo, and timeouts worded as torch's
backends word them. One spawned group per world size runs every case.
"""
import re
import time
from datetime import timedelta

import pytest

import harness
from test_torch_backend import _Checker

WORLD_SIZES = (2, 3)


def _init():
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401

    ctx = harness.context()
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timedelta(seconds=30))
    return dist.group.WORLD, dist.new_group(backend="gloo")


def _lookups(c, pg, rank, ws):
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import ringcomm

    devices = ["cpu", "cuda"] if ringcomm.build_info()["cuda"] else ["cpu"]
    c.check("registered for cpu and cuda", dist.Backend.backend_capability["ringcomm"] == ["cpu", "cuda"],
            str(dist.Backend.backend_capability.get("ringcomm")))
    c.check("_device_types", pg._device_types == [torch.device(d) for d in devices], str(pg._device_types))
    c.check("_get_backend(cpu) is the group", pg._get_backend(torch.device("cpu")) is pg)
    if "cuda" in devices:
        c.check("_get_backend(cuda) is the group", pg._get_backend(torch.device("cuda:0")) is pg)
    c.raises("_get_backend(meta)", lambda: pg._get_backend(torch.device("meta")), RuntimeError, ["meta"])
    c.check("object collective device", c10d._get_object_coll_device(pg) == "cpu")
    c.check("device capability", c10d._device_capability(pg) == devices, str(c10d._device_capability(pg)))
    c.raises("a tensor on another device", lambda: dist.all_reduce(torch.ones(2, device="meta")), ValueError,
             ["meta", "CPU and CUDA"])
    before = pg._get_sequence_number_for_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    dist.barrier()
    after = pg._get_sequence_number_for_group()
    c.check("sequence number counts calls", after - before == 4, f"{before} -> {after}")
    seqs = [None] * ws
    dist.all_gather_object(seqs, pg._get_sequence_number_for_group())
    c.check("sequence numbers agree", len(set(seqs)) == 1, str(seqs))


def _profiler(c, rank, ws):
    import torch
    import torch.distributed as dist

    x = torch.ones(3, 2)
    for async_op in (False, True):
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            w = dist.all_reduce(x, async_op=async_op)
            if async_op:
                w.wait()
            dist.broadcast(x, 0)
            if rank == 0:
                dist.send(torch.ones(4), 1)
            elif rank == 1:
                dist.recv(torch.empty(4), 0)
        events = {}
        for e in prof.function_events:
            if e.name.startswith("ringcomm:"):
                events.setdefault(e.name, []).append(e)
        want = {"ringcomm:all_reduce": [[3, 2]], "ringcomm:broadcast": [[3, 2]]}
        if rank == 0:
            want["ringcomm:send"] = [[4]]
        elif rank == 1:
            want["ringcomm:recv"] = [[4]]
        c.check(f"profiler events async={async_op}", sorted(events) == sorted(want), str(sorted(events)))
        for name, shapes in want.items():
            for e in events.get(name, []):
                c.check(f"{name} event async={async_op}", e.is_async and e.count == 1 and e.input_shapes == [shapes[0]],
                        f"is_async {e.is_async} count {e.count} shapes {e.input_shapes}")
    # Outside a profiler nothing is recorded and blocking calls stay inline.
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        pass
    dist.all_reduce(x)
    c.check("no events without a profiler", not [e for e in prof.function_events if "ringcomm" in e.name])


def _monitored(c, pg, rank, ws):
    import torch
    import torch.distributed as dist

    import ringcomm.torch_backend as rtb

    c.raises("torch's dist.monitored_barrier gates on the gloo name", lambda: dist.monitored_barrier(),
             ValueError, ["GLOO"])
    rtb.monitored_barrier(timeout=timedelta(seconds=5))
    pg.monitored_barrier(timedelta(seconds=5), wait_all_ranks=True)
    c.check("monitored_barrier passes", True)

    # Rank 1 stays away: rank 0 names it after the timeout, the others hear at once.
    if rank != 1:
        start = time.monotonic()
        if rank == 0:
            c.raises("monitored_barrier names the missing rank",
                     lambda: pg.monitored_barrier(timedelta(seconds=0.5)), RuntimeError,
                     ["Rank 1 failed to pass monitoredBarrier in 500 ms"])
            took = time.monotonic() - start
            c.check("rank 0 waits its timeout", 0.45 <= took < 3, f"{took:.2f} s")
        else:
            c.raises("the others hear rank 0's verdict",
                     lambda: pg.monitored_barrier(timedelta(seconds=20)), RuntimeError,
                     [f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting "
                      "for send/recv from rank 0", "Rank 1 failed to pass"])
            took = time.monotonic() - start
            c.check("the others do not wait for their own deadline", took < 5, f"{took:.2f} s")
    else:
        time.sleep(0.7)
        # The straggler arrives late and reads the same verdict at once.
        c.raises("a late rank reads the verdict", lambda: pg.monitored_barrier(timedelta(seconds=20)),
                 RuntimeError, ["Rank 1 successfully reached monitoredBarrier", "Rank 1 failed to pass"])
    dist.barrier()

    if ws >= 3:
        if rank == 0:
            c.raises("wait_all_ranks names every missing rank",
                     lambda: pg.monitored_barrier(timedelta(seconds=0.3), wait_all_ranks=True), RuntimeError,
                     [f"Ranks {', '.join(str(r) for r in range(1, ws))} failed to pass monitoredBarrier"])
        else:
            time.sleep(0.9 * (ws - 1))
            c.raises("late ranks after wait_all_ranks", lambda: pg.monitored_barrier(timedelta(seconds=20)),
                     RuntimeError, ["successfully reached monitoredBarrier"])
        dist.barrier()

    if rank == 0:
        c.raises("rank 0 with no time left", lambda: pg.monitored_barrier(timedelta(seconds=0)), RuntimeError,
                 ["Rank 0 timed out in monitoredBarrier"])
    else:
        c.raises("after rank 0 ran out of time", lambda: pg.monitored_barrier(timedelta(seconds=20)),
                 RuntimeError, ["successfully reached monitoredBarrier", "Rank 0 timed out"])
    dist.barrier()
    # The communicator is untouched by all of that.
    x = torch.ones(4)
    dist.all_reduce(x)
    c.check("collectives after failed monitored barriers", torch.equal(x, torch.full((4,), float(ws))))


def _sparse(c, pg, gloo, rank, ws):
    import torch
    import torch.distributed as dist

    def sparse_input(sparse_dims, dense_dims, seed):
        g = torch.Generator().manual_seed(seed * 31 + rank)
        nnz = rank + 2
        size = [ws + 3] * sparse_dims + [2] * dense_dims
        idx = torch.randint(0, ws + 3, (sparse_dims, nnz), generator=g)
        vals = torch.randint(-3, 4, (nnz, *[2] * dense_dims), generator=g).float()
        return torch.sparse_coo_tensor(idx, vals, size, check_invariants=True)

    for sd in (1, 2, 3):
        for dd in (0, 1, 2):
            def case(g, sd=sd, dd=dd):
                t = sparse_input(sd, dd, sd * 10 + dd)
                dist.all_reduce(t, group=g)
                return t.to_dense()
            c.same(f"sparse all_reduce {sd} sparse + {dd} dense dims", case)

    def empty_on_rank_0(g):
        t = sparse_input(1, 1, 5)
        if rank == 0:
            t = torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.int64), torch.empty((0, 2)), t.shape,
                                        check_invariants=True)
        dist.all_reduce(t, group=g)
        return t.to_dense()
    c.same("sparse all_reduce, no entries on rank 0", empty_on_rank_0)

    c.raises("sparse all_reduce with MAX", lambda: dist.all_reduce(sparse_input(1, 0, 1), op=dist.ReduceOp.MAX),
             ValueError, ["SUM"])
    c.raises("sparse broadcast", lambda: dist.broadcast(sparse_input(1, 0, 1), 0), ValueError,
             ["sparse", "all_reduce"])
    # Ranks that disagree on the shape all raise, and the group goes on.
    bad = torch.sparse_coo_tensor(torch.zeros((1, 1), dtype=torch.int64), torch.ones(1), (5 + (rank == 1),),
                                  check_invariants=True)
    c.raises("sparse shapes differ across ranks", lambda: dist.all_reduce(bad), ValueError, ["differ across ranks"])
    x = torch.ones(2)
    dist.all_reduce(x)
    c.check("group usable after the sparse mismatch", torch.equal(x, torch.full((2,), float(ws))))

    # DDP with a sparse embedding, as on gloo.
    def ddp(g):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 4, mode="sum", sparse=True), torch.nn.Linear(4, 1))
        net = torch.nn.parallel.DistributedDataParallel(model, process_group=g)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(3):
            opt.zero_grad()
            loss = net(torch.randint(0, 20, (6, 3), generator=gen)).square().mean()
            loss.backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    c.same("DDP with a sparse EmbeddingBag", ddp, tol=1e-6)


def _timeouts(c, rank, ws):
    import torch.distributed as dist

    short = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        start = time.monotonic()
        try:
            dist.barrier(short)
            c.check("barrier timeout", False, "barrier returned though only rank 0 called it")
        except Exception as e:  # noqa: BLE001
            took = time.monotonic() - start
            # torch's suite matches " (Timed out|closed|timeout) ".
            c.check("barrier timeout wording", re.search(" (Timed out|closed|timeout) ", str(e)) is not None, str(e))
            c.check("barrier timeout honours the group's", 0.9 <= took < 4, f"{took:.2f} s")
    dist.barrier()


def _async_save(c, rank, ws):
    """torch.distributed.checkpoint.async_save needs a CPU backend in the group."""
    import os
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    ckpt = os.path.join(tempfile.gettempdir(), f"ringcomm-dcp-{harness.context().store.add('dcp', 0)}-{ws}")
    objs = [ckpt if rank == 0 else None]
    dist.broadcast_object_list(objs, 0)
    ckpt = objs[0]
    state = {"w": torch.arange(6, dtype=torch.float32), "b": torch.full((2,), 7.0)}  # replicated: alike everywhere
    fut = dcp.async_save({"model": state}, checkpoint_id=ckpt)
    fut.result(timeout=60)
    dist.barrier()
    loaded = {"model": {"w": torch.zeros(6), "b": torch.zeros(2)}}
    dcp.load(loaded, checkpoint_id=ckpt)
    c.check("dcp.async_save round trip", torch.equal(loaded["model"]["w"], torch.arange(6, dtype=torch.float32))
            and torch.equal(loaded["model"]["b"], torch.full((2,), 7.0)), str(loaded))


def _detail(c, rank, ws):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives raise on every rank, naming both."""
    import torch
    import torch.distributed as dist

    x = torch.ones(3)
    dist.all_reduce(x)
    c.check("DETAIL: matching calls pass", torch.equal(x, torch.full((3,), float(ws))))
    bad = torch.ones(3 + (rank == 1))
    c.raises("DETAIL: shapes differ", lambda: dist.all_reduce(bad), RuntimeError,
             ["Detected mismatch between collectives on ranks", "OpType=ALL_REDUCE", "TensorShape=[[3]]",
              "TensorShape=[[4]]"])
    if rank == 1:
        c.raises("DETAIL: ops differ", lambda: dist.broadcast(torch.ones(2), 0), RuntimeError,
                 ["OpType=BROADCAST", "OpType=ALL_REDUCE"])
    else:
        c.raises("DETAIL: ops differ", lambda: dist.all_reduce(torch.ones(2)), RuntimeError,
                 ["OpType=BROADCAST", "OpType=ALL_REDUCE"])
    y = torch.ones(2)
    dist.all_reduce(y)
    c.check("DETAIL: the group goes on", torch.equal(y, torch.full((2,), float(ws))))


def _everything(_comm, parts):
    import torch.distributed as dist

    pg, gloo = _init()
    ctx = harness.context()
    rank, ws = ctx.rank, ctx.world_size
    c = _Checker(pg, gloo)
    if "lookups" in parts:
        _lookups(c, pg, rank, ws)
    if "profiler" in parts:
        _profiler(c, rank, ws)
    if "monitored" in parts:
        _monitored(c, pg, rank, ws)
    if "sparse" in parts:
        _sparse(c, pg, gloo, rank, ws)
    if "timeouts" in parts:
        _timeouts(c, rank, ws)
    if "async_save" in parts:
        _async_save(c, rank, ws)
    if "detail" in parts:
        _detail(c, rank, ws)
    dist.destroy_process_group()
    return c.fails if c.count else ["no case ran"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_torch_lookups_monitored_barrier_sparse(world_size):
    parts = ("lookups", "profiler", "monitored", "sparse", "timeouts", "async_save")
    harness.assert_no_failures(
        harness.run_ranks(_everything, world_size, (parts,), init=False, hard_timeout=150))


def test_torch_debug_detail_checks_collectives():
    harness.assert_no_failures(harness.run_ranks(_everything, 2, (("detail",),), init=False, hard_timeout=90,
                                                 env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}))
