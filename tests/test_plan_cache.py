"""The plan cache (csrc/comm/plan_cache.h): a repeated call's plan is re-based from the
cache instead of planned again, and must be the plan planned afresh, step for step.

The first half drives the native checker (csrc/testing/plan_cache_check.h: one rank's cache
over fake buffers, never read or written, each plan it hands out compared with
plan_call's fresh one) over every op, schedule family, world size 1-9, rank, count, root,
ring order and in-place form, moving the buffers between calls as a training loop's
fresh tensors move; and checks which calls hit, miss or are never kept. No process is
spawned for it.

The second half runs the collective matrix (every primitive, op, count, root and
in-place form; one dtype per element size) twice on spawned ranks (world sizes 1-5, the
harness's hard timeouts) with the cache on, against numpy references, and reads the
communicators' counters: with room for every signature the second pass is all hits;
with the default 64 plans, plans are evicted and the results stay right. With
RINGCOMM_PLAN_CACHE=0 nothing is counted and the results are the same."""

import random

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
}
ROOTED = {"broadcast", "reduce", "scatter", "gather"}
IN_PLACE = {"reduce_scatter", "all_gather", "scatter", "gather"}
WORLDS = range(1, 10)
GB = 1 << 30


def _counts(world):
    return sorted({0, 1, world - 1, 37, world * SLICE * 3 + 5})


def _layouts():
    """Buffer addresses (out, in, scratch) of three calls: far apart; moved by odd
    amounts (a fresh tensor's address is anything); adjacent (in right after out)."""
    base = 0x7f00_0000_0000
    return [
        (base, base + 64 * GB, base + 128 * GB),
        (base + 7 * GB + 4100, base + 80 * GB + 12, base + 3 * GB + 68),
        (base + 200 * GB, base + 200 * GB + 8 * GB, base + 200 * GB + 24 * GB),
    ]


def _ring(world, shuffled):
    if not shuffled or world == 1:
        return None
    order = list(range(world))
    random.Random(world).shuffle(order)
    return order if order != sorted(order) else order[1:] + order[:1]


def _hosts(world):
    """Two hosts, the second with fewer ranks (uneven: the hierarchical schedules' rounds)."""
    return [0 if r < (world + 1) // 2 else 1 for r in range(world)]


def _buffers(op, rank, root, layout, in_place):
    """(out, in_) for the call as the communicator passes them: absent where the op has
    no such buffer on this rank, the in-place form derived by the checker."""
    out, inp, scratch = layout
    if op in ("all_reduce", "broadcast", "reduce"):
        inp = 0
    if op == "scatter" and rank != root:
        inp = 0
    if op == "gather" and rank != root:
        out = 0
    return out, inp, scratch


def _cases(op, world, rank):
    roots = range(world) if op in ROOTED else [-1]
    for root in roots:
        forms = [False]
        if op in IN_PLACE and (op not in ("scatter", "gather") or rank == root):
            forms.append(True)
        for in_place in forms:
            for count in _counts(world):
                if op == "all_to_all":
                    count *= world
                yield root, in_place, count


@pytest.mark.parametrize("op", sorted(FAMILIES))
def test_every_cached_plan_is_the_fresh_plan(op):
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
                        for i, layout in enumerate(_layouts()):
                            out, inp, scratch = _buffers(op, rank, root, layout, in_place)
                            what = (f"{op} algo={algo} world={world} rank={rank} ring={ring} root={root} "
                                    f"count={count} in_place={in_place} call {i + 1}")
                            res = ch.plan(op, algo, count=count, elem_size=4, root=root, avg=op != "reduce",
                                          out=out, in_=inp, scratch=scratch, in_place=in_place)
                            assert res["mismatch"] == "", f"{what}: {res['mismatch']}"
                            if algo == "pull":
                                assert not res["kept"] and not res["hit"], f"{what}: a pull plan was kept"
                            else:
                                assert res["kept"], f"{what}: the plan was not kept"
                                # Empty buffers never overlap: count 0 has one form.
                                again = i > 0 or (in_place and count == 0)
                                assert res["hit"] == again, f"{what}: hit={res['hit']}"
                            checked += 1
                            hits += res["hit"]
                    stats = ch.stats()
                    assert stats["evictions"] == 0
                    if algo == "pull":
                        assert stats["hits"] == stats["misses"] == stats["entries"] == 0
    assert checked > 100 and hits > checked // 4


def _checker(**kw):
    kw.setdefault("slice_elems", SLICE)
    return _C_testing.PlanCacheChecker(1, 4, **kw)


def _plan(ch, op, layout=0, **kw):
    out, inp, scratch = _layouts()[layout]
    if op in ("all_reduce", "broadcast", "reduce"):
        inp = 0
    res = ch.plan(op, out=out, in_=inp, scratch=scratch, **kw)
    assert res["mismatch"] == "", f"{op} {kw}: {res['mismatch']}"
    return res


def test_a_repeated_call_hits_whatever_its_buffers():
    ch = _checker()
    assert not _plan(ch, "all_reduce", 0, algo="ring", count=1000)["hit"]
    for layout in (1, 2, 0):
        assert _plan(ch, "all_reduce", layout, algo="ring", count=1000)["hit"]
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
    _plan(ch, "all_reduce", 0, **base)
    assert not _plan(ch, "all_reduce", 1, **{**base, **change})["hit"], change
    # Both are kept: each repeats as a hit.
    assert _plan(ch, "all_reduce", 2, **base)["hit"]
    assert _plan(ch, "all_reduce", 2, **{**base, **change})["hit"]


def test_the_element_type_is_not_part_of_the_signature():
    """int32 and float32 calls share a plan (plan_call sees only the element size);
    the checker compares it with the fresh plan anyway."""
    ch = _checker()
    _plan(ch, "all_reduce", 0, algo="ring", count=100, elem_size=4)
    assert _plan(ch, "all_reduce", 1, algo="ring", count=100, elem_size=4)["hit"]


@pytest.mark.parametrize("op", ["broadcast", "reduce", "scatter", "gather"])
def test_roots_do_not_share_plans(op):
    ch = _checker()
    inp = 0 if op in ("broadcast", "reduce") else _layouts()[0][1]
    out = _layouts()[0][0]
    for root in range(4):
        o = 0 if op == "gather" and root != 1 else out
        i = 0 if op == "scatter" and root != 1 else inp
        res = ch.plan(op, count=50, root=root, out=o, in_=i, scratch=_layouts()[0][2])
        assert res["mismatch"] == "" and not res["hit"], (root, res)
    for root in range(4):
        o = 0 if op == "gather" and root != 1 else out + 4096
        i = 0 if op == "scatter" and root != 1 else (inp and inp + 8)
        res = ch.plan(op, count=50, root=root, out=o, in_=i, scratch=_layouts()[1][2])
        assert res["mismatch"] == "" and res["hit"], (root, res)


@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_in_place_and_out_of_place_do_not_collide(op):
    """The in-place form skips this rank's own copy (the block is already there): a plan
    of one form handed to the other would copy a block onto itself or leave it out."""
    ch = _checker()
    a = _plan(ch, op, 0, count=40, in_place=False)
    b = _plan(ch, op, 0, count=40, in_place=True)
    assert not a["hit"] and not b["hit"]
    assert ch.stats()["entries"] == 2
    for layout in (1, 2):
        assert _plan(ch, op, layout, count=40, in_place=False)["hit"]
        assert _plan(ch, op, layout, count=40, in_place=True)["hit"]
    if op == "all_gather":  # (the ring reduce_scatter's two forms happen to plan alike)
        fresh = _C_testing.PlanCacheChecker(1, 4, capacity=0, slice_elems=SLICE)
        out, inp, scratch = _layouts()[0]
        steps = [fresh.plan(op, count=40, out=out, in_=inp, scratch=scratch, in_place=f)["steps"]
                 for f in (False, True)]
        assert steps[0] != steps[1], "the two forms plan alike: this test would not see them collide"


def test_the_least_recently_used_plan_goes_first():
    ch = _checker(capacity=3)
    for n in (10, 20, 30):
        _plan(ch, "all_reduce", 0, algo="ring", count=n)
    assert _plan(ch, "all_reduce", 1, algo="ring", count=10)["hit"]  # 10 is now the most recent
    _plan(ch, "all_reduce", 0, algo="ring", count=40)  # evicts 20
    s = ch.stats()
    assert (s["entries"], s["evictions"]) == (3, 1)
    assert _plan(ch, "all_reduce", 2, algo="ring", count=10)["hit"]
    assert _plan(ch, "all_reduce", 2, algo="ring", count=30)["hit"]
    assert not _plan(ch, "all_reduce", 2, algo="ring", count=20)["hit"]


def test_the_step_budget_bounds_the_cache():
    ch = _checker(max_steps=200)
    big = _plan(ch, "all_reduce", 0, algo="ring", count=100000)
    assert big["steps"] > 200 and not big["kept"]
    assert not _plan(ch, "all_reduce", 1, algo="ring", count=100000)["hit"]  # planned afresh every time
    small = [_plan(ch, "all_reduce", 0, algo="ring", count=n) for n in (1000, 1500, 1700, 500)]
    assert all(r["kept"] for r in small)
    s = ch.stats()
    assert s["steps"] <= 200 and s["evictions"] > 0 and s["uncached"] == 2


def test_capacity_zero_turns_the_cache_off():
    ch = _checker(capacity=0)
    for layout in (0, 1, 0):
        res = _plan(ch, "all_reduce", layout, algo="ring", count=1000)
        assert not res["hit"] and not res["kept"]
    assert ch.stats() == {"hits": 0, "misses": 0, "uncached": 0, "evictions": 0, "entries": 0, "steps": 0,
                          "capacity": 0}


def test_after_is_shifted_past_the_steps_already_planned():
    """Tree and recursive doubling steps wait for earlier ones (`after`, an index into
    the schedule); appended after other steps, a kept plan's indices move with it."""
    for op, algo in (("broadcast", "tree"), ("all_reduce", "recursive_doubling")):
        for rank in range(5):
            ch = _C_testing.PlanCacheChecker(rank, 5, slice_elems=SLICE)
            kw = {"root": 0} if op == "broadcast" else {}
            out, _, scratch = _layouts()[0]
            for prefix in (0, 7, 3):
                res = ch.plan(op, algo, count=64, out=out, scratch=scratch, prefix=prefix, **kw)
                assert res["mismatch"] == "", (op, rank, prefix, res["mismatch"])
            assert ch.stats()["hits"] == 2


@pytest.mark.parametrize("field", ["dst", "src", "nbytes", "tag", "after"])
def test_the_checker_sees_a_wrong_plan(field):
    """The comparison can fail: a kept plan changed in one field is reported, naming
    the step and the field (a re-base onto the wrong buffer, a stale header, ...)."""
    ch = _checker()
    out, _, scratch = _layouts()[0]
    args = dict(op="all_reduce", algo="ring", count=1000, scratch=scratch)
    assert ch.plan(out=out, **args)["steps"] > 5
    res = ch.plan(out=out + 4096, tamper=(5, field), **args)
    assert res["hit"]
    assert res["mismatch"].startswith(f"step 5: {field} is "), res["mismatch"]
    assert ch.plan(out=out + 8192, **args)["mismatch"] == ""  # the cache's copy was not changed


def test_checker_refuses_bad_calls():
    with pytest.raises(ValueError, match="root"):
        _checker().plan("broadcast", count=4, root=4, out=1 << 40)
    with pytest.raises(ValueError, match="unknown collective"):
        _checker().plan("barrier")
    with pytest.raises(ValueError):
        _checker().plan("scatter", algo="bruck")
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
    """`exact`: every call of the matrix is planned (no latency path taken by some
    and not others, as timing decides), and the cache holds them all, so the second
    pass plans the same calls and every one hits."""
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


# The small synchronous all_reduce's latency path plans nothing, and whether a call
# takes it depends on timing (not behind a queued call): off, for exact counts.
EXACT = {"RINGCOMM_PLAN_CACHE": "4096", "RINGCOMM_ONESHOT_MAX_BYTES": "0"}


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
    evicted and planned again) and the latency path on: results right, hits."""
    results = _run_twice(4, {}, exact=False)
    assert all(r[2]["evictions"] > 0 and r[2]["entries"] == 64 for r in results), [r[2] for r in results]


def test_matrix_with_the_cache_off():
    _run_twice(3, {"RINGCOMM_PLAN_CACHE": "0"}, exact=False)


def test_pull_plans_are_planned_afresh():
    """Pull schedules are never kept (their planning writes this rank's address into
    the table the peers read): every planned call uncached, the results right."""
    results = harness.run_ranks(_twice, 2, env={"RINGCOMM_ALGO": "pull", "RINGCOMM_PULL_MIN_BYTES": "1"},
                                comm_timeout=30.0, hard_timeout=240)
    harness.assert_no_failures([r[0] for r in results])
    if not all(r[3] for r in results):
        pytest.skip("single-copy pulls are not available here (cross-memory attach)")
    for rank, (_, _, s2, _) in enumerate(results):
        assert s2["uncached"] > 0 and s2["hits"] == s2["misses"] == s2["entries"] == 0, (rank, s2)
