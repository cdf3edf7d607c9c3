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
from collections import deque

import torch
import torch.distributed as dist

from ringcomm.torch_backend.tensors import flat

_HEADER = 2  # int64 elements: tag, byte count


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


class TaggedP2P:
    """Tagged send/recv of one process group over its own Communicator."""

    def __init__(self, comm):
        self._comm = comm
        self._posted = {}      # src -> deque of _Posted, in the order recv was called
        self._unexpected = {}  # src -> deque of (tag, bytes) that arrived before their recv
        self._lock = threading.RLock()

    def send(self, data, dst, tag):
        """Issues the header and the bytes of `data` (contiguous) to dst; returns their Works."""
        body = _as_bytes(data)
        header = torch.tensor([tag, body.numel()], dtype=torch.int64)
        with self._lock:
            works = [self._comm.send(header, dst, async_op=True)]
            if body.numel():
                works.append(self._comm.send(body, dst, async_op=True))
        return works

    def post(self, out, src, tag):
        """A recv of `out` (contiguous) from src with `tag`: matched now if its
        message already arrived, else queued for the headers still to come."""
        p = _Posted(tag, _as_bytes(out))
        with self._lock:
            kept = self._unexpected.get(src)
            if kept:
                for i, (t, body) in enumerate(kept):
                    if t == tag:
                        del kept[i]
                        self._deliver(p, src, body)
                        return p
            self._posted.setdefault(src, deque()).append(p)
        return p

    def progress(self, src, p):
        """Reads messages from src until `p` is done; raises its error."""
        with self._lock:
            while not p.done:
                self._read_one(src)
        if p.error is not None:
            raise p.error

    def _read_one(self, src):
        header = torch.empty(_HEADER, dtype=torch.int64)
        self._comm.recv(header, src)
        tag, nbytes = int(header[0]), int(header[1])
        waiting = self._posted.get(src, ())
        p = next((q for q in waiting if q.tag == tag), None)
        if p is not None and p.buf.numel() == nbytes:
            if nbytes:
                self._comm.recv(p.buf, src)
            waiting.remove(p)
            p.done = True
            return
        # Kept for a later recv, or read to keep the stream in step when its
        # size does not match the recv waiting for it (which then fails).
        body = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            self._comm.recv(body, src)
        if p is None:
            self._unexpected.setdefault(src, deque()).append((tag, body))
        else:
            waiting.remove(p)
            self._deliver(p, src, body)

    @staticmethod
    def _deliver(p, src, body):
        if body.numel() != p.buf.numel():
            p.error = ValueError(f"ringcomm recv from rank {src} with tag {p.tag}: the tensor has "
                                 f"{p.buf.numel()} bytes, the message sent with that tag has {body.numel()}")
        else:
            p.buf.copy_(body)
        p.done = True


class TaggedRecvWork(dist._Work):
    """The Work of a tagged recv: waiting reads the source's messages until
    this recv's has come (see the module docstring), then copies back."""

    def __init__(self, tagged, src, posted, result, staging):
        super().__init__()
        self._tagged, self._src, self._posted = tagged, src, posted
        self._result, self._staging = result, staging
        self._error = None
        self._finished = False

    def _finish(self):
        if not self._finished:
            try:
                for p in self._posted:
                    self._tagged.progress(self._src, p)
                self._staging.finish()
            except Exception as e:  # noqa: BLE001 - raised to every waiter
                self._error = e
            self._finished = True
        if self._error is not None:
            raise self._error

    def wait(self, timeout=None):
        # The native recvs wait up to the group's timeout; a shorter one
        # asked here cannot be honoured without abandoning a message halfway.
        self._finish()
        return True

    def is_completed(self):
        return self._finished or all(p.done for p in self._posted)

    def is_success(self):
        return self.is_completed() and self._error is None and all(p.error is None for p in self._posted)

    def exception(self):
        return self._error

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

