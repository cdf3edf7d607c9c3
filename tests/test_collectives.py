"""Every primitive x dtype x reduce op x element count, against numpy references.

Each test spawns one group of ranks that runs the whole matrix and returns the list of
failed cases, so a world size costs one spawn.
"""

import pytest

import checks
import harness


def _matrix(comm, kwargs):
    return checks.collective_matrix(comm, **kwargs)


def _run_matrix(world_size, env=None, hard_timeout=150, **kwargs):
    results = harness.run_ranks(_matrix, world_size, (kwargs,), env=env,
                                comm_timeout=20.0, hard_timeout=hard_timeout)
    harness.assert_no_failures(results)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_primitives_all_dtypes(world_size):
    """Default tuning: counts 0, 1, 7, 1000, 100003 (odd counts do not divide by 2, 3, 4)."""
    _run_matrix(world_size)


def test_tiny_chunks_force_multi_chunk_paths():
    """256-byte slots, 4 in flight: even 1000 elements take many pipelined chunks
    (pull schedules off, so large messages go through the FIFOs too)."""
    _run_matrix(3, env={"RINGCOMM_SLOT_BYTES": 256, "RINGCOMM_SLOTS": 4, "RINGCOMM_PULL": 0},
                counts=(0, 1, 7, 1000, 10007, checks.BIG),
                big_dtypes=("float32", "int8", "bfloat16"), tag="slots256 ")


def test_streamed_slot_stores():
    """Every slot written with non-temporal stores (RINGCOMM_SLOT_STORES=streamed;
    `auto` writes a probe slot in 16 that way and switches to it on some
    machines), flat and pipelined paths, pulls off so large messages use the FIFOs."""
    _run_matrix(3, env={"RINGCOMM_SLOT_STORES": "streamed", "RINGCOMM_PULL": 0},
                counts=(0, 1, 7, 1000, 100003, checks.BIG),
                big_dtypes=("float32", "int8", "bfloat16"), tag="streamed ")


@pytest.mark.parametrize("world_size", [2, 4])
def test_pull_schedules_for_every_size(world_size):
    """Single-copy pull schedules (cross-memory attach) for every primitive and size."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": "pull", "RINGCOMM_PULL_MIN_BYTES": 1}, tag="pull ")


def test_fifo_schedules_for_every_size():
    """No pull schedules: every size goes through the shared-memory FIFOs."""
    _run_matrix(3, env={"RINGCOMM_PULL": 0}, tag="fifo ")


@pytest.mark.parametrize("algo,world_size", [("oneshot", 2), ("oneshot", 5), ("ring", 4), ("pull", 3)])
def test_all_reduce_forced_algorithm(algo, world_size):
    """RINGCOMM_ALGO forces one all_reduce algorithm for every size."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": algo}, prims=("all_reduce",),
                counts=(0, 1, 2, 3, 7, 1000, 65537, checks.BIG), tag=f"algo={algo} ")


@pytest.mark.parametrize("algo", ["recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_doubling_all_reduce(algo, world_size):
    """Recursive doubling and Rabenseifner (with the fix-up for non-powers of two) for
    every dtype, op and size: results against numpy, identical bits on every rank
    (checks.py)."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": f"all_reduce:{algo}"}, prims=("all_reduce",),
                counts=(0, 1, 2, 7, 1000, 65537), tag=f"{algo} ", hard_timeout=240)


@pytest.mark.parametrize("world_size,check", [(2, 1), (3, 1), (6, 1), (7, 1), (6, 0)])
def test_tree_broadcast_and_reduce(world_size, check):
    """Binomial trees for broadcast and reduce, every root (the matrix rotates roots):
    with the agreement check on, beyond two ranks, their covering form (every rank
    sends and receives in each round: algo/schedules.h); with it off, the plain trees."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": "tree", "RINGCOMM_CHECK_AGREEMENT": check},
                prims=("broadcast", "reduce"), counts=(0, 1, 7, 1000, 65537), tag=f"tree check={check} ",
                hard_timeout=240)


@pytest.mark.parametrize("world_size", [2, 3, 5, 7])
def test_bruck_all_gather(world_size):
    """Bruck's all-gather (wrapped ranges sent in two pieces) for every dtype and size."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": "all_gather:bruck"}, prims=("all_gather",),
                counts=(0, 1, 7, 1000, 20011), tag="bruck ", hard_timeout=240)


@pytest.mark.parametrize("world_size", [2, 5])
def test_direct_all_gather(world_size):
    """The direct all-gather (every block straight to every rank) for every dtype and size,
    up to blocks of many slots."""
    _run_matrix(world_size, env={"RINGCOMM_ALGO": "all_gather:direct"}, prims=("all_gather",),
                counts=(0, 1, 7, 1000, 200003), tag="direct ", hard_timeout=240)


def _laps(comm):
    """Payloads that move within their slots lap after lap (transport/shm/segment_header.h,
    payload_offset_for): sizes on both sides of the bounds, sources at every kind of page
    offset, streamed and cached slot stores alike, many more laps than slots; each result
    checked, each send buffer overwritten the moment its call returns."""
    import numpy as np

    fails = []
    r, n = comm.rank, comm.world_size
    slot = 4 * 16 * 1024  # RINGCOMM_SLOT_BYTES below: the band is 16 KiB to 32 KiB
    sizes = (16 * 1024 - 8, 16 * 1024, 16 * 1024 + 4, 24 * 1024 + 100, slot // 2, slot // 2 + 4, slot + 12)
    store = np.zeros(2 * slot + 8192, np.uint8)
    for lap in range(3 * 12):  # 12 slots in flight: every place of every slot, several times
        for i, size in enumerate(sizes):
            shift = (lap * 1031 + i * 17) % 4096  # the page offset the payload asks for
            salt = lap * 31 + i
            src = store[shift:shift + size]
            src[:] = (np.arange(size) * 7 + salt * 13 + r) % 251
            got = np.zeros(size, np.uint8)
            comm.sendrecv(src, (r + 1) % n, got, (r - 1) % n)
            src[:] = 0
            want = (np.arange(size) * 7 + salt * 13 + (r - 1) % n) % 251
            if not np.array_equal(got, want):
                fails.append(f"sendrecv of {size} B at page offset {shift}, lap {lap}: wrong from byte "
                             f"{int(np.argmax(got != want))}")
            floats = size // 4
            x = np.full(floats, float(r + lap), np.float32)
            comm.all_reduce(x)
            if floats and not (x == sum(range(n)) + n * lap).all():
                fails.append(f"all_reduce of {floats} floats, lap {lap}: wrong")
            part = np.full(max(floats // n, 1), float(r * 100 + lap), np.float32)
            out = np.zeros(part.size * n, np.float32)
            comm.all_gather(out, part)
            if not (out.reshape(n, -1) == (np.arange(n) * 100 + lap)[:, None]).all():
                fails.append(f"all_gather of {part.size} floats per rank, lap {lap}: wrong")
    return fails


@pytest.mark.parametrize("stores", ["cached", "streamed"])
def test_payloads_moving_within_slots_arrive_whole(stores):
    results = harness.run_ranks(_laps, 3, (), env={"RINGCOMM_SLOT_BYTES": 64 * 1024, "RINGCOMM_SLOTS": 12,
                                                   "RINGCOMM_PULL": 0, "RINGCOMM_SLOT_STORES": stores},
                                comm_timeout=30.0, hard_timeout=200)
    harness.assert_no_failures(results)


def _reader_costs(comm):
    """Every call below folds its peer's segment where it arrived (oneshot all_reduce of
    one slot: the flat path's held receives); the reader must still publish what reading
    those slots costs, or the writer never learns to write them around the caches."""
    import numpy as np

    peer = 1 - comm.rank
    before = comm._native.slot_read_cost_updates(peer)
    x = np.ones(16 * 1024, np.float32)  # 64 KiB: timed (at least 16 KiB), one slot
    for _ in range(400):
        x[:] = 1
        comm.all_reduce(x)
    fails = [] if (x == 2).all() else ["all_reduce: wrong result"]
    got = comm._native.slot_read_cost_updates(peer) - before
    if got < 8:
        fails.append(f"rank {comm.rank} published its cost of reading rank {peer}'s slots {got} times "
                     "in 400 folded calls")
    if comm._native.slot_read_cost_updates(comm.rank) != 0 or comm._native.slot_read_cost_updates(7) != 0:
        fails.append("read cost updates for a rank that is no shared-memory peer")
    return fails


def test_folded_receives_feed_the_slot_store_rule():
    results = harness.run_ranks(_reader_costs, 2, (), env={"RINGCOMM_ALGO": "all_reduce:oneshot",
                                                           "RINGCOMM_PULL": 0},
                                comm_timeout=30.0, hard_timeout=120)
    harness.assert_no_failures(results)
