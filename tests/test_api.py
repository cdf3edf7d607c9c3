"""The public surface: names, init variants (store + timedelta, torchrun environment),
the default communicator, the context manager, close() and finalize()."""

import time
from datetime import timedelta

import numpy as np

import harness
from checks import ALL_OPS, first_line


def test_public_names():
    import ringcomm

    for name in ("init", "finalize", "Communicator", "Work", "ReduceOp", "RingcommError",
                 "TimeoutError", "all_reduce", "reduce_scatter", "all_gather", "broadcast",
                 "reduce", "scatter", "gather", "all_to_all", "send", "recv", "barrier"):
        assert hasattr(ringcomm, name), f"ringcomm.{name} is missing"
    assert issubclass(ringcomm.TimeoutError, ringcomm.RingcommError)
    assert issubclass(ringcomm.RingcommError, Exception)
    for op in ALL_OPS:
        assert hasattr(ringcomm.ReduceOp, op.upper()), f"ReduceOp.{op.upper()} is missing"
    for method in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter",
                   "gather", "all_to_all", "send", "recv", "barrier", "split", "close",
                   "__enter__", "__exit__"):
        assert hasattr(ringcomm.Communicator, method), f"Communicator.{method} is missing"
    for method in ("wait", "is_completed", "exception"):
        assert hasattr(ringcomm.Work, method), f"Work.{method} is missing"


def _expect_refused(fails, what, call):
    t0 = time.monotonic()
    try:
        call()
        fails.append(f"{what}: succeeded")
    except Exception as e:  # noqa: BLE001 - any clear error, quickly
        if time.monotonic() - t0 > 2.0:
            fails.append(f"{what}: took {time.monotonic() - t0:.1f}s to raise {type(e).__name__}")
        return e


def _lifecycle(comm):
    import torch.distributed as dist

    import ringcomm

    ctx = harness.context()
    r, ws = ctx.rank, ctx.world_size
    total = float(ws * (ws + 1) // 2)
    fails = []

    def check(what, x, expected):
        if not np.array_equal(x, np.full(x.shape, expected, x.dtype)):
            fails.append(f"{what}: got {x}, expected {expected}")

    # init with any Store and a timedelta timeout; the module functions use it.
    c1 = ringcomm.init(rank=r, world_size=ws, store=dist.PrefixStore("a", ctx.store),
                       timeout=timedelta(seconds=20))
    if (c1.rank, c1.world_size) != (r, ws):
        fails.append(f"init: (rank, world_size) = ({c1.rank}, {c1.world_size}), expected ({r}, {ws})")
    x = np.full(3, r + 1.0, np.float32)
    ringcomm.all_reduce(x)
    check("module all_reduce on the default communicator", x, total)

    # Context manager; the last init() becomes the default communicator.
    with ringcomm.init(rank=r, world_size=ws, store=dist.PrefixStore("b", ctx.store),
                       timeout=20.0) as c2:
        x = np.full(3, r + 1, np.int64)
        ringcomm.all_reduce(x, op="max")
        check("module all_reduce after a second init", x, ws)
        x = np.full(3, r + 1.0, np.float64)
        ringcomm.all_reduce(x, comm=c1)
        check("the first communicator still works", x, total)
    _expect_refused(fails, "all_reduce on a communicator closed by `with`",
                    lambda: c2.all_reduce(np.ones(2, np.float32)))
    try:
        c2.close()
    except Exception as e:  # noqa: BLE001
        fails.append(f"second close() raised {type(e).__name__}: {first_line(e)}")

    # finalize() closes the default communicator.
    c3 = ringcomm.init(rank=r, world_size=ws, store=dist.PrefixStore("c", ctx.store), timeout=20.0)
    x = np.full(3, r + 1, np.int32)
    ringcomm.all_reduce(x)
    check("all_reduce on a third init", x, total)
    ringcomm.finalize()
    _expect_refused(fails, "module all_reduce after finalize()",
                    lambda: ringcomm.all_reduce(np.ones(2, np.float32)))
    _expect_refused(fails, "the finalized communicator", lambda: c3.all_reduce(np.ones(2, np.float32)))
    c1.close()
    return fails


def test_init_variants_context_manager_and_finalize():
    harness.assert_no_failures(harness.run_ranks(_lifecycle, 2, init=False, hard_timeout=90))


def _from_torchrun_env(comm):
    import ringcomm

    with ringcomm.init(timeout=20.0) as c:
        x = np.full(5, c.rank + 1, np.int64)
        c.all_reduce(x)
        return [c.rank, c.world_size, x.tolist()]


def test_init_from_torchrun_environment():
    ws = 3
    port = harness.free_port()
    env = {r: {"RANK": r, "WORLD_SIZE": ws, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": ws,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in range(ws)}
    res = harness.run_ranks(_from_torchrun_env, ws, init=False, rank_env=env, hard_timeout=90)
    assert res == [[r, ws, [6] * 5] for r in range(ws)]
