"""The plan checker (csrc/testing/plan_check.cpp) over every collective and every
schedule family it has: each rank's schedule of one call is built with plan_call on
fake buffers and all ranks are run together in this process under the executor's own
ordering rules (csrc/comm/step_order.h), over FIFOs of a few slots. The checker proves
each plan well formed (peers, byte ranges), every send matched by a receive of the same
size in the same order, and the run complete (no deadlock); the device form runs the
GPU executor's groups under NCCL's strict group semantics instead.

Tiny slots (64 bytes) make every step many segments and the larger counts many ring
rounds. No process is spawned: all of it is pure in-process arithmetic.

The second half proves the checker can fail: plans broken on purpose (a step dropped,
two swapped, a size changed) and a real ring over FIFOs too shallow for its slices are
reported, naming the rank, the step and what is wrong."""

import random

import pytest

from ringcomm import _C_testing

SLOT = 64  # bytes per FIFO slot
NSLOTS = 4  # slots per FIFO: a ring slice is one slot (ring_slice_elems)
ELEM = 4

# Every op with every schedule family it has (csrc/comm/algo_choice.cpp has()); "auto"
# is the op's default family (ring, chain, or direct exchanges).
FAMILIES = {
    "all_reduce": ["auto", "ring", "oneshot", "pull", "recursive_doubling", "rabenseifner"],
    "reduce_scatter": ["auto", "ring", "pull"],
    "all_gather": ["auto", "ring", "pull", "bruck", "direct"],
    "broadcast": ["auto", "ring", "pull", "tree"],
    "reduce": ["auto", "ring", "pull", "tree"],
    "scatter": ["auto", "pull"],
    "gather": ["auto", "pull"],
    "all_to_all": ["auto", "pull"],
    "barrier": ["auto"],
}
ROOTED = {"broadcast", "reduce", "scatter", "gather"}
WORLDS = list(range(1, 10)) + [16]
# Elements moved per ring round per block at SLOT x NSLOTS // 4 bytes.
SLICE = SLOT * max(1, NSLOTS // 4) // ELEM


def _counts(world):
    """0, 1, world-1, an odd count, and one large enough for several ring rounds."""
    return sorted({0, 1, world - 1, 37, world * SLICE * 3 + 5})


def _roots(op, world):
    if op not in ROOTED:
        return [-1]
    return list(range(world)) if world <= 9 else [0, 1, world // 2, world - 1]


def _rings(world):
    """Rank order and a shuffled (non-identity) ring order."""
    shuffled = list(range(world))
    random.Random(world).shuffle(shuffled)
    if world > 1 and shuffled == sorted(shuffled):
        shuffled = shuffled[1:] + shuffled[:1]
    return [None, shuffled]


def _check(op, algo, world, count, **kw):
    if op == "all_to_all":
        count *= world  # the input holds world equal blocks
    kw.setdefault("slot_bytes", SLOT)
    kw.setdefault("nslots", NSLOTS)
    return _C_testing.check_plan(op, algo, world=world, count=count, elem_size=ELEM, **kw)


def _sound(res, what):
    assert res["error"] == "", f"{what}: {res['error']}"


@pytest.mark.parametrize("op", sorted(FAMILIES))
def test_every_plan_is_sound_on_the_cpu_executor(op):
    checked = 0
    for algo in FAMILIES[op]:
        for world in WORLDS:
            for ring in _rings(world):
                for count in _counts(world):
                    for root in _roots(op, world):
                        for avg in (False, True) if op in ("all_reduce", "reduce_scatter", "reduce") else (False,):
                            what = f"{op}/{algo} world={world} count={count} root={root} avg={avg} ring={ring}"
                            res = _check(op, algo, world, count, root=root, avg=avg, ring=ring,
                                         agreement=op in ROOTED)
                            _sound(res, what)
                            if world > 1:
                                # Something was exchanged (the check looked at messages).
                                assert res["messages"] > 0, what
                            checked += 1
    assert checked > 0


@pytest.mark.parametrize("nslots", [2, 3, 16])
def test_plans_complete_over_shallow_and_deep_fifos(nslots):
    # The communicator's slices are a quarter of the FIFO (at least one slot): every
    # family completes down to FIFOs of two slots.
    for op, algos in FAMILIES.items():
        for algo in algos:
            for world in (2, 3, 5, 8, 16):
                count = world * 40 + 3
                for root in _roots(op, world)[:3]:
                    res = _check(op, algo, world, count, root=root, nslots=nslots, ring=_rings(world)[1])
                    _sound(res, f"{op}/{algo} world={world} nslots={nslots} root={root}")


@pytest.mark.parametrize("op", sorted(set(FAMILIES) - {"barrier"}))
def test_every_plan_is_sound_on_the_device_executor(op):
    # The GPU executor's grouped transfers (csrc/comm/device_executor.cpp), chunks of
    # 64 bytes: every step cut into many. Pull schedules do not run on the device.
    for algo in FAMILIES[op]:
        if algo == "pull":
            continue
        for world in WORLDS:
            for count in _counts(world):
                for root in _roots(op, world):
                    what = f"device {op}/{algo} world={world} count={count} root={root}"
                    res = _check(op, algo, world, count, root=root, executor="device", chunk_bytes=64)
                    _sound(res, what)
                    if world > 1 and count > 0:  # (the device moves no empty transfers)
                        assert res["messages"] > 0, what


def test_families_are_the_ones_asked_for():
    expect = {("all_reduce", "auto"): "ring", ("all_reduce", "oneshot"): "oneshot",
              ("all_reduce", "recursive_doubling"): "recursive_doubling",
              ("all_reduce", "rabenseifner"): "rabenseifner", ("all_reduce", "pull"): "pull",
              ("all_gather", "bruck"): "bruck", ("all_gather", "direct"): "direct", ("broadcast", "tree"): "tree", ("reduce", "tree"): "tree",
              ("broadcast", "ring"): "fifo", ("scatter", "auto"): "fifo"}
    for (op, algo), family in expect.items():
        assert _check(op, algo, 4, 8, root=0)["family"] == family, (op, algo)


def test_unknown_or_invalid_calls_raise():
    with pytest.raises(ValueError, match="has no tree schedule"):
        _C_testing.check_plan("all_reduce", "tree", world=4, count=8)
    with pytest.raises(ValueError, match="src 4 is out of range for a communicator of world size 4"):
        _C_testing.check_plan("broadcast", world=4, count=8, root=4)
    with pytest.raises(ValueError, match="permutation"):
        _C_testing.check_plan("all_reduce", world=3, count=8, ring=[0, 1, 1])
    with pytest.raises(ValueError, match="divide evenly"):
        _C_testing.check_plan("all_to_all", world=3, count=8)
    with pytest.raises(ValueError, match="pull"):
        _C_testing.check_plan("all_reduce", "pull", world=3, count=8, executor="device")
    with pytest.raises(ValueError, match="no step 99"):
        _C_testing.check_plan("all_reduce", world=3, count=8, drop=(0, 99))


# --- The checker fails when it should --------------------------------------------


def test_rooted_trees_check_themselves_beyond_two_ranks():
    """With the agreement check on, a tree broadcast or reduce at more than two ranks
    runs no agreement rounds: its covering form has every rank send and receive once
    in each of ceil(log2 n) rounds (an empty message where the tree moves nothing),
    and the checker proves every rank hears from every other before it finishes. The
    other rooted families still run the agreement first (and are covered by it)."""
    for op in ("broadcast", "reduce"):
        for world in (3, 4, 5, 6, 7, 8, 9, 16):
            rounds = (world - 1).bit_length()
            for root in _roots(op, world):
                for count in (0, 1, 37):
                    what = f"{op}/tree world={world} root={root} count={count}"
                    res = _check(op, "tree", world, count, root=root, agreement=True, avg=op == "reduce")
                    _sound(res, what)
                    assert res["family"] == "tree", what
                    if count <= 1:  # one segment a message: exactly the dissemination's messages
                        assert res["messages"] == world * rounds, (what, res["messages"])
            # The chain (ring family) is not covering: the agreement's rounds come first.
            res = _check(op, "ring", world, 1, root=0, agreement=True)
            _sound(res, f"{op}/ring world={world}")
            assert res["messages"] == world * rounds + world - 1, (op, world, res["messages"])


def test_a_covering_tree_that_sends_early_is_reported():
    """Rank 1 of a 4-rank covering broadcast sends its round-2 message before its
    round-1 receive: every message still pairs and the run completes, but rank 3 then
    finishes without having heard, through any chain, from rank 0 (a disagreement of
    rank 0's could go unnoticed there). The checker reports it."""
    base = _check("broadcast", "tree", 4, 1, root=0, agreement=True)
    _sound(base, "untouched")
    res = _check("broadcast", "tree", 4, 1, root=0, agreement=True, swap=(1, 0, 3))
    assert "rank 3 finishes the rooted call without hearing from rank 0" in res["error"], res["error"]
    assert "no agreement rounds" in res["error"], res["error"]


def test_a_dropped_send_is_reported():
    # Ring all_reduce, world 4, blocks of 10 elements (one round of 6 messages per rank
    # and direction): dropping rank 1's first send leaves rank 2's last receive empty.
    res = _check("all_reduce", "ring", 4, 40, drop=(1, 0))
    assert res["error"] == ("rank 2 step 6 (recv of 40 bytes from rank 1) never gets a message: "
                            "rank 1 sends 5 messages to rank 2, which receives 6"), res["error"]


def test_a_dropped_receive_is_reported():
    # Tree broadcast from 0, world 4: rank 1 only receives from rank 0 (step 0);
    # dropping that receive leaves rank 0's send to it unmatched.
    res = _check("broadcast", "tree", 4, 10, root=0, drop=(1, 0))
    assert res["error"] == ("rank 0 step 1 (send of 40 bytes to rank 1) is never received: "
                            "rank 1 receives 0 messages from rank 0, which sends 1"), res["error"]


def test_swapped_sends_of_different_sizes_are_reported():
    # Ring reduce_scatter, world 3, 37 elements: 16 per round, so rounds move 64, 64 and
    # 20 bytes; rank 0's first send (round 0) swapped with its last (round 2).
    plan = _check("reduce_scatter", "ring", 3, 37)
    _sound(plan, "unbroken")
    last_send = 2 * (plan["steps"] // 3 // 3)  # 3 steps a round: send, recv-reduce-send, recv-reduce
    res = _check("reduce_scatter", "ring", 3, 37, swap=(0, 0, last_send))
    assert res["error"].startswith("rank 0 step 0 (send of 20 bytes to rank 1) is message 1 from rank 0 to rank 1, "
                                   "which rank 1 step 1 (recv-reduce-send of 64 bytes from rank 0 to rank 2)"), \
        res["error"]
    assert res["error"].endswith("20 bytes sent, 64 expected")


def test_a_resized_step_is_reported():
    res = _check("all_gather", "bruck", 5, 7, resize=(3, 1, 4))
    assert res["error"] == ("rank 3 step 1 (send of 4 bytes to rank 2) is message 1 from rank 3 to rank 2, which "
                            "rank 2 step 2 (recv of 28 bytes from rank 3) receives: 4 bytes sent, 28 expected"), \
        res["error"]


def test_a_step_past_its_buffer_is_reported():
    # Oneshot all_reduce world 2, count 3 (12 bytes): rank 0's send grown to 16 bytes
    # reads past the end of its buffer.
    res = _check("all_reduce", "oneshot", 2, 3, resize=(0, 0, 16))
    assert res["error"] == ("rank 0 step 0 (send of 16 bytes to rank 1): src runs past the end of out (16 bytes "
                            "at out+0, which holds 12)"), res["error"]


def test_a_step_waiting_for_a_later_one_is_reported():
    res = _check("broadcast", "tree", 4, 10, root=0, after=(1, 0, 3))
    assert res["error"].startswith("rank 1 step 0 (recv of 40 bytes from rank 0): waits for step 3, which does not "
                                   "come before it"), res["error"]


def test_a_ring_slice_as_deep_as_the_fifo_deadlocks():
    # Slices of a whole FIFO (4 slots): every rank fills its successor's FIFO and then
    # waits to send the next block while nobody receives (algo/ring.cpp's argument).
    res = _check("all_reduce", "ring", 4, 4 * 64, slice_elems=SLOT * NSLOTS // ELEM)
    assert res["error"].startswith("deadlock: no rank can move: rank 0 step 1 (recv-reduce-send of 256 bytes "
                                   "from rank 3 to rank 1) waits for rank 1 to take data (its FIFO holds 4 of 4 "
                                   "segments), 0 segments moved; rank 1 step 1"), res["error"]
    # The same plan with the communicator's slices (a quarter of the FIFO) completes.
    _sound(_check("all_reduce", "ring", 4, 4 * 64), "communicator's slices")


def test_one_slot_fifos_deadlock_the_ring():
    # Why the configuration asks for at least 3 slots: with one, even a one-slot slice
    # fills the FIFO, and the ring stops.
    res = _check("all_reduce", "ring", 3, 100, nslots=1)
    assert res["error"].startswith("deadlock: no rank can move"), res["error"]


def test_an_exchange_that_sends_before_it_receives_deadlocks():
    # Recursive doubling, world 2: each rank sends its buffer and receives its
    # partner's at once. Made to receive only once its send is done (after=), the
    # exchange still completes while the buffer fits the FIFO (10 elements), and
    # deadlocks once it does not (100 elements, 7 slots against 4).
    _sound(_check("all_reduce", "recursive_doubling", 2, 10, after=(-1, 1, 0)), "fits the FIFO")
    res = _check("all_reduce", "recursive_doubling", 2, 100, after=(-1, 1, 0))
    assert res["error"] == (
        "deadlock: no rank can move: rank 0 step 0 (send of 400 bytes to rank 1) waits for rank 1 to take data (its "
        "FIFO holds 4 of 4 segments), 4 segments moved; rank 1 step 0 (send of 400 bytes to rank 0) waits for rank 0 "
        "to take data (its FIFO holds 4 of 4 segments), 4 segments moved"), res["error"]


def test_device_groups_that_wait_for_each_other_are_reported():
    # The same change on the device: a step with `after` starts a new group, so each
    # rank's first group holds only its sends, which its partner receives in its
    # second group: under NCCL's strict group semantics neither group completes,
    # whatever the size.
    _sound(_check("all_reduce", "recursive_doubling", 2, 10, executor="device", chunk_bytes=64), "unbroken")
    res = _check("all_reduce", "recursive_doubling", 2, 10, after=(-1, 1, 0), executor="device", chunk_bytes=64)
    assert res["error"] == ("device deadlock: no group can complete: rank 0 waits in group 0 of 2 (1 of 1 transfers "
                            "unmatched); rank 1 waits in group 0 of 2 (1 of 1 transfers unmatched)"), res["error"]


def test_a_read_of_a_buffer_its_owner_no_longer_keeps_is_reported():
    # Pull broadcast from 0, world 3: a non-root reads the root's buffer (step 1) and
    # then tells it so (step 2, after the read). Telling it before reading lets the
    # root return while its buffer is still to be read.
    _sound(_check("broadcast", "pull", 3, 10, root=0), "unbroken")
    res = _check("broadcast", "pull", 3, 10, root=0, after=(-1, 2, -1))
    assert res["error"] == ("rank 1 step 1 (pull of 40 bytes from rank 0): reads rank 0's buffer after rank 0 has "
                            "finished the call (nothing makes it wait for this read)"), res["error"]


# Host placements for the hierarchical all-reduce: even, uneven, interleaved, one
# rank per host, one host.
HOST_LAYOUTS = [[0, 0, 1, 1], [0, 1, 0, 1, 0], [0, 1, 1, 2, 2, 2], [0, 1, 2], [0, 0, 0],
                [0, 0, 0, 1, 1, 1, 2, 2], [r % 4 for r in range(16)], [0] * 5 + [1] * 2 + [2] * 9]


@pytest.mark.parametrize("executor", ["cpu", "device"])
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"])
def test_hierarchical_plans_are_sound(executor, op):
    for hosts in HOST_LAYOUTS:
        world = len(hosts)
        for count in _counts(world):
            for avg in (False, True) if op not in ("broadcast", "all_gather") else (False,):
                for root in _roots(op, world):
                    for nslots in ((2, NSLOTS) if executor == "cpu" else (NSLOTS,)):
                        what = (f"hierarchical {op} {executor} hosts={hosts} count={count} avg={avg} "
                                f"root={root} nslots={nslots}")
                        res = _check(op, "hierarchical", world, count, avg=avg, root=root, hosts=hosts,
                                     nslots=nslots, executor=executor, chunk_bytes=64, agreement=op in ROOTED)
                        _sound(res, what)
                        assert res["family"] == "hierarchical", what  # (one host: its ring/tree, so tagged)


def test_a_broken_hierarchical_plan_is_reported():
    # Rank 2 (host 1's first rank) loses one step of its inter-host ring.
    res = _check("all_reduce", "hierarchical", 4, 1000, hosts=[0, 0, 1, 1], drop=(2, 3))
    assert res["error"] != ""
    with pytest.raises(ValueError, match="host labels"):
        _check("all_reduce", "hierarchical", 4, 10, hosts=[0, 1])
