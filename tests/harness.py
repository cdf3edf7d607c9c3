"""Multi-process test harness: run one function on every rank of a local job.

``run_ranks(fn, world_size, args)`` picks a free TCP port, spawns ``world_size``
processes (multiprocessing "spawn" context) and in each one:

1. applies the test's environment variables (inherited ``RINGCOMM_*`` variables are
   dropped first, so a test sees exactly the tuning it asked for; only
   ``RINGCOMM_TEST_TRANSPORT=tcp`` in pytest's environment sets RINGCOMM_TRANSPORT
   for every rank of every test that does not set it, to run a suite over TCP),
2. creates ``torch.distributed.TCPStore("127.0.0.1", port, world_size,
   is_master=(rank == 0))``,
3. calls ``ringcomm.init(rank=, world_size=, store=, timeout=comm_timeout)`` unless
   ``init=False`` (then ``fn`` gets ``None`` and does its own init),
4. runs ``fn(comm, *args)`` and closes the communicator,
5. sends back the pickled return value, or the formatted traceback.

The parent enforces a hard timeout: ranks still running when it expires get their
Python stacks dumped to stderr (faulthandler on SIGUSR1, shown in pytest's captured
stderr) and are killed, and the test fails saying which ranks did not finish. Once
one rank has failed, the others get ``grace`` seconds to finish before they are
killed too, so a failure does not cost the whole hard timeout.

Spawning a rank that imports torch costs seconds, so a rank function should check a
whole matrix of cases and return a list of failure strings; ``assert_no_failures``
turns the per-rank lists into one readable assertion.

``fn`` must be a module-level function (it is pickled by reference). Inside a rank,
``context()`` gives the rank, world size and store, also when ``init=False``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence

_DONE_KEY = "__harness_done__"


class HarnessError(AssertionError):
    """A multi-process run did not complete cleanly (base class)."""


class RankError(HarnessError):
    """One or more ranks raised; the message holds their tracebacks."""


class RankDied(HarnessError):
    """A rank process exited without reporting a result (crash, os._exit, signal).
    `died`: rank -> exit code; `results`: what the other ranks returned (tests
    that kill ranks on purpose check the survivors')."""

    def __init__(self, message: str, died: Optional[Dict[int, Any]] = None,
                 results: Optional[Dict[int, Any]] = None):
        super().__init__(message)
        self.died = dict(died or {})
        self.results = dict(results or {})


class HardTimeout(HarnessError):
    """Some ranks did not finish within the hard timeout and were killed."""

    def __init__(self, message: str, unfinished: Sequence[int], results: Dict[int, Any]):
        super().__init__(message)
        self.unfinished = list(unfinished)
        self.results = results


@dataclasses.dataclass
class RankContext:
    rank: int
    world_size: int
    store: Any  # torch.distributed.TCPStore
    port: int
    comm_timeout: Optional[float]


_CONTEXT: Optional[RankContext] = None


def context() -> RankContext:
    """The calling rank's context; only valid inside a rank process."""
    if _CONTEXT is None:
        raise RuntimeError("harness.context() called outside a rank process")
    return _CONTEXT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TCP_STATES = {"01": "established", "0A": "listen"}


def tcp_sockets() -> list:
    """(local port, remote port, state) of every TCP socket this process holds."""
    inodes = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[9] in inodes:
                local, remote = (int(c.rsplit(":", 1)[1], 16) for c in (cols[1], cols[2]))
                out.append((local, remote, _TCP_STATES.get(cols[3], cols[3])))
    return out


def _die_with_parent() -> None:
    # If pytest is killed, the ranks must not linger (Linux only; best effort).
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def _rank_main(rank: int, world_size: int, port: int, fn: Callable, args: tuple,
               env: Dict[str, str], do_init: bool, comm_timeout: Optional[float],
               store_timeout: float, q) -> None:
    global _CONTEXT
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ranks take Ctrl-C as a terminal's Python does, also when the suite was
    # started in the background by a script or nohup (which leave SIGINT
    # ignored, and Python then installs no handler): the tests that send
    # SIGINT check ringcomm's interrupt path, not how pytest was launched.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for key in [k for k in os.environ if k.startswith("RINGCOMM_")]:
        del os.environ[key]
    os.environ.update(env)

    def report(ok: bool, payload: Any) -> None:
        try:
            data = pickle.dumps(payload)
        except Exception:  # an unpicklable result is a test bug: say so
            ok, data = False, pickle.dumps(
                "result could not be pickled:\n" + traceback.format_exc())
        q.put((rank, ok, data))

    store = None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0,
                              timeout=timedelta(seconds=store_timeout))
        _CONTEXT = RankContext(rank, world_size, store, port, comm_timeout)
        comm = None
        if do_init:
            import ringcomm

            kwargs = {} if comm_timeout is None else {"timeout": comm_timeout}
            comm = ringcomm.init(rank=rank, world_size=world_size, store=store, **kwargs)
        try:
            result = fn(comm, *args)
        except BaseException:
            report(False, traceback.format_exc())
            if comm is not None:
                try:
                    comm.close()
                except BaseException:
                    pass
            return
        if comm is not None:
            try:
                comm.close()
            except BaseException:
                report(False, "fn returned, then comm.close() raised:\n"
                       + traceback.format_exc())
                return
        report(True, result)
    except BaseException:
        report(False, traceback.format_exc())
    finally:
        _linger_as_store_master(store, rank, world_size)


def _linger_as_store_master(store, rank: int, world_size: int) -> None:
    # Rank 0 hosts the store: leaving early would break ranks still using it.
    if store is None:
        return
    try:
        store.add(_DONE_KEY, 1)
        if rank == 0:
            deadline = time.monotonic() + 10.0
            while store.add(_DONE_KEY, 0) < world_size and time.monotonic() < deadline:
                time.sleep(0.02)
    except Exception:
        pass


def run_ranks(fn: Callable, world_size: int, args: Sequence = (), *,
              env: Optional[Dict[str, Any]] = None,
              rank_env: Optional[Dict[int, Dict[str, Any]]] = None,
              init: bool = True, comm_timeout: Optional[float] = 30.0,
              hard_timeout: float = 120.0, grace: float = 10.0) -> List[Any]:
    """Run ``fn(comm, *args)`` on ``world_size`` spawned ranks; return the results by rank.

    ``comm_timeout`` is passed to ``init(timeout=)``; None leaves it out (so
    RINGCOMM_TIMEOUT or the default applies).
    Raises RankError if a rank raised, RankDied if one exited without a result,
    HardTimeout if some did not finish within ``hard_timeout`` seconds.
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    store_timeout = max(hard_timeout, comm_timeout or 0.0) + 30.0
    procs = []
    for rank in range(world_size):
        renv = {k: str(v) for k, v in (env or {}).items()}
        renv.update({k: str(v) for k, v in (rank_env or {}).get(rank, {}).items()})
        renv.setdefault("OMP_NUM_THREADS", "1")
        if os.environ.get("RINGCOMM_TEST_TRANSPORT"):  # run a whole suite over one transport
            renv.setdefault("RINGCOMM_TRANSPORT", os.environ["RINGCOMM_TEST_TRANSPORT"])
        p = ctx.Process(target=_rank_main, name=f"rank{rank}", daemon=True,
                        args=(rank, world_size, port, fn, tuple(args), renv, init,
                              comm_timeout, store_timeout, q))
        procs.append(p)
    start = time.monotonic()
    results: Dict[int, Any] = {}
    errors: Dict[int, str] = {}
    died: Dict[int, Any] = {}
    dead_since: Dict[int, float] = {}
    try:
        for p in procs:
            p.start()
        deadline = start + hard_timeout
        grace_deadline = None
        while len(results) + len(errors) + len(died) < world_size:
            now = time.monotonic()
            if now >= deadline or (grace_deadline is not None and now >= grace_deadline):
                break
            try:
                rank, ok, data = q.get(timeout=0.05)
            except queue_mod.Empty:
                for rank, p in enumerate(procs):
                    done = rank in results or rank in errors or rank in died
                    if done or p.is_alive():
                        continue
                    # Its last message may still be in the pipe: give it a moment.
                    first = dead_since.setdefault(rank, now)
                    if now - first > 1.0:
                        died[rank] = p.exitcode
                if died and grace_deadline is None:
                    grace_deadline = time.monotonic() + grace
                continue
            payload = pickle.loads(data)
            if ok:
                results[rank] = payload
            else:
                errors[rank] = payload
                if grace_deadline is None:
                    grace_deadline = time.monotonic() + grace
        elapsed = time.monotonic() - start
        finished = set(results) | set(errors) | set(died)
        unfinished = [r for r in range(world_size) if r not in finished]
        if unfinished:
            for r in unfinished:  # stacks of the stuck ranks go to captured stderr
                _signal(procs[r], signal.SIGUSR1)
            time.sleep(0.5)
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.kill()
        for p in started:
            p.join(timeout=10)
        q.close()
        q.join_thread()

    parts = []
    for r in sorted(errors):
        parts.append(f"--- rank {r} raised:\n{errors[r]}")
    for r in sorted(died):
        parts.append(f"--- rank {r} exited with code {died[r]} without reporting a result")
    detail = "\n".join(parts)
    head = f"{fn.__name__} on world_size={world_size}"
    killed = ""
    if unfinished:
        killed = (f"ranks {unfinished} did not finish within "
                  f"{'the hard timeout' if not (errors or died) else f'{grace:.0f}s after another rank failed'} "
                  f"({elapsed:.1f}s elapsed, hard timeout {hard_timeout:.0f}s) and were killed; "
                  f"their Python stacks are in the captured stderr.")
    if errors:
        raise RankError(f"{head}: ranks {sorted(errors)} raised. {killed}\n{detail}")
    if died:
        raise RankDied(f"{head}: {killed}\n{detail}", died, results)
    if unfinished:
        raise HardTimeout(f"{head}: {killed}", unfinished, results)
    return [results[r] for r in range(world_size)]


def _signal(p, sig) -> None:
    try:
        os.kill(p.pid, sig)
    except (ProcessLookupError, TypeError):
        pass


def assert_no_failures(results: Sequence[Sequence[str]], limit: int = 40) -> None:
    """Fail with every rank's failure strings (each rank returns a list of them)."""
    lines = []
    total = 0
    for rank, failures in enumerate(results):
        total += len(failures)
        for f in failures:
            lines.append(f"rank {rank}: {f}")
    if total:
        shown = lines[:limit]
        more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
        msg = f"{total} failed checks:\n" + "\n".join(shown) + more
        print(msg, file=sys.stderr)
        raise AssertionError(msg)


def survivors_of(fn: Callable, world_size: int, killed: Sequence[int], args: Sequence = (), **run_kw) -> Dict[int, Any]:
    """Runs a group in which exactly the ranks `killed` die on purpose; returns the
    other ranks' results (fails if another rank died, or none did)."""
    try:
        run_ranks(fn, world_size, args, **run_kw)
    except RankDied as e:
        assert set(e.died) == set(killed), f"ranks {sorted(e.died)} died, {sorted(killed)} were to: {e}"
        return e.results
    raise AssertionError(f"ranks {sorted(killed)} were to be killed, but every rank reported")


def loss_mismatches(who: str, losses: Dict[int, float], reference: Sequence[float], rtol: float,
                    skip: Sequence[int] = ()) -> List[str]:
    """Failure strings for a run's per-step losses against a fault-free run's: a
    step missing (but `skip`), or one further than rtol (relative) from it."""
    out = []
    missing = [s for s in range(len(reference)) if s not in losses and s not in skip]
    if missing:
        out.append(f"{who}: no loss for steps {missing}")
    for step, loss in sorted(losses.items()):
        if not abs(loss - reference[step]) <= rtol * abs(reference[step]):
            out.append(f"{who}: step {step} loss {loss!r}, fault-free {reference[step]!r}")
    return out


# ------------------------------------------------------------------ sectioned groups
# A test module that checks many things in one spawned group of ranks runs them as
# sections: each section fills its own failure list, and a section that raises
# stops the ones after it (the ranks may be out of step). One group per world size
# serves every test of the module.


def print_and_check(results: Sequence[dict]) -> None:
    """For rank functions that return {"fails": [...], "msgs": [...]}: prints every
    rank's messages (figures, seen with pytest -s), then fails with every failure."""
    for r, out in enumerate(results):
        for m in out["msgs"]:
            print(f"rank {r}: {m}")
    assert_no_failures([out["fails"] for out in results])


def run_sections(comm, sections: Sequence[str], functions: dict, tracebacks: bool = False) -> dict:
    """In a rank: functions[name](comm, fail) for each name in order; returns {name: failures}."""
    import traceback

    import ringcomm
    from checks import first_line

    out, broken = {}, None
    for name in sections:
        failures = out.setdefault(name, [])
        if broken:
            failures.append(f"not run: {broken}")
            continue
        try:
            functions[name](comm, failures.append)
        except Exception as e:  # noqa: BLE001
            failures.append(f"raised {type(e).__name__}: {first_line(e)}"
                            + (f"\n{traceback.format_exc()}" if tracebacks else ""))
            if isinstance(e, ringcomm.RingcommError):
                broken = f"the communicator became unusable in section {name!r}"
            else:
                broken = f"section {name!r} stopped with an exception; ranks may be out of step"
    return out


def cached_groups(fn: Callable, **run_kw) -> Callable[[int], list]:
    """results(world_size): run_ranks(fn, world_size, **run_kw), once per world size
    (a failed run is remembered and raised again)."""
    cache = {}

    def results(world_size: int) -> list:
        if world_size not in cache:
            try:
                cache[world_size] = run_ranks(fn, world_size, **run_kw)
            except HarnessError as e:
                cache[world_size] = e
        res = cache[world_size]
        if isinstance(res, Exception):
            raise res
        return res

    return results
