"""Tags and receives from any source in the "ringcomm" torch backend, against gloo.

Every case is one script run on the ringcomm group and on a gloo group over
the same ranks (test_torch_backend's _Checker): the results must be equal,
so the expected matching is gloo's. Messages carry values that say which
one they are, so a swap shows. One spawned group per world size runs all the
cases; the 3-rank group runs them several rounds (the batch_isend_irecv with
tags hung there now and then in an earlier design). A second test loses a
peer while a tagged recv and an any-source recv wait.
"""
import json
import os
import time
from datetime import timedelta

import pytest

import harness
from test_torch_backend import _Checker, _init_groups

N = 6  # elements of the small messages: all one size, so only matching tells them apart
ROUNDS = {2: 1, 3: 3}


def _msg(torch, k, n=N, dtype="float32"):
    """Message number k: its values say which one it is."""
    return (torch.arange(n) % 50 + 100 * k).to(getattr(torch, dtype))


def _cases(c, rank, ws, rnd):
    import torch
    import torch.distributed as dist

    peer = 1 - rank if rank < 2 else None
    tag0 = 1000 * rnd  # each round its own tags

    def between_0_and_1(name, fn):
        """fn(group) on ranks 0 and 1; the others return nothing."""
        c.same(name, lambda g: fn(g) if peer is not None else [])

    def isends(g, dst, msgs):
        """isend (tensor, tag) pairs, then wait: gloo's send waits for its recv,
        which the receiver posts in another order."""
        for w in [dist.isend(t, dst, group=g, tag=tag) for t, tag in msgs]:
            w.wait()
        return []

    def reverse(g):
        if rank == 0:
            return isends(g, 1, [(_msg(torch, 1), tag0 + 1), (_msg(torch, 2), tag0 + 2)])
        a, b = torch.zeros(N), torch.zeros(N)
        dist.recv(b, 0, group=g, tag=tag0 + 2)
        dist.recv(a, 0, group=g, tag=tag0 + 1)
        return [a, b]
    between_0_and_1("tagged sends received in reverse order", reverse)

    def interleaved(g):
        sent = [(5, 1), (0, 2), (7, 3), (0, 4), (5, 5)]
        if rank == 0:
            return isends(g, 1, [(_msg(torch, k), tag and tag0 + tag) for tag, k in sent])
        outs = []
        for tag in (0, 7, 5, 0, 5):
            t = torch.zeros(N)
            dist.recv(t, 0, group=g, tag=tag and tag0 + tag)
            outs.append(t)
        return outs
    between_0_and_1("default tag interleaved with tags", interleaved)

    def fifo(g):
        if rank == 0:
            return isends(g, 1, [(_msg(torch, k), tag0 + (3 if k % 2 else 4)) for k in range(6)])
        outs = [torch.zeros(N) for _ in range(6)]
        for k in (1, 3, 0, 5, 2, 4):
            dist.recv(outs[k], 0, group=g, tag=tag0 + (3 if k % 2 else 4))
        return outs
    between_0_and_1("same tag stays in order", fifo)

    def exchange(big):
        def fn(g):
            # Both ranks isend two tags and a default-tag message and irecv them
            # in another order: the streams must not block each other.
            sends = [dist.isend(_msg(torch, 10 * rank + k, big), peer, group=g, tag=tag0 + 20 + k) for k in range(2)]
            plain = dist.isend(_msg(torch, 10 * rank + 5, big), peer, group=g)
            a, b, d = torch.zeros(big), torch.zeros(big), torch.zeros(big)
            rb = dist.irecv(b, peer, group=g, tag=tag0 + 21)
            rd = dist.irecv(d, peer, group=g)
            ra = dist.irecv(a, peer, group=g, tag=tag0 + 20)
            for w in (ra, rd, rb) + tuple(sends) + (plain,):
                w.wait()
            return [a, b, d]
        return fn
    between_0_and_1("isend/irecv with tags both ways, 64 KiB", exchange(1 << 14))
    between_0_and_1("isend/irecv with tags both ways, 1 MiB each (more than the FIFOs hold)", exchange(1 << 18))

    def batched(big, tags, dtype):
        # Every rank sends two tagged messages to the next and receives the
        # previous rank's in the other order; the sends are waited for first.
        def fn(g):
            nxt, prv = (rank + 1) % ws, (rank - 1) % ws
            ops = [dist.P2POp(dist.isend, _msg(torch, 30 + rank, big, dtype), nxt, g, tag=tags[0]),
                   dist.P2POp(dist.isend, _msg(torch, 40 + rank, big, dtype), nxt, g, tag=tags[1])]
            x, y = torch.zeros(big, dtype=getattr(torch, dtype)), torch.zeros(big, dtype=getattr(torch, dtype))
            ops += [dist.P2POp(dist.irecv, y, prv, g, tag=tags[1]), dist.P2POp(dist.irecv, x, prv, g, tag=tags[0])]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return [x, y]
        return fn
    c.same("batch_isend_irecv with tags (ring)", batched(N, (tag0 + 8, tag0 + 9), "int64"))
    c.same("batch_isend_irecv with tags, 4 MiB, sends waited first (ring)", batched(1 << 20, (tag0 + 15, tag0 + 16),
                                                                                   "float32"))

    def shapes(g):
        if rank == 0:
            return isends(g, 1, [(_msg(torch, 6, 12, "float64"), tag0 + 11),
                                 (torch.tensor([True, False, True]), tag0 + 12)])
        flag, t = torch.zeros(3, dtype=torch.bool), torch.zeros(12, dtype=torch.float64)
        dist.recv(flag, 0, group=g, tag=tag0 + 12)
        dist.recv(t, 0, group=g, tag=tag0 + 11)
        return [t, flag]
    between_0_and_1("float64 and bool tensors with tags", shapes)

    def any_source(g):
        # Every other rank sends its rank under one tag; rank 0 receives from
        # any source (dist.recv returns the sender) and sorts by sender.
        if rank != 0:
            isends(g, 0, [(_msg(torch, rank), tag0 + 6)])
            return []
        got = []
        for _ in range(ws - 1):
            t = torch.zeros(N)
            src = dist.recv(t, group=g, tag=tag0 + 6)
            got.append((src, t))
        got.sort(key=lambda p: p[0])
        return [torch.tensor([s for s, _ in got])] + [t for _, t in got]
    c.same("dist.recv from any source returns the sender", any_source)

    def irecv_any(g):
        # Rank 1 sends two messages of one tag: irecv from any source gets them in order.
        if rank == 1:
            return isends(g, 0, [(_msg(torch, 7), tag0 + 17), (_msg(torch, 8), tag0 + 17)])
        if rank != 0:
            return []
        a, b = torch.zeros(N), torch.zeros(N)
        wa = dist.irecv(a, group=g, tag=tag0 + 17)
        wb = dist.irecv(b, group=g, tag=tag0 + 17)
        wa.wait()
        wb.wait()
        return [torch.tensor([wa._source_rank(), wb._source_rank()]), a, b]
    c.same("dist.irecv from any source, _source_rank()", irecv_any)

    if ws >= 3:
        def sources(g):
            # Rank 2 receives rank 1's message before rank 0's; each source has its own order.
            if rank < 2:
                return isends(g, 2, [(_msg(torch, rank), tag0 + 6), (_msg(torch, rank + 2), tag0 + 7)])
            outs = [torch.zeros(N) for _ in range(4)]
            dist.recv(outs[3], 1, group=g, tag=tag0 + 7)
            dist.recv(outs[0], 0, group=g, tag=tag0 + 6)
            dist.recv(outs[1], 1, group=g, tag=tag0 + 6)
            dist.recv(outs[2], 0, group=g, tag=tag0 + 7)
            return outs
        c.same("tagged messages from two sources", sources)

        def any_then_named(g):
            # Rank 2: any source takes tag 25 (from rank 1 only), the named recvs the rest.
            if rank == 0:
                return isends(g, 2, [(_msg(torch, 50), tag0 + 24)])
            if rank == 1:
                return isends(g, 2, [(_msg(torch, 51), tag0 + 24), (_msg(torch, 52), tag0 + 25)])
            t25, a, b = torch.zeros(N), torch.zeros(N), torch.zeros(N)
            src = dist.recv(t25, group=g, tag=tag0 + 25)
            dist.recv(b, 1, group=g, tag=tag0 + 24)
            dist.recv(a, 0, group=g, tag=tag0 + 24)
            return [torch.tensor([src]), t25, a, b]
        c.same("any source beside named sources", any_then_named)


def _ringcomm_only(c, rank, ws):
    """What gloo does not share: a non-contiguous and an empty tagged message,
    63-bit and negative tags, wait(timeout) on a tagged irecv, a bad tag."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        dist.send(torch.zeros(0), 1, tag=13)
        dist.send(_msg(torch, 6, 12).reshape(3, 4).t(), 1, tag=11)
        dist.send(_msg(torch, 7), 1, tag=-(2**40))
        dist.send(_msg(torch, 8), 1, tag=2**62)
        time.sleep(0.5)
        dist.send(_msg(torch, 9), 1, tag=21)
    elif rank == 1:
        empty = torch.ones(0)
        dist.recv(empty, 0, tag=13)
        c.check("an empty tagged message", empty.numel() == 0)
        t = torch.zeros(3, 4).t()
        dist.recv(t, 0, tag=11)
        c.check("a non-contiguous tagged message", torch.equal(t, _msg(torch, 6, 12).reshape(3, 4).t()), str(t))
        big, neg = torch.zeros(N), torch.zeros(N)
        dist.recv(big, 0, tag=2**62)
        dist.recv(neg, 0, tag=-(2**40))
        c.check("negative and 63-bit tags", torch.equal(big, _msg(torch, 8)) and torch.equal(neg, _msg(torch, 7)),
                f"{big.tolist()} {neg.tolist()}")
        late = torch.zeros(N)
        w = dist.irecv(late, 0, tag=21)
        c.raises("wait(timeout) on a tagged irecv", lambda: w.wait(timeout=timedelta(milliseconds=50)),
                 RuntimeError, ["did not complete within"])
        c.check("not completed after the expired wait", not w.is_completed())
        w.wait()
        c.check("the tagged irecv after an expired wait", w.is_completed() and torch.equal(late, _msg(torch, 9)),
                str(late))
        c.check("a named irecv's _source_rank()", w._source_rank() == 0, str(w._source_rank()))
    c.raises("a tag that is not an int", lambda: c.rc.send([torch.ones(1)], (rank + 1) % ws, "x"), TypeError, ["tag"])
    c.raises("source_rank of a send", lambda: dist.isend(torch.ones(1), (rank + 1) % ws, tag=77)._source_rank(),
             RuntimeError, ["recv"])
    dist.recv(torch.ones(1), (rank - 1) % ws, tag=77)  # the message of the check above
    dist.barrier()


def _everything(comm):
    ctx = harness.context()
    rc, gloo = _init_groups()
    c = _Checker(rc, gloo)
    for rnd in range(ROUNDS[ctx.world_size]):
        _cases(c, ctx.rank, ctx.world_size, rnd)
    _ringcomm_only(c, ctx.rank, ctx.world_size)
    import torch.distributed as dist

    dist.destroy_process_group()
    return c.fails if c.count else ["no checks ran"]


@pytest.mark.parametrize("world_size", (2, 3))
def test_tags_match_gloo(world_size):
    harness.assert_no_failures(harness.run_ranks(_everything, world_size, init=False, hard_timeout=240))


def test_tags_match_gloo_over_tcp():
    harness.assert_no_failures(harness.run_ranks(_everything, 3, init=False, env={"RINGCOMM_TRANSPORT": "tcp"},
                                                 hard_timeout=240))


TIMEOUT = 8.0


def _peer_dies_during_tagged_recv(comm, out_dir):
    """World 3: rank 2 dies while rank 0 waits for a tagged message from it
    (another tag's message of rank 2 is held) and rank 1 waits from any source."""
    import torch
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401

    ctx = harness.context()
    dist.init_process_group("ringcomm", store=ctx.store, rank=ctx.rank, world_size=3,
                            timeout=timedelta(seconds=TIMEOUT))
    x = torch.zeros(4)
    if ctx.rank == 2:
        dist.send(torch.ones(4), 0, tag=2)  # a message of another tag, kept unread
        dist.barrier()
        time.sleep(0.3)
        os._exit(3)
    dist.barrier()
    t0 = time.monotonic()
    try:
        if ctx.rank == 0:
            dist.recv(x, 2, tag=1)
        else:
            dist.recv(x, tag=1)
        err = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        err = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump({"error": err, "seconds": time.monotonic() - t0}, f)
    return None


def test_peer_dies_during_tagged_and_any_source_recv(tmp_path):
    with pytest.raises(harness.RankDied):
        harness.run_ranks(_peer_dies_during_tagged_recv, 3, (str(tmp_path),), init=False,
                          hard_timeout=90, grace=TIMEOUT + 30)
    for r in (0, 1):
        out = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert out["error"] and "rank 2" in out["error"], (r, out)
        assert out["seconds"] < TIMEOUT, (r, out)
