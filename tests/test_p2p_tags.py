"""Tags and receives from any source in ringcomm's send/recv (csrc/comm/p2p_match.cpp).

A recv takes the oldest message from its source (ANY_SOURCE: from any rank)
sent with its tag; messages of one source and tag keep their order, messages
of different tags may be received in any order. Every message's values say
which one it is, so a swap shows. One spawned group per configuration runs all
the matching cases (shared memory, TCP, pulls for mid-sized messages, world
sizes 2 and 3); the error cases (timeouts, a size mismatch, a peer killed or
an abort during a tagged or any-source wait, the limit on held messages) each
poison the communicator, so they get groups of their own.
"""
import json
import os
import threading
import time

import numpy as np
import pytest

import harness

N = 6  # elements of the small messages: all one size, so only matching tells them apart
MIB = 1 << 20


def _msg(k, n=N, dtype=np.float32):
    """Message number k: its values say which one it is."""
    return ((np.arange(n) % 50) + 100 * k).astype(dtype)


def _matching_cases(comm):
    import ringcomm

    r, ws = comm.rank, comm.world_size
    fails = []

    def check(name, ok, detail=""):
        if not ok:
            fails.append(f"rank {r}: {name}: {detail}")

    def wait_all(works):
        for w in works:
            w.wait(timeout=60)

    peer = 1 - r if r < 2 else None

    # Tagged sends received in the opposite order (same size: a swap would pass unnoticed by size).
    if r == 0:
        wait_all([comm.isend(_msg(1), 1, tag=1), comm.isend(_msg(2), 1, tag=2)])
    elif r == 1:
        a, b = np.zeros(N, np.float32), np.zeros(N, np.float32)
        sb = comm.recv(b, 0, tag=2)
        sa = comm.recv(a, 0, tag=1)
        check("reverse tag order", np.array_equal(a, _msg(1)) and np.array_equal(b, _msg(2)), f"{a[:2]} {b[:2]}")
        check("sync recv returns the source", sa == 0 and sb == 0, f"{sa} {sb}")

    # Default-tag and tagged messages interleaved, received in another order.
    sent = [(5, 1), (0, 2), (7, 3), (0, 4), (5, 5)]
    if r == 0:
        wait_all([comm.isend(_msg(k), 1, tag=t) for t, k in sent])
    elif r == 1:
        got = []
        for t in (0, 7, 5, 0, 5):
            x = np.zeros(N, np.float32)
            comm.recv(x, 0, tag=t)
            got.append(int(x[0]) // 100)
        check("default tag among tags", got == [2, 3, 1, 4, 5], str(got))

    # One tag's messages never overtake each other.
    if r == 0:
        wait_all([comm.isend(_msg(k), 1, tag=3 if k % 2 else 4) for k in range(8)])
    elif r == 1:
        outs = {}
        for k in (1, 3, 0, 5, 2, 4, 7, 6):
            x = np.zeros(N, np.float32)
            comm.recv(x, 0, tag=3 if k % 2 else 4)
            outs[k] = int(x[0]) // 100
        check("same tag keeps its order", outs == {k: k for k in range(8)}, str(outs))

    # Async receives posted in another order than the sends, then the sends
    # (a "go" message tells the sender they are posted; a collective here
    # would wait for the receives: calls run in issue order).
    if r == 1:
        xs = {t: np.zeros(N, np.float32) for t in (11, 12, 13)}
        works = {t: comm.irecv(xs[t], 0, tag=t) for t in (13, 11, 12)}
        comm.send(_msg(0), 0, tag=99)
        wait_all(works.values())
        check("irecvs posted before the sends", all(np.array_equal(xs[t], _msg(t)) for t in xs),
              str({t: xs[t][0] for t in xs}))
        check("irecv's Work names the source", all(w.source_rank() == 0 for w in works.values()),
              str([w.source_rank() for w in works.values()]))
    elif r == 0:
        comm.recv(np.zeros(N, np.float32), 1, tag=99)
        for t in (11, 12, 13):
            comm.send(_msg(t), 1, tag=t)

    # Other dtypes, empty messages, extreme tags.
    if r == 0:
        wait_all([comm.isend(np.zeros(0, np.float32), 1, tag=-(2**63)), comm.isend(_msg(6, 12, np.float64), 1, tag=2**63 - 1),
                  comm.isend(np.array([True, False, True]), 1, tag=-5)])
    elif r == 1:
        flag, t64, empty = np.zeros(3, bool), np.zeros(12, np.float64), np.ones(0, np.float32)
        comm.recv(flag, 0, tag=-5)
        comm.recv(t64, 0, tag=2**63 - 1)
        comm.recv(empty, 0, tag=-(2**63))
        check("bool, float64 and empty messages with extreme tags",
              flag.tolist() == [True, False, True] and np.array_equal(t64, _msg(6, 12, np.float64)), f"{flag} {t64[:2]}")

    # Any source: every other rank sends its rank under tag 9, rank 0 takes them as they come.
    if r == 0:
        srcs, vals = [], []
        for _ in range(ws - 1):
            x = np.zeros(N, np.float32)
            srcs.append(comm.recv(x, tag=9))
            vals.append(int(x[0]) // 100)
        check("any source gets every sender once", sorted(srcs) == list(range(1, ws)) and srcs == vals,
              f"sources {srcs} values {vals}")
        # Async any-source with a tag that one sender uses twice: its two messages in order.
        x, y = np.zeros(N, np.float32), np.zeros(N, np.float32)
        wx = comm.irecv(x, ringcomm.ANY_SOURCE, tag=10)
        wy = comm.irecv(y, None, tag=10)
        wait_all([wx, wy])
        check("async any source", wx.source_rank() == 1 and wy.source_rank() == 1 and int(x[0]) // 100 == 20
              and int(y[0]) // 100 == 21, f"{wx.source_rank()} {wy.source_rank()} {x[0]} {y[0]}")
        # A tag sent before another by the same rank, received second from any source.
        a, b = np.zeros(N, np.float32), np.zeros(N, np.float32)
        sb = comm.recv(b, tag=31)
        sa = comm.recv(a, tag=30)
        check("any source passes another tag's message", (sa, sb) == (1, 1) and int(a[0]) // 100 == 30
              and int(b[0]) // 100 == 31, f"{sa} {sb} {a[0]} {b[0]}")
    else:
        comm.send(_msg(r), 0, tag=9)
        if r == 1:
            wait_all([comm.isend(_msg(20), 0, tag=10), comm.isend(_msg(21), 0, tag=10)])
            wait_all([comm.isend(_msg(30), 0, tag=30), comm.isend(_msg(31), 0, tag=31)])

    # Both directions at once, mixed tags, messages larger than the FIFOs
    # (16 x 128 KiB), received in the reverse order with blocking recvs.
    if peer is not None:
        sizes = {20: 3 * MIB // 4, 21: 5 * MIB // 4, 0: 3 * MIB // 4}  # float32 elements: 3, 5, 3 MiB
        works = [comm.isend(_msg(10 * r + k, n), peer, tag=t) for k, (t, n) in enumerate(sizes.items())]
        outs = {}
        for t in (0, 21, 20):
            outs[t] = np.zeros(sizes[t], np.float32)
            comm.recv(outs[t], peer, tag=t)
        wait_all(works)
        expect = {t: _msg(10 * peer + k, n) for k, (t, n) in enumerate(sizes.items())}
        check("both ways, > FIFO, reverse order", all(np.array_equal(outs[t], expect[t]) for t in sizes),
              str({t: outs[t][:2] for t in outs}))
        # The same with irecvs posted first, then sends, waited for in another order.
        xs = {t: np.zeros(sizes[t], np.float32) for t in sizes}
        rw = [comm.irecv(xs[t], peer, tag=t) for t in (21, 0, 20)]
        sw = [comm.isend(_msg(10 * r + k, n), peer, tag=t) for k, (t, n) in enumerate(sizes.items())]
        wait_all(sw + rw)
        check("both ways, irecvs first", all(np.array_equal(xs[t], expect[t]) for t in sizes),
              str({t: xs[t][:2] for t in xs}))

    # A message sent before collectives and received after them: the
    # collectives move it out of their way (held), small and > FIFO.
    for n in (N, 3 * MIB // 4):
        w = comm.isend(_msg(60, n), 1, tag=61) if r == 0 else None
        comm.barrier()
        y = np.ones(4, np.float32)
        comm.all_reduce(y)  # the small one-shot path
        z = np.ones(1 << 16, np.float32)
        comm.all_reduce(z)  # the general path
        check(f"collectives with a message in flight ({n} elements)", y[0] == ws and z[-1] == ws, f"{y[0]} {z[-1]}")
        if r == 1:
            x = np.zeros(n, np.float32)
            comm.recv(x, 0, tag=61)
            check(f"message received after collectives ({n} elements)", np.array_equal(x, _msg(60, n)), str(x[:2]))
        if w is not None:
            w.wait(timeout=60)

    # sendrecv (tag 0) still pairs with the peers' sendrecv.
    if ws >= 2:
        x = np.zeros(N, np.float32)
        comm.sendrecv(_msg(r), (r + 1) % ws, x, (r - 1) % ws)
        check("sendrecv ring", np.array_equal(x, _msg((r - 1) % ws)), str(x[:2]))

    # Bad tags and sources fail before anything is sent.
    for name, fn, exc in [
        ("tag str", lambda: comm.send(_msg(0), (r + 1) % ws, tag="x"), TypeError),
        ("tag bool", lambda: comm.recv(np.zeros(N, np.float32), (r + 1) % ws, tag=True), TypeError),
        ("tag 2**63", lambda: comm.isend(_msg(0), (r + 1) % ws, tag=2**63), ValueError),
        ("src -2", lambda: comm.recv(np.zeros(N, np.float32), -2), ValueError),
    ]:
        try:
            fn()
            fails.append(f"rank {r}: {name}: no error")
        except exc as e:
            check(name, ("tag" if "tag" in name else "src") in str(e), str(e))
        except Exception as e:  # noqa: BLE001 - reported
            fails.append(f"rank {r}: {name}: {type(e).__name__}: {e}")
    comm.barrier()
    return fails


CONFIGS = {
    "shm-2": (2, {}),
    "shm-3": (3, {}),
    "tcp-2": (2, {"RINGCOMM_TRANSPORT": "tcp"}),
    "tcp-3": (3, {"RINGCOMM_TRANSPORT": "tcp"}),
    # Messages of 1 MiB and more pull (single copy): out-of-order pulls, and a
    # second large send to a peer while a pull to it waits (it goes eager).
    "pull-2": (2, {"RINGCOMM_PULL_MIN_BYTES": str(MIB)}),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_matching(config):
    ws, env = CONFIGS[config]
    harness.assert_no_failures(harness.run_ranks(_matching_cases, ws, env=env, hard_timeout=180))


TIMEOUT = 3.0


def _never_sent(comm, any_source):
    """A recv for a tag nobody sends: from rank 1 (whose message of another
    tag is held meanwhile), or from any source. The other rank waits past the
    timeout, so the error is the receiver's own."""
    import ringcomm

    r = comm.rank
    if r == 0:
        if not any_source:
            comm.send(_msg(1), 1, tag=5)
        time.sleep(TIMEOUT + 2)
        return None
    t0 = time.monotonic()
    try:
        comm.recv(np.zeros(N, np.float32), None if any_source else 0, tag=6)
        return "no timeout"
    except ringcomm.TimeoutError as e:
        return {"text": str(e), "seconds": time.monotonic() - t0}


@pytest.mark.parametrize("any_source", [False, True])
def test_recv_for_a_tag_never_sent_times_out(any_source):
    out = harness.run_ranks(_never_sent, 2, (any_source,), comm_timeout=TIMEOUT, hard_timeout=90)[1]
    assert isinstance(out, dict), out
    musts = (["recv from any rank (tag 6)", "waiting for a message with tag 6 from any rank"] if any_source else
             ["recv from rank 0 (tag 6)", "waiting for a message with tag 6 from rank 0",
              "held unmatched: from rank 0: 1 message(s), tags 5"])
    for must in musts:
        assert must in out["text"], out["text"]
    assert "timed out after 3" in out["text"].lower(), out["text"]
    assert out["seconds"] < TIMEOUT + 3, out


def _size_mismatch(comm):
    import ringcomm

    r = comm.rank
    try:
        if r == 0:
            comm.send(_msg(1, 10), 1, tag=4)
            comm.barrier()
        else:
            comm.recv(np.zeros(5, np.float32), 0, tag=4)
        return ["no error"]
    except ringcomm.RingcommError as e:
        return {"type": type(e).__name__, "text": str(e)}


def test_size_mismatch_fails_both_ranks():
    sender, receiver = harness.run_ranks(_size_mismatch, 2, comm_timeout=20, hard_timeout=90)
    assert isinstance(receiver, dict) and receiver["type"] == "CollectiveMismatchError", receiver
    for must in ("tag 4", "5 elements of float32 (20 bytes)", "send of rank 0 of 10 elements of float32"):
        assert must in receiver["text"], receiver["text"]
    assert isinstance(sender, dict) and "rank 1" in sender["text"] and "10 elements" in sender["text"], sender


def _held_limit(comm, first):
    """Rank 0 sends 4 MiB (over the 1 MiB limit on held messages) and then the
    message rank 1 waits for, which cannot pass the first. `first` says which
    rank's call starts its clock first, and so times out first: either way
    rank 1's error names the limit (when rank 0 times out first, rank 1 raises
    with rank 0's abort notice, and adds the limit to it)."""
    import ringcomm

    r = comm.rank
    if r == 0:
        if first == "receiver":
            time.sleep(0.5)
        try:
            comm.isend(_msg(1, MIB), 1, tag=1)  # 4 MiB, more than the 1 MiB limit
            comm.send(_msg(2), 1, tag=2)  # waits behind it (the FIFO is full), until the timeout
        except ringcomm.RingcommError:
            pass
        return []
    if first == "sender":
        time.sleep(1.0)
    try:
        comm.recv(np.zeros(N, np.float32), 0, tag=2)
        return ["no error"]
    except ringcomm.RingcommError as e:
        text = str(e)
        if first == "receiver" and not isinstance(e, ringcomm.TimeoutError):
            return [f"not a timeout: {text}"]
        if first == "sender" and "rank 0" not in text:
            return [f"rank 0 not named: {text}"]
        return [] if "does not fit under the limit on held unmatched messages (1048576 bytes" in text and \
            "RINGCOMM_P2P_UNEXPECTED_MB" in text else [f"error text: {text}"]


@pytest.mark.parametrize("first", ["receiver", "sender"])
def test_held_messages_limit_is_named(first):
    res = harness.run_ranks(_held_limit, 2, args=(first,), env={"RINGCOMM_P2P_UNEXPECTED_MB": "1"},
                            comm_timeout=TIMEOUT, hard_timeout=90, grace=30)
    assert res[1] == [], res


def _peer_killed(comm, out_dir):
    """World 3: rank 2 dies while rank 0 waits for a message from any source
    and rank 1 waits for a tagged message from rank 0."""
    r = comm.rank
    comm.barrier()
    if r == 2:
        time.sleep(0.5)
        os._exit(3)
    t0 = time.monotonic()
    try:
        if r == 0:
            comm.recv(np.zeros(N, np.float32), tag=7)
        else:
            comm.recv(np.zeros(N, np.float32), 0, tag=7)
        err = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump({"error": err, "seconds": time.monotonic() - t0}, f)
    return None


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_peer_killed_during_any_source_wait(tmp_path, transport):
    env = {"RINGCOMM_TRANSPORT": transport} if transport == "tcp" else {}
    with pytest.raises(harness.RankDied):
        harness.run_ranks(_peer_killed, 3, (str(tmp_path),), env=env, comm_timeout=60, hard_timeout=90, grace=30)
    for r in (0, 1):
        out = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert out["error"] and "rank 2" in out["error"], (r, out)
        assert out["seconds"] < 15, (r, out)


def _abort_during_tagged_wait(comm):
    """Rank 0's other thread aborts while it waits for tag 3 from rank 1;
    rank 1 waits for tag 3 from any source: both raise at once."""
    r = comm.rank
    comm.barrier()
    if r == 0:
        threading.Timer(0.5, lambda: comm.abort("test abort")).start()
    t0 = time.monotonic()
    try:
        comm.recv(np.zeros(N, np.float32), 1 if r == 0 else None, tag=3)
        return ["no error"]
    except Exception as e:  # noqa: BLE001 - checked
        took = time.monotonic() - t0
        text = f"{type(e).__name__}: {e}"
        return [] if "test abort" in text and took < 10 else [f"rank {r} after {took:.1f} s: {text}"]


def test_abort_during_tagged_and_any_source_wait():
    harness.assert_no_failures(harness.run_ranks(_abort_during_tagged_wait, 2, comm_timeout=60, hard_timeout=90))
