"""The GPU "ring" family's translation of schedules into grouped transfers and kernels
(csrc/comm/device_executor.cpp), run on this machine over an in-process stand-in for
NCCL's point-to-point groups (csrc/testing/device_sim.cpp): every rank a thread, a group
done only once all its transfers matched their peers'. A translation that could
deadlock on GPUs times out here; results must equal the CPU path's references.

World sizes 2-8 (a real GPU run of these needs one GPU per rank), chunks small enough
that every step is cut into many, every collective of the family, every root."""

import numpy as np
import pytest

import checks
from ringcomm import ReduceOp, _C_testing

CHUNK = 256  # bytes: many chunks per step even for small counts


def _sim(kind, outs, ins, op=ReduceOp.SUM, root=-1, chunk=CHUNK):
    _C_testing._simulate_device_call(kind, outs, ins, int(op), root, chunk, 10.0)


def _inputs(dtype, op, world, n, seed):
    return [checks.gen(dtype, op, seed, r, 0, n) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_reductions_match_references(world):
    for dtype in ("float32", "int32", "bfloat16", "float64"):
        cont = checks.containers_for(dtype)[0]  # torch for bfloat16
        for op in checks.ops_for(dtype):
            for n in (0, 1, 7, 1000, 4099):
                vals = _inputs(dtype, op, world, n * world, checks.seed_of("ar", dtype, op, n))
                stack = np.stack(vals)
                ref = checks.reference(op, stack, dtype, world)
                tol = checks.tolerance(dtype, op, world)
                # all_reduce: in place on every rank.
                bufs = [checks.make_buf(v, dtype, cont) for v in vals]
                _sim("all_reduce", bufs, [None] * world, ReduceOp[op.upper()])
                for r in range(world):
                    err = checks.compare(bufs[r], ref, tol)
                    assert err is None, f"all_reduce {dtype} {op} n={n} rank {r}: {err}"
                # reduce_scatter: block r of the reduction on rank r.
                outs = [checks.empty_buf(n, dtype, cont) for _ in range(world)]
                ins = [checks.make_buf(v, dtype, cont) for v in vals]
                _sim("reduce_scatter", outs, ins, ReduceOp[op.upper()])
                for r in range(world):
                    err = checks.compare(outs[r], ref[r * n:(r + 1) * n], tol)
                    assert err is None, f"reduce_scatter {dtype} {op} n={n} rank {r}: {err}"
                # reduce to every root.
                for root in range(world):
                    bufs = [checks.make_buf(v, dtype, cont) for v in vals]
                    _sim("reduce", bufs, [None] * world, ReduceOp[op.upper()], root)
                    err = checks.compare(bufs[root], ref, tol)
                    assert err is None, f"reduce {dtype} {op} n={n} root {root}: {err}"


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_data_movement_matches_references(world):
    for n in (0, 1, 5, 1000, 3001):
        vals = [np.arange(n, dtype=np.int32) + 1000 * r for r in range(world)]
        # all_gather
        outs = [np.zeros(world * n, np.int32) for _ in range(world)]
        _sim("all_gather", outs, vals)
        for r in range(world):
            assert np.array_equal(outs[r], np.concatenate(vals)), f"all_gather n={n} rank {r}"
        for root in range(world):
            # broadcast
            bufs = [v.copy() for v in vals]
            _sim("broadcast", bufs, [None] * world, root=root)
            assert all(np.array_equal(b, vals[root]) for b in bufs), f"broadcast n={n} root {root}"
            # scatter: the root's input is world blocks
            big = np.arange(world * n, dtype=np.int32)
            outs = [np.zeros(n, np.int32) for _ in range(world)]
            _sim("scatter", outs, [big if r == root else None for r in range(world)], root=root)
            for r in range(world):
                assert np.array_equal(outs[r], big[r * n:(r + 1) * n]), f"scatter n={n} root {root} rank {r}"
            # gather
            outs = [np.zeros(world * n, np.int32) if r == root else None for r in range(world)]
            _sim("gather", outs, vals, root=root)
            assert np.array_equal(outs[root], np.concatenate(vals)), f"gather n={n} root {root}"
        # all_to_all: block j of rank i's input goes to rank j's block i.
        ins = [np.arange(world * n, dtype=np.int32) + 100000 * r for r in range(world)]
        outs = [np.zeros(world * n, np.int32) for _ in range(world)]
        _sim("all_to_all", outs, ins)
        for j in range(world):
            want = np.concatenate([ins[i][j * n:(j + 1) * n] for i in range(world)])
            assert np.array_equal(outs[j], want), f"all_to_all n={n} rank {j}"


def test_every_rank_gets_the_same_bits():
    """Float sums depend on the fold order; the ring reduces each block once and then
    passes the result around, so every rank must hold the same bits."""
    world, n = 4, 4099
    vals = [np.random.default_rng(r).standard_normal(n).astype(np.float32) * 1e4 for r in range(world)]
    bufs = [v.copy() for v in vals]
    _sim("all_reduce", bufs, [None] * world)
    assert all(np.array_equal(bufs[0], b) for b in bufs[1:])


def test_chunk_size_is_checked():
    with pytest.raises(ValueError, match="multiple of 64"):
        _sim("all_reduce", [np.zeros(4, np.float32)] * 2, [None] * 2, chunk=100)


def test_mismatched_sizes_are_reported_not_hung():
    """Ranks that disagree on the count fail (sizes differ, or a rank waits for a
    transfer that never comes: the simulated group times out)."""
    with pytest.raises(Exception, match="sim"):
        _C_testing._simulate_device_call("broadcast", [np.zeros(100, np.int32), np.zeros(99, np.int32)], [None, None],
                                 0, 0, CHUNK, 2.0)


def _sim_algo(kind, outs, ins, op, root, algo):
    _C_testing._simulate_device_call(kind, outs, ins, int(op), root, CHUNK, 10.0, algo)


@pytest.mark.parametrize("algo", ["recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_doubling_runs_on_the_device_executor(world, algo):
    """The same recursive doubling / Rabenseifner schedules the CPU runs, through the
    GPU family's translation (groups honour `after`): references, identical bits on
    every rank."""
    for dtype in ("float32", "int32", "bfloat16"):
        cont = checks.containers_for(dtype)[0]
        for op in checks.ops_for(dtype):
            for n in (0, 1, 7, 1000):
                vals = _inputs(dtype, op, world, n, checks.seed_of("rd", dtype, op, n))
                ref = checks.reference(op, np.stack(vals), dtype, world)
                tol = checks.tolerance(dtype, op, world)
                bufs = [checks.make_buf(v, dtype, cont) for v in vals]
                _sim_algo("all_reduce", bufs, [None] * world, ReduceOp[op.upper()], -1, algo)
                for r in range(world):
                    err = checks.compare(bufs[r], ref, tol)
                    assert err is None, f"{algo} {dtype} {op} n={n} rank {r}: {err}"
                    assert checks.to_np(bufs[r]).tobytes() == checks.to_np(bufs[0]).tobytes(), \
                        f"{algo} {dtype} {op} n={n}: rank {r}'s bits differ from rank 0's"


@pytest.mark.parametrize("world", [2, 3, 6, 7])
def test_trees_run_on_the_device_executor(world):
    for dtype in ("float32", "int64"):
        for n in (0, 1, 1000):
            for root in range(world):
                vals = _inputs(dtype, "sum", world, n, checks.seed_of("tree", dtype, n, root))
                bufs = [checks.make_buf(v, dtype, "numpy") for v in vals]
                _sim_algo("broadcast", bufs, [None] * world, ReduceOp.SUM, root, "tree")
                for r in range(world):
                    assert (checks.to_np(bufs[r]) == vals[root]).all(), f"tree broadcast n={n} root {root} rank {r}"
                ref = checks.reference("sum", np.stack(vals), dtype, world)
                bufs = [checks.make_buf(v, dtype, "numpy") for v in vals]
                _sim_algo("reduce", bufs, [None] * world, ReduceOp.SUM, root, "tree")
                err = checks.compare(bufs[root], ref, checks.tolerance(dtype, "sum", world))
                assert err is None, f"tree reduce n={n} root {root}: {err}"
                for r in range(world):
                    if r != root:
                        assert (checks.to_np(bufs[r]) == vals[r]).all(), f"tree reduce wrote rank {r}'s buffer"


@pytest.mark.parametrize("world", [2, 3, 5, 7, 8])
def test_bruck_all_gather_runs_on_the_device_executor(world):
    for n in (0, 1, 5, 1000):
        vals = [np.arange(n, dtype=np.int32) + 1000 * r for r in range(world)]
        outs = [np.zeros(n * world, np.int32) for _ in range(world)]
        _sim_algo("all_gather", outs, vals, ReduceOp.SUM, -1, "bruck")
        for r in range(world):
            assert np.array_equal(outs[r], np.concatenate(vals)), f"bruck all_gather n={n} rank {r}"
