"""The cuda_ipc transport's protocol (csrc/transport/cuda_ipc/ipc_channel.h) between real
processes over its CPU stand-in, host shared memory (tests/ipc_standin.py): every
primitive x dtype x op at world sizes 2-4 through the schedules of csrc/algo, one-shot
and two-shot all-reduce bit-identical on every rank, a peer killed mid-call, an abort
from another thread, and buffers released. Slots are tiny, so that every message is
cut into many chunks and every slot is reused many times. The CUDA implementation of
the same interface is checked by tests/test_gpu_ipc.py (scripts/gpu_check.sh)."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import checks
import harness
from ipc_standin import Call, IpcStandIn

SMALL = {"slot_bytes": 512, "nslots": 2, "stage_bytes": 16384, "one_shot_max": 1024, "two_shot_max": 16384}
COUNTS = (0, 1, 7, 1000, 4099)
TIMEOUT_S = 10.0


def _matrix(_comm, prims, dtypes, counts, family):
    comm = IpcStandIn(timeout_s=TIMEOUT_S, family=family, **SMALL)
    call, fails, i = Call(comm), [], 0
    ws = comm.world_size
    try:
        for prim in prims:
            for dtype in dtypes:
                for op in (checks.ops_for(dtype) if prim in checks.REDUCING else (None,)):
                    for n in counts:
                        i += 1
                        conts = checks.containers_for(dtype)
                        cont, variant, root = conts[i % len(conts)], i // 2, (i // 3) % ws
                        seed = checks.seed_of("ipc", prim, dtype, op, n, i)
                        desc = f"{family} {prim} {dtype} {op} n={n} root={root}"
                        try:
                            err = checks.run_primitive_case(comm, prim, call, dtype, op, n, cont, variant, seed, root,
                                                               (i // 2) % 2 == 1)
                        except Exception as e:  # noqa: BLE001
                            fails.append(f"{desc}: raised {type(e).__name__}: {checks.first_line(e)}")
                            return fails
                        if err:
                            fails.append(f"{desc}: {err}")
        fails += _p2p(comm)
    finally:
        comm.close()
    return fails


def _p2p(comm):
    """send/recv around the ring (each rank sends to the next and receives from the one
    before in one group), and rank 0 -> 1 alone, of sizes from 0 to many slots."""
    r, ws, fails = comm.rank, comm.world_size, []
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    for n in (0, 1, 1000, 30011):
        seed = checks.seed_of("ipc-p2p", n)
        got = np.full(n, -1, np.int32)
        comm.sendrecv(checks.gen("int32", None, seed, r, 0, n), nxt, got, prv)
        if not np.array_equal(got, checks.gen("int32", None, seed, prv, 0, n)):
            fails.append(f"sendrecv of {n} int32 from rank {prv}: wrong data")
        x = np.arange(n, dtype=np.float64) * (r + 1)
        if r == 0:
            comm.send(x, 1)
        elif r == 1:
            comm.recv(x, 0)
            if not np.array_equal(x, np.arange(n, dtype=np.float64)):
                fails.append(f"send/recv of {n} float64 from rank 0: wrong data")
    return fails


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_primitive_dtype_and_op(world):
    results = harness.run_ranks(_matrix, world, (checks.PRIMITIVES, checks.DTYPES, COUNTS, "auto"), init=False,
                                hard_timeout=300)
    harness.assert_no_failures(results)


@pytest.mark.parametrize("world", [3, 4])
def test_other_schedule_families(world):
    """The other families of csrc/algo run over cuda_ipc unchanged (all_reduce forced
    past one-/two-shot to its schedule by counts above the stage)."""
    fails = []
    for family, prims in (("recursive_doubling", ["all_reduce"]), ("rabenseifner", ["all_reduce"]),
                          ("tree", ["broadcast", "reduce"]), ("bruck", ["all_gather"])):
        results = harness.run_ranks(_matrix, world, (prims, ("float32", "int32", "bfloat16"), (0, 7, 5000), family),
                                    init=False, hard_timeout=200)
        fails += [f for rank in results for f in rank]
    assert not fails, "\n".join(fails[:40])


def _bits(_comm, counts):
    """all_reduce of inexact float values under each algorithm; returns the bits."""
    comm = IpcStandIn(timeout_s=TIMEOUT_S, **SMALL)
    rng = np.random.default_rng(1234 + comm.rank)
    out = {}
    try:
        for dtype in ("float32", "float16", "float64"):
            for op in ("sum", "avg", "prod"):
                for n in counts:
                    base = rng.standard_normal(n).astype(dtype)
                    for algo in ("oneshot", "twoshot"):
                        x = base.copy()
                        comm.all_reduce(x, op=op, algo=algo)
                        out[f"{dtype}/{op}/{n}/{algo}"] = x.tobytes().hex()
        out["chosen"] = [comm.native.choose(b, "auto") for b in (0, 1024, 1025, 16384, 16385)]
    finally:
        comm.close()
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_one_shot_and_two_shot_are_bit_identical_on_every_rank(world):
    results = harness.run_ranks(_bits, world, ((1, 5, 257, 2000),), init=False, hard_timeout=120)
    fails = []
    for key in results[0]:
        if key == "chosen":
            continue
        for r in range(1, world):
            if results[r][key] != results[0][key]:
                fails.append(f"{key}: rank {r}'s bits differ from rank 0's")
        if key.endswith("/oneshot") and results[0][key] != results[0][key[:-len("oneshot")] + "twoshot"]:
            fails.append(f"{key}: one-shot and two-shot differ")
    assert not fails, "\n".join(fails[:40])
    # The thresholds pick by size: one-shot to 1024 B, two-shot to the stage, then the ring.
    assert results[0]["chosen"] == ["oneshot", "oneshot", "twoshot", "twoshot", "ring"]


def _lose_a_peer(_comm, report_dir, algo):
    """Every rank loops over all_reduce; 0.3 s in, rank 1 kills itself (SIGKILL) from a
    thread, in the middle of a call. The survivors report when and how they raised."""
    import ringcomm

    comm = IpcStandIn(timeout_s=TIMEOUT_S, **SMALL)
    ctx = harness.context()
    r = comm.rank
    if r == 1:
        threading.Timer(0.3, lambda: (ctx.store.set("gone_at", repr(time.time())),
                                      os.kill(os.getpid(), signal.SIGKILL))).start()
    x = np.ones(3000, np.float32)
    out, calls = {"rank": r}, 0
    try:
        while True:
            comm.all_reduce(x, algo=algo)
            calls += 1
    except ringcomm.RingcommError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    end = time.time()
    out["calls"] = calls
    out["detect_s"] = end - float(ctx.store.get("gone_at"))
    try:
        x[:] = 1
        comm.all_reduce(x, algo=algo)
        out["after"] = "succeeded"
    except ringcomm.RingcommError as e:
        out["after"] = f"{type(e).__name__}: {e}"
    comm.close()
    with open(os.path.join(report_dir, f"rank{r}.json"), "w") as f:
        json.dump(out, f)
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo", ["ring", "oneshot"])
def test_a_peer_killed_mid_call_makes_every_other_rank_raise(world, algo, tmp_path):
    with pytest.raises(harness.RankDied) as ei:
        harness.run_ranks(_lose_a_peer, world, (str(tmp_path), algo), init=False, hard_timeout=60, grace=30)
    assert "rank 1" in str(ei.value)
    fails = []
    for r in range(world):
        if r == 1:
            continue
        path = tmp_path / f"rank{r}.json"
        if not path.exists():
            fails.append(f"rank {r} reported nothing")
            continue
        out = json.loads(path.read_text())
        print(f"world {world} {algo}: rank {r} raised {out['detect_s'] * 1e3:.0f} ms after rank 1 died, "
              f"after {out['calls']} calls: {out['error'][:200]}")
        if out["detect_s"] > TIMEOUT_S:
            fails.append(f"rank {r}: raised {out['detect_s']:.1f} s after rank 1 died (deadline {TIMEOUT_S} s)")
        if "rank 1" not in out["error"]:
            fails.append(f"rank {r}: the error does not name rank 1: {out['error'][:300]}")
        if not out["after"].startswith("RingcommError") or "unusable after an earlier error" not in out["after"]:
            fails.append(f"rank {r}: the call after the error: {out['after'][:300]}")
    assert not fails, "\n".join(fails)


def _abort_from_a_thread(_comm):
    """Rank 0 waits in a call rank 1 never makes; another thread of rank 0 aborts it
    0.3 s in. Rank 0's call must raise at once (not at the 10 s deadline), and rank 1's
    next call must raise naming rank 0's reason."""
    import ringcomm

    comm = IpcStandIn(timeout_s=TIMEOUT_S, **SMALL)
    ctx = harness.context()
    out = {}
    if comm.rank == 0:
        threading.Timer(0.3, lambda: comm.abort("the test aborted rank 0")).start()
        t = time.monotonic()
        for algo in ("ring", "oneshot"):
            try:
                comm.all_reduce(np.ones(5000, np.float32), algo=algo)
                out[algo] = "succeeded"
            except ringcomm.RingcommError as e:
                out[algo] = f"{type(e).__name__}: {e}"
            out[f"{algo}_s"] = time.monotonic() - t
        ctx.store.set("aborted", "1")
    else:
        ctx.store.wait(["aborted"])
        try:
            comm.all_reduce(np.ones(5000, np.float32), algo="ring")
            out["ring"] = "succeeded"
        except ringcomm.RingcommError as e:
            out["ring"] = f"{type(e).__name__}: {e}"
    maps_before = _ipc_mappings()
    comm.close()
    out["maps_open"] = len(maps_before)
    out["maps_after_close"] = _ipc_mappings()
    return out


def _ipc_mappings():
    with open("/proc/self/maps") as f:
        return [line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in f if "/dev/shm/ringcomm-" in line]


def test_abort_from_another_thread():
    r0, r1 = harness.run_ranks(_abort_from_a_thread, 2, init=False, hard_timeout=60)
    assert r0["ring"].startswith("RingcommError") and "aborted" in r0["ring"], r0
    assert r0["ring_s"] < 3.0, f"rank 0 raised {r0['ring_s']:.1f} s in, not at once after the abort"
    assert "unusable after an earlier error" in r0["oneshot"], r0
    assert "the test aborted rank 0" in r1["ring"] and "rank 0" in r1["ring"], r1
    for r in (r0, r1):
        assert r["maps_open"] == 2, f"while open, a rank maps its buffer and its peer's: {r['maps_open']}"
        assert r["maps_after_close"] == [], f"close() left mappings: {r['maps_after_close']}"


def _names(_comm, abort):
    comm = IpcStandIn(timeout_s=TIMEOUT_S, **SMALL)
    ctx = harness.context()
    out = {"linked_after_init": comm.native.linked_name()}
    comm.all_reduce(np.ones(100, np.float32))
    ctx.store.set(f"reduced/{comm.rank}", "1")  # an abort before a peer finished would fail its call
    ctx.store.wait([f"reduced/{r}" for r in range(comm.world_size)])
    if abort:
        comm.abort("abort, then close")
    comm.close()
    ctx.store.set(f"closed/{comm.rank}", "1")
    ctx.store.wait([f"closed/{r}" for r in range(comm.world_size)])
    out["maps_after_close"] = _ipc_mappings()
    out["pid"] = os.getpid()
    return out


@pytest.mark.parametrize("abort", [False, True])
def test_buffers_are_released_and_nothing_is_left_in_dev_shm(abort):
    before = set(os.listdir("/dev/shm"))
    results = harness.run_ranks(_names, 3, (abort,), init=False, hard_timeout=60)
    for r, out in enumerate(results):
        assert out["linked_after_init"] == "", f"rank {r}'s name stays in /dev/shm after every peer mapped it"
        assert out["maps_after_close"] == [], f"rank {r}: mappings left after close: {out['maps_after_close']}"
    left = [n for n in set(os.listdir("/dev/shm")) - before
            if any(f"-{out['pid']}-" in n for out in results)]
    assert left == [], f"names left in /dev/shm: {left}"


def _disagree(_comm):
    """Ranks with different slot sizes: init fails on every rank naming both geometries
    (rank 0's settings are agreed first, so this only happens when a rank bypasses
    them: here the channel is built by hand)."""
    from ringcomm import _C_testing, cuda_ipc

    ctx = harness.context()
    slot = 512 if ctx.rank == 0 else 1024
    native = _C_testing._IpcHostComm(ctx.rank, ctx.world_size, slot, 2, 16384, 5.0, 1024, 16384)
    try:
        cuda_ipc.connect(native, ctx.store, "bad", ctx.rank, ctx.world_size, 5.0)
        return "connected"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    finally:
        native.close()


def test_ranks_with_other_geometries_are_refused():
    results = harness.run_ranks(_disagree, 2, init=False, hard_timeout=60)
    assert all(out != "connected" for out in results), results
    # The rank that looked first names the mismatch; the other may find the buffer
    # already released by then.
    assert any("another geometry" in out and "same settings" in out for out in results), results


def _mismatch(_comm, case):
    """Ranks that call different sizes: the receiving side finds the peer's stamp
    (the size it wrote beside its data) different and every rank raises."""
    import ringcomm

    comm = IpcStandIn(prefix=f"mm-{case}", timeout_s=TIMEOUT_S, **SMALL)
    r = comm.rank
    t = time.monotonic()
    out = {}
    try:
        if case == "send_recv":
            if r == 0:
                comm.send(np.ones(100, np.int32), 1)
            else:
                comm.recv(np.ones(50, np.int32), 0)
        elif case in ("oneshot", "twoshot", "ring"):
            comm.all_reduce(np.ones(100 * (r + 1), np.float32), algo=case)
        comm.all_reduce(np.ones(10, np.float32))  # the sender of send_recv learns it here
        out["error"] = None
    except ringcomm.RingcommError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["s"] = time.monotonic() - t
    comm.close()
    return out


@pytest.mark.parametrize("case", ["send_recv", "oneshot", "twoshot", "ring"])
def test_ranks_calling_different_sizes_get_a_mismatch_error(case):
    results = harness.run_ranks(_mismatch, 2, (case,), init=False, hard_timeout=60)
    for r, out in enumerate(results):
        assert out["error"] is not None, f"rank {r}: no error"
        assert "another size than it expected" in out["error"], f"rank {r}: {out['error']}"
        assert out["s"] < TIMEOUT_S / 2, f"rank {r} raised after {out['s']:.1f} s, not at once"
    assert any(o["error"].startswith("CollectiveMismatchError") for o in results), results


def _timeout(_comm):
    import ringcomm

    comm = IpcStandIn(timeout_s=1.0, **SMALL)
    ctx = harness.context()
    out = {}
    if comm.rank == 0:
        t = time.monotonic()
        try:
            comm.all_reduce(np.ones(10, np.float32))
        except ringcomm.RingcommError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["s"] = time.monotonic() - t
        ctx.store.set("timed_out", "1")
    else:
        ctx.store.wait(["timed_out"])
        try:
            comm.all_reduce(np.ones(10, np.float32))
        except ringcomm.RingcommError as e:
            out["error"] = f"{type(e).__name__}: {e}"
    comm.close()
    return out


def test_a_peer_that_never_calls_times_out_naming_op_call_rank_and_peer():
    r0, r1 = harness.run_ranks(_timeout, 2, init=False, hard_timeout=60)
    assert r0["error"].startswith("TimeoutError"), r0
    assert "all_reduce (call 1) on rank 0" in r0["error"] and "waiting for rank 1" in r0["error"], r0
    assert 0.9 < r0["s"] < 5, r0
    # Rank 1's call fails at once, saying that rank 0 timed out.
    assert "rank 0 timed out" in r1.get("error", ""), r1


def _bad_peer(_comm):
    """A send to a rank that does not exist is refused before anything is counted:
    the channel still works afterwards."""
    comm = IpcStandIn(prefix="badpeer", timeout_s=TIMEOUT_S, **SMALL)
    out = {}
    try:
        comm.sendrecv(np.ones(4, np.int32), 7, np.ones(4, np.int32), (comm.rank + 1) % 2)
        out["bad"] = "accepted"
    except ValueError as e:
        out["bad"] = str(e)
    x = np.ones(3000, np.float32)
    comm.all_reduce(x, algo="ring")
    out["after"] = float(x[0])
    got = np.zeros(10, np.int32)
    comm.sendrecv(np.full(10, comm.rank, np.int32), 1 - comm.rank, got, 1 - comm.rank)
    out["p2p"] = int(got[0])
    comm.close()
    return out


def test_a_bad_peer_is_refused_and_the_channel_stays_usable():
    for r, out in enumerate(harness.run_ranks(_bad_peer, 2, init=False, hard_timeout=60)):
        assert "peer 7 is not another rank" in out["bad"], out
        assert out["after"] == 2.0 and out["p2p"] == 1 - r, out
