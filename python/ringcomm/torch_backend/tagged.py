"""Tag matching for the backend's send/recv: a recv(src, tag) gets the oldest
message from src sent with that tag, as gloo and MPI match.

The native core pairs a pair's messages in issue order and cannot look at a
message before receiving it, so tagged messages travel on a communicator of
their own (made with the group): the default tag keeps the native path and
its cost, and the two streams cannot swap or block each other, whatever
order a program mixes them in. On that communicator every message is a
header (tag, byte count) followed by its bytes. A receiver reads the headers
from a source in arrival order: a message that a posted recv of its tag is
waiting for goes straight into that recv's tensor; any other is kept, in a
copy, for a later recv of its tag from that source (MPI's posted and
unexpected queues).

Reading happens in the thread that waits: the core takes calls from one
thread at a time, so no background thread may read while the caller sends.
A tagged irecv therefore completes when it, or a later tagged recv from the
same source, is waited for; isend completes on its own, as for the default
tag.
"""
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from ringcomm.errors import TimeoutError
from ringcomm.torch_backend.tensors import flat
from ringcomm.torch_backend.work import _seconds

_HEADER = 2  # int64 elements: tag, byte count
_SPINS = 200  # polls before a waiter starts to sleep between them


def _as_bytes(t):
    """1-D uint8 view of a contiguous tensor: tagged messages move bytes."""
    f = flat(t)
    return f.view(torch.uint8) if f.dtype != torch.uint8 else f


class _Posted:
    """A tagged recv waiting for its message."""

    __slots__ = ("tag", "buf", "done", "error")

    def __init__(self, tag, buf):
        self.tag, self.buf = tag, buf
        self.done, self.error = False, None


class _Reading:
    """What is being read from one source: a header, then its bytes."""

    __slots__ = ("work", "header", "tag", "body", "into")

    def __init__(self, work, header):
        self.work, self.header = work, header
        self.tag = self.body = self.into = None  # set once the header arrived


class TaggedP2P:
    """Tagged send/recv of one process group over its own Communicator."""

    def __init__(self, comm):
        self._comm = comm
        self._posted = {}      # src -> deque of _Posted, in the order recv was called
        self._unexpected = {}  # src -> deque of (tag, bytes) that arrived before their recv
        self._reading = {}     # src -> _Reading
        self._failed = None    # the error a read failed with: every later wait raises it
        self._issuer = None    # the thread of the last tagged call: the only one that posts reads
        self._lock = threading.RLock()

    def send(self, data, dst, tag):
        """Issues the header and the bytes of `data` (contiguous) to dst; returns their Works."""
        body = _as_bytes(data)
        header = torch.tensor([tag, body.numel()], dtype=torch.int64)
        with self._lock:
            self._issuer = threading.get_ident()
            works = [self._comm.send(header, dst, async_op=True)]
            if body.numel():
                works.append(self._comm.send(body, dst, async_op=True))
        return works

    def post(self, out, src, tag):
        """A recv of `out` (contiguous) from src with `tag`: matched now if its
        message already arrived, else queued for the headers still to come."""
        p = _Posted(tag, _as_bytes(out))
        with self._lock:
            self._issuer = threading.get_ident()
            kept = self._unexpected.get(src)
            if kept:
                for i, (t, body) in enumerate(kept):
                    if t == tag:
                        del kept[i]
                        self._deliver(p, src, body)
                        return p
            self._posted.setdefault(src, deque()).append(p)
            self._advance(src)
        return p

    def wait_until(self, done, timeout=None):
        """Advances every source until done() is true; raises a read's error.

        Only the thread that issued the last tagged call posts reads (the
        core's one-thread rule); another one (torch's future completer)
        just watches. On `timeout` (seconds) first, raises TimeoutError.
        """
        spins = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._failed is not None:
                    raise self._failed
                if self._issuer == threading.get_ident():
                    for src in list(self._reading):
                        self._advance(src)
            if done():
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"ringcomm: a tagged send/recv did not complete within {timeout} s "
                                   "(it is still running)")
            spins += 1
            # Spin first (a small message is microseconds away), then sleep
            # so that a long wait does not take a core from the peers.
            time.sleep(0 if spins < _SPINS else min(1e-3, 1e-5 * (spins - _SPINS + 1)))

    def _advance(self, src):
        """Moves src's reading on as far as arrived messages allow (never blocks)."""
        while True:
            r = self._reading.get(src)
            if r is None:
                if not self._posted.get(src):
                    return  # nobody waits for src: its messages stay in the stream
                header = torch.empty(_HEADER, dtype=torch.int64)
                self._reading[src] = _Reading(self._comm.recv(header, src, async_op=True), header)
                continue
            if r.work is not None:
                if not r.work.is_completed():
                    return
                err = r.work.exception()
                if err is not None:
                    self._failed = err
                    raise err
                r.work = None
            if r.tag is None:
                self._start_body(src, r)
                continue
            del self._reading[src]
            if r.into is None:
                self._unexpected.setdefault(src, deque()).append((r.tag, r.body))
            elif r.body is not None:
                self._deliver(r.into, src, r.body)
            else:
                r.into.done = True

    def _start_body(self, src, r):
        """A header arrived: posts its bytes' recv, into the matching recv's
        tensor when the sizes agree, else into a copy (kept, or read to keep
        the stream in step when the size is wrong: that recv then fails)."""
        r.tag, nbytes = int(r.header[0]), int(r.header[1])
        waiting = self._posted.get(src, ())
        p = next((q for q in waiting if q.tag == r.tag), None)
        if p is not None:
            waiting.remove(p)
            r.into = p
        if p is None or p.buf.numel() != nbytes:
            r.body = torch.empty(nbytes, dtype=torch.uint8)
        target = p.buf if r.body is None else r.body
        if nbytes:
            r.work = self._comm.recv(target, src, async_op=True)

    @staticmethod
    def _deliver(p, src, body):
        if body.numel() != p.buf.numel():
            p.error = ValueError(f"ringcomm recv from rank {src} with tag {p.tag}: the tensor has "
                                 f"{p.buf.numel()} bytes, the message sent with that tag has {body.numel()}")
        else:
            p.buf.copy_(body)
        p.done = True


class TaggedSendWork:
    """The native Works of one tagged send; waiting for them advances the
    tagged receives too (module docstring). RingcommWork wraps it."""

    def __init__(self, tagged, works):
        self._tagged, self._works = tagged, works

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def exception(self):
        return next((e for e in (w.exception() for w in self._works) if e is not None), None)

    def wait(self, timeout=None):
        # The native sends fail on their own at the group's timeout.
        self._tagged.wait_until(self.is_completed, _seconds(timeout))
        err = self.exception()
        if err is not None:
            raise err
        return True


class TaggedRecvWork(dist._Work):
    """The Work of a tagged recv: waiting advances the tagged receives until
    this one's message has come (module docstring), then copies back."""

    def __init__(self, tagged, src, posted, result, staging):
        super().__init__()
        self._tagged, self._src, self._posted = tagged, src, posted
        self._result, self._staging = result, staging
        self._error = None
        self._finished = False

    def _finish(self, timeout=None):
        if not self._finished:
            try:
                self._tagged.wait_until(lambda: all(p.done for p in self._posted), timeout)
            except TimeoutError:
                if not all(p.done for p in self._posted):
                    raise  # this wait expired; the recv is still posted
            except Exception as e:  # noqa: BLE001 - raised to every waiter
                self._error = e
            if self._error is None:
                try:
                    err = next((p.error for p in self._posted if p.error is not None), None)
                    if err is not None:
                        raise err
                    self._staging.finish()
                except Exception as e:  # noqa: BLE001 - raised to every waiter
                    self._error = e
            self._finished = True
        if self._error is not None:
            raise self._error

    def wait(self, timeout=None):
        """Blocks until the message arrived (or `timeout` expired: TimeoutError,
        the recv stays posted); raises the recv's error."""
        self._finish(_seconds(timeout))
        return True

    def is_completed(self):
        return self._finished or all(p.done for p in self._posted)

    def is_success(self):
        return self.is_completed() and self._error is None and all(p.error is None for p in self._posted)

    def exception(self):
        if self._error is not None:
            return self._error
        return next((p.error for p in self._posted if p.done and p.error is not None), None)

    def source_rank(self):
        return self._src

    def get_future(self):
        """A future completed with the tensors: it waits first (module docstring)."""
        fut = torch.futures.Future()
        try:
            self._finish()
            fut.set_result(self._result)
        except Exception as e:  # noqa: BLE001 - handed to the future
            fut.set_exception(e)
        return fut
