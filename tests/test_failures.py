"""Never a hang: a rank that skips a collective, a rank that never joins init, and a
killed job (which must leave nothing behind in /dev/shm)."""

import os
import re
import signal
import stat
import time
from datetime import timedelta

import numpy as np
import pytest

import harness
from checks import first_line

TIMEOUT = 2.0  # communicator timeout in these tests, seconds
MARGIN = 3.0  # how late after the deadline the error may come


def _names_op(msg, op):
    return re.search(op.replace("_", "[_ -]?"), msg, re.IGNORECASE) is not None


def _number(msg, n):
    return re.search(rf"(?<![\d.]){n}(?![\d.])", msg) is not None


def _skip_one_collective(comm, skipper):
    """All ranks run 3 all_reduces; then `skipper` skips the 4th, which the others
    must abandon with ringcomm.TimeoutError; afterwards their communicator refuses
    further calls."""
    import ringcomm

    ctx = harness.context()
    r, ws = comm.rank, comm.world_size
    fails = []
    for i in range(3):
        x = np.full(8, r + i, np.int32)
        comm.all_reduce(x)
        if not (x == ws * (ws - 1) // 2 + ws * i).all():
            fails.append(f"warm-up all_reduce {i} wrong: {x}")
    if r == skipper:
        # Stay alive (a dead peer is another test) until the others are done.
        ctx.store.wait([f"timeout_test/{q}" for q in range(ws) if q != skipper],
                       timedelta(seconds=120))
        return {"fails": fails}

    msg, elapsed = None, None
    x = np.ones(1000, np.float32)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
        fails.append(f"all_reduce returned although rank {skipper} never called it")
    except ringcomm.TimeoutError as e:
        elapsed, msg = time.monotonic() - t0, str(e)
    except Exception as e:  # noqa: BLE001
        fails.append(f"all_reduce raised {type(e).__name__} ({first_line(e)}), "
                     "expected ringcomm.TimeoutError")
    if elapsed is not None:
        if not TIMEOUT * 0.8 <= elapsed <= TIMEOUT + MARGIN:
            fails.append(f"TimeoutError after {elapsed:.2f}s, expected about {TIMEOUT}s "
                         f"(at most {TIMEOUT + MARGIN}s)")
        if not _names_op(msg, "all_reduce"):
            fails.append(f"TimeoutError does not name the op all_reduce: {msg!r}")
        if "rank" not in msg.lower() or not _number(msg, r):
            fails.append(f"TimeoutError does not name this rank ({r}): {msg!r}")
        if "seq" not in msg.lower():
            fails.append(f"TimeoutError does not name the sequence number: {msg!r}")
        if ws == 2 and not _number(msg, skipper):
            fails.append(f"TimeoutError does not name the peer waited for ({skipper}): {msg!r}")

    # Poisoned: later calls raise RingcommError at once.
    for what, call in (("all_reduce", lambda: comm.all_reduce(np.ones(4, np.float32))),
                       ("barrier", lambda: ringcomm.barrier(comm=comm)),
                       ("broadcast", lambda: ringcomm.broadcast(np.ones(4, np.int64), src=0, comm=comm))):
        t0 = time.monotonic()
        try:
            call()
            fails.append(f"{what} after the timeout succeeded; the communicator should refuse it")
        except ringcomm.RingcommError:
            if time.monotonic() - t0 > 1.0:
                fails.append(f"{what} after the timeout took {time.monotonic() - t0:.1f}s to refuse")
        except Exception as e:  # noqa: BLE001
            fails.append(f"{what} after the timeout raised {type(e).__name__} "
                         f"({first_line(e)}), expected RingcommError")
    ctx.store.set(f"timeout_test/{r}", "1")
    return {"fails": fails, "msg": msg, "elapsed": elapsed}


@pytest.mark.parametrize("world_size,via", [(2, "init(timeout=)"), (3, "RINGCOMM_TIMEOUT")])
def test_rank_skipping_a_collective_times_out(world_size, via):
    skipper = world_size - 1
    if via == "RINGCOMM_TIMEOUT":
        kw = dict(env={"RINGCOMM_TIMEOUT": TIMEOUT}, comm_timeout=None)
    else:
        kw = dict(comm_timeout=TIMEOUT)
    res = harness.run_ranks(_skip_one_collective, world_size, (skipper,), hard_timeout=90, **kw)
    for r, out in enumerate(res):
        if r != skipper:
            print(f"rank {r}: {out['elapsed']}s: {out['msg']}")
    harness.assert_no_failures([out["fails"] for out in res])


def _late_rank_sees_the_timeout(comm, skipper):
    """Rank `skipper` skips an all_reduce; rank 1 enters it a second after rank 0, so
    rank 0's deadline passes first and its abort reaches rank 1 before rank 1's own
    deadline: rank 1 must raise ringcomm.TimeoutError too (naming rank 0's timeout),
    not a plain RingcommError."""
    import ringcomm

    ctx = harness.context()
    r, ws = comm.rank, comm.world_size
    fails = []
    comm.all_reduce(np.ones(4, np.float32))
    if r == skipper:
        ctx.store.wait([f"late_timeout/{q}" for q in range(ws) if q != skipper], timedelta(seconds=120))
        return fails
    if r == 1:
        time.sleep(1.0)
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(1000, np.float32))
        fails.append("all_reduce returned although the last rank never called it")
    except ringcomm.TimeoutError as e:
        msg = str(e)
        if r == 1 and time.monotonic() - t0 > TIMEOUT - 0.3:
            fails.append(f"rank 1 waited {time.monotonic() - t0:.2f}s: rank 0's abort notice should end it first")
        if not _names_op(msg, "all_reduce") or not _number(msg, r) or "seq" not in msg:
            fails.append(f"TimeoutError does not name the op, this rank and the seq: {msg!r}")
        if r == 1 and ("rank 0" not in msg or "Timed out" not in msg):
            fails.append(f"rank 1's TimeoutError does not name rank 0's timeout: {msg!r}")
    except Exception as e:  # noqa: BLE001
        fails.append(f"all_reduce raised {type(e).__name__} ({first_line(e)}), expected ringcomm.TimeoutError")
    ctx.store.set(f"late_timeout/{r}", "1")
    return fails


def test_a_rank_told_of_a_peers_timeout_raises_timeout_error():
    res = harness.run_ranks(_late_rank_sees_the_timeout, 3, (2,), hard_timeout=90, comm_timeout=TIMEOUT)
    harness.assert_no_failures(res)


def _never_joins(comm):
    """Round A: the last rank never calls init; round B: rank 0 (which still hosts the
    TCPStore) never calls init. The others must get ringcomm.TimeoutError in time."""
    import torch.distributed as dist

    import ringcomm

    ctx = harness.context()
    r, ws = ctx.rank, ctx.world_size
    fails, msgs = [], []
    for rnd, absent in (("A", ws - 1), ("B", 0)):
        if r != absent:
            store = dist.PrefixStore(f"never_joins_{rnd}", ctx.store)
            t0 = time.monotonic()
            try:
                c = ringcomm.init(rank=r, world_size=ws, store=store, timeout=TIMEOUT)
                fails.append(f"round {rnd}: init returned although rank {absent} never joined")
                c.close()
            except ringcomm.TimeoutError as e:
                elapsed = time.monotonic() - t0
                msgs.append(f"round {rnd}: {elapsed:.2f}s: {e}")
                if elapsed > TIMEOUT + MARGIN:
                    fails.append(f"round {rnd}: init raised TimeoutError after {elapsed:.1f}s, "
                                 f"deadline {TIMEOUT}s")
            except Exception as e:  # noqa: BLE001
                fails.append(f"round {rnd}: init raised {type(e).__name__} ({first_line(e)}), "
                             "expected ringcomm.TimeoutError")
        ctx.store.set(f"never_joins/{rnd}/{r}", "1")
        ctx.store.wait([f"never_joins/{rnd}/{q}" for q in range(ws)], timedelta(seconds=60))
    return {"fails": fails, "msgs": msgs}


def test_rank_that_never_joins_init():
    res = harness.run_ranks(_never_joins, 3, init=False, hard_timeout=90)
    harness.print_and_check(res)


SHM = "/dev/shm"


def _listing():
    """Names in /dev/shm, less multiprocessing's own semaphores (the harness queue)."""
    try:
        return {n for n in os.listdir(SHM) if not n.startswith("sem.mp-")}
    except FileNotFoundError:
        return set()


def _work_then_die(comm, before, report_dir):
    """Use every link (all_reduce both ways, all_to_all), report what this rank sees
    in /dev/shm, then die by SIGKILL like a killed job."""
    import ringcomm

    r, ws = comm.rank, comm.world_size
    for n in (7, 1 << 20):
        x = np.ones(n, np.float32)
        ringcomm.all_reduce(x, comm=comm)
    out = np.zeros(3 * ws, np.int32)
    comm.all_to_all(out, np.arange(3 * ws, dtype=np.int32))
    comm.barrier()
    lines = []
    for name in sorted(_listing() - set(before)):
        try:
            st = os.stat(os.path.join(SHM, name))
        except FileNotFoundError:
            continue
        lines.append(f"{name} {stat.S_IMODE(st.st_mode):o} {st.st_uid}")
    with open(os.path.join(report_dir, f"rank{r}"), "w") as f:
        f.write("\n".join(lines))
    comm.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm on this machine")
def test_killed_job_leaves_nothing_in_dev_shm(tmp_path):
    before = _listing()
    with pytest.raises(harness.RankDied) as ei:
        harness.run_ranks(_work_then_die, 3, (sorted(before), str(tmp_path)), hard_timeout=90)
    assert "exited with code -9" in str(ei.value), str(ei.value)
    seen = {}
    for r in range(3):
        with open(tmp_path / f"rank{r}") as f:
            for line in f.read().splitlines():
                name, mode, uid = line.split()
                seen[name] = (mode, int(uid))
    bad_mode = {n: m for n, (m, _) in seen.items() if m != "600"}
    assert not bad_mode, f"shared segments not created 0600: {bad_mode}"
    time.sleep(0.5)
    # Only what the ranks saw while alive counts, so other jobs' segments do not.
    leaked = sorted((_listing() - before) & set(seen))
    for name in leaked:  # clean up after the failure
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            pass
    assert not leaked, f"killed job left these in {SHM}: {leaked}"


def _mismatched_call(c, what, r):
    """Rank 0 and rank 1 make calls that differ in `what`."""
    if what == "count":
        c.all_reduce(np.ones(10 + r, np.float32))
    elif what == "op":
        c.all_reduce(np.ones(10, np.float32), op="max" if r else "sum")
    elif what == "dtype":
        c.all_reduce(np.ones(10, np.float32 if r else np.float64))
    elif what == "root":
        c.broadcast(np.ones(10, np.float32), src=r)
    elif what == "reduce root":
        c.reduce(np.ones(10, np.float32), dst=1 - r)
    elif what == "gather count":
        c.gather(np.zeros(2 * (3 + r), np.float32) if r == 0 else None, np.ones(3 + r, np.float32), dst=0)
    elif what == "broadcast vs reduce":
        if r:
            c.reduce(np.ones(10, np.float32), dst=0)
        else:
            c.broadcast(np.ones(10, np.float32), src=0)
    elif r:
        c.broadcast(np.ones(10, np.float32), src=0)
    else:
        c.all_reduce(np.ones(10, np.float32))


def _mismatched_calls(comm):
    """Ranks that call different collectives get a RingcommError describing both
    calls (from the message headers), not a hang or a wrong answer."""
    import ringcomm

    fails = []
    # Rooted calls at two ranks: their schedules have both ranks hear from each
    # other (comm/call_plan.cpp make_mutual), so they raise in the call itself.
    for what in ("count", "op", "dtype", "root", "kind", "reduce root", "gather count", "broadcast vs reduce"):
        c = comm.split(ranks=[0, 1])  # a fresh communicator each time: a mismatch poisons it
        msg = None
        try:
            _mismatched_call(c, what, comm.rank)
            fails.append(f"{what}: mismatched calls did not raise")
        except ringcomm.TimeoutError as e:
            fails.append(f"{what}: TimeoutError instead of a mismatch error: {first_line(e)}")
        except ringcomm.RingcommError as e:
            msg = str(e)
        try:
            c.all_reduce(np.ones(4, np.float32))
            fails.append(f"{what}: the communicator still accepts calls after the mismatch")
        except ringcomm.TimeoutError as e:
            fails.append(f"{what}: TimeoutError instead of a mismatch error: {first_line(e)}")
        except ringcomm.RingcommError as e:
            msg = msg or str(e)
        if msg is not None and ("mismatch" not in msg or msg.count("(seq") < 2):
            fails.append(f"{what}: message does not describe both calls: {msg!r}")
        c.close()
    return fails


def test_mismatched_calls_are_reported():
    results = harness.run_ranks(_mismatched_calls, 2, comm_timeout=10.0, hard_timeout=90)
    harness.assert_no_failures(results)
