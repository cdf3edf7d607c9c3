"""Tags in the "ringcomm" backend's send/recv: a recv gets the oldest message
from its source sent with its tag, as on gloo.

Every case runs on the ringcomm group and on a gloo group over the same
ranks (test_torch_backend's _Checker), so the expected order is gloo's, and
the values are distinct per message so that a swap shows. One spawned group
per world size runs all the cases; a second test loses a peer while a tagged
recv waits.
"""

import json
import os
import time
from datetime import timedelta

import pytest

import harness
from test_torch_backend import _Checker, _init_groups

N = 6  # elements of the small messages: all the same size, so only matching tells them apart


def _msg(torch, k, n=N, dtype="float32"):
    """Message number k: its values say which one it is."""
    return (torch.arange(n) % 50 + 100 * k).to(getattr(torch, dtype))


def _p2p_cases(c, rank, ws):
    import torch
    import torch.distributed as dist

    peer = 1 - rank if rank < 2 else None

    def between_0_and_1(name, fn):
        """fn(group) on ranks 0 and 1 (the sender is 0); the others return nothing."""
        c.same(name, lambda g: fn(g) if peer is not None else [])

    def isends(g, dst, msgs):
        """Sends (tensor, tag) pairs with isend and waits: gloo's blocking send
        waits for its recv, which the receiver posts in another order."""
        for w in [dist.isend(t, dst, group=g, tag=tag) for t, tag in msgs]:
            w.wait()
        return []

    def reverse(g):
        if rank == 0:
            return isends(g, 1, [(_msg(torch, 1), 1), (_msg(torch, 2), 2)])
        a, b = torch.zeros(N), torch.zeros(N)
        dist.recv(b, 0, group=g, tag=2)
        dist.recv(a, 0, group=g, tag=1)
        return [a, b]
    between_0_and_1("tagged sends received in reverse order", reverse)

    def interleaved(g):
        # Default-tag and tagged messages of one size, received in another order.
        sent = [(5, 1), (0, 2), (7, 3), (0, 4), (5, 5)]
        if rank == 0:
            return isends(g, 1, [(_msg(torch, k), tag) for tag, k in sent])
        outs = []
        for tag in (0, 7, 5, 0, 5):
            t = torch.zeros(N)
            dist.recv(t, 0, group=g, tag=tag)
            outs.append(t)
        return outs
    between_0_and_1("default tag interleaved with tags", interleaved)

    def fifo(g):
        if rank == 0:
            return isends(g, 1, [(_msg(torch, k), 3 if k % 2 else 4) for k in range(6)])
        outs = [torch.zeros(N) for _ in range(6)]
        for k in (1, 3, 0, 5, 2, 4):  # each tag's messages in order, the tags interleaved differently
            dist.recv(outs[k], 0, group=g, tag=3 if k % 2 else 4)
        return outs
    between_0_and_1("same tag stays in order", fifo)

    def exchange(g):
        # Both ranks isend 64 KiB in two tags and one default-tag message, and
        # irecv them in another order: the two streams must not block each
        # other. (1 MiB here hangs now and then in the core: see the report
        # of the tags branch; the same pattern without tags hangs too.)
        big = 1 << 14
        sends = [dist.isend(_msg(torch, 10 * rank + k, big), peer, group=g, tag=20 + k) for k in range(2)]
        plain = dist.isend(_msg(torch, 10 * rank + 5, big), peer, group=g)
        a, b, d = torch.zeros(big), torch.zeros(big), torch.zeros(big)
        rb = dist.irecv(b, peer, group=g, tag=21)
        rd = dist.irecv(d, peer, group=g)
        ra = dist.irecv(a, peer, group=g, tag=20)
        for w in (ra, rd, rb) + tuple(sends) + (plain,):
            w.wait()
        return [a, b, d]
    between_0_and_1("isend/irecv with tags both ways, default tag among them", exchange)

    # batch_isend_irecv against the values expected, on ringcomm only: gloo's
    # side of these hung now and then at 3 ranks (in its Work.wait()).
    def batched(g, big, tags, dtype):
        ops = [dist.P2POp(dist.isend, _msg(torch, 30 + rank, big, dtype), peer, g, tag=tags[0]),
               dist.P2POp(dist.isend, _msg(torch, 40 + rank, big, dtype), peer, g, tag=tags[1])]
        x, y = torch.zeros(big, dtype=getattr(torch, dtype)), torch.zeros(big, dtype=getattr(torch, dtype))
        ops += [dist.P2POp(dist.irecv, y, peer, g, tag=tags[1]), dist.P2POp(dist.irecv, x, peer, g, tag=tags[0])]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return (torch.equal(x, _msg(torch, 30 + peer, big, dtype)) and torch.equal(y, _msg(torch, 40 + peer, big, dtype)),
                f"{x[:3].tolist()} {y[:3].tolist()}")
    if peer is not None:
        # The tags go through start/end_coalescing. 4 MiB each way is more
        # than the FIFOs hold, with the sends waited for first (as a loop over
        # batch_isend_irecv's Works does): the receives must progress while a
        # send is waited for.
        c.check("batch_isend_irecv with tags", *batched(c.rc, N, (8, 9), "int64"))
        c.check("batch_isend_irecv with tags, 4 MiB, sends waited first", *batched(c.rc, 1 << 20, (15, 16), "float32"))

    def shapes(g):
        # Other dtypes keep their values under tags (tagged messages move bytes).
        if rank == 0:
            return isends(g, 1, [(_msg(torch, 6, 12, "float64"), 11), (torch.tensor([True, False, True]), 12)])
        flag, t = torch.zeros(3, dtype=torch.bool), torch.zeros(12, dtype=torch.float64)
        dist.recv(flag, 0, group=g, tag=12)
        dist.recv(t, 0, group=g, tag=11)
        return [t, flag]
    between_0_and_1("float64 and bool tensors with tags", shapes)

    if ws >= 3:
        def sources(g):
            # Rank 2 receives rank 1's message before rank 0's; each source has its own order.
            if rank < 2:
                return isends(g, 2, [(_msg(torch, rank), 6), (_msg(torch, rank + 2), 7)])
            outs = [torch.zeros(N) for _ in range(4)]
            dist.recv(outs[3], 1, group=g, tag=7)
            dist.recv(outs[0], 0, group=g, tag=6)
            dist.recv(outs[1], 1, group=g, tag=6)
            dist.recv(outs[2], 0, group=g, tag=7)
            return outs
        c.same("tagged messages from two sources", sources)

    # Ringcomm only from here (gloo refuses non-contiguous tensors and hangs on
    # an empty message). A non-contiguous and an empty tagged message, a size that does not match the tag's
    # message: a clear error, and the messages after it (tagged and default)
    # still arrive.
    rc = c.rc
    if rank == 0:
        dist.send(torch.zeros(0), 1, tag=13)
        dist.send(_msg(torch, 6, 12).reshape(3, 4).t(), 1, tag=11)
        dist.send(_msg(torch, 1, 10), 1, tag=4)
        dist.send(_msg(torch, 2), 1, tag=4)
        dist.send(_msg(torch, 3), 1)
        dist.send(_msg(torch, 7), 1, tag=-(2**40))
        dist.send(_msg(torch, 8), 1, tag=2**62)
    elif rank == 1:
        empty = torch.ones(0)
        dist.recv(empty, 0, tag=13)
        c.check("an empty tagged message", empty.numel() == 0)
        t = torch.zeros(3, 4).t()
        dist.recv(t, 0, tag=11)
        c.check("a non-contiguous tagged message", torch.equal(t, _msg(torch, 6, 12).reshape(3, 4).t()), str(t))
        c.raises("recv smaller than the tag's message", lambda: dist.recv(torch.zeros(5), 0, tag=4),
                 ValueError, ["tag 4", "20 bytes", "40"])
        after, plain = torch.zeros(N), torch.zeros(N)
        dist.recv(plain, 0)
        dist.recv(after, 0, tag=4)
        c.check("messages after the mismatch", torch.equal(after, _msg(torch, 2)) and torch.equal(plain, _msg(torch, 3)),
                f"{after.tolist()} {plain.tolist()}")
        big, neg = torch.zeros(N), torch.zeros(N)
        dist.recv(big, 0, tag=2**62)
        dist.recv(neg, 0, tag=-(2**40))
        c.check("negative and 63-bit tags", torch.equal(big, _msg(torch, 8)) and torch.equal(neg, _msg(torch, 7)),
                f"{big.tolist()} {neg.tolist()}")
    # A tagged irecv's wait(timeout) expires while the message is not there,
    # and the recv stays posted.
    if rank == 0:
        time.sleep(0.5)
        dist.send(_msg(torch, 9), 1, tag=21)
    elif rank == 1:
        late = torch.zeros(N)
        w = dist.irecv(late, 0, tag=21)
        c.raises("wait(timeout) on a tagged irecv", lambda: w.wait(timeout=timedelta(milliseconds=50)),
                 RuntimeError, ["did not complete within"])
        c.check("not completed after the expired wait", not w.is_completed())
        w.wait()
        c.check("the tagged irecv after an expired wait", w.is_completed() and torch.equal(late, _msg(torch, 9)),
                str(late))
    c.raises("a tag that is not an int", lambda: rc.send([torch.ones(1)], (rank + 1) % ws, "x"), TypeError, ["tag"])
    c.raises("recv from any source", lambda: dist.recv(torch.ones(2), tag=3), RuntimeError, ["any source"])
    dist.barrier()


def _everything(comm):
    ctx = harness.context()
    rc, gloo = _init_groups()
    c = _Checker(rc, gloo)
    _p2p_cases(c, ctx.rank, ctx.world_size)
    import torch.distributed as dist

    dist.destroy_process_group()
    return c.fails if c.count else ["no checks ran"]


@pytest.mark.parametrize("world_size", (2, 3))
def test_tags_match_gloo(world_size):
    harness.assert_no_failures(harness.run_ranks(_everything, world_size, init=False, hard_timeout=150))


TIMEOUT = 8.0


def _peer_dies_during_tagged_recv(comm, out_dir):
    import torch
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401

    ctx = harness.context()
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT))
    x = torch.zeros(4)
    if ctx.rank == 1:
        dist.send(torch.ones(4), 0, tag=2)  # a message of another tag, kept unread
        dist.barrier()
        time.sleep(0.3)
        os._exit(3)
    dist.barrier()
    t0 = time.monotonic()
    try:
        dist.recv(x, 1, tag=1)
        err = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, "rank0.json"), "w") as f:
        json.dump({"error": err, "seconds": time.monotonic() - t0}, f)
    return None


def test_peer_dies_during_tagged_recv(tmp_path):
    with pytest.raises(harness.RankDied):
        harness.run_ranks(_peer_dies_during_tagged_recv, 2, (str(tmp_path),), init=False,
                          hard_timeout=90, grace=TIMEOUT + 30)
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["error"] and "rank 1" in out["error"], out
    assert out["seconds"] < TIMEOUT + 5, out
