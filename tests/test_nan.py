"""NaN semantics, one for every path (docs/usage.md "NaN", csrc/comm/chooser.h): NaN
propagates. SUM, PROD and AVG by IEEE arithmetic, MIN and MAX like torch.maximum /
numpy.maximum (never fmax's "drop the NaN"), whatever the operand order, so every
schedule gives the same NaN-ness on every rank: a NaN in one rank's input at one
position makes that position NaN on every rank that gets the result.

- the CPU kernels alone (both tables: AVX2 here, the baseline one in a subprocess),
  every floating dtype x op, NaN on either side, in place, across the vector body and
  the tail;
- every CPU schedule family, forced with init(algo=) or RINGCOMM_ALGO: all_reduce, reduce (every root
  in turn) and reduce_scatter with NaN (and inf - inf) planted in one or two ranks'
  inputs, on one host (world size 3: the non-power-of-two fix-ups) and across two
  "hosts" (world size 4: the hierarchical schedules, TCP between hosts);
- the GPU ring family's translation over the in-process NCCL stand-in;
- the GPU family choice: floating-point MIN/MAX never go to NCCL under auto, and
  forcing NCCL on them is refused.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import checks
import harness
from ringcomm import ReduceOp, _C, _C_testing

FLOATS = checks.FLOAT_DTYPES
ARITH = ("sum", "prod", "min", "max", "avg")
CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int8": 4, "uint8": 5,
         "int32": 6, "int64": 7, "bool": 8}

# ----------------------------------------------------------------- references


def _store(values, dtype):
    """float64 values rounded to `dtype` (bfloat16 through torch), returned in
    ref_np_dtype(dtype): what a kernel that computes wide and rounds once stores."""
    v = np.asarray(values, np.float64)
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).float().numpy()
    return v.astype(checks.ref_np_dtype(dtype))


def _nan_aware_diff(got, want, tol=None):
    """None if `got` has NaN exactly where `want` has, and equal values elsewhere."""
    g = checks.to_np(got).astype(np.float64)
    w = np.asarray(want, np.float64).reshape(-1)
    if g.shape != w.shape:
        return f"result has {g.size} elements, expected {w.size}"
    gn, wn = np.isnan(g), np.isnan(w)
    if not np.array_equal(gn, wn):
        i = int(np.flatnonzero(gn != wn)[0])
        return (f"NaN at {int(gn.sum())} positions, expected {int(wn.sum())}; first difference at [{i}]: "
                f"got {g[i]!r}, expected {w[i]!r}")
    if tol is None:
        ok = g[~gn] == w[~wn]
    else:
        ok = np.isclose(g[~gn], w[~wn], rtol=tol[0], atol=tol[1])
    if not ok.all():
        i = int(np.flatnonzero(~gn)[np.flatnonzero(~ok)[0]])
        return f"{int((~ok).sum())} values wrong; first at [{i}]: got {g[i]!r}, expected {w[i]!r}"
    return None


# ---------------------------------------------------------------- the kernels

# Every ordered pair of these meets in the kernel test: NaN against numbers, zeros of
# both signs, infinities and NaN itself.
SPECIAL = (np.nan, 1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, 3.0, -np.nan)


def _kernel_operands(n_repeat, offset):
    pairs = np.array([(x, y) for x in SPECIAL for y in SPECIAL], np.float64)
    a = np.concatenate([np.tile(pairs[:, 0], n_repeat), np.arange(offset, dtype=np.float64)])
    b = np.concatenate([np.tile(pairs[:, 1], n_repeat), np.full(offset, np.nan)])
    return a, b


def _kernel_reference(op, a, b, dtype, divisor):
    with np.errstate(invalid="ignore", over="ignore"):
        if op in ("sum", "avg"):
            r = _store(a + b, dtype)
            return _store(r.astype(np.float64) / divisor, dtype) if op == "avg" else r
        if op == "prod":
            return _store(a * b, dtype)
        return _store((np.minimum if op == "min" else np.maximum)(a, b), dtype)


def kernel_failures():
    """Every floating dtype x op of this process's kernel table (its name first)."""
    fails = [_C.build_info()["reduce_isa"]]
    divisor = 3
    for dtype in FLOATS:
        cont = checks.containers_for(dtype)[-1]
        for op in ARITH:
            # 81 pairs x repeats puts NaN in 16-wide vector bodies and in tails; the
            # offsets shift which lanes they land in.
            for n_repeat, offset in ((1, 0), (1, 5), (3, 13)):
                a, b = _kernel_operands(n_repeat, offset)
                want = _kernel_reference(op, _store(a, dtype), _store(b, dtype), dtype, divisor)
                want_swapped = _kernel_reference(op, _store(b, dtype), _store(a, dtype), dtype, divisor)
                for name, (x, y, ref) in {"a op b": (a, b, want), "b op a": (b, a, want_swapped)}.items():
                    bx, by = checks.make_buf(x, dtype, cont), checks.make_buf(y, dtype, cont)
                    dst = checks.empty_buf(x.size, dtype, cont)
                    _C.local_reduce(dst, bx, by, int(ReduceOp[op.upper()]), divisor)
                    err = _nan_aware_diff(dst, ref)
                    if err:
                        fails.append(f"{dtype} {op} {name} n={x.size}: {err}")
                    _C.local_reduce(bx, bx, by, int(ReduceOp[op.upper()]), divisor)  # in place, dst == a
                    err = _nan_aware_diff(bx, ref)
                    if err:
                        fails.append(f"{dtype} {op} {name} in place n={x.size}: {err}")
                # NaN-ness never depends on the order (the values may: MIN(-0, +0)).
                if not np.array_equal(np.isnan(want), np.isnan(want_swapped)):
                    fails.append(f"{dtype} {op}: the reference itself is order-dependent")
    return fails


def test_cpu_kernels_propagate_nan():
    fails = kernel_failures()
    assert fails[1:] == [], f"kernel table {fails[0]}:\n" + "\n".join(fails[1:40])


def test_baseline_kernels_propagate_nan():
    """The portable table (RINGCOMM_REDUCE_ISA=baseline; chosen once per process)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys; sys.path.insert(0, %r); import test_nan; print(repr(test_nan.kernel_failures()))" % here
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RINGCOMM_REDUCE_ISA": "baseline"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    fails = eval(r.stdout.strip().splitlines()[-1])  # a list of str printed by repr
    assert fails[0] == "baseline", fails[0]
    assert fails[1:] == [], "\n".join(fails[1:40])


# ------------------------------------------------------- collectives with NaN


def _planted(dtype, op, seed, world, n):
    """Every rank's input (world x n, ref dtype) with NaN planted in one or two
    ranks' inputs (and, for SUM / AVG / PROD, inf - inf or 0 * inf, which make NaN
    from numbers), and the NaN-propagating reference. Deterministic in `seed`, so
    every rank builds the same."""
    stack = np.stack([checks.gen(dtype, op, seed, q, 0, n) for q in range(world)]).astype(np.float64)
    if n:
        rng = np.random.default_rng(seed)
        spots = {0, n - 1, n // 2} | set(int(i) for i in rng.integers(0, n, 3))
        for i, pos in enumerate(sorted(spots)):
            q = (seed + i) % world
            stack[q, pos] = np.nan
            if i % 3 == 1:  # the same position NaN on a second rank too
                stack[(q + 1) % world, pos] = np.nan
        if n > 2 and world > 1:
            pos = int(rng.integers(0, n))
            if op in ("sum", "avg"):
                stack[0, pos], stack[world - 1, pos] = np.inf, -np.inf
            elif op == "prod":
                stack[:, pos] = 1.0
                stack[0, pos], stack[world - 1, pos] = 0.0, np.inf
            else:  # an infinity loses to NaN and wins against numbers
                stack[world - 1, pos] = np.inf if op == "max" else -np.inf
    with np.errstate(invalid="ignore"):
        if op in ("sum", "avg"):
            ref = stack.sum(axis=0)
            if op == "avg":
                ref = ref / world
        elif op == "prod":
            ref = stack.prod(axis=0)
        else:
            ref = (np.minimum if op == "min" else np.maximum).reduce(stack, axis=0)
    assert n == 0 or np.isnan(ref).any(), "no NaN planted"
    return [_store(row, dtype) for row in stack], _store(ref, dtype)


def nan_matrix(comm, prims, counts, tag):
    """all_reduce / reduce / reduce_scatter of every floating dtype x op x count with
    planted NaN; returns failure strings."""
    ws, r = comm.world_size, comm.rank
    fails = []
    i = 0
    for prim in prims:
        for dtype in FLOATS:
            for op in ARITH:
                for n in counts:
                    if n > 10000 and dtype not in ("float32", "bfloat16"):
                        continue
                    i += 1
                    cont = checks.containers_for(dtype)[i % len(checks.containers_for(dtype))]
                    seed = checks.seed_of("nan", tag, prim, dtype, op, n)
                    tol = checks.tolerance(dtype, op, ws)
                    desc = f"{tag}{prim} {dtype} {op} count={n} {cont}"
                    try:
                        if prim == "all_reduce":
                            rows, ref = _planted(dtype, op, seed, ws, n)
                            x = checks.make_buf(rows[r], dtype, cont)
                            comm.all_reduce(x, op=op)
                            err = _nan_aware_diff(x, ref, tol)
                        elif prim == "reduce":
                            root = i % ws
                            desc += f" root={root}"
                            rows, ref = _planted(dtype, op, seed, ws, n)
                            x = checks.make_buf(rows[r], dtype, cont)
                            comm.reduce(x, dst=root, op=op)
                            err = _nan_aware_diff(x, ref if r == root else rows[r], tol if r == root else None)
                            if err and r != root:
                                err = f"non-root rank's buffer changed: {err}"
                        else:
                            rows, ref = _planted(dtype, op, seed, ws, ws * n)
                            inp = checks.make_buf(rows[r], dtype, cont)
                            inplace = i % 2 == 1
                            desc += " in-place" if inplace else ""
                            out = checks.flat_view(inp)[r * n:(r + 1) * n] if inplace else checks.empty_buf(
                                n, dtype, cont)
                            comm.reduce_scatter(out, inp, op=op)
                            err = _nan_aware_diff(out, ref[r * n:(r + 1) * n], tol)
                    except Exception as e:  # noqa: BLE001
                        fails.append(f"{desc}: raised {type(e).__name__}: {checks.first_line(e)}")
                        return fails
                    if err:
                        fails.append(f"{desc}: {err}")
    return fails


# Which primitives each forced family serves (comm/algo_choice.cpp algo_has).
FAMILIES = {
    "auto": ("all_reduce", "reduce", "reduce_scatter"),
    "ring": ("all_reduce", "reduce", "reduce_scatter"),  # the chain for reduce
    "oneshot": ("all_reduce",),
    "recursive_doubling": ("all_reduce",),
    "rabenseifner": ("all_reduce",),
    "tree": ("reduce",),
    "pull": ("all_reduce", "reduce", "reduce_scatter"),
    "hierarchical": ("all_reduce", "reduce", "reduce_scatter"),
    "env": ("all_reduce", "reduce", "reduce_scatter"),  # init(algo=None): RINGCOMM_ALGO decides
}
# RINGCOMM_ALGO for the "env" communicator: one family per primitive.
ENV_ALGO = {"all_reduce": "rabenseifner", "reduce": "tree", "reduce_scatter": "hierarchical"}
EXPLAINED = {"all_reduce": "all_reduce", "reduce": "reduce", "reduce_scatter": "reduce_scatter"}


def _families_rank(_comm, families, counts):
    """One communicator per family (init(algo=family)) on this group; every rank runs
    the NaN matrix on each. Returns {"fails": [...], "msgs": [...]}."""
    import torch.distributed as dist

    import ringcomm

    ctx = harness.context()
    fails, msgs = [], []
    for fam in families:
        store = dist.PrefixStore(f"nan-{fam}", ctx.store)
        with ringcomm.init(rank=ctx.rank, world_size=ctx.world_size, store=store, timeout=30.0,
                           algo=None if fam == "env" else fam) as c:
            prims = FAMILIES[fam]
            # What the forced family really runs (the cost model's first entry).
            ran = sorted({c.explain(EXPLAINED[p], n * 4)[0][0] for p in prims for n in counts})
            msgs.append(f"algo={fam}: runs {', '.join(ran)}")
            if fam == "env":
                for p in prims:
                    got = {c.explain(EXPLAINED[p], n * 4)[0][0] for n in counts}
                    if got != {ENV_ALGO[p]}:
                        fails.append(f"RINGCOMM_ALGO: explain() says {p} runs {sorted(got)}")
            elif fam != "auto" and not any(fam in name for name in ran):
                fails.append(f"algo={fam}: explain() says the calls run {ran}")
            fails += nan_matrix(c, prims, counts, f"algo={fam} ")
    return {"fails": fails, "msgs": msgs}


def _run_families(world, families, counts, rank_env=None, hard_timeout=300):
    results = harness.run_ranks(_families_rank, world, (families, counts), init=False,
                                rank_env=rank_env, comm_timeout=30.0, hard_timeout=hard_timeout)
    harness.print_and_check(results)


def test_every_family_propagates_nan_on_one_host():
    """World size 3 (not a power of two: the doubling schedules' fix-ups run), every
    family one host has; sizes from the latency path to many pipelined chunks."""
    _run_families(3, ["auto", "ring", "oneshot", "recursive_doubling", "rabenseifner", "tree", "pull"],
                  (1, 7, 1000, 65537))


def test_every_family_propagates_nan_across_hosts():
    """Two "hosts" of two ranks, interleaved (TCP between them): the hierarchical
    schedules (intra-host reduce-scatter, inter-host all-reduce, trees of trees) next
    to the flat ones; and one communicator whose families come from RINGCOMM_ALGO."""
    algo = ",".join(f"{p}:{a}" for p, a in ENV_ALGO.items())
    hosts = {r: {"RINGCOMM_HOST_ID": f"h{r % 2}", "RINGCOMM_ALGO": algo} for r in range(4)}
    _run_families(4, ["auto", "hierarchical", "ring", "recursive_doubling", "tree", "env"], (1, 7, 1000, 20011),
                  rank_env=hosts)


# ------------------------------------------- the GPU ring family, on the stand-in


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_device_executor_propagates_nan(world):
    """The GPU ring family's translation (csrc/comm/device_executor.cpp) over the
    in-process NCCL stand-in: the same planted NaN, every family it runs."""
    fails = []
    for dtype in FLOATS:
        cont = checks.containers_for(dtype)[-1]
        for op in ARITH:
            tol = checks.tolerance(dtype, op, world)
            code = int(ReduceOp[op.upper()])
            for n in (1, 7, 1000):
                seed = checks.seed_of("nan-sim", world, dtype, op, n)
                for algo in ("auto", "recursive_doubling", "rabenseifner"):
                    rows, ref = _planted(dtype, op, seed, world, n)
                    bufs = [checks.make_buf(v, dtype, cont) for v in rows]
                    _C_testing._simulate_device_call("all_reduce", bufs, [None] * world, code, -1, 256, 10.0, algo)
                    for r in range(world):
                        err = _nan_aware_diff(bufs[r], ref, tol)
                        if err:
                            fails.append(f"all_reduce {algo} {dtype} {op} n={n} rank {r}: {err}")
                for algo in ("auto", "tree"):
                    root = seed % world
                    rows, ref = _planted(dtype, op, seed, world, n)
                    bufs = [checks.make_buf(v, dtype, cont) for v in rows]
                    _C_testing._simulate_device_call("reduce", bufs, [None] * world, code, root, 256, 10.0, algo)
                    err = _nan_aware_diff(bufs[root], ref, tol)
                    if err:
                        fails.append(f"reduce {algo} {dtype} {op} n={n} root {root}: {err}")
                rows, ref = _planted(dtype, op, seed, world, world * n)
                ins = [checks.make_buf(v, dtype, cont) for v in rows]
                outs = [checks.empty_buf(n, dtype, cont) for _ in range(world)]
                _C_testing._simulate_device_call("reduce_scatter", outs, ins, code, -1, 256, 10.0)
                for r in range(world):
                    err = _nan_aware_diff(outs[r], ref[r * n:(r + 1) * n], tol)
                    if err:
                        fails.append(f"reduce_scatter {dtype} {op} n={n} rank {r}: {err}")
    assert not fails, "\n".join(fails[:40])


# ---------------------------------------------------------- the GPU family choice


def _family(algo, default, dtype, op, reduces=True):
    """What a GPU call over NCCL runs: the one chooser (csrc/comm/chooser.h), as GpuCommunicator asks it."""
    return _C.choose_algo("nccl", "all_reduce" if reduces else "broadcast", 1024, CODES[dtype],
                          int(ReduceOp[op.upper()]), algo=algo, configured=default)


def test_gpu_auto_never_sends_floating_min_max_to_nccl():
    for dtype in CODES:
        for op in checks.ops_for(dtype):
            fam = _family("auto", "auto", dtype, op)
            if dtype in FLOATS and op in ("min", "max"):
                assert fam == "ring", (dtype, op)  # NCCL's drop NaN
            elif dtype == "bool" or op in ("band", "bor", "bxor"):
                assert fam == "ring", (dtype, op)  # NCCL has none
            else:
                assert fam == "nccl", (dtype, op)  # NCCL reduces alike: SUM, PROD, AVG; integer MIN/MAX
            assert _family("ring", "auto", dtype, op) == "ring"
            # The communicator's default (RINGCOMM_GPU_ALGO) stands in for a call's "auto".
            assert _family("auto", "ring", dtype, op) == "ring"
            # Calls that only move data go to NCCL as bytes, whatever the dtype.
            assert _family("auto", "auto", dtype, op, reduces=False) == "nccl"
            assert _family("nccl", "ring", dtype, op, reduces=False) == "nccl"


@pytest.mark.parametrize("how", ["per call", "communicator default"])
def test_forcing_nccl_on_floating_min_max_is_refused(how):
    args = ("nccl", "auto") if how == "per call" else ("auto", "nccl")
    named = "algo='nccl'" if how == "per call" else "RINGCOMM_GPU_ALGO=nccl"
    for dtype in FLOATS:
        for op in ("min", "max"):
            with pytest.raises(ValueError, match="drops NaN") as e:
                _family(*args, dtype, op)
            assert dtype in str(e.value) and named in str(e.value) and "algo='ring'" in str(e.value)
        for op in ("sum", "prod", "avg"):
            assert _family(*args, dtype, op) == "nccl"
    for dtype in checks.INT_DTYPES:
        assert _family(*args, dtype, "max") == "nccl" and _family(*args, dtype, "min") == "nccl"
        with pytest.raises(ValueError, match="NCCL has no reduce op bxor"):
            _family(*args, dtype, "bxor")
    with pytest.raises(ValueError, match="NCCL has no dtype bool"):
        _family(*args, "bool", "max")


def test_gpu_family_arguments_are_checked():
    with pytest.raises(ValueError, match="not one of auto, nccl, ring"):
        _C.choose_algo("nccl", "all_reduce", 4, 2, 0, algo="fast")
    with pytest.raises(ValueError, match="RINGCOMM_GPU_ALGO='tree' is not one of auto, nccl, ring"):
        _C.choose_algo("nccl", "all_reduce", 4, 2, 0, configured="tree")
    with pytest.raises(ValueError, match="not a DataType"):
        _C.choose_algo("nccl", "all_reduce", 4, 9, 0)
    with pytest.raises(ValueError, match="needs the cuda_ipc transport"):
        _C.choose_algo("nccl", "all_reduce", 4, 2, 0, algo="oneshot")
    with pytest.raises(ValueError, match="needs the NCCL transport"):
        _C.choose_algo("cuda_ipc", "all_reduce", 4, 2, 0, algo="nccl", stage_bytes=1 << 20)
