"""What init() does with hostile or absurd input from the store, in-process: every
peer record read from the store is checked like socket data (a RingcommError naming
the rank, never a crash or a raw KeyError), and memory follows the peers actually
on this host, not the world size (issue 11)."""

import json
import os
import resource
import time

import numpy as np
import pytest

import ringcomm
from ringcomm import bootstrap

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402


def _census(rank, **over):
    rec = {"host": bootstrap.host_identity(), "pid": os.getpid(), "pidns": bootstrap.pid_namespace(),
           "slot_bytes": 131072, "nslots": 16, "ranks": None, "transport": "shm", "check_agreement": True,
           "cost_model": "measure", "cost_model_error": None, "ring_order": "host"}
    rec.update(over)
    return rec


def _init_with_forged_peer(census, segment=None, timeout=1.5):
    """init() of rank 0 of 2 over shared memory, rank 1's records forged in the store."""
    store = dist.HashStore()
    gen = ringcomm.collectives._generation + 1  # the prefix init() will use
    raw = census if isinstance(census, (bytes, str)) else json.dumps(census)
    store.set(f"ringcomm/{gen}/info/1", raw)
    if segment is not None:
        store.set(f"ringcomm/{gen}/shm/info/1", segment if isinstance(segment, (bytes, str)) else json.dumps(segment))
    return ringcomm.init(rank=0, world_size=2, store=store, timeout=timeout, transport="shm")


BAD_CENSUS = [
    ("not JSON", b"\xff\xfe not json"),
    ("a list", json.dumps([1, 2, 3])),
    ("missing keys", json.dumps({"host": "x"})),
    ("pid a string", _census(1, pid="12")),
    ("slot_bytes wrong", _census(1, slot_bytes=-5)),
    ("huge host", _census(1, host="h" * 100000)),
    ("transport unknown", _census(1, transport="carrier-pigeon")),
]


@pytest.mark.parametrize("what,record", BAD_CENSUS, ids=[w for w, _ in BAD_CENSUS])
def test_malformed_census_record_is_a_clear_error(what, record):
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(ringcomm.RingcommError) as ei:
        _init_with_forged_peer(record)
    msg = str(ei.value)
    assert "rank 1" in msg, msg
    assert not (set(os.listdir("/dev/shm")) - before), "init left a segment behind"


BAD_SEGMENT = [
    ("empty name", {"segment": ""}),
    ("not ours", {"segment": "/etc-passwd"}),
    ("path traversal", {"segment": "/ringcomm-1-2-../../../etc/passwd"}),
    ("no such segment", {"segment": "/ringcomm-1-1-" + "0" * 32}),
    ("a number", {"segment": 5}),
    ("garbage", b"\x00\x01\x02"),
]


@pytest.mark.parametrize("what,record", BAD_SEGMENT, ids=[w for w, _ in BAD_SEGMENT])
def test_malformed_segment_record_is_a_clear_error(what, record):
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(ringcomm.RingcommError) as ei:
        _init_with_forged_peer(_census(1), record)
    msg = str(ei.value)
    assert "rank 1" in msg, msg
    time.sleep(0.05)
    assert not (set(os.listdir("/dev/shm")) - before), "init left a segment behind"


def test_peer_record_that_disagrees_is_a_value_error():
    with pytest.raises(ValueError, match="slot_bytes"):
        _init_with_forged_peer(_census(1, slot_bytes=65536))


def test_huge_world_size_costs_nothing_before_the_census():
    """world_size=100000 on one rank: init waits for the census and times out; it
    maps no segment (formerly world_size x slots x slot bytes, touched up front:
    23 GB in /dev/shm) and its memory stays small."""
    before_shm = set(os.listdir("/dev/shm"))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    t0 = time.monotonic()
    with pytest.raises(ringcomm.TimeoutError) as ei:
        ringcomm.init(rank=0, world_size=100000, store=dist.HashStore(), timeout=1.0)
    took = time.monotonic() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert took < 10, f"init took {took:.1f} s to time out"
    assert grown < 200, f"peak RSS grew {grown:.0f} MiB for world_size=100000"
    assert not (set(os.listdir("/dev/shm")) - before_shm)
    assert "more" in str(ei.value) and len(str(ei.value)) < 2000, str(ei.value)[:300]


def test_world_of_one_works_and_closed_communicator_is_harmless():
    comm = ringcomm.init(rank=0, world_size=1, store=dist.HashStore(), timeout=5)
    x = np.arange(4, dtype=np.float32)
    comm.all_reduce(x)
    comm.broadcast(x, src=0)
    assert (x == np.arange(4)).all()
    comm.close()
    comm.close()
    with pytest.raises(ringcomm.RingcommError, match="closed"):
        comm.all_reduce(x)
