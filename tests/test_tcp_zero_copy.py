"""Large TCP transfers without a copy through the transport's slots: segments of more
than 64 KiB are sent from the caller's buffer (Link::send_ref) and read straight into
it (Link::post_recv). Checked here: every size around the segment lines, both
directions at once, message streams with tags matched out of order, a collective
whose posted receive meets a point-to-point message first, buffers reused the moment
a call returns, and the error paths: a receiver that times out mid-frame must find
its buffer untouched afterwards, and a sender that times out with frames still queued
by reference must fail cleanly on both ranks.
"""

import os
import signal
import time

import numpy as np

import harness

TCP = {"RINGCOMM_TRANSPORT": "tcp"}
SLOT = 128 * 1024


def _pattern(nbytes, salt):
    return ((np.arange(nbytes, dtype=np.int64) * 131 + salt * 7919) % 251).astype(np.uint8)


def _pids(comm):
    """Every rank's process id; the ranks leave it together."""
    pids = np.zeros(comm.world_size, np.int64)
    comm.all_gather(pids, np.array([os.getpid()], np.int64))
    comm.barrier()
    return pids


def _streams(comm):
    """Point-to-point and collectives over TCP at sizes around the in-place lines."""
    fails = []
    r = comm.rank
    peer = 1 - r
    before = comm._native.tcp_frames_in_place()
    sizes = (SLOT // 2, SLOT // 2 + 1, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 5, 8 * 1024 * 1024 + 12)
    # Both directions at once (sendrecv), each size; the send buffer is overwritten the
    # moment the call returns, and the next exchange proves the peer got the original.
    for i, n in enumerate(sizes):
        mine = _pattern(n, 10 * i + r)
        got = np.zeros(n, np.uint8)
        comm.sendrecv(mine, peer, got, peer)
        mine[:] = 0
        if not np.array_equal(got, _pattern(n, 10 * i + peer)):
            bad = int(np.argmax(got != _pattern(n, 10 * i + peer)))
            fails.append(f"sendrecv of {n} B: wrong data from byte {bad}")
    # Blocking send, then the buffer reused at once: rank 1 must see what was sent.
    for i, n in enumerate((SLOT + 1, 5 * SLOT, 6 * 1024 * 1024 + 3)):
        if r == 0:
            x = _pattern(n, 100 + i)
            comm.send(x, 1)
            x[:] = 0xEE
            w = comm.isend(x, 1)  # the overwritten buffer goes next, by reference too
            w.wait()
            x[:] = 0x11
        else:
            a, b = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
            comm.recv(a, 0)
            comm.recv(b, 0)
            if not np.array_equal(a, _pattern(n, 100 + i)):
                fails.append(f"send of {n} B overwritten after it returned: rank 1 got changed data")
            if not (b == 0xEE).all():
                fails.append(f"isend of {n} B overwritten after wait(): rank 1 got changed data")
    # A stream of messages with tags, received in another order than sent (the
    # first arrives before its receive is posted and is held; the rest land in place).
    n1, n2, n3 = 2 * SLOT + 7, 9 * SLOT, SLOT + 3
    if r == 0:
        ws = [comm.isend(_pattern(n, 200 + t), 1, tag=t) for t, n in ((1, n1), (2, n2), (3, n3))]
        for w in ws:
            w.wait()
    else:
        b2, b1, b3 = np.zeros(n2, np.uint8), np.zeros(n1, np.uint8), np.zeros(n3, np.uint8)
        ws = [comm.irecv(b2, 0, tag=2), comm.irecv(b1, 0, tag=1), comm.irecv(b3, 0, tag=3)]
        for w in ws:
            w.wait()
        for t, b in ((1, b1), (2, b2), (3, b3)):
            if not np.array_equal(b, _pattern(b.size, 200 + t)):
                fails.append(f"tagged stream: message with tag {t} ({b.size} B) wrong")
    # A collective whose receive is posted while the peer's next frame is a
    # point-to-point message sent before the collective.
    big = np.full(2 * 1024 * 1024 + 3, r + 1.0, np.float32)
    if r == 0:
        w = comm.isend(_pattern(4 * SLOT + 1, 300), 1, tag=9)
        comm.all_reduce(big)
        w.wait()
    else:
        comm.all_reduce(big)
        p2p = np.zeros(4 * SLOT + 1, np.uint8)
        comm.recv(p2p, 0, tag=9)
        if not np.array_equal(p2p, _pattern(p2p.size, 300)):
            fails.append("a message sent before a collective, received after it: wrong data")
    if not (big == 3.0).all():
        fails.append(f"all_reduce after a point-to-point message: {big[:3]} ... (expected 3.0)")
    # Collectives of large sizes; each call's buffers are overwritten once it returns.
    n = 3 * 1024 * 1024 + 5
    for it in range(3):
        fails += _gather_reduce_broadcast(comm, n, it, src=0)
        inp = np.concatenate([np.full(n, 1.0 + it, np.float32), np.full(n, 2.0 + r, np.float32)])
        out = np.zeros(n, np.float32)
        comm.reduce_scatter(out, inp)
        inp[:] = -1
        if not (out == (2 * (1.0 + it) if r == 0 else 5.0)).all():
            fails.append(f"reduce_scatter of {n} floats per rank, round {it}: {out[:3]}")
    return fails + _moved_in_place(comm, before)


def _gather_reduce_broadcast(comm, n, it, src):
    """all_gather, all_reduce and broadcast of n floats (per rank) at any world size,
    round `it`; the inputs are overwritten as soon as each call returns."""
    fails = []
    r, ws = comm.rank, comm.world_size
    ramp = np.arange(n, dtype=np.float32)
    g = np.zeros(ws * n, np.float32)
    mine = ramp % 997 + 1000 * r + it
    comm.all_gather(g, mine)
    mine[:] = -1
    for q in range(ws):
        if not np.array_equal(g[q * n:(q + 1) * n], ramp % 997 + 1000 * q + it):
            fails.append(f"all_gather of {n} floats per rank, round {it}: block {q} wrong")
    x = ramp % 991 + r + it
    comm.all_reduce(x)
    if not np.array_equal(x, ws * (ramp % 991) + ws * (ws - 1) // 2 + ws * it):
        fails.append(f"all_reduce of {n} floats, round {it}: wrong")
    x[:] = -1
    b = np.full(n, 5.0 + it, np.float32) if r == src else np.zeros(n, np.float32)
    comm.broadcast(b, src=src)
    if not (b == 5.0 + it).all():
        fails.append(f"broadcast of {n} floats from rank {src}, round {it}: wrong")
    return fails


def _moved_in_place(comm, before):
    """A failure unless large frames were both sent by reference and landed in place
    since `before` (tcp_frames_in_place())."""
    sent, landed = (a - b for a, b in zip(comm._native.tcp_frames_in_place(), before))
    if sent == 0 or landed == 0:
        return [f"large frames did not move in place: {sent} sent by reference, {landed} landed"]
    return []


def test_large_transfers_move_in_place_and_arrive_whole():
    results = harness.run_ranks(_streams, 2, (), env=TCP, comm_timeout=60.0, hard_timeout=180)
    harness.assert_no_failures(results)


def _ring_of_three(comm):
    """At three ranks the ring forwards what it receives (all_gather, the second half
    of all_reduce): those segments land in place and leave from there."""
    fails = []
    before = comm._native.tcp_frames_in_place()
    for n in (SLOT // 4 + 1, 3 * 1024 * 1024 + 5):
        for it in range(2):
            fails += _gather_reduce_broadcast(comm, n, it, src=1)
    return fails + _moved_in_place(comm, before)


def test_a_ring_of_three_forwards_in_place():
    results = harness.run_ranks(_ring_of_three, 3, (), env=TCP, comm_timeout=60.0, hard_timeout=180)
    harness.assert_no_failures(results)


# Run by a process of its own (neither rank can stop itself and count on the other to
# resume it): stops rank 1 (in its recv), says so in FLAG, lets rank 0's send fill the
# sockets (its last write then ends inside a frame), stops rank 0 and resumes rank 1;
# resumes rank 0 after a while whatever happens (rank 1 does it first).
_CONDUCTOR = """
import os, signal, sys, time
pid0, pid1, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
time.sleep(0.3)
os.kill(pid1, signal.SIGSTOP)
open(flag, "w").close()
try:
    time.sleep(0.7)
    os.kill(pid0, signal.SIGSTOP)
finally:
    os.kill(pid1, signal.SIGCONT)
time.sleep(15)
os.kill(pid0, signal.SIGCONT)
"""


def _receiver_times_out(comm):
    """Rank 1 receives 64 MiB and is stopped (SIGSTOP) in its recv; rank 0's send fills
    the sockets, and rank 0 is stopped with its last write inside a frame; rank 1 runs
    on, reads up to that point (the frame is landing in its buffer) and times out. It
    then fills its buffer with a pattern and lets rank 0 go on: nothing may be written
    into the buffer after its recv has returned (the rest of that frame must not land)."""
    import subprocess
    import sys
    import tempfile

    import ringcomm

    fails = []
    r = comm.rank
    pids = _pids(comm)
    n = 64 * 1024 * 1024
    if r == 0:
        flag = os.path.join(tempfile.mkdtemp(), "rank1-stopped")
        conductor = subprocess.Popen([sys.executable, "-c", _CONDUCTOR, str(pids[0]), str(pids[1]), flag])
        deadline = time.monotonic() + 20
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.005)
        x = np.full(n, 0x5A, np.uint8)
        try:
            comm.send(x, 1)
            fails.append("rank 0's send succeeded although rank 1 timed out")
        except ringcomm.RingcommError:
            pass
        conductor.kill()
        conductor.wait()
        return fails
    buf = np.zeros(n, np.uint8)
    try:
        try:
            comm.recv(buf, 0)
            fails.append("rank 1's recv succeeded although rank 0 was stopped")
        except ringcomm.TimeoutError:
            pass
        except ringcomm.RingcommError as e:
            fails.append(f"rank 1's recv raised {type(e).__name__}, expected TimeoutError: {e}")
        landed = int(np.count_nonzero(buf))
        if not 0 < landed < n:
            fails.append(f"expected a part of the message to have landed before the stop, got {landed} of {n} B")
        buf[:] = 0xC3
    finally:
        os.kill(int(pids[0]), signal.SIGCONT)
    time.sleep(1.5)  # rank 0 sends on; rank 1's I/O thread reads what comes
    if not (buf == 0xC3).all():
        changed = np.flatnonzero(buf != 0xC3)
        fails.append(f"{changed.size} bytes of rank 1's buffer were written after its recv had failed "
                     f"(first at byte {changed[0]}; {landed} B had landed before)")
    return fails


def test_a_receive_that_times_out_leaves_its_buffer_alone():
    results = harness.run_ranks(_receiver_times_out, 2, (), env=TCP, comm_timeout=3.0, hard_timeout=90)
    harness.assert_no_failures(results)


def _sender_times_out(comm):
    """Rank 0 stops rank 1 (SIGSTOP) and sends 64 MiB: the socket fills, frames stay
    queued by reference, and the send times out. Rank 0 then overwrites and frees its
    buffer and lets rank 1 go on: both ranks raise, rank 1 with rank 0's reason."""
    import ringcomm

    fails = []
    r = comm.rank
    pids = _pids(comm)
    n = 64 * 1024 * 1024
    if r == 1:
        buf = np.zeros(n, np.uint8)
        try:
            comm.recv(buf, 0)
            fails.append("rank 1's recv succeeded although rank 0's send timed out")
        except ringcomm.RingcommError as e:
            if "rank 0" not in str(e) or "imed out" not in str(e):
                fails.append(f"rank 1's error does not carry rank 0's timeout: {e}")
        return fails
    time.sleep(0.3)  # rank 1 is in its recv
    os.kill(int(pids[1]), signal.SIGSTOP)
    x = np.full(n, 0x5A, np.uint8)
    try:
        comm.send(x, 1)
        fails.append("rank 0's send to a stopped rank succeeded")
    except ringcomm.TimeoutError:
        pass
    except ringcomm.RingcommError as e:
        fails.append(f"rank 0's send raised {type(e).__name__}, expected TimeoutError: {e}")
    x[:] = 0
    del x
    os.kill(int(pids[1]), signal.SIGCONT)
    time.sleep(1.0)
    return fails


def test_a_send_that_times_out_with_frames_queued_fails_cleanly():
    results = harness.run_ranks(_sender_times_out, 2, (), env=TCP, comm_timeout=3.0, hard_timeout=90)
    harness.assert_no_failures(results)
