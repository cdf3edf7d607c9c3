"""TCP connections are made when a schedule first needs them (csrc/transport/tcp/
connector.h): with TCP forced between all ranks, a communicator connects only its
ring neighbours at init, a ring all_reduce uses no other, recursive doubling adds
its log2 partners, a barrier and the agreement check of rooted calls add the
dissemination partners r + 2^k, and only all_to_all (everyone talks to everyone)
makes the full mesh;
each pair of ranks has at most one connection whoever dialled. A peer killed
before any connection to it exists is still reported, naming it, on every rank.

The connections are read from the kernel (/proc/self/fd and /proc/net/tcp): a
socket belongs to a communicator when its local port is that communicator's
listening port (accepted, or the listener itself) or its remote port is a peer's
(dialled); the two ends of an accepted connection are matched by the dialler's
local port and the rank it dialled.
"""

import json
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

import checks
import harness

def _links(rank, infos):
    """This rank's sockets of the communicator whose census is `infos`: the peers it
    dialled (with the local port), the remote ports of those it accepted, and
    whether its listener is open."""
    mine = infos[rank]["tcp"][1]
    peer_of = {int(i["tcp"][1]): q for q, i in enumerate(infos) if q != rank}
    dialled, accepted, listening = [], [], False
    for local, remote, state in harness.tcp_sockets():
        if state == "listen" and local == mine:
            listening = True
        elif state == "established" and local == mine:
            accepted.append(remote)
        elif state == "established" and remote in peer_of:
            dialled.append([peer_of[remote], local])
    return {"dialled": dialled, "accepted": accepted, "listening": listening}


def _sync(ctx, name):
    """A barrier through the store (a collective would make connections of its own)."""
    ctx.store.set(f"{name}/{ctx.rank}", "1")
    ctx.store.wait([f"{name}/{q}" for q in range(ctx.world_size)], timedelta(seconds=60))


def _communicator(ctx, prefix, algo):
    """A Communicator over TCP with `algo`, and its census (the listening ports)."""
    import ringcomm
    from ringcomm import bootstrap
    from ringcomm.config import make_config

    seen = {}
    exchange = bootstrap.exchange

    def keep_census(store, pfx, *args, **kw):
        infos = exchange(store, pfx, *args, **kw)
        if pfx == prefix:
            seen["infos"] = infos
        return infos

    bootstrap.exchange = keep_census
    try:
        comm = ringcomm.Communicator(ctx.store, prefix, ctx.rank, ctx.world_size,
                                     make_config(timeout=30, transport="tcp", algo=algo))
    finally:
        bootstrap.exchange = exchange
    return comm, seen["infos"]


def _all_reduce_sizes(comm, tag):
    fails = []
    r, ws = comm.rank, comm.world_size
    for n in (1, 1000, 100003):
        x = np.full(n, r + 1, np.int64)
        comm.all_reduce(x)
        if not (x == ws * (ws + 1) // 2).all():
            fails.append(f"{tag}: all_reduce of {n} gave {x[:4]}")
    return fails


def _connection_phases(comm):
    """Snapshots of each rank's connections after each phase, and the failures."""
    ctx = harness.context()
    r, ws = ctx.rank, ctx.world_size
    fails, snaps = [], {}

    def snap(phase, infos):
        """This rank's connections once every rank finished `phase` (none goes on before all looked)."""
        _sync(ctx, phase)
        snaps[phase] = _links(r, infos)
        _sync(ctx, phase + " seen")

    ring, ring_infos = _communicator(ctx, "conn-ring", "ring")
    if ring.transports != ["self" if q == r else "tcp" for q in range(ws)]:
        fails.append(f"transports are {ring.transports}")
    snap("ring init", ring_infos)
    fails += _all_reduce_sizes(ring, "ring")
    snap("ring all_reduce", ring_infos)
    # The other ring schedules stay on the same links.
    for prim in ("all_gather", "reduce_scatter"):
        fails += checks.collective_matrix(ring, prims=(prim,), dtypes=("float32", "int64"), counts=(0, 7, 1000),
                                          tag="ring ", allow_default=False)
        snap("ring " + prim, ring_infos)
    # A barrier is the dissemination barrier: partners r + 1, r + 2, r + 4.
    for _ in range(3):
        ring.barrier()
    snap("ring barrier", ring_infos)
    # A chain broadcast and reduce use the ring too; rooted calls first check
    # that every rank issued the same call (Communicator::agree_on_call), over
    # the dissemination barrier's partners: no new connection.
    fails += checks.collective_matrix(ring, prims=("broadcast", "reduce"), dtypes=("float32", "int64"),
                                      counts=(0, 7, 1000), tag="ring ", allow_default=False)
    snap("ring run", ring_infos)

    rd, rd_infos = _communicator(ctx, "conn-rd", "all_reduce:recursive_doubling")
    snap("rd init", rd_infos)
    fails += _all_reduce_sizes(rd, "recursive doubling")
    snap("rd run", rd_infos)

    # Everyone talks to everyone: the full mesh, one connection per pair.
    for n in (0, 3, 1000):
        inp = np.arange(ws * n, dtype=np.int32) + 1000 * r
        out = np.empty_like(inp)
        rd.all_to_all(out, inp)
        want = np.concatenate([np.arange(r * n, (r + 1) * n, dtype=np.int32) + 1000 * q for q in range(ws)])
        if not (out == want).all():
            fails.append(f"all_to_all of {n} per rank gave a wrong result")
    snap("all_to_all run", rd_infos)

    # Every primitive on the fully connected communicator and on the sparse one.
    fails += checks.collective_matrix(ring, dtypes=("float32", "int32"), counts=(0, 7, 1000), tag="ring-all ", allow_default=False)
    fails += checks.collective_matrix(rd, dtypes=("float32", "int32"), counts=(0, 7, 1000), tag="rd-all ", allow_default=False)
    fails += checks.p2p_and_barrier(rd, "rd ")
    ring.close()
    rd.close()
    return {"fails": fails, "snaps": snaps}


def _edges(snaps, phase, ws):
    """The connections of one phase as {frozenset({a, b}): count}, and the failures
    found in matching the two ends of each."""
    fails, edges = [], {}
    # Keyed by (the dialler's local port, the rank dialled): the kernel gives the
    # same ephemeral port to connections towards different peers (the 4-tuple is
    # what must be unique), so a local port alone names no connection.
    by_port = {}
    for r in range(ws):
        for peer, local in snaps[r][phase]["dialled"]:
            edges[frozenset((r, peer))] = edges.get(frozenset((r, peer)), 0) + 1
            by_port[(local, peer)] = r
    for r in range(ws):
        for remote in snaps[r][phase]["accepted"]:
            if (remote, r) not in by_port:
                fails.append(f"{phase}: rank {r} holds an accepted connection from port {remote} that no rank dialled")
    dialled_to = {r: sum(1 for (_, p) in by_port if p == r) for r in range(ws)}
    for r in range(ws):
        if len(snaps[r][phase]["accepted"]) != dialled_to[r]:
            fails.append(f"{phase}: rank {r} accepted {len(snaps[r][phase]['accepted'])} connections, "
                         f"{dialled_to[r]} were dialled to it")
    for e, n in edges.items():
        if n != 1:
            fails.append(f"{phase}: ranks {sorted(e)} have {n} connections (want one)")
    return set(edges), fails


def _ring_edges(ws):
    return {frozenset((r, (r + 1) % ws)) for r in range(ws)}


@pytest.mark.parametrize("world_size", [8])
def test_connections_follow_the_schedules(world_size):
    ws = world_size
    res = harness.run_ranks(_connection_phases, ws, init=False, hard_timeout=300)
    harness.assert_no_failures([out["fails"] for out in res])
    snaps = [out["snaps"] for out in res]
    ring = _ring_edges(ws)
    doubling = {frozenset((r, r ^ m)) for r in range(ws) for m in (1, 2, 4)}
    mesh = {frozenset((a, b)) for a in range(ws) for b in range(a)}
    dissemination = {frozenset((r, (r + d) % ws)) for r in range(ws) for d in (1, 2, 4)}
    want = {"ring init": ring, "ring all_reduce": ring, "ring all_gather": ring, "ring reduce_scatter": ring,
            "ring barrier": ring | dissemination, "ring run": ring | dissemination, "rd init": ring, "rd run": ring | doubling,
            "all_to_all run": mesh}
    fails = []
    for phase, expect in want.items():
        got, bad = _edges(snaps, phase, ws)
        fails += bad
        print(f"{phase}: {len(got)} connections (full mesh {len(mesh)}); sockets per rank "
              f"{[len(s[phase]['dialled']) + len(s[phase]['accepted']) for s in snaps]}")
        if got != expect:
            fails.append(f"{phase}: connections {sorted(map(sorted, got))}, expected {sorted(map(sorted, expect))}")
        # The listener stays open until every peer is connected, then closes.
        for r in range(ws):
            full = sum(1 for e in got if r in e) == ws - 1
            if snaps[r][phase]["listening"] == full:
                fails.append(f"{phase}: rank {r}'s listener is {'open' if full else 'closed'} with "
                             f"{'every' if full else 'not every'} peer connected")
    assert not fails, "\n".join(fails)


def _killed_before_first_use(comm, report_dir):
    """World 4: rank 3 is killed after init, before any call. Ranks 0 and 2 (its ring
    neighbours) hold a connection to it; rank 1 has none: it receives from rank 3,
    so it dials, and the dial is refused. Then (so that rank 1's error is its own)
    ranks 0 and 2 run an all_reduce, which cannot finish without ranks 1 and 3."""
    import ringcomm

    ctx = harness.context()
    r = ctx.rank
    rd, _ = _communicator(ctx, "conn-kill", "all_reduce:recursive_doubling")
    _sync(ctx, "kill-init")
    if r == 3:
        ctx.store.set("gone_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.store.wait(["gone_at"], timedelta(seconds=60))
    time.sleep(0.2)
    if r != 1:
        ctx.store.wait(["rank1-done"], timedelta(seconds=60))
    out = {"rank": r}
    t0 = time.time()
    try:
        if r == 1:
            rd.recv(np.empty(1000, np.float32), 3)
        else:
            rd.all_reduce(np.ones(1000, np.float32))
        out["error"] = None
    except ringcomm.RingcommError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["took_s"] = time.time() - t0
    if r == 1:
        ctx.store.set("rank1-done", "1")
    with open(os.path.join(report_dir, f"rank{r}.json"), "w") as f:
        json.dump(out, f)
    rd.close()
    return out


def test_peer_killed_before_first_use_is_named_on_every_rank(tmp_path):
    with pytest.raises(harness.RankDied):
        harness.run_ranks(_killed_before_first_use, 4, (str(tmp_path),), init=False, hard_timeout=120,
                          grace=30)
    fails = []
    for r in (0, 1, 2):
        path = tmp_path / f"rank{r}.json"
        if not path.exists():
            fails.append(f"rank {r} reported nothing")
            continue
        out = json.loads(path.read_text())
        print(f"rank {r}: raised after {out['took_s']:.2f} s: {out['error']}")
        if out["error"] is None:
            fails.append(f"rank {r}: its call succeeded without rank 3")
            continue
        if "rank 3" not in out["error"]:
            fails.append(f"rank {r}: the error does not name rank 3: {out['error'][:400]}")
        if "TimeoutError" in out["error"] or out["took_s"] > 5.0:
            fails.append(f"rank {r}: took {out['took_s']:.1f} s (timeout 30 s): {out['error'][:300]}")
        if r == 1 and ("connecting over TCP to rank 3" not in out["error"] or "refused" not in out["error"]):
            fails.append(f"rank 1: expected its refused dial to rank 3 in the error: {out['error'][:400]}")
    assert not fails, "\n".join(fails)
