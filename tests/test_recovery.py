"""Fault recovery primitives (issue 23, point 1): revoke, agree, shrink.

One spawned group of 4 ranks per transport runs the sections in order; the
last ones kill ranks, so the survivors go on with fewer:

- revoke from another thread while every rank blocks in a call: all raise
  RevokedError within PROMPT; later calls raise it too; agree and shrink
  work on the revoked communicator (shrink of nobody: a fresh world of 4).
- agree's AND, with one rank voting False, and an int flag.
- shrink with an async operation pending on the parent: the Work fails with
  RevokedError, the child works.
- a rank stopped (SIGSTOP) for longer than detection takes, less than the
  timeout, while the others agree: it is waited for, not declared dead.
- rank 3 SIGKILLed mid all_reduce: the survivors raise naming it, revoke,
  agree -> (True, [3]), shrink -> world 3 with parent_ranks [0, 1, 2]; the
  whole recovery timed; then a shrink of the shrink with exclude=[2] called
  by ranks 0 and 1 only.

A second group: a rank dies while the others shrink (before voting, and
after voting while the new communicator is being built): the survivors end
with the same communicator of the rest.
"""

import os
import signal
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

import harness
from checks import first_line

PROMPT = 0.1
SLACK = 0.4  # this shared 2-core VM
BIG = 1 << 18


def _sync(ctx, name, ranks=None):
    ranks = range(ctx.world_size) if ranks is None else ranks
    ctx.store.set(f"sync/{name}/{ctx.rank}", "1")
    ctx.store.wait([f"sync/{name}/{r}" for r in ranks], timedelta(seconds=60))


def _new_comm(ctx, timeout=60.0):
    import ringcomm

    return ringcomm.init(rank=ctx.rank, world_size=ctx.world_size, store=ctx.store, timeout=timeout)


def _check_works(comm, what, fails):
    """An all_reduce on `comm` gives the sum of (rank + 1)."""
    x = np.full(1024, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    want = comm.world_size * (comm.world_size + 1) / 2
    if not np.all(x == want):
        fails.append(f"{what}: all_reduce gave {x[0]}, want {want}")


def _revoke_in_flight(ctx, fails, msgs):
    import ringcomm

    comm = _new_comm(ctx)
    r = ctx.rank
    _check_works(comm, "before revoke", fails)
    x = np.ones(BIG, np.float32)
    fired = []
    if r == 2:
        def strike():
            fired.append(time.monotonic())
            comm.revoke("rank 2 revokes on purpose")
        t = threading.Timer(0.3, strike)
        t.start()
    # Ranks 0..2 block in an all_reduce that rank 3 joins only after the revoke.
    t0 = time.monotonic()
    try:
        if r == 3:
            ctx.store.wait(["revoke/fired"], timedelta(seconds=60))
        comm.all_reduce(x)
        fails.append(f"revoke: rank {r}'s call succeeded")
    except ringcomm.RevokedError as e:
        end = time.monotonic()
        if r == 2:
            ctx.store.set("revoke/fired", repr(fired[0]))
            took = end - fired[0]
            if took > PROMPT + SLACK:
                fails.append(f"revoke: rank 2's own call raised {took:.3f} s after revoke()")
        msgs.append(f"revoke: rank {r} raised RevokedError after {end - t0:.2f} s: {first_line(e)[:140]}")
        if "rank 2" not in str(e):
            fails.append(f"revoke: rank {r}'s error does not name rank 2: {first_line(e)}")
    except Exception as e:  # noqa: BLE001
        fails.append(f"revoke: rank {r} raised {type(e).__name__}, not RevokedError: {first_line(e)}")
        if r == 2:
            ctx.store.set("revoke/fired", "0")
    try:
        comm.all_reduce(np.ones(4, np.float32))
        fails.append(f"revoke: rank {r}'s later call succeeded")
    except ringcomm.RevokedError:
        pass
    except Exception as e:  # noqa: BLE001
        fails.append(f"revoke: rank {r}'s later call raised {type(e).__name__}: {first_line(e)}")
    # agree and shrink work on the revoked communicator.
    ok, failed = comm.agree(True)
    if (ok, failed) != (True, []):
        fails.append(f"revoke: agree gave {(ok, failed)} on rank {r}")
    child = comm.shrink()
    if (child.world_size, child.rank, child.parent_ranks) != (4, r, [0, 1, 2, 3]):
        fails.append(f"revoke: shrink gave rank {child.rank} of {child.world_size}, {child.parent_ranks}")
    _check_works(child, "the shrink of a revoked communicator", fails)
    child.close()
    comm.close()
    _sync(ctx, "revoke")


def _agree_values(ctx, fails, msgs):
    comm = _new_comm(ctx)
    r = ctx.rank
    got = comm.agree(r != 3)
    if got != (False, []):
        fails.append(f"agree: rank {r} got {got}, want (False, []) (rank 3 voted False)")
    got = comm.agree(0b1111 if r else 0b0110)
    if got != (0b0110, []):
        fails.append(f"agree: int flags gave {got} on rank {r}")
    got = comm.agree(True)
    if got != (True, []):
        fails.append(f"agree: rank {r} got {got}")
    for bad in (-1, "yes", 1.5):
        try:
            comm.agree(bad)
            fails.append(f"agree({bad!r}) was accepted")
        except (TypeError, ValueError):
            pass
    _check_works(comm, "after agree", fails)  # agree does not disturb the communicator
    comm.close()
    _sync(ctx, "agree")


def _shrink_with_pending(ctx, fails, msgs):
    import ringcomm

    comm = _new_comm(ctx)
    r = ctx.rank
    pending = None
    if r == 0:
        pending = comm.all_reduce(np.ones(BIG, np.float32), async_op=True)  # nobody joins it
        time.sleep(0.2)
    _sync(ctx, "pending-issued")
    child = comm.shrink()
    if pending is not None:
        try:
            pending.wait(10)
            fails.append("shrink: the parent's pending all_reduce succeeded")
        except ringcomm.RevokedError:
            pass
        except Exception as e:  # noqa: BLE001
            fails.append(f"shrink: the pending Work raised {type(e).__name__}: {first_line(e)}")
    _check_works(child, "the shrink with a pending op", fails)
    child.close()
    comm.close()
    _sync(ctx, "pending")


def _slow_is_not_dead(ctx, fails, msgs):
    """Rank 1 stops rank 2 (SIGSTOP) for 1.5 s while ranks 0, 1 and 3 agree:
    far longer than detection takes (ms), far less than the timeout."""
    comm = _new_comm(ctx)
    r = ctx.rank
    pid2 = int(ctx.store.get("pid/2")) if r == 1 else None
    _sync(ctx, "stop-ready")
    if r == 1:
        os.kill(pid2, signal.SIGSTOP)
        threading.Timer(1.5, os.kill, (pid2, signal.SIGCONT)).start()
    if r == 2:
        time.sleep(0.1)  # stopped around here
    t0 = time.monotonic()
    got = comm.agree(True, timeout=30)
    took = time.monotonic() - t0
    if got != (True, []):
        fails.append(f"stopped: rank {r} got {got}: a stopped rank was declared dead")
    msgs.append(f"stopped: rank {r} agreed in {took:.2f} s")
    comm.close()
    _sync(ctx, "stopped")


def _kill_and_recover(ctx, fails, msgs):
    import ringcomm

    comm = _new_comm(ctx)
    r = ctx.rank
    _check_works(comm, "before the kill", fails)
    _sync(ctx, "kill-ready")
    if r == 3:
        time.sleep(0.3)
        ctx.store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(BIG, np.float32))
        fails.append(f"kill: rank {r}'s all_reduce succeeded without rank 3")
    except ringcomm.RingcommError as e:
        t_detect = time.monotonic()
        if "rank 3" not in str(e) and not isinstance(e, ringcomm.RevokedError):
            fails.append(f"kill: rank {r}'s error names neither rank 3 nor a revoke: {first_line(e)}")
    comm.revoke("rank 3 is gone")
    ok, failed = comm.agree(True)
    t_agree = time.monotonic()
    if (ok, failed) != (True, [3]):
        fails.append(f"kill: agree gave {(ok, failed)} on rank {r}, want (True, [3])")
    child = comm.shrink()
    t_shrink = time.monotonic()
    if (child.world_size, child.rank, child.parent_ranks) != (3, r, [0, 1, 2]):
        fails.append(f"kill: shrink gave rank {child.rank} of {child.world_size}, {child.parent_ranks}")
    _check_works(child, "after the shrink", fails)
    t_step = time.monotonic()
    killed_at = float(ctx.store.get("killed_at"))
    msgs.append(f"kill: rank {r}: detect {t_detect - t0:.3f} s, agree {t_agree - t_detect:.3f} s, shrink "
                f"{t_shrink - t_agree:.3f} s, next call done {time.time() - killed_at:.3f} s after the kill")
    if t_step - t0 > 5:
        fails.append(f"kill: rank {r} needed {t_step - t0:.1f} s from the kill to a working communicator")
    # A shrink of the shrink, by ranks 0 and 1 only (rank 2 is excluded and does not call).
    # Not before rank 2's check is done: the shrink revokes the child, and a revoke
    # interrupts every rank's call in flight, also one that completed elsewhere.
    _sync(ctx, "kill-checked", ranks=[0, 1, 2])
    if r < 2:
        grand = child.shrink(exclude=[2])
        if (grand.world_size, grand.rank, grand.parent_ranks) != (2, r, [0, 1]):
            fails.append(f"kill: second shrink gave rank {grand.rank} of {grand.world_size}")
        _check_works(grand, "the shrink of a shrink", fails)
        grand.close()
    ctx.store.set(f"kill/done/{r}", "1")
    ctx.store.wait([f"kill/done/{q}" for q in range(3)], timedelta(seconds=60))
    child.close()
    comm.close()


def _recovery(comm, transport):
    ctx = harness.context()
    ctx.store.set(f"pid/{ctx.rank}", str(os.getpid()))
    fails, msgs = [], []
    _revoke_in_flight(ctx, fails, msgs)
    _agree_values(ctx, fails, msgs)
    _shrink_with_pending(ctx, fails, msgs)
    _slow_is_not_dead(ctx, fails, msgs)
    _kill_and_recover(ctx, fails, msgs)
    return {"fails": fails, "msgs": msgs}


def _results(run, killed):
    """The results by rank of a group in which the ranks `killed` die by design."""
    try:
        res = run()
    except harness.RankDied as e:
        assert set(e.died) == set(killed) and all(c == -signal.SIGKILL for c in e.died.values()), str(e)
        return e.results
    raise AssertionError(f"ranks {killed} were to be killed, but every rank reported: {res}")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_revoke_agree_shrink(transport):
    env = {"RINGCOMM_TRANSPORT": transport} if transport == "tcp" else {}
    res = _results(lambda: harness.run_ranks(_recovery, 4, (transport,), env=env, init=False,
                                             hard_timeout=240, grace=60), killed=[3])
    harness.print_and_check([res[r] for r in range(3)])


def _revoked_then_died(comm):
    """Rank 2, on a host of its own (so no pid tells its death), revokes the
    communicator and then dies before it votes: its ABORT frame is not the end of
    its connection (a rank that aborted keeps it until it closes, and closes with
    a goodbye), so its EOF without one is evidence of the death, and the
    survivors' shrink completes in milliseconds, not after the timeout."""
    import ringcomm

    ctx = harness.context()
    r = ctx.rank
    fails, msgs = [], []
    comm = _new_comm(ctx, timeout=30)
    _check_works(comm, "before the revoke", fails)
    _sync(ctx, "revoke-ready")
    if r == 2:
        comm.revoke("rank 2 gives up")
        time.sleep(0.3)  # its ABORT frames are out
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        while True:
            comm.all_reduce(np.ones(16, np.float32))
    except ringcomm.RingcommError as e:
        if not isinstance(e, ringcomm.RevokedError):
            fails.append(f"rank {r}: {first_line(e)}")
    t0 = time.monotonic()
    child = comm.shrink()
    took = time.monotonic() - t0
    if (child.world_size, child.parent_ranks) != (2, [0, 1]):
        fails.append(f"rank {r}: shrink gave {child.world_size} ranks {child.parent_ranks}")
    _check_works(child, "after the shrink", fails)
    msgs.append(f"shrink without the rank that revoked and died: {took * 1e3:.0f} ms")
    if took > 5:
        fails.append(f"rank {r}: the shrink took {took:.1f} s (timeout 30 s): the death was not noticed")
    ctx.store.set(f"rd/done/{r}", "1")
    ctx.store.wait([f"rd/done/{q}" for q in range(2)], timedelta(seconds=60))
    child.close()
    comm.close()
    return {"fails": fails, "msgs": msgs}


def test_a_remote_rank_that_revoked_then_died_is_found_gone():
    hosts = {r: {"RINGCOMM_HOST_ID": f"host-{r}"} for r in range(3)}
    res = _results(lambda: harness.run_ranks(_revoked_then_died, 3, rank_env=hosts, init=False,
                                             hard_timeout=120, grace=60), killed=[2])
    harness.print_and_check([res[r] for r in range(2)])


def _second_death(comm, when):
    """Rank 3 is SIGKILLed mid all_reduce; while the survivors shrink, rank 2
    dies too: `when` = "before_vote" (it never enters shrink) or "building"
    (it voted, then dies as it starts building the new communicator). Ranks 0
    and 1 must end with the same communicator of world 2, within 10 s."""
    import ringcomm
    from ringcomm import communicator as rc_comm

    ctx = harness.context()
    r = ctx.rank
    comm = _new_comm(ctx)
    fails, msgs = [], []
    _check_works(comm, "before the kills", fails)
    _sync(ctx, "ready")
    if r == 3:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(np.ones(BIG, np.float32))
        fails.append(f"rank {r}'s all_reduce succeeded without rank 3")
    except ringcomm.RingcommError:
        pass
    if r == 2 and when == "before_vote":
        os.kill(os.getpid(), signal.SIGKILL)
    if r == 2 and when == "building":
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        rc_comm.Communicator.__init__ = die
    t0 = time.monotonic()
    child = comm.shrink()
    took = time.monotonic() - t0
    if (child.world_size, child.rank, child.parent_ranks) != (2, r, [0, 1]):
        fails.append(f"{when}: shrink gave rank {child.rank} of {child.world_size}, {child.parent_ranks}")
    _check_works(child, f"{when}: after the shrink", fails)
    msgs.append(f"{when}: rank {r} shrank to {child.world_size} ranks in {took:.3f} s ({comm._shrinks} attempts)")
    if took > 10:
        fails.append(f"{when}: shrink took {took:.1f} s")
    ctx.store.set(f"done/{r}", "1")
    ctx.store.wait([f"done/{q}" for q in range(2)], timedelta(seconds=60))
    child.close()
    comm.close()
    return {"fails": fails, "msgs": msgs}


@pytest.mark.parametrize("when", ["before_vote", "building"])
def test_a_second_death_while_shrinking(when):
    env = {"RINGCOMM_TRANSPORT": "tcp"} if when == "building" else {}  # one case per transport
    res = _results(lambda: harness.run_ranks(_second_death, 4, (when,), env=env, init=False,
                                             hard_timeout=120, grace=60), killed=[2, 3])
    harness.print_and_check([res[r] for r in range(2)])


def _grow(comm, transport):
    """Ranks 0..2 form a communicator of 3; rank 3 of the spawned group is a
    replacement that calls init(join=...). The members grow at a point of
    their choosing: nobody waits at first (grow returns the same
    communicator), then the joiner is admitted as rank 3 of 4. A joiner whose
    settings differ from the members' (rank 4), and one without the members'
    join token (rank 5), are refused, and the members' communicator goes on."""
    import ringcomm

    ctx = harness.context()
    r = ctx.rank
    fails, msgs = [], []
    if r == 5:  # RINGCOMM_JOIN_TOKEN is not the members' token: refused
        ctx.store.wait(["grow/third"], timedelta(seconds=60))
        try:
            ringcomm.init(join="default", store=ctx.store, timeout=60)
            fails.append("the joiner with a wrong token was admitted")
        except ringcomm.RingcommError as e:
            if "wrong join token" not in str(e):
                fails.append(f"the wrong-token joiner's error: {first_line(e)}")
            msgs.append(f"refused: {first_line(e)[:120]}")
        return {"fails": fails, "msgs": msgs}
    if r == 4:  # RINGCOMM_SLOTS differs from the members': refused
        ctx.store.wait(["grow/second"], timedelta(seconds=60))
        try:
            ringcomm.init(join="default", store=ctx.store, timeout=60)
            fails.append("the joiner with other settings was admitted")
        except ValueError as e:
            msgs.append(f"refused: {first_line(e)[:120]}")
        return {"fails": fails, "msgs": msgs}
    if r == 3:
        ctx.store.wait(["grow/members-up"], timedelta(seconds=60))
        t0 = time.monotonic()
        comm = ringcomm.init(join="default", store=ctx.store, timeout=60)
        msgs.append(f"joined as rank {comm.rank} of {comm.world_size} after {time.monotonic() - t0:.2f} s")
        if (comm.rank, comm.world_size) != (3, 4):
            fails.append(f"the joiner got rank {comm.rank} of {comm.world_size}")
        _check_works(comm, "the grown communicator (joiner)", fails)
        _refused(ctx, comm, fails)
        comm.close()
        return {"fails": fails, "msgs": msgs}
    comm = ringcomm.init(rank=r, world_size=3, store=ctx.store, timeout=60)
    _check_works(comm, "the members before grow", fails)
    same = comm.grow()
    if same is not comm:
        fails.append("grow() with nobody waiting returned a new communicator")
    _let_one_in(ctx, comm, "grow/members-up")
    t0 = time.monotonic()
    grown = comm.grow()
    msgs.append(f"grew to {grown.world_size} in {time.monotonic() - t0:.3f} s")
    if (grown.rank, grown.world_size) != (r, 4):
        fails.append(f"member {r} is rank {grown.rank} of {grown.world_size} after grow")
    _check_works(grown, "the grown communicator (member)", fails)
    _check_works(comm, "the members' old communicator after grow", fails)
    comm.close()
    _refused(ctx, grown, fails)
    grown.close()
    return {"fails": fails, "msgs": msgs}


def _let_one_in(ctx, comm, go):
    """Rank 0 sets `go` (the joiner waiting for it asks to join) and waits until
    it waits; then every member of `comm` passes a barrier, ready to grow."""
    from ringcomm import recovery

    if comm.rank == 0:
        ctx.store.set(go, "1")
        deadline = time.monotonic() + 60
        while recovery.waiting(ctx.store, "default") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    comm.barrier()


def _refused(ctx, grown, fails):
    """The 4 ranks of the grown communicator grow again while a joiner with
    another RINGCOMM_SLOTS waits: every rank raises ValueError naming the
    setting, and their communicator goes on."""
    r = grown.rank
    _let_one_in(ctx, grown, "grow/second")
    try:
        grown.grow()
        fails.append(f"rank {r}: grow admitted a joiner whose settings differ")
    except ValueError as e:
        if "nslots" not in str(e):
            fails.append(f"rank {r}: the refusal does not name the setting: {first_line(e)}")
    _check_works(grown, "the communicator after a refused joiner", fails)
    # A joiner that does not hold the members' join token is refused; the members go on.
    _let_one_in(ctx, grown, "grow/third")
    same = grown.grow(token="s3cret")
    if same is not grown:
        fails.append(f"rank {r}: grow admitted a joiner with a wrong token")
    _check_works(grown, "the communicator after a wrong-token joiner", fails)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_grow_admits_a_replacement(transport):
    env = {"RINGCOMM_TRANSPORT": transport} if transport == "tcp" else {}
    harness.print_and_check(harness.run_ranks(_grow, 6, (transport,), env=env,
                                              rank_env={4: {"RINGCOMM_SLOTS": 7}, 5: {"RINGCOMM_JOIN_TOKEN": "wrong"}},
                                              init=False, hard_timeout=150))


def test_garbage_in_the_store_is_a_clear_error():
    """In-process, over a HashStore with the other rank's entries forged: a
    vote that is no flag, an entry that is neither vote nor death, and a
    malformed seat for a joiner each raise RingcommError naming what is wrong
    (never a raw ValueError / KeyError), at once."""
    import json

    import torch.distributed as dist

    import ringcomm
    from ringcomm import recovery

    for forged, words in (("vote:banana", "rank 1 voted 'banana': not a flag"),
                          ("vote:" + "9" * 30, "not a flag"), ("junk", "malformed")):
        st = dist.HashStore()
        st.set("p/state/1", forged)
        t0 = time.monotonic()
        with pytest.raises(ringcomm.RingcommError, match=words):
            recovery.agree(st, "p", 0, [0, 1], "1", recovery.Liveness(None, None, 0), 5.0, parse=recovery.flag_vote)
        assert time.monotonic() - t0 < 2
    for seat in (b"\xff", json.dumps({"prefix": "x"}), json.dumps({"prefix": "x", "rank": 5, "world": 2,
                                                                   "cost_params": {}})):
        st = dist.HashStore()
        st.set(f"{recovery.JOIN}/j/seat/1", seat)
        with pytest.raises(ringcomm.RingcommError, match="malformed"):
            ringcomm.init(join="j", store=st, timeout=2)
    with pytest.raises(ValueError, match="job"):
        ringcomm.init(join="a/b", store=dist.HashStore(), timeout=1)
    with pytest.raises(ValueError, match="leave rank"):
        ringcomm.init(rank=0, join="j", store=dist.HashStore(), timeout=1)


def test_agree_is_interruptible_and_bounded():
    """agree waiting for a rank that never votes (in-process, HashStore): a
    signal handler's exception (as Ctrl-C's KeyboardInterrupt) ends it within
    ~50 ms, and without one the timeout ends it, declaring the rank gone."""
    import threading

    import torch.distributed as dist

    from ringcomm import recovery

    class Interrupt(Exception):
        pass

    def handler(signum, frame):
        raise Interrupt()

    old = signal.signal(signal.SIGUSR2, handler)
    try:
        fired = []
        t = threading.Timer(0.3, lambda: (fired.append(time.monotonic()), os.kill(os.getpid(), signal.SIGUSR2)))
        t.start()
        with pytest.raises(Interrupt):
            recovery.agree(dist.HashStore(), "p", 0, [0, 1], "1", recovery.Liveness(None, None, 0), 30.0)
        assert time.monotonic() - fired[0] < 0.2
    finally:
        signal.signal(signal.SIGUSR2, old)
    t0 = time.monotonic()
    votes, dead = recovery.agree(dist.HashStore(), "p", 0, [0, 1], "1", recovery.Liveness(None, None, 0), 0.5)
    assert votes == {0: "1"} and list(dead) == [1] and "did not join" in dead[1], (votes, dead)
    assert time.monotonic() - t0 < 2


def _drop_3d(comm):
    """TP2 x PP2 x DP2 at world 8 (oversubscribed): rank 3 (TP rank 1 of
    replica 1) is SIGKILLed while every rank runs collectives on its TP, DP
    and PP groups. Its replica (ranks 2, 3, 6, 7) is dropped: ranks 2, 6 and
    7 get (None, None); ranks 0, 1, 4 and 5 go on in a world of 4 with the
    same TP and PP coordinates and DP groups of one."""
    import ringcomm
    from ringcomm.parallel import drop_lost_replicas, split_3d

    ctx = harness.context()
    r = ctx.rank
    fails, msgs = [], []
    world = _new_comm(ctx, timeout=60)
    g = split_3d(world, tp=2, pp=2)
    _sync(ctx, "3d-ready")
    x = np.ones(4096, np.float32)
    t0 = time.monotonic()
    try:
        for i in range(100000):
            if r == 3 and i == 50:
                os.kill(os.getpid(), signal.SIGKILL)
            g.tp.all_reduce(x)
            g.dp.all_reduce(x)
            g.pp.all_reduce(x)
            x[:] = 1
        fails.append(f"rank {r}: the collectives went on without rank 3")
    except ringcomm.RingcommError:
        pass
    new_world, ng = drop_lost_replicas(world, g)
    took = time.monotonic() - t0
    if r in (2, 6, 7):
        if new_world is not None:
            fails.append(f"rank {r} of the lost replica was not dropped")
    else:
        if new_world is None:
            fails.append(f"rank {r} was dropped with the lost replica")
        else:
            want = {0: 0, 1: 1, 4: 2, 5: 3}[r]
            if (new_world.rank, new_world.world_size, ng.dp_size) != (want, 4, 1):
                fails.append(f"rank {r}: rank {new_world.rank} of {new_world.world_size}, dp {ng.dp_size}")
            if (ng.tp_rank, ng.pp_rank) != (g.tp_rank, g.pp_rank):
                fails.append(f"rank {r}: the coordinates moved: tp {g.tp_rank}->{ng.tp_rank}, pp {g.pp_rank}->"
                             f"{ng.pp_rank}")
            y = np.ones(16, np.float32)
            ng.tp.all_reduce(y)
            ng.pp.all_reduce(y)
            ng.dp.all_reduce(y)
            if not np.all(y == 4):
                fails.append(f"rank {r}: the new groups gave {y[0]}, want 4")
            ng.close()
            new_world.close()
        msgs.append(f"rank {r}: in a world of 4, {took:.2f} s after the loop began (rank 3 died in it)")
    world.close()
    survivors = [0, 1, 2, 4, 5, 6, 7]
    ctx.store.set(f"3d-done/{r}", "1")
    ctx.store.wait([f"3d-done/{q}" for q in survivors], timedelta(seconds=60))
    return {"fails": fails, "msgs": msgs}


def test_3d_drops_the_replica_of_a_lost_tp_rank():
    res = _results(lambda: harness.run_ranks(_drop_3d, 8, init=False, hard_timeout=180, grace=60), killed=[3])
    harness.print_and_check([res[r] for r in (0, 1, 2, 4, 5, 6, 7)])
