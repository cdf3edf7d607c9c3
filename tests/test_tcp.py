"""The TCP transport on one host: every primitive over TCP (RINGCOMM_TRANSPORT=tcp),
TCP and shared memory in one communicator, the secret handshake, garbage on an
established connection, and a peer that dies in the middle of a collective.

Ranks on other hosts (network namespaces, torchrun) are in test_multihost.py.
"""

import json
import os
import signal
import socket
import struct
import time

import numpy as np
import pytest

import checks
import harness
from checks import first_line

TCP = {"RINGCOMM_TRANSPORT": "tcp"}


def _tcp_matrix(comm, kwargs, expect):
    tag = kwargs.get("tag", "")
    fails = []
    got = comm.transports
    if got != expect[comm.rank]:
        fails.append(f"{tag}transports are {got}, expected {expect[comm.rank]}")
    fails += checks.collective_matrix(comm, **kwargs)
    fails += checks.p2p_and_barrier(comm, tag)
    return fails


def _expect_all_tcp(ws):
    return [["self" if q == r else "tcp" for q in range(ws)] for r in range(ws)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_primitives_over_tcp(world_size):
    """Every primitive x dtype x op, counts 0, 1, 7, 1000 and 100003 (the big one on a few
    dtypes), send/recv and barrier, with every peer over TCP."""
    kwargs = dict(big_dtypes=("float32", "int64", "bfloat16", "bool"), tag="tcp ")
    results = harness.run_ranks(_tcp_matrix, world_size, (kwargs, _expect_all_tcp(world_size)),
                                env=TCP, comm_timeout=30.0, hard_timeout=150)
    harness.assert_no_failures(results)


def test_tcp_tiny_slots_force_multi_segment_paths():
    """256-byte slots, 4 in flight: every message takes many frames, the rings fill and
    the socket reader stops and restarts."""
    kwargs = dict(dtypes=("float32", "int8", "bfloat16", "int64"), counts=(0, 1, 7, 1000, 10007),
                  tag="tcp-slots256 ")
    results = harness.run_ranks(_tcp_matrix, 3, (kwargs, _expect_all_tcp(3)),
                                env=dict(TCP, RINGCOMM_SLOT_BYTES=256, RINGCOMM_SLOTS=4),
                                comm_timeout=30.0, hard_timeout=150)
    harness.assert_no_failures(results)


def _polling_receiver(comm):
    """Small frames read by the waiting caller itself, large ones by the I/O thread,
    around the 64 KiB line between them, in send/recv and collectives; then the matrix."""
    import ringcomm

    fails = []
    r, ws = comm.rank, comm.world_size
    peer = 1 - r if ws == 2 else None
    before = comm._native.tcp_frames_read()
    # At least three rounds; more (for at most 30 s) until both sides have read
    # frames on this rank: on a loaded machine the I/O thread may win every race
    # of a round. The ranks agree on going on (MAX over a flag and the deadline).
    deadline = time.monotonic() + 30
    rnd = 0
    while True:
        if rnd >= 3:
            io, caller = (a - b for a, b in zip(comm._native.tcp_frames_read(), before))
            more = np.array([float(io == 0 or caller == 0), float(time.monotonic() > deadline)], np.float64)
            comm.all_reduce(more, op=ringcomm.ReduceOp.MAX)
            if more[0] == 0 or more[1] == 1:
                break
        for nbytes in (0, 1, 4096, 65536 - 64, 65536, 65536 + 4, 131072, 300000):
            n = nbytes // 4
            if r == 0:
                x = (np.arange(n, dtype=np.int32) * 7 + rnd + nbytes).astype(np.int32)
                comm.send(x, peer)
                back = np.empty(n, np.int32)
                comm.recv(back, peer)
                if not np.array_equal(back, x + 1):
                    fails.append(f"ping-pong of {nbytes} B, round {rnd}: wrong echo")
            else:
                got = np.empty(n, np.int32)
                comm.recv(got, peer)
                want = (np.arange(n, dtype=np.int32) * 7 + rnd + nbytes).astype(np.int32)
                if not np.array_equal(got, want):
                    fails.append(f"ping-pong of {nbytes} B, round {rnd}: wrong data at rank 1")
                comm.send(got + 1, peer)
            y = np.full(max(n, 1), r + 1 + rnd, np.float32)
            comm.all_reduce(y)
            if not np.all(y == ws * (ws + 1) / 2 + ws * rnd):
                fails.append(f"all_reduce of {y.nbytes} B, round {rnd}: {y[:4]}")
        rnd += 1
    io, caller = (a - b for a, b in zip(comm._native.tcp_frames_read(), before))
    if caller == 0:
        fails.append(f"no frame was read by the waiting caller (I/O thread: {io})")
    if io == 0:
        fails.append(f"no frame was read by the I/O thread (caller: {caller})")
    fails += _tcp_matrix(comm, dict(dtypes=("float32", "int8", "bfloat16"), counts=(0, 1, 16385, 100003),
                                    tag="tcp-polling "), _expect_all_tcp(ws))
    return fails


def test_a_polling_receiver_reads_small_frames_itself():
    """A waiter that polls (spins, then yields) reads a small frame waiting in the
    kernel itself (TcpTransport::recv_now); larger frames, and the rest, stay with the
    I/O thread. Both are counted, and every byte checked."""
    results = harness.run_ranks(_polling_receiver, 2, (),
                                env=dict(TCP, RINGCOMM_SPIN_US=50, RINGCOMM_YIELD_US=5000),
                                comm_timeout=30.0, hard_timeout=150)
    harness.assert_no_failures(results)


def test_shm_and_tcp_in_one_communicator():
    """Default transport: ranks 0 and 1 share a host identity (shared memory), rank 2
    claims another host (TCP to both); the collectives and a split are still right."""
    expect = [["self", "shm", "tcp"], ["shm", "self", "tcp"], ["tcp", "tcp", "self"]]
    kwargs = dict(dtypes=("float32", "int32", "bool"), counts=(0, 7, 1000, checks.BIG), tag="mixed ")
    rank_env = {0: {"RINGCOMM_HOST_ID": "host-a"}, 1: {"RINGCOMM_HOST_ID": "host-a"},
                2: {"RINGCOMM_HOST_ID": "host-b"}}
    results = harness.run_ranks(_mixed, 3, (kwargs, expect), env={"RINGCOMM_TRANSPORT": "auto"},
                                rank_env=rank_env, comm_timeout=30.0, hard_timeout=120)
    harness.assert_no_failures(results)


def _mixed(comm, kwargs, expect):
    fails = _tcp_matrix(comm, kwargs, expect)
    sub = comm.split([2, 0])  # new rank 0 is old rank 2: TCP between the two
    if sub is not None:
        if sub.transports != [["self", "tcp"], ["tcp", "self"]][sub.rank]:
            fails.append(f"split: transports are {sub.transports}")
        x = np.full(5, comm.rank + 1, np.int64)
        sub.all_reduce(x)
        if not (x == 4).all():
            fails.append(f"split all_reduce over TCP gave {x}")
        sub.close()
    return fails


def test_build_info_lists_tcp():
    import ringcomm

    assert "tcp" in ringcomm.build_info()["transports"]


def test_bad_transport_name_is_rejected():
    import ringcomm

    with pytest.raises(ValueError, match="transport"):
        ringcomm.init(rank=0, world_size=1, store=object(), transport="carrier-pigeon")


# ------------------------------------------------------------------------ security

def _tcp_address(store, prefix, rank):
    store.wait([f"{prefix}/info/{rank}"])
    info = json.loads(bytes(store.get(f"{prefix}/info/{rank}")).decode())
    return info["tcp"][0], int(info["tcp"][1]), info


def _closed_by_peer(sock, timeout=10.0):
    """True when the other end closed (EOF or reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _knock(infos, fails):
    """Connects to rank 0's listener the ways a stranger would; each must be closed.
    Returns a connection that says nothing (checked later)."""
    host, port = infos[0]["tcp"][0], int(infos[0]["tcp"][1])
    secret = bytes.fromhex(infos[0]["secret"])
    hello_from_rank5 = struct.pack("<QIIiiiIQ", 0x31706374676E6972, 2, 56, 5, 0, 2, 4, 131072)
    attempts = {
        "wrong secret": os.urandom(32) + b"x" * 200,
        "wrong secret, then a valid greeting": bytes(32) + hello_from_rank5,
        "truncated secret": secret[:10],
        "valid secret, rank out of range": secret + hello_from_rank5,
        "plain HTTP": b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64,
    }
    socks = {}
    for what, payload in attempts.items():
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(payload)
        if what == "truncated secret":
            s.shutdown(socket.SHUT_WR)
        socks[what] = s
    silent = socket.create_connection((host, port), timeout=10)
    for what, s in socks.items():
        if not _closed_by_peer(s):
            fails.append(f"{what}: rank 0 did not close the connection")
        s.close()
    return silent


def _intruders_then_join(comm):
    """While rank 0 waits for rank 1's TCP connection, rank 1 first knocks on rank 0's
    listener as a stranger would (wrong secret, no secret, a truncated greeting, a valid
    secret from a rank that does not exist, HTTP); rank 0 must close each of them and
    still build the communicator with the real rank 1."""
    import ringcomm
    from ringcomm import bootstrap
    from ringcomm.config import make_config

    ctx = harness.context()
    r = ctx.rank
    prefix = "intruders"
    fails = []
    silent = []
    if r == 1:
        exchange = bootstrap.exchange

        def exchange_then_knock(store, pfx, *args, **kw):
            infos = exchange(store, pfx, *args, **kw)
            if pfx == prefix:  # rank 0 is about to accept: knock before rank 1 dials
                silent.append(_knock(infos, fails))
            return infos

        bootstrap.exchange = exchange_then_knock
    comm = ringcomm.Communicator(ctx.store, prefix, r, 2, make_config(timeout=30, transport="tcp"))
    if r == 1:
        if not silent:
            fails.append("the knocking did not run")
        elif not _closed_by_peer(silent[0]):
            fails.append("a silent connection stayed open after the communicator was built")
    x = np.full(100003, r + 1, np.float32)
    comm.all_reduce(x)
    if not (x == 3).all():
        fails.append("all_reduce after the intruders gave a wrong result")
    comm.barrier()
    comm.close()
    return fails


def test_connections_without_the_secret_are_closed():
    results = harness.run_ranks(_intruders_then_join, 2, init=False, hard_timeout=90)
    harness.assert_no_failures(results)


def _socket_to(addr, port):
    """A Python socket on the same connection as this process's fd connected to addr:port."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.getpeername()[:2] == (addr, port):
                return s
        except OSError:
            pass
        s.close()
    raise AssertionError(f"no socket connected to {addr}:{port} in this process")


def _frame(kind, nbytes, payload_offset=0):
    """A frame header as wire.h lays it out (the tag left zero)."""
    return struct.pack("<IB3xIIQ", 0x46434E52, kind, nbytes, payload_offset, 0) + bytes(32)


def _truncate(s):
    s.sendall(_frame(1, 1000) + b"x" * 10)
    s.shutdown(socket.SHUT_WR)


GARBAGE = {
    "random bytes": lambda s: s.sendall(os.urandom(4096)),
    "oversized segment": lambda s: s.sendall(_frame(1, 1 << 31)),
    "bad payload offset": lambda s: s.sendall(_frame(1, 16, 9999)),
    "unknown frame type": lambda s: s.sendall(_frame(9, 0)),
    "truncated frame": _truncate,
}


def _garbage_after_handshake(comm):
    """For each kind of garbage: a fresh 2-rank TCP communicator, one good all_reduce,
    then rank 1 writes garbage into its established connection to rank 0 (bypassing
    ringcomm); rank 0's next call must raise a RingcommError that says what was wrong."""
    import ringcomm

    ctx = harness.context()
    r = comm.rank
    fails, msgs = [], []
    for i, (what, inject) in enumerate(GARBAGE.items()):
        sub = comm.split([0, 1])
        x = np.ones(1000, np.float32)
        sub.all_reduce(x)
        key = f"garbage/{i}"
        if r == 1:
            # Rank 0 finished the all_reduce, so everything rank 1 sent is through.
            ctx.store.wait([f"{key}/r0-done"])
            host, port, _ = _tcp_address(ctx.store, sub._prefix, 0)
            s = _socket_to(host, port)
            inject(s)
            s.close()
            ctx.store.set(f"{key}/injected", "1")
            ctx.store.wait([f"{key}/r0-checked"])
        else:
            ctx.store.set(f"{key}/r0-done", "1")
            ctx.store.wait([f"{key}/injected"])
            try:
                sub.all_reduce(np.ones(1000, np.float32))
                fails.append(f"{what}: all_reduce succeeded after garbage on the connection")
            except ringcomm.TimeoutError as e:
                fails.append(f"{what}: TimeoutError instead of a clear error: {first_line(e)}")
            except ringcomm.RingcommError as e:
                msgs.append(f"{what}: {e}")
                expected = "truncated" if what == "truncated frame" else "not a valid ringcomm frame"
                if expected not in str(e) or "rank 1" not in str(e):
                    fails.append(f"{what}: the error does not say {expected!r} about rank 1: {e}")
            ctx.store.set(f"{key}/r0-checked", "1")
        sub.close()
    comm.barrier()  # the parent communicator (also TCP) is unharmed
    return {"fails": fails, "msgs": msgs}


def test_garbage_on_an_established_connection_is_a_clear_error():
    res = harness.run_ranks(_garbage_after_handshake, 2, env=TCP, comm_timeout=15.0, hard_timeout=120)
    for m in res[0]["msgs"]:
        print(m)
    harness.assert_no_failures([out["fails"] for out in res])


# ---------------------------------------------------------------------- disconnect

def _die_mid_all_reduce(comm, report_dir):
    """Rank 2 starts a large all_reduce and is killed (SIGKILL) while it runs; ranks 0
    and 1 must raise RingcommError (not hang until the deadline) naming rank 2."""
    import ringcomm

    r = comm.rank
    x = np.ones(8 << 20, np.float32)
    comm.all_reduce(np.ones(1000, np.float32))
    if r == 2:
        comm.all_reduce(x, async_op=True)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    outcome = {"error": None, "type": None, "elapsed": None}
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
        comm.all_reduce(x)  # rank 2 is gone by now at the latest
    except ringcomm.RingcommError as e:
        outcome.update(error=str(e), type=type(e).__name__)
    outcome["elapsed"] = time.monotonic() - t0
    with open(os.path.join(report_dir, f"rank{r}.json"), "w") as f:
        json.dump(outcome, f)
    return outcome


def test_peer_killed_mid_collective_raises_on_the_others(tmp_path):
    comm_timeout = 20.0
    with pytest.raises(harness.RankDied) as ei:
        harness.run_ranks(_die_mid_all_reduce, 3, (str(tmp_path),), env=TCP,
                          comm_timeout=comm_timeout, hard_timeout=90)
    assert "rank 2 exited with code -9" in str(ei.value), str(ei.value)
    for r in (0, 1):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} did not report (it hung or crashed): {ei.value}"
        out = json.loads(path.read_text())
        print(f"rank {r}: {out['type']} after {out['elapsed']:.2f}s: {out['error']}")
        assert out["error"] is not None, f"rank {r}: the all_reduces with a dead rank 2 succeeded"
        # Detected from the connection, not by waiting out the deadline:
        assert out["type"] == "RingcommError", out
        assert "rank 2" in out["error"], out
