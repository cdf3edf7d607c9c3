"""torch Work objects over ringcomm Works.

A torch call may issue several ringcomm operations (one per tensor, or the
sends and receives of an uneven all_to_all) and may have results to copy
back (non-contiguous tensors, lists filled from a flat buffer). RingcommWork
waits for all of them, copies back once, and then completes its torch future.

Futures matter because DDP waits on `get_future()` only (in C++, never
calling wait()): a future that was asked for is completed by the group's
Completer thread as soon as the ringcomm operations finish.
"""
import atexit
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from ringcomm.errors import RingcommError, TimeoutError  # noqa: A004
from ringcomm.work import Work


def _seconds(timeout):
    """None for no limit. torch's C++ side passes timedelta(0) for "no timeout"."""
    if timeout is None:
        return None
    t = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return t if t > 0 else None


def _outcome(parent):
    """The value of the future RingcommWork.get_future() hands out, or its error.

    Raising in a then() callback is the one way Python has to mark a torch
    future as failed in C++: torch's Future.set_exception completes it *with*
    the exception object as its value, and DDP's reducer then read that object
    as the all_reduce result and crashed (SIGSEGV). So C++ consumers (DDP,
    FSDP2, functional collectives) see a future with an error; Python's
    wait() raises a RuntimeError that quotes the ringcomm error. A plain
    function (not a bound method): torch keeps the callback in C++, where a
    reference back to the Work would be a cycle no garbage collector sees.
    """
    error, result = parent.value()
    if error is not None:
        raise error
    return result


class RingcommWork(dist._Work):
    """The Work a ringcomm process group returns.

    `works` are the issued ringcomm Works (empty when the call already
    completed), `result` the value of the future (the output tensors, as
    torch's backends give), `staging` the copies to make on completion.
    """

    # Defaults as class attributes: a Work is made on every call, and most
    # calls complete before it is made (only what differs is set on it).
    _staging = None
    _completer = None
    _settled = False
    _error = None
    _future = None  # completed by _settle, parent of _public
    _public = None  # what get_future() returns
    _delivered = False
    _watched = False
    _record = None  # a profiler record, ended by the Completer (see profile())
    _record_ended = None
    _source = None  # a recv's source rank, or a callable giving it once complete

    _works = ()
    # A Work made complete (the blocking calls' common case) locks only in
    # get_future(), briefly and calling nothing that locks: it shares one lock
    # rather than making its own (every step here is paid per call).
    _lock = threading.Lock()

    def __init__(self, works, result, staging=None, completer=None):
        super().__init__()
        self._result = result
        if completer is not None:
            self._completer = completer
        if not works and staging is None:
            self._settled = True  # nothing to copy back, no error
            return
        self._works = works if type(works) is list else list(works)
        self._lock = threading.Lock()
        if staging is not None:
            self._staging = staging
        if not self._works:
            self._settle()

    def profile(self, record):
        """Ends `record` (an entered profiler RecordFunction) when the operation
        completes, in the Completer's thread as torch's backends end theirs in
        their worker thread (profilers then see an async event); wait()
        returns only once it ended, so a profiler closed right after sees it."""
        self._record, self._record_ended = record, threading.Event()
        self._completer.watch(self)

    def _end_record(self):
        record, self._record = self._record, None
        if record is not None:
            try:
                record.__exit__(None, None, None)
            finally:
                self._record_ended.set()

    # -- completion ----------------------------------------------------------
    def _native_done(self):
        return all(w.is_completed() for w in self._works)

    def _settle(self, ok=False):
        """Once every ringcomm Work completed: copy back, then complete the
        future. `ok`: they are known to have succeeded."""
        with self._lock:
            if not self._settled:
                err = None
                for w in () if ok else self._works:
                    err = w.exception()
                    if err is not None:
                        break
                if err is None and self._staging is not None:
                    try:
                        self._staging.finish()
                    except Exception as e:  # noqa: BLE001 - handed to the waiter
                        err = e
                self._error = err
                self._staging = None
                self._settled = True
            fut = None
            if self._future is not None and not self._delivered:
                self._delivered = True
                fut = self._future
        if fut is not None:
            self._deliver(fut)

    def _deliver(self, fut):
        # `fut` is the parent of the future handed out (see get_future); its
        # value is what _outcome turns into the child's value or error.
        fut.set_result((self._error, self._result))

    def _poll(self, timeout_s):
        """Waits up to timeout_s for the first unfinished ringcomm Work."""
        for w in self._works:
            if not w.is_completed():
                try:
                    w.wait(timeout_s)
                except RingcommError:
                    pass  # a wait that expired, or the op failed: _settle() reads which
                return

    # -- torch's Work API ----------------------------------------------------
    def wait(self, timeout=None):
        """Blocks until the operation completed; raises its error if it failed.

        On a `timeout` (seconds or timedelta) that expires first, raises
        ringcomm.TimeoutError; the operation keeps running.
        """
        if not self._settled:
            works = self._works
            if timeout is None and len(works) == 1 and type(works[0]) is Work:
                # One call waited for without a limit (a torch send, a recv): a
                # normal return of the native wait is its success.
                try:
                    works[0].wait()
                except RingcommError:
                    pass  # _settle() below reads the error
                else:
                    self._settle(ok=True)
        if not self._settled:
            t = _seconds(timeout)
            deadline = None if t is None else time.monotonic() + t
            for w in self._works:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    w.wait(left)
                except RingcommError:
                    if not w.is_completed():
                        raise  # this wait expired; the operation is still running
            if not self._native_done():
                return True  # CUDA: the current stream now waits for the op; the host does not
            self._settle()
        if self._record_ended is not None:
            self._record_ended.wait()
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        """A torch.futures.Future completed with the output tensors (or the error)."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                self._public = self._future.then(_outcome)
            fut = self._future
            deliver = self._settled and not self._delivered
            if deliver:
                self._delivered = True
            watch = not self._settled and not self._watched
            if watch:
                self._watched = True
        if deliver:
            self._deliver(fut)
        elif watch:
            self._completer.watch(self)
        return self._public

    def is_completed(self):
        if not self._settled and self._native_done():
            self._settle()
        return self._settled

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error if self.is_completed() else None

    def result(self):
        return self._result

    def _set_source(self, source):
        self._source = source

    def source_rank(self):
        """A recv's: the group rank the message came from (waits for it)."""
        if self._source is None:
            raise RuntimeError("ringcomm: source_rank() may only be called on the Work of a recv")
        if callable(self._source):
            self.wait()
            return self._source()
        return self._source

    _source_rank = source_rank


_WORK_INIT = dist._Work.__init__


class CompletedWork(RingcommWork):
    """The Work of a call that completed before it was made (a blocking call
    of the fast paths): nothing to wait for, no error, only its result."""

    _settled = True

    def __init__(self, result):  # noqa: D107 - every step here is paid per call
        _WORK_INIT(self)
        self._result = result


class NativeWork(RingcommWork):
    """The Work of a call issued as one native ringcomm Work with nothing to
    copy back: the fast paths of all_reduce, send and recv (one dense CPU
    tensor). It is a RingcommWork in every respect; only the steps paid per
    call are fewer (torch's blocking send and recv are this Work's wait())."""

    def __init__(self, work, result, completer):  # noqa: D107
        _WORK_INIT(self)
        self._works = (work,)
        self._result = result
        self._completer = completer
        self._lock = threading.Lock()

    def wait(self, timeout=None):
        if timeout is None and not self._settled:
            try:
                self._works[0].wait()
            except RingcommError:
                return RingcommWork.wait(self)  # settles with the error and raises it
            if self._future is None and self._record_ended is None:
                # Succeeded, nothing to copy back, no future to complete:
                # settled without the lock. A get_future() racing with this
                # (another thread) saw the Work unsettled and handed it to the
                # Completer, which completes the future.
                self._settled = True
                return True
            self._settle(ok=True)  # completes the future before wait() returns
        return RingcommWork.wait(self, timeout)


class StreamEvent:
    """A CUDA event recorded on the current stream after a call's work there:
    the ringcomm Work interface (wait / is_completed / exception) over it, for
    calls ordered on the current stream (blocking CUDA calls, and calls whose
    results are copied back)."""

    __slots__ = ("_event",)

    def __init__(self, device):
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(device))

    def wait(self, timeout=None):
        """Without timeout: the current stream waits (the host does not). With
        one: the host waits that long, raising TimeoutError, then the stream waits."""
        t = _seconds(timeout)
        if t is not None:
            deadline = time.monotonic() + t
            while not self._event.query():
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"ringcomm: a CUDA call did not complete within {t} s "
                                       "(it is still running)")
                time.sleep(0.0005)
        torch.cuda.current_stream().wait_event(self._event)
        return True

    def is_completed(self):
        return self._event.query()

    def exception(self):
        return None


# Completers whose thread may be running; stopped at interpreter exit (below).
_RUNNING = weakref.WeakSet()
# How long exit waits for a Completer that is inside a future's callback.
EXIT_JOIN_S = 5.0


def _stop_completers():
    """At interpreter exit, before finalization: every Completer thread ends
    after what it is doing (a future's callbacks); Works still pending stay so.

    A daemon thread that takes the GIL back once the interpreter finalizes is
    ended by pthread_exit, and torch takes the GIL back in a noexcept
    destructor inside Future.set_result (around the callbacks it runs): a
    Completer caught there aborted the whole process ("terminate called
    without an active exception"). atexit handlers run before finalization,
    so the thread ends here instead."""
    threads = [t for t in (c._exit() for c in list(_RUNNING)) if t is not None]
    deadline = time.monotonic() + EXIT_JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


atexit.register(_stop_completers)


class Completer:
    """One thread per process group that completes the futures somebody asked for.

    It waits on the oldest watched Work; every POLL_S it also completes later
    ones that finished first (sends and receives may finish out of order).
    At interpreter exit it stops (_stop_completers).
    """

    POLL_S = 0.01

    def __init__(self, name):
        self._name = name
        self._cv = threading.Condition()
        self._pending = []
        self._thread = None
        self._stop = False
        self._exiting = False

    def watch(self, work):
        """Settles `work` once it finished: completes its future, ends its profiler record."""
        with self._cv:
            self._pending.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                _RUNNING.add(self)
                self._thread.start()
            self._cv.notify()

    def close(self):
        """The thread ends once every watched Work completed."""
        with self._cv:
            self._stop = True
            self._cv.notify()

    def _exit(self):
        """The thread ends after its current step; returns it (to join), or None."""
        with self._cv:
            self._exiting = True
            self._cv.notify()
            return self._thread

    def _loop(self):
        while True:
            with self._cv:
                while not self._pending and not self._stop and not self._exiting:
                    self._cv.wait()
                if not self._pending or self._exiting:
                    return
                head = self._pending[0]
            try:
                head._poll(self.POLL_S)
            except Exception:  # noqa: BLE001 - _settle() below records the error
                pass
            with self._cv:
                if self._exiting:
                    return
                done = [w for w in self._pending if w._native_done() or w._settled]
                if done:
                    self._pending = [w for w in self._pending if not any(w is d for d in done)]
            for w in done:
                if self._exiting:
                    return
                try:
                    w._settle()
                except Exception:  # noqa: BLE001 - a failing future callback must not stop the thread
                    pass
                w._end_record()
