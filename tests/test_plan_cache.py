"""The plan cache (csrc/comm/plan_cache.h): a repeated call's plan is re-based from the
cache instead of planned again, and must be the plan planned afresh, step for step.

It drives the native checker (csrc/comm/plan_cache_check.h: one rank's cache
over fake buffers, never read or written, each plan it hands out compared with
plan_call's fresh one) over every op, schedule family, world size 1-9, rank, count, root,
ring order and in-place form, moving the buffers between calls as a training loop's
fresh tensors move; and checks which calls hit, miss or are never kept. No process is
spawned for it."""

import random

import pytest

from ringcomm import _C

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
                    ch = _C.PlanCacheChecker(rank, world, capacity=4096, ring=ring, hosts=hosts, slice_elems=SLICE)
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
    return _C.PlanCacheChecker(1, 4, **kw)


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
        fresh = _C.PlanCacheChecker(1, 4, capacity=0, slice_elems=SLICE)
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
            ch = _C.PlanCacheChecker(rank, 5, slice_elems=SLICE)
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
        _C.PlanCacheChecker(0, 3, ring=[0, 1, 1])
