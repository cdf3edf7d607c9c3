"""The plan cache (csrc/comm/plan_cache.h): a repeated call's plan comes from the cache
instead of being planned again, and must be the plan planned afresh, step for step.

Plans name the call's buffers by id and offset (csrc/algo/step.h), so a kept plan is run
as it stands on every later call's buffers. The first half drives the native checker
(csrc/testing/plan_cache_check.h: one rank's cache, each plan it hands out compared with
plan_call's fresh one) over every op, schedule family, world size 1-9, rank, count,
root, ring order and buffer form (present or absent, in place or not), and checks which
calls hit or miss. No process is spawned for it.

The second half runs the collective matrix (every primitive, op, count, root and
in-place form; one dtype per element size) twice on spawned ranks (world sizes 1-5, the
harness's hard timeouts) with the cache on, against numpy references, and reads the
communicators' counters: with room for every signature the second pass is all hits (kept
plans run on the fresh buffers of the second pass); with the default 64 plans, plans are
evicted and the results stay right. With RINGCOMM_PLAN_CACHE=0 nothing is counted and the
results are the same."""

import random

import numpy as np
import pytest

import checks
import harness
from ringcomm import _C_testing

SLICE = 16  # elements per ring round per block: larger counts take several rounds
FAMILIES = {
    "all_reduce": ["auto", "ring", "oneshot", "pull", "recursive_doubling", "rabenseifner", "hierarchical"],
    "reduce_scatter": ["auto", "ring", "pull", "hierarchical"],
    "all_gather": ["auto", "ring", "pull", "bruck", "hierarchical"],
    "broadcast": ["auto", "ring", "pull", "tree", "hierarchical"],
    "reduce": ["auto", "ring", "pull", "tree", "hierarchical"],
    "scatter": ["auto", "pull"],
    "gather": ["auto", "pull"],
    "all_to_all": ["auto", "pull"],
    "barrier": ["auto"],
}
ROOTED = {"broadcast", "reduce", "scatter", "gather"}
IN_PLACE = {"reduce_scatter", "all_gather", "scatter", "gather"}
WORLDS = range(1, 10)


def _counts(world):
    return sorted({0, 1, world - 1, 37, world * SLICE * 3 + 5})


def _ring(world, shuffled):
    if not shuffled or world == 1:
        return None
    order = list(range(world))
    random.Random(world).shuffle(order)
    return order if order != sorted(order) else order[1:] + order[:1]


def _hosts(world):
    """Two hosts, the second with fewer ranks (uneven: the hierarchical schedules' rounds)."""
    return [0 if r < (world + 1) // 2 else 1 for r in range(world)]


def _buffers(op, rank, root):
    """(has_out, has_in) for the call as the communicator passes it."""
    has_out, has_in = True, True
    if op in ("all_reduce", "broadcast", "reduce", "barrier"):
        has_in = False
    if op == "barrier":
        has_out = False
    if op == "scatter" and rank != root:
        has_in = False
    if op == "gather" and rank != root:
        has_out = False
    return has_out, has_in


def _cases(op, world, rank):
    roots = range(world) if op in ROOTED else [-1]
    for root in roots:
        forms = [False]
        if op in IN_PLACE and (op not in ("scatter", "gather") or rank == root):
            forms.append(True)
        for in_place in forms:
            for count in (_counts(world) if op != "barrier" else [0]):
                if op == "all_to_all":
                    count *= world
                yield root, in_place, count


@pytest.mark.parametrize("op", sorted(FAMILIES))
def test_every_cached_plan_is_the_fresh_plan(op):
    """Each call twice: a miss that keeps the plan, then a hit; both the fresh plan. Pull
    plans are kept too (they name the address table by id and publish the run's address)."""
    checked = hits = 0
    for algo in FAMILIES[op]:
        for world in WORLDS:
            for shuffled in (False, True):
                ring = _ring(world, shuffled)
                if shuffled and ring is None:
                    continue
                hosts = _hosts(world) if algo == "hierarchical" else None
                for rank in range(world):
                    ch = _C_testing.PlanCacheChecker(rank, world, capacity=4096, ring=ring, hosts=hosts, slice_elems=SLICE)
                    for root, in_place, count in _cases(op, world, rank):
                        has_out, has_in = _buffers(op, rank, root)
                        # Empty buffers never overlap: count 0 has one form.
                        seen = in_place and count == 0
                        for i in range(2):
                            what = (f"{op} algo={algo} world={world} rank={rank} ring={ring} root={root} "
                                    f"count={count} in_place={in_place} call {i + 1}")
                            res = ch.plan(op, algo, count=count, elem_size=4, root=root, avg=op != "reduce",
                                          has_out=has_out, has_in=has_in, in_place=in_place)
                            assert res["mismatch"] == "", f"{what}: {res['mismatch']}"
                            assert res["kept"], f"{what}: the plan was not kept"
                            assert res["hit"] == (i > 0 or seen), f"{what}: hit={res['hit']}"
                            checked += 1
                            hits += res["hit"]
                    assert ch.stats()["evictions"] == 0
    assert checked > 20 and hits >= checked // 2


def _checker(**kw):
    kw.setdefault("slice_elems", SLICE)
    return _C_testing.PlanCacheChecker(1, 4, **kw)


def _plan(ch, op, **kw):
    if op in ("all_reduce", "broadcast", "reduce"):
        kw.setdefault("has_in", False)
    res = ch.plan(op, **kw)
    assert res["mismatch"] == "", f"{op} {kw}: {res['mismatch']}"
    return res


def test_a_repeated_call_hits():
    ch = _checker()
    assert not _plan(ch, "all_reduce", algo="ring", count=1000)["hit"]
    for _ in range(3):
        assert _plan(ch, "all_reduce", algo="ring", count=1000)["hit"]
    assert ch.stats() == {"hits": 3, "misses": 1, "uncached": 0, "evictions": 0, "entries": 1,
                          "steps": ch.stats()["steps"], "capacity": 64}
    assert ch.stats()["steps"] > 0


@pytest.mark.parametrize("change", [
    {"count": 1001}, {"elem_size": 8}, {"elem_size": 2}, {"avg": True}, {"algo": "rabenseifner"},
    {"algo": "oneshot"}, {"algo": "hierarchical"},
])
def test_a_changed_signature_misses(change):
    ch = _checker(hosts=[0, 0, 1, 1])
    base = {"algo": "ring", "count": 1000, "elem_size": 4, "avg": False}
    _plan(ch, "all_reduce", **base)
    assert not _plan(ch, "all_reduce", **{**base, **change})["hit"], change
    # Both are kept: each repeats as a hit.
    assert _plan(ch, "all_reduce", **base)["hit"]
    assert _plan(ch, "all_reduce", **{**base, **change})["hit"]


@pytest.mark.parametrize("op", ["broadcast", "reduce", "scatter", "gather"])
def test_roots_do_not_share_plans(op):
    ch = _checker()
    for again in (False, True):
        for root in range(4):
            has_out = not (op == "gather" and root != 1)
            has_in = op in ("scatter", "gather") and not (op == "scatter" and root != 1)
            res = ch.plan(op, count=50, root=root, has_out=has_out, has_in=has_in)
            assert res["mismatch"] == "" and res["hit"] == again, (root, res)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "scatter", "gather"])
def test_in_place_and_out_of_place_do_not_collide(op):
    """The in-place form skips this rank's own copy (the block is already there): a plan
    of one form handed to the other would copy a block onto itself or leave it out."""
    ch = _checker()
    kw = {"root": 1} if op in ("scatter", "gather") else {}
    a = _plan(ch, op, count=40, in_place=False, **kw)
    b = _plan(ch, op, count=40, in_place=True, **kw)
    assert not a["hit"] and not b["hit"]
    assert ch.stats()["entries"] == 2
    for _ in range(2):
        assert _plan(ch, op, count=40, in_place=False, **kw)["hit"]
        assert _plan(ch, op, count=40, in_place=True, **kw)["hit"]
    if op != "reduce_scatter":  # (the ring reduce_scatter's two forms happen to plan alike)
        fresh = _C_testing.PlanCacheChecker(1, 4, capacity=0, slice_elems=SLICE)
        steps = [fresh.plan(op, count=40, in_place=f, **kw)["steps"] for f in (False, True)]
        assert steps[0] != steps[1], "the two forms plan alike: this test would not see them collide"


def test_barrier_is_planned_and_kept():
    """The barrier goes through plan_call and the cache like every other call."""
    for world in (1, 2, 5, 8):
        ch = _C_testing.PlanCacheChecker(0, world, slice_elems=SLICE)
        first = ch.plan("barrier", has_out=False, has_in=False)
        again = ch.plan("barrier", has_out=False, has_in=False)
        assert first["mismatch"] == again["mismatch"] == ""
        assert not first["hit"] and again["hit"] and first["kept"]
        # log2(world) rounds of send, recv, fence.
        assert first["steps"] == 3 * (world - 1).bit_length(), (world, first)


def test_the_least_recently_used_plan_goes_first():
    ch = _checker(capacity=3)
    for n in (10, 20, 30):
        _plan(ch, "all_reduce", algo="ring", count=n)
    assert _plan(ch, "all_reduce", algo="ring", count=10)["hit"]  # 10 is now the most recent
    _plan(ch, "all_reduce", algo="ring", count=40)  # evicts 20
    s = ch.stats()
    assert (s["entries"], s["evictions"]) == (3, 1)
    assert _plan(ch, "all_reduce", algo="ring", count=10)["hit"]
    assert _plan(ch, "all_reduce", algo="ring", count=30)["hit"]
    assert not _plan(ch, "all_reduce", algo="ring", count=20)["hit"]


def test_the_step_budget_bounds_the_cache():
    ch = _checker(max_steps=200)
    big = _plan(ch, "all_reduce", algo="ring", count=100000)
    assert big["steps"] > 200 and not big["kept"]
    assert not _plan(ch, "all_reduce", algo="ring", count=100000)["hit"]  # planned afresh every time
    small = [_plan(ch, "all_reduce", algo="ring", count=n) for n in (1000, 1500, 1700, 500)]
    assert all(r["kept"] for r in small)
    s = ch.stats()
    assert s["steps"] <= 200 and s["evictions"] > 0 and s["uncached"] == 2


def test_capacity_zero_turns_the_cache_off():
    ch = _checker(capacity=0)
    for _ in range(3):
        res = _plan(ch, "all_reduce", algo="ring", count=1000)
        assert not res["hit"] and not res["kept"]
    assert ch.stats() == {"hits": 0, "misses": 0, "uncached": 0, "evictions": 0, "entries": 0, "steps": 0,
                          "capacity": 0}


@pytest.mark.parametrize("field", ["dst", "src", "nbytes", "after"])
def test_the_checker_sees_a_wrong_plan(field):
    """The comparison can fail: a kept plan changed in one field is reported, naming
    the step and the field."""
    ch = _checker()
    args = dict(op="all_reduce", algo="ring", count=1000, has_in=False)
    assert ch.plan(**args)["steps"] > 5
    res = ch.plan(tamper=(5, field), **args)
    assert res["hit"]
    assert res["mismatch"].startswith(f"step 5: {field} is "), res["mismatch"]
    assert ch.plan(**args)["mismatch"] == ""  # the cache's copy was not changed


def test_checker_refuses_bad_calls():
    with pytest.raises(ValueError, match="root"):
        _checker().plan("broadcast", count=4, root=4)
    with pytest.raises(ValueError):
        _checker().plan("scatter", algo="bruck")
    with pytest.raises(ValueError, match="in-place"):
        _checker().plan("all_reduce", count=4, has_in=False, in_place=True)
    with pytest.raises(ValueError, match="permutation"):
        _C_testing.PlanCacheChecker(0, 3, ring=[0, 1, 1])


# ----------------------------------------------------------- spawned ranks

# Fewer dtypes than the full matrix (the plan depends only on the element size: one
# dtype of each size), every primitive, op, count, root and in-place form.
MATRIX = dict(dtypes=("int8", "float16", "float32", "float64", "bool"), counts=(0, 1, 7, 1000, 20011))


def _twice(comm):
    first = checks.collective_matrix(comm, tag="twice ", **MATRIX)
    s1 = comm.plan_cache_stats()
    second = checks.collective_matrix(comm, tag="twice ", **MATRIX)  # the same calls, fresh buffers
    s2 = comm.plan_cache_stats()
    return first + second, s1, s2, comm.pull_enabled


def _stats_failures(results, capacity, exact):
    """`exact`: the cache holds every signature of the matrix, so the second pass
    plans the same calls and every one hits."""
    failures = []
    for rank, (_, s1, s2, _) in enumerate(results):
        planned_first = s1["hits"] + s1["misses"] + s1["uncached"]
        planned_second = s2["hits"] + s2["misses"] + s2["uncached"] - planned_first
        hits_second = s2["hits"] - s1["hits"]
        if capacity == 0:
            if any(s2[k] for k in ("hits", "misses", "uncached", "entries")) or s2["capacity"] != 0:
                failures.append(f"rank {rank}: the cache is off but counted {s2}")
            continue
        if s2["entries"] > capacity:
            failures.append(f"rank {rank}: {s2['entries']} plans held, more than {capacity}")
        if not exact:
            if planned_second == 0 or hits_second == 0:
                failures.append(f"rank {rank}: no hit in the second pass: {s1} then {s2}")
            continue
        if planned_first == 0 or planned_second != planned_first:
            failures.append(f"rank {rank}: {planned_first} calls planned in the first pass, {planned_second} "
                            f"in the second ({s1} then {s2})")
        if s2["misses"] != s1["misses"] or s2["evictions"] != 0 or s2["uncached"] != s1["uncached"]:
            failures.append(f"rank {rank}: the second pass missed: {s1} then {s2}")
        if hits_second != planned_second:
            failures.append(f"rank {rank}: not every call hit the second time: {s1} then {s2}")
    return failures


def _run_twice(world_size, env, exact=True, hard_timeout=240):
    capacity = int(env.get("RINGCOMM_PLAN_CACHE", 64))
    results = harness.run_ranks(_twice, world_size, env=env, comm_timeout=30.0, hard_timeout=hard_timeout)
    harness.assert_no_failures([r[0] for r in results])
    failures = _stats_failures(results, capacity, exact)
    assert not failures, "\n".join(failures)
    return results


# Every call is planned, the small synchronous all_reduce run inline included (its
# one-shot plan comes from the cache like any other).
# Exact counts need the same pick for a signature on both passes: the tuner
# (comm/autotune.h), which may move a signature to another family between
# them, is off (tests/test_autotune.py has it on).
EXACT = {"RINGCOMM_PLAN_CACHE": "4096", "RINGCOMM_AUTOTUNE": "0"}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_matrix_twice_with_the_cache_on(world_size):
    """Every primitive against numpy, twice; the second pass is all hits (the cache
    holds every signature of the matrix: no eviction)."""
    _run_twice(world_size, EXACT)


def test_matrix_with_forced_families_twice():
    """The families auto rarely picks at these sizes: trees, Bruck, Rabenseifner, with
    tiny slots (many ring rounds)."""
    _run_twice(3, {**EXACT, "RINGCOMM_SLOT_BYTES": "256", "RINGCOMM_SLOTS": "4",
                   "RINGCOMM_ALGO": "all_reduce:rabenseifner,broadcast:tree,reduce:tree,all_gather:bruck"})


def test_matrix_twice_with_default_tuning():
    """The default cache (64 plans, fewer than the matrix's signatures: plans are
    evicted and planned again): results right, hits."""
    results = _run_twice(4, {}, exact=False)
    assert all(r[2]["evictions"] > 0 and r[2]["entries"] == 64 for r in results), [r[2] for r in results]


def test_matrix_with_the_cache_off():
    _run_twice(3, {"RINGCOMM_PLAN_CACHE": "0"}, exact=False)


def test_pull_plans_are_kept():
    """Pull schedules are kept like the others (their steps name the address table by
    id; the address each run publishes is that run's buffer's): the second pass hits,
    the results right on its fresh buffers."""
    results = harness.run_ranks(_twice, 2, env={"RINGCOMM_ALGO": "pull", "RINGCOMM_PULL_MIN_BYTES": "1",
                                                "RINGCOMM_AUTOTUNE": "0",
                                                "RINGCOMM_PLAN_CACHE": "4096"},
                                comm_timeout=30.0, hard_timeout=240)
    harness.assert_no_failures([r[0] for r in results])
    if not all(r[3] for r in results):
        pytest.skip("single-copy pulls are not available here (cross-memory attach)")
    failures = _stats_failures(results, 4096, True)
    assert not failures, "\n".join(failures)


def _kept_plans_on_fresh_buffers(comm):
    """One signature, run on different buffers each time (the kept plan resolves them
    per run); in place and out of place; the barrier; async calls queued in front of a
    small synchronous all_reduce (the worker runs the queue; the same one-shot plan)."""
    n, r = comm.world_size, comm.rank
    fails = []
    s0 = comm.plan_cache_stats()
    for i in range(4):
        x = np.full(33, r + i, np.float32)
        comm.all_reduce(x)
        if not (x == n * i + n * (n - 1) / 2).all():
            fails.append(f"all_reduce call {i}: {x[:4]}")
    s1 = comm.plan_cache_stats()
    if s1["hits"] - s0["hits"] < 3:
        fails.append(f"all_reduce on fresh buffers did not hit: {s0} then {s1}")
    for i in range(3):
        # Out of place, then in place (input = this rank's block of the output).
        out = np.zeros(5 * n, np.int32)
        comm.all_gather(out, np.full(5, 10 * r + i, np.int32))
        exp = np.repeat(np.arange(n, dtype=np.int32) * 10 + i, 5)
        if not (out == exp).all():
            fails.append(f"all_gather out of place, call {i}: {out}")
        buf = np.full(5 * n, -1, np.int32)
        buf[5 * r:5 * r + 5] = 10 * r + i
        comm.all_gather(buf, buf[5 * r:5 * r + 5])
        if not (buf == exp).all():
            fails.append(f"all_gather in place, call {i}: {buf}")
    s2 = comm.plan_cache_stats()
    comm.barrier()
    comm.barrier()
    s3 = comm.plan_cache_stats()
    if s3["hits"] - s2["hits"] != 1 or s3["misses"] - s2["misses"] != 1:
        fails.append(f"two barriers: not one miss then one hit: {s2} then {s3}")
    for it in range(3):
        a = np.full(1000, r + it, np.float64)
        b = np.full(2, 2 * r + it, np.int32)
        if r == 0:
            w = comm.all_reduce(a, async_op=True)  # rank 0's next call queues behind it
            comm.all_reduce(b)
            w.wait()
        else:
            comm.all_reduce(a)
            comm.all_reduce(b)
        if not (a == n * it + n * (n - 1) / 2).all() or not (b == n * (n - 1) + n * it).all():
            fails.append(f"queued and inline calls, round {it}: {a[:3]}, {b}")
    return fails


@pytest.mark.parametrize("world_size", [2, 3])
def test_kept_plans_run_on_fresh_buffers(world_size):
    results = harness.run_ranks(_kept_plans_on_fresh_buffers, world_size, env={}, comm_timeout=30.0,
                                hard_timeout=120)
    harness.assert_no_failures(results)


def _memo_plans_across_evictions(comm):
    """The in-place ops' check memo hands a repeated call the plan its signature ran last
    (csrc/comm/communicator_run.cpp), only while the cache still keeps it: with room
    for one plan, an out-of-place call in between (which the memo does not see) evicts
    it, and the next in-place call is planned again, and right."""
    n, r = comm.world_size, comm.rank
    fails = []

    def stats():
        return comm.plan_cache_stats()

    for op in ("all_reduce", "broadcast", "reduce"):
        for rnd in range(3):
            s0 = stats()
            for i in range(3):
                x = np.full(7, r + i + rnd, np.float32)
                if op == "all_reduce":
                    comm.all_reduce(x)
                    ok = (x == n * (i + rnd) + n * (n - 1) / 2).all()
                elif op == "broadcast":
                    comm.broadcast(x, src=n - 1)
                    ok = (x == n - 1 + i + rnd).all()
                else:
                    comm.reduce(x, dst=0)
                    ok = (x == n * (i + rnd) + n * (n - 1) / 2).all() if r == 0 else (x == r + i + rnd).all()
                if not ok:
                    fails.append(f"{op} round {rnd} call {i}: {x}")
            s1 = stats()
            # The first call of a round plans (the plan was evicted), the other two hit.
            if (s1["misses"] - s0["misses"], s1["hits"] - s0["hits"]) != (1, 2):
                fails.append(f"{op} round {rnd}: not one miss then two hits: {s0} then {s1}")
            out = np.zeros(3 * n, np.int32)
            comm.all_gather(out, np.full(3, r, np.int32))  # evicts the in-place op's plan
            if not (out == np.repeat(np.arange(n, dtype=np.int32), 3)).all():
                fails.append(f"all_gather after {op}: {out}")
    if stats()["evictions"] < 9:
        fails.append(f"the cache of one plan evicted too little: {stats()}")
    return fails


@pytest.mark.parametrize("world_size", [2, 3])
def test_memo_plans_are_not_used_once_evicted(world_size):
    results = harness.run_ranks(_memo_plans_across_evictions, world_size, env={"RINGCOMM_PLAN_CACHE": "1"},
                                comm_timeout=30.0, hard_timeout=120)
    harness.assert_no_failures(results)
