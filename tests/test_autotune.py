"""`auto`'s tuner (csrc/comm/autotune.h, RINGCOMM_AUTOTUNE).

The state machine first, with made-up times (ringcomm._C_testing.AutoTuner, one
rank: the agreement is the identity): the band, the exploration and what it keeps,
load that comes and goes, the backoff. Then real communicators at world 2-4, one
spawned group each: a model made wrong on purpose (every prediction far below the
calls' times) makes every op's signatures explore; every call's result is checked
against numpy meanwhile (synchronous and queued asynchronous calls, whose kept plans
the switch must not leave behind); every rank reports the same tuning(), agreed
times included; explain() names what the tuner runs; the tuner off, an op forced by
RINGCOMM_ALGO and world size 1 tune nothing; ranks that disagree on RINGCOMM_AUTOTUNE
raise at init; a rank killed while its peers explore makes them raise, not hang.
"""

import os

import numpy as np
import pytest

import harness

_C_testing = pytest.importorskip("ringcomm._C_testing")

CANDS = [("oneshot", 1e-4), ("recursive_doubling", 2e-4), ("ring", 5e-4)]


def _feed(t, nbytes, times, n):
    """n calls whose time is times(family running) -> what the last call ran."""
    runs = "oneshot"
    for _ in range(n):
        runs = t.call(nbytes, times(runs), CANDS) or "oneshot"  # "": the model's pick
    return runs


def test_within_the_band_the_model_pick_stays():
    t = _C_testing.AutoTuner()
    assert t.state(8) == "none"
    # 1.2x the prediction: inside the band, at every check.
    assert _feed(t, 8, lambda a: 1.2e-4, 20000) == "oneshot"
    assert t.state(8) == "model" and t.explorations(8) == 0
    assert _feed(t, 16, lambda a: 0.8e-4, 20000) == "oneshot"  # faster than predicted, inside the band
    assert t.state(16) == "model" and t.explorations(16) == 0


def test_far_from_the_prediction_it_explores_and_keeps_the_fastest():
    t = _C_testing.AutoTuner()
    measured = {"oneshot": 5e-4, "recursive_doubling": 3e-4, "ring": 9e-4}
    runs, running = [], "oneshot"
    for _ in range(1 + t.first_check + 2 * t.samples):
        running = t.call(8, measured[running], CANDS) or "oneshot"
        runs.append(running)
    # The first call is not sampled; the check after first_check samples finds 5x
    # the prediction; then each other candidate runs `samples` calls.
    assert runs[:t.first_check] == ["oneshot"] * t.first_check, runs
    assert runs[t.first_check:t.first_check + t.samples] == ["recursive_doubling"] * t.samples, runs
    assert runs[t.first_check + t.samples:-1] == ["ring"] * t.samples, runs
    assert runs[-1] == "recursive_doubling" and t.state(8) == "tuned", runs
    # Steady: it stays.
    assert _feed(t, 8, lambda a: measured[a], 5000) == "recursive_doubling"
    assert t.explorations(8) == 1


def test_load_coming_and_going_moves_the_pick():
    t = _C_testing.AutoTuner()
    idle = {"oneshot": 5e-4, "recursive_doubling": 3e-4, "ring": 9e-4}
    busy = {"oneshot": 2e-3, "recursive_doubling": 4e-3, "ring": 6e-3}  # load reorders them
    assert _feed(t, 8, lambda a: idle[a], 2000) == "recursive_doubling"
    # Load comes: the kept family runs > 1.3x its kept time, the next check explores.
    assert _feed(t, 8, lambda a: busy[a], 2000) == "oneshot"
    assert t.explorations(8) == 2 and t.state(8) == "tuned"
    # Load goes: < 1/1.3 of the kept time explores again.
    assert _feed(t, 8, lambda a: idle[a], 5000) == "recursive_doubling"
    assert t.explorations(8) == 3


def test_an_exploration_that_keeps_the_pick_backs_off():
    """Each flip of the machine's speed (2x, then back) crosses the band and explores,
    and each keeps the same family: the calls to the next check double each time, up
    to max_backoff times the first."""
    t = _C_testing.AutoTuner()
    base = {"oneshot": 5e-4, "recursive_doubling": 3e-4, "ring": 9e-4}
    running = "oneshot"
    while t.state(8) != "tuned":  # the first exploration, from the model's pick
        running = t.call(8, base[running], CANDS) or "oneshot"
    scale, backoff = 1.0, 1
    gaps, expected = [], []
    for k in range(6):
        # The interval was set when the last exploration ended, at that scale and backoff.
        expected.append(int(t.check_seconds / (base["recursive_doubling"] * scale) * backoff))
        scale = 2.0 if scale == 1.0 else 1.0
        before, n = t.explorations(8), 0
        while t.explorations(8) == before:
            running = t.call(8, base[running] * scale, CANDS) or "oneshot"
            n += 1
        gaps.append(n)
        while t.state(8) != "tuned":
            running = t.call(8, base[running] * scale, CANDS) or "oneshot"
        assert running == "recursive_doubling"
        backoff = min(backoff * 2, t.max_backoff)
    assert all(abs(g - e) <= 2 for g, e in zip(gaps, expected)), (gaps, expected)
    assert gaps[4] >= 6 * gaps[0], gaps


# -- real communicators --------------------------------------------------------

def _wrong_model(comm):
    """Every prediction ~1000x below the calls' real times: every signature explores."""
    p = comm.cost_params()
    for link in ("intra", "inter"):
        p[link] = {"alpha": 1e-9, "beta": 1e-15, "overhead": 1e-10}
    p["gamma"] = 1e-15
    p["fits"] = []
    comm.set_cost_params(p)


def _check(fails, tag, got, want):
    if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
        fails.append(f"{tag}: got {np.asarray(got).ravel()[:4]}, want {np.asarray(want).ravel()[:4]}")


def _ops_round(comm, fails, count, it, async_calls=False):
    n, r = comm.world_size, comm.rank
    base = np.arange(count, dtype=np.float32) % 97
    x = base * (r + 1) + it
    want_sum = base * (n * (n + 1) / 2) + n * it
    works = []
    if async_calls:
        bufs = [x.copy() for _ in range(6)]
        works = [comm.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        for k, b in enumerate(bufs):
            _check(fails, f"async all_reduce {count} it {it} #{k}", b, want_sum)
        return
    y = x.copy()
    comm.all_reduce(y)
    _check(fails, f"all_reduce {count} it {it}", y, want_sum)
    out = np.zeros(count, np.float32)
    full = np.concatenate([base * (r + 1) + it] * n)
    comm.reduce_scatter(out, full)
    _check(fails, f"reduce_scatter {count} it {it}", out, want_sum)
    g = np.zeros(count * n, np.float32)
    comm.all_gather(g, x)
    _check(fails, f"all_gather {count} it {it}",
           g, np.concatenate([base * (q + 1) + it for q in range(n)]))
    b = x.copy() if r == 1 % n else np.zeros(count, np.float32)
    comm.broadcast(b, src=1 % n)
    _check(fails, f"broadcast {count} it {it}", b, base * (1 % n + 1) + it)
    red = x.copy()
    comm.reduce(red, dst=0)
    if r == 0:
        _check(fails, f"reduce {count} it {it}", red, want_sum)


def _tuned_group(comm):
    import torch.distributed as dist

    import ringcomm

    fails = []
    _wrong_model(comm)
    counts = (1, 3000)
    for it in range(40):
        for count in counts:
            _ops_round(comm, fails, count, it)
    for it in range(12):
        _ops_round(comm, fails, 777, it, async_calls=True)
    tuning = comm.tuning()
    seen = {(e["op"], e["nbytes"]): e for e in tuning}
    n = comm.world_size
    for op, nb in [("all_reduce", 4), ("all_reduce", 12000), ("reduce_scatter", 4 * n), ("all_gather", 4 * n),
                   ("broadcast", 12000), ("reduce", 4), ("all_reduce", 3108)]:
        e = seen.get((op, nb))
        finite = [name for name, t in comm.explain(op, nb) if t == t]
        if len(finite) < 2:  # one candidate: nothing to tune
            if e is not None:
                fails.append(f"{op} {nb} has one candidate ({finite}) but is tuned: {e}")
            continue
        if e is None:
            fails.append(f"tuning() has no {op} {nb}: {sorted(seen)}")
            continue
        if e["state"] != "tuned" or e["explorations"] < 1:
            fails.append(f"{op} {nb}: {e}")
        elif sorted(m[0] for m in e["measured"]) != sorted(finite):
            fails.append(f"{op} {nb}: explored {e['measured']}, candidates {finite}")
        elif comm.explain(op, nb)[0][0] != e["runs"]:
            fails.append(f"{op} {nb}: explain {comm.explain(op, nb)[0]} but the tuner runs {e['runs']}")
    store = harness.context().store
    r = comm.rank
    # Off, forced, and a disagreement, on further communicators of the same ranks.
    os.environ["RINGCOMM_AUTOTUNE"] = "0"
    off = ringcomm.init(rank=r, world_size=n, store=dist.PrefixStore("off", store), timeout=30)
    os.environ["RINGCOMM_AUTOTUNE"] = "1"
    forced = ringcomm.init(rank=r, world_size=n, store=dist.PrefixStore("forced", store), timeout=30,
                           algo="all_reduce:ring")
    for c in (off, forced):
        _wrong_model(c)
        for it in range(30):
            y = np.full(8, r + 1.0, np.float32)
            c.all_reduce(y)
            _check(fails, "off/forced all_reduce", y, np.full(8, n * (n + 1) / 2))
    if off.tuning() != []:
        fails.append(f"RINGCOMM_AUTOTUNE=0 tuned: {off.tuning()}")
    if any(e["op"] == "all_reduce" for e in forced.tuning()):
        fails.append(f"a forced all_reduce was tuned: {forced.tuning()}")
    off.close()
    forced.close()
    os.environ["RINGCOMM_AUTOTUNE"] = "0" if r == 0 else "1"
    try:
        ringcomm.init(rank=r, world_size=n, store=dist.PrefixStore("disagree", store), timeout=30).close()
        fails.append("ranks disagreeing on RINGCOMM_AUTOTUNE made a communicator")
    except ValueError as e:
        if "autotune" not in str(e):
            fails.append(f"disagreement raised {e!r}")
    os.environ.pop("RINGCOMM_AUTOTUNE", None)
    return {"fails": fails, "tuning": tuning}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_op_explores_right_and_alike(world_size):
    res = harness.run_ranks(_tuned_group, world_size, comm_timeout=60.0, hard_timeout=300, grace=30)
    harness.assert_no_failures([r["fails"] for r in res])
    # The agreed figures make the ranks' tuning identical, times and all (repr: NaN
    # is kept_s of a signature still exploring when the calls end, and NaN != NaN).
    for r in res[1:]:
        assert repr(r["tuning"]) == repr(res[0]["tuning"])


def _world_one(comm):
    y = np.ones(4, np.float32)
    for _ in range(30):
        comm.all_reduce(y)
    return comm.tuning()


def test_world_one_tunes_nothing():
    assert harness.run_ranks(_world_one, 1, hard_timeout=120) == [[]]


def _killed_while_exploring(comm):
    import time

    import ringcomm

    _wrong_model(comm)
    y = np.ones(1000, np.float32)
    t0 = time.monotonic()
    try:
        for i in range(200):
            if comm.rank == 2 and i == 8:  # mid-exploration (the first check is after call 6)
                os._exit(7)
            comm.all_reduce(y)
    except ringcomm.RingcommError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0, "state": comm.tuning()}
    return {"error": None}


def test_a_rank_lost_while_its_peers_explore():
    res = harness.survivors_of(_killed_while_exploring, 3, killed=[2], comm_timeout=60.0, hard_timeout=120,
                               grace=30)
    assert sorted(res) == [0, 1]
    for rank, out in res.items():
        assert out["error"] and "rank 2" in out["error"], (rank, out)
        assert out["seconds"] < 20, (rank, out)  # told at once, not at the 60 s timeout
        assert out["state"][0]["state"] == "exploring", out


def _large_calls_try_pulls(comm):
    """From 16 MiB up, where every rank can read its peers' memory, the
    single-copy pulls are candidates of the collectives: unmodelled (never the
    model's pick), measured when a pick runs far from its prediction. The FIFO
    schedules' slots pass between the cores through the caches, which some
    placements of a VM's cores make 4-5x slower for whole runs; pulls are not."""
    fails = []
    n, r = comm.world_size, comm.rank
    pull = comm._native.pull_enabled
    big, small = 16 << 20, 8 << 20
    for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"):
        names = [a for a, _ in comm.explain(op, big)]
        if ("pull" in names) != pull:
            fails.append(f"{op} {big}: pull readable {pull}, candidates {comm.explain(op, big)}")
        if any(a == "pull" and t == t for a, t in comm.explain(op, big)):
            fails.append(f"{op}: pull has a prediction {comm.explain(op, big)}")
        if "pull" in [a for a, _ in comm.explain(op, small)]:
            fails.append(f"{op} {small}: pull listed below 16 MiB: {comm.explain(op, small)}")
    _wrong_model(comm)
    count = big // 4
    base = (np.arange(count, dtype=np.float32) % 97)
    # What the explorations measured, gathered as the calls go: one that the
    # tuner repeats near the end (load came or went) is still partial then.
    explored = {}

    def note_explorations():
        for e in comm.tuning():
            if e["state"] != "exploring":
                explored.setdefault((e["op"], e["nbytes"]), set()).update(m[0] for m in e["measured"])

    for it in range(24):
        x = base * (r + 1) + it
        want = base * (n * (n + 1) / 2) + n * it
        y = x.copy()
        comm.all_reduce(y)
        _check(fails, f"all_reduce it {it}", y, want)
        part = -(-count // n)  # all ranks' data at least 16 MiB
        g = np.empty(part * n, np.float32)
        comm.all_gather(g, x[:part])
        _check(fails, f"all_gather it {it}", g, np.concatenate([(base[:part] * (q + 1) + it) for q in range(n)]))
        b = x.copy() if r == 0 else np.zeros(count, np.float32)
        comm.broadcast(b, src=0)
        _check(fails, f"broadcast it {it}", b, base + it)
        note_explorations()
    seen = {(e["op"], e["nbytes"]): e for e in comm.tuning()}
    for key in (("all_reduce", big), ("all_gather", part * n * 4), ("broadcast", big)):
        e = seen.get(key)
        if e is None or e["explorations"] < 1:
            fails.append(f"{key} did not explore: {e}")
            continue
        measured = sorted(explored.get(key, ()))
        if ("pull" in measured) != pull:
            fails.append(f"{key}: pull readable {pull}, explored {measured} (now: {e})")
    return {"fails": fails, "tuning": comm.tuning(), "pull": pull}


@pytest.mark.parametrize("world_size", [2, 3])
def test_large_calls_explore_the_pulls(world_size):
    res = harness.run_ranks(_large_calls_try_pulls, world_size, comm_timeout=60.0, hard_timeout=300, grace=30)
    harness.assert_no_failures([r["fails"] for r in res])
    for r in res[1:]:  # alike on every rank (repr: a signature still exploring has kept_s NaN)
        assert repr(r["tuning"]) == repr(res[0]["tuning"])


def test_large_calls_without_pulls_do_not_list_them():
    res = harness.run_ranks(_large_calls_try_pulls, 2, comm_timeout=60.0, hard_timeout=300, grace=30,
                            env={"RINGCOMM_PULL": "0"})
    harness.assert_no_failures([r["fails"] for r in res])
    assert not res[0]["pull"]
