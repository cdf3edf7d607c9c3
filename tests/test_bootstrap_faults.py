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


def _own_segments():
    """This process's ringcomm segments in /dev/shm ("ringcomm-<pidns>-<pid>-..."):
    other jobs sharing the machine (a second suite, multiprocessing's
    semaphores) may add names at any time."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("ringcomm-") and f"-{os.getpid()}-" in n}


def _census(rank, **over):
    rec = {"host": bootstrap.host_identity(), "pid": os.getpid(), "pidns": bootstrap.pid_namespace(),
           "cpus": [0, 1], "slot_bytes": 131072, "nslots": 16, "ranks": None, "transport": "shm", "check_agreement": True,
           "autotune": True, "cost_model": "measure", "cost_model_error": None, "ring_order": "host"}
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
    ("cpus not a list", _census(1, cpus=3)),
    ("cpus negative", _census(1, cpus=[0, -1])),
    ("cpus huge", _census(1, cpus=list(range(70000)))),
]


@pytest.mark.parametrize("what,record", BAD_CENSUS, ids=[w for w, _ in BAD_CENSUS])
def test_malformed_census_record_is_a_clear_error(what, record):
    before = _own_segments()
    with pytest.raises(ringcomm.RingcommError) as ei:
        _init_with_forged_peer(record)
    msg = str(ei.value)
    assert "rank 1" in msg, msg
    assert not (_own_segments() - before), "init left a segment behind"


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
    before = _own_segments()
    with pytest.raises(ringcomm.RingcommError) as ei:
        _init_with_forged_peer(_census(1), record)
    msg = str(ei.value)
    assert "rank 1" in msg, msg
    time.sleep(0.05)
    assert not (_own_segments() - before), "init left a segment behind"


def test_peer_record_that_disagrees_is_a_value_error():
    with pytest.raises(ValueError, match="slot_bytes"):
        _init_with_forged_peer(_census(1, slot_bytes=65536))


def test_huge_world_size_costs_nothing_before_the_census():
    """world_size=100000 on one rank: init waits for the census and times out; it
    maps no segment (formerly world_size x slots x slot bytes, touched up front:
    23 GB in /dev/shm) and its memory stays small."""
    before_shm = _own_segments()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    t0 = time.monotonic()
    with pytest.raises(ringcomm.TimeoutError) as ei:
        ringcomm.init(rank=0, world_size=100000, store=dist.HashStore(), timeout=1.0)
    took = time.monotonic() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert took < 10, f"init took {took:.1f} s to time out"
    assert grown < 200, f"peak RSS grew {grown:.0f} MiB for world_size=100000"
    assert not (_own_segments() - before_shm)
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


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_store_that_never_comes_up_names_rank_0(monkeypatch):
    """Rank 0 (the store's host under MASTER_ADDR / MASTER_PORT) never started
    or died before its store was up: the other ranks cannot tell it from a slow
    rank 0, so they wait the timeout, and then say who serves the store."""
    port = _free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(ringcomm.RingcommError) as e:
        ringcomm.init(rank=1, world_size=2, timeout=2.0)
    took = time.monotonic() - t0
    text = str(e.value)
    assert took < 15, f"init took {took:.1f} s with a 2 s timeout"
    assert "rank 0" in text and f"127.0.0.1:{port}" in text and "MASTER_ADDR" in text, text
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(ringcomm.RingcommError, match="torchrun's agent"):
        ringcomm.init(rank=1, world_size=2, timeout=1.0)


def test_store_host_killed_during_init_names_rank_0(monkeypatch):
    """Rank 0's store is up and rank 0 is SIGKILLed before it joined: rank 1,
    waiting for rank 0's record, fails at once (not at its 60 s timeout),
    saying that rank 0 served the store."""
    import signal
    import subprocess
    import sys
    import threading

    port = _free_port()
    code = ("import sys, time, datetime; from torch.distributed import TCPStore; "
            f"s = TCPStore('127.0.0.1', {port}, 2, True, timeout=datetime.timedelta(seconds=60), "
            "wait_for_workers=False); print('up', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        killed = []

        def kill():
            killed.append(time.monotonic())
            p.send_signal(signal.SIGKILL)

        threading.Timer(1.0, kill).start()
        with pytest.raises(ringcomm.RingcommError) as e:
            ringcomm.init(rank=1, world_size=2, timeout=60.0)
        after = time.monotonic() - killed[0]
        text = str(e.value)
        assert after < 5, f"init failed {after:.1f} s after the store's host was killed"
        assert not isinstance(e.value, ringcomm.TimeoutError), text
        assert "the store failed" in text and "served by rank 0" in text and f"127.0.0.1:{port}" in text, text
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
