"""The harness itself, without ringcomm: results, errors, crashes and hangs."""

import os
import time

import pytest

import harness


def _basic(comm, tag):
    ctx = harness.context()
    store = ctx.store
    store.set(f"k{ctx.rank}", str(ctx.rank * 10))
    seen = [int(store.get(f"k{r}")) for r in range(ctx.world_size)]
    return {
        "comm": comm,
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "tag": tag,
        "seen": seen,
        "env": os.environ.get("HARNESS_TEST_VAR"),
        "rank_env": os.environ.get("HARNESS_RANK_VAR"),
        "inherited": os.environ.get("RINGCOMM_INHERITED_BY_ACCIDENT"),
    }


def test_results_env_and_store(monkeypatch):
    monkeypatch.setenv("RINGCOMM_INHERITED_BY_ACCIDENT", "1")
    res = harness.run_ranks(_basic, 3, ("hello",), init=False, hard_timeout=60,
                            env={"HARNESS_TEST_VAR": "x"}, rank_env={1: {"HARNESS_RANK_VAR": 7}})
    assert [r["rank"] for r in res] == [0, 1, 2]
    for r in res:
        assert r["comm"] is None
        assert r["world_size"] == 3 and r["tag"] == "hello"
        assert r["seen"] == [0, 10, 20]
        assert r["env"] == "x"
        assert r["inherited"] is None
    assert [r["rank_env"] for r in res] == [None, "7", None]


def _raise_on_rank1(comm):
    if harness.context().rank == 1:
        raise KeyError("marker-from-rank-1")
    return "fine"


def test_rank_exception_is_reraised_with_traceback():
    with pytest.raises(harness.RankError) as ei:
        harness.run_ranks(_raise_on_rank1, 2, init=False, hard_timeout=60)
    msg = str(ei.value)
    assert "ranks [1] raised" in msg
    assert "marker-from-rank-1" in msg and "Traceback" in msg and "_raise_on_rank1" in msg


def _write_pid_then(comm, tmpdir, mode):
    ctx = harness.context()
    with open(os.path.join(tmpdir, f"pid{ctx.rank}"), "w") as f:
        f.write(str(os.getpid()))
    if ctx.rank == 1:
        if mode == "hang":
            while True:
                time.sleep(1)
        if mode == "exit":
            os._exit(3)
        if mode == "raise":
            raise RuntimeError("rank 1 gave up")
    if ctx.rank == 2 and mode == "raise":
        while True:  # a rank stuck while another one failed
            time.sleep(1)
    return ctx.rank


def _pids(tmpdir, n):
    pids = []
    for r in range(n):
        with open(os.path.join(tmpdir, f"pid{r}")) as f:
            pids.append(int(f.read()))
    return pids


def _assert_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_hang_hits_hard_timeout_and_kills_everything(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(harness.HardTimeout) as ei:
        harness.run_ranks(_write_pid_then, 2, (str(tmp_path), "hang"), init=False,
                          hard_timeout=8)
    elapsed = time.monotonic() - t0
    assert elapsed < 8 + 10, elapsed
    # Rank 0 normally finishes in time; on a loaded machine it may be killed too.
    assert 1 in ei.value.unfinished
    assert f"ranks {ei.value.unfinished} did not finish within the hard timeout" in str(ei.value)
    _assert_gone(_pids(tmp_path, 2))


def test_raise_while_another_rank_hangs_fails_after_grace(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(harness.RankError) as ei:
        harness.run_ranks(_write_pid_then, 3, (str(tmp_path), "raise"), init=False,
                          hard_timeout=300, grace=2)
    assert time.monotonic() - t0 < 60
    msg = str(ei.value)
    assert "rank 1 gave up" in msg and "ranks [2] did not finish" in msg
    _assert_gone(_pids(tmp_path, 3))


def test_rank_that_exits_without_result(tmp_path):
    with pytest.raises(harness.RankDied) as ei:
        harness.run_ranks(_write_pid_then, 2, (str(tmp_path), "exit"), init=False,
                          hard_timeout=60)
    assert "rank 1 exited with code 3" in str(ei.value)
    _assert_gone(_pids(tmp_path, 2))


def _unpicklable(comm):
    return lambda: None


def test_unpicklable_result_is_reported():
    with pytest.raises(harness.RankError, match="could not be pickled"):
        harness.run_ranks(_unpicklable, 1, init=False, hard_timeout=60)


def test_assert_no_failures_formats_all_ranks():
    harness.assert_no_failures([[], []])
    with pytest.raises(AssertionError, match=r"2 failed checks:\nrank 0: a\nrank 1: b"):
        harness.assert_no_failures([["a"], ["b"]])
