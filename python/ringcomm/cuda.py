"""The GPU path: collectives on CUDA tensors (torch), CUDA arrays (cupy, anything
with ``__cuda_array_interface__``, DLPack objects on a CUDA device through torch).

Stream semantics (docs/gpus.md): a call is ordered after the work already queued on the
caller's stream (``stream=``; default: the framework's current stream on the tensor's
device), runs on the communicator's own stream, and

- with ``async_op=False`` the caller's stream waits for it (the host does not block,
  as with torch.distributed's NCCL backend); the result is in place for every later
  kernel on that stream;
- with ``async_op=True`` a :class:`GpuWork` comes back: ``wait()`` makes the caller's
  current stream wait (no host block), ``synchronize()`` blocks the host.

Buffers stay alive until the operation finished: the communicator holds references to
them until the host has seen the operation's event complete (or, at close(), until its
stream is drained). Tensors are not ``record_stream``'ed on the comm stream (what
torch's NCCL backend does under TORCH_NCCL_AVOID_RECORD_STREAMS=1): the references alone
keep the caching allocator from handing their memory out early, and torch never holds an
event on a stream that close() destroys. A stream capturing a CUDA graph gets the
operation queued on itself (NCCL and ringcomm's kernels are capturable).

Errors: an operation the watchdog aborted (or that an NCCL error struck after it was
queued) raises from ``synchronize()`` and ``wait()``, and ``exception()`` returns its
error, although its event completes (every event does once NCCL is aborted).

Transports: NCCL, or cuda_ipc for the ranks of one host (ringcomm/cuda_ipc.py: picked
when two ranks share a GPU, which NCCL refuses, or by RINGCOMM_TRANSPORT=cuda_ipc /
init(transport="cuda_ipc"); the protocol is csrc/transport/cuda_ipc/ipc_channel.h). Over
cuda_ipc every call runs ringcomm's schedules, all_reduce also one-shot or two-shot by size
(or ``algo="oneshot" | "twoshot" | "ring"``), and calls cannot be captured into CUDA graphs
(a clear error).

Algorithms (``algo=`` per call, or RINGCOMM_GPU_ALGO): "nccl" (NCCL's collective),
"ring" (ringcomm's schedules over NCCL send/recv with ringcomm's CUDA kernels), "auto"
(nccl where NCCL reduces alike; ring for bool, the bitwise ops and floating-point MIN/MAX,
whose NCCL versions drop NaN where ringcomm propagates it: "nccl" forced on those raises
ValueError; the rule is csrc/comm/chooser.h). Rank 0's RINGCOMM_GPU_ALGO and
RINGCOMM_GPU_CHUNK_BYTES hold for every rank (agreed when an NCCL communicator is
created): ranks that ran different families would wait on each other until the watchdog
fired.
"""
import os
import threading

from ringcomm import _C, bootstrap, validate
from ringcomm.errors import RingcommError, TimeoutError  # noqa: F401 - part of this module's API (__all__)
from ringcomm.gpu_buffers import device_buffer, is_device_buffer, stream_handle
from ringcomm.gpu_work import GpuWork
from ringcomm.nccl import agree_settings, available, compiled, nccl_version  # noqa: F401 - available: API

DEFAULT_CHUNK_BYTES = 4 << 20


def _host():
    return bootstrap.host_identity()


def bootstrap_exchange(store, prefix, rank, world_size, info, timeout_s):
    """Every rank's {"host", "gpu"} for pick_gpu_transport (checked like socket data)."""
    schema = {"host": validate.text(1024), "gpu": validate.text(64)}
    return bootstrap.exchange(store, prefix, rank, world_size, info, timeout_s, schema=schema)


# Buffers of calls whose stream close() could not drain (a CUDA error): the GPU may
# still write them, so their memory must never return to the allocator.
_held_forever = []


class GpuPath:
    """The GPU side of one Communicator: one native GPU communicator per device, created
    at the first call on that device (every rank must make its first GPU call of a
    device together, as with any collective), over NCCL or over cuda_ipc
    (ringcomm/cuda_ipc.py pick_gpu_transport: by choice, or because two ranks share a
    GPU)."""

    def __init__(self, comm):
        self._comm = comm
        self._natives = {}
        self._ipc_prefix = {}  # device -> store prefix of its cuda_ipc communicator
        self._created = 0
        self._inflight = []  # (native work, buffers): references held until its event completed
        self._lock = threading.Lock()
        self._default_algo = _C.parse_algo("nccl", os.environ.get("RINGCOMM_GPU_ALGO", "auto") or "auto",
                                           "RINGCOMM_GPU_ALGO")
        raw = os.environ.get("RINGCOMM_GPU_CHUNK_BYTES") or str(DEFAULT_CHUNK_BYTES)
        try:
            self._chunk = int(raw.strip(), 10)
        except ValueError:
            raise ValueError(f"environment variable RINGCOMM_GPU_CHUNK_BYTES={raw!r} is not an integer") from None
        if not 64 <= self._chunk <= (1 << 30) or self._chunk % 64:
            raise ValueError(f"environment variable RINGCOMM_GPU_CHUNK_BYTES must be a multiple of 64 between 64 "
                             f"and 1 GiB, got {self._chunk}")

    # -- setup ----------------------------------------------------------------
    def transport(self, device):
        """"nccl" or "cuda_ipc": what this communicator's calls on `device` run over
        (None before the first call there)."""
        g = self._natives.get(device)
        return None if g is None else ("cuda_ipc" if g.over_ipc else "nccl")

    def native(self, device):
        g = self._natives.get(device)
        if g is not None:
            return g
        from ringcomm import cuda_ipc

        c = self._comm
        store, rank, ws = c._store, c.rank, c.world_size
        n = self._created
        self._created += 1
        infos = bootstrap_exchange(store, f"{c._prefix}/gpu/{n}", rank, ws,
                                   {"host": _host(), "gpu": _C.cuda_pci_bus_id(device)}, c._config.timeout_s)
        if cuda_ipc.pick_gpu_transport(c._config.transport, infos) == "cuda_ipc":
            g = self._native_ipc(device, f"{c._prefix}/cuda_ipc/{n}")
            self._natives[device] = g
            self._ipc_prefix[device] = f"{c._prefix}/cuda_ipc/{n}"
            return g
        nccl_version()  # load NCCL (clear error if absent) before talking to the peers
        key = f"{c._prefix}/nccl/{n}"
        shared = agree_settings(store, key, rank, c._config.timeout_s,
                                {"chunk": self._chunk, "algo": self._default_algo},
                                lambda: _C.nccl_unique_id().hex())
        g = _C.GpuCommunicator(rank, ws, device, bytes.fromhex(shared["uid"]), c._config.timeout_s,
                               shared["chunk"], shared["algo"])
        self._natives[device] = g
        return g

    def _native_ipc(self, device, prefix):
        from ringcomm import cuda_ipc

        c = self._comm
        store, rank, ws, timeout_s = c._store, c.rank, c.world_size, c._config.timeout_s
        ipc_algo = _C.parse_algo("cuda_ipc", os.environ.get("RINGCOMM_IPC_ALGO", "auto") or "auto",
                                 "RINGCOMM_IPC_ALGO")
        # The ring family's chunk is the slot (RINGCOMM_GPU_CHUNK_BYTES, unless
        # RINGCOMM_IPC_SLOT_BYTES says otherwise).
        mine = cuda_ipc.settings(None if os.environ.get("RINGCOMM_IPC_SLOT_BYTES") else {"slot_bytes": self._chunk})
        mine["algo"] = ipc_algo
        s = cuda_ipc.agree(store, f"{prefix}/settings", rank, timeout_s, mine)
        g = _C.GpuCommunicator.over_cuda_ipc(rank, ws, device, timeout_s, s["slot_bytes"], s["nslots"],
                                             s["stage_bytes"], s["one_shot_max"], s["two_shot_max"], s["algo"])
        try:
            cuda_ipc.connect(g, store, prefix, rank, ws, timeout_s)
        except BaseException:
            g.close()
            raise
        return g

    def close(self):
        """Closes every NCCL communicator (each drains its stream, or its NCCL was aborted
        and its kernels exited), and only then drops the references to the buffers of
        calls in flight: their memory may go back to torch's allocator only once the
        GPU no longer touches it."""
        natives, self._natives = self._natives, {}
        # (After a failure the peers' kernels stop at the abort word: no wait.)
        healthy_ipc = [d for d, g in natives.items() if g.over_ipc and not g.async_error()]
        if healthy_ipc:
            self._quiesce_ipc(healthy_ipc)
        try:
            for g in natives.values():
                g.close()
        except BaseException:
            # A stream that could not be drained may still use them: never free them.
            _held_forever.extend(self._inflight)
            raise
        finally:
            self._inflight = []

    # A cuda_ipc rank's buffers are read by its peers' kernels (one-shot reads every
    # input; a ring reads the slots it was sent): freeing them when this rank's own
    # calls are done may pull memory from under a slower peer. So before freeing,
    # each rank finishes its calls and then waits for every peer to have done so,
    # through the store, bounded: a peer that never comes is dead or failed, and
    # its kernels stop at their own deadline.
    CLOSE_WAIT_S = 30.0

    def _quiesce_ipc(self, devices):
        for work, _ in list(self._inflight):
            try:
                work.synchronize(self._comm._config.timeout_s)
            except Exception:  # noqa: BLE001 - a failed call is over too
                pass
        c = self._comm
        wait = min(self.CLOSE_WAIT_S, c._config.timeout_s)
        for device in devices:
            prefix = self._ipc_prefix.get(device)
            if prefix is None:
                continue
            try:
                c._store.set(f"{prefix}/closed/{c.rank}", "1")
                bootstrap.wait_keys(c._store, [f"{prefix}/closed/{r}" for r in range(c.world_size) if r != c.rank],
                                    wait, "waiting for the cuda_ipc peers to finish before freeing buffers", c.rank)
            except Exception:  # noqa: BLE001 - a peer or the store is gone: nobody reads us any more
                pass

    def abort(self, why):
        for g in self._natives.values():
            g.abort(why)

    # -- calls ----------------------------------------------------------------
    def _prune(self):
        # is_completed queries the event in relaxed capture mode: safe while
        # another thread captures a CUDA graph.
        inflight = self._inflight
        while inflight and inflight[0][0].is_completed():
            inflight.pop(0)

    def _finish(self, g, native_work, bufs, caller, async_op):
        torch_bufs = [b for b in bufs if b is not None and b.torch]
        # No record_stream: the references in _inflight keep the memory from the
        # allocator until the event completed (see the module docstring).
        keep = tuple(b.obj for b in bufs if b is not None)
        if not native_work.captured:
            self._prune()
            self._inflight.append((native_work, keep))
        if async_op:
            return GpuWork(native_work, keep, g.device, bool(torch_bufs))
        native_work.wait_stream(caller)
        return None

    def _bufs(self, *named):
        if not any(x is not None and is_device_buffer(x) for _, x in named):
            raise ValueError("stream= and algo= apply to GPU buffers (CUDA tensors / arrays); CPU calls take "
                             "neither (the CPU algorithm is chosen with RINGCOMM_ALGO)")
        if not compiled():
            raise RingcommError("ringcomm: this build has no GPU path (it was built without a CUDA toolkit); "
                                "rebuild with CUDA to pass GPU buffers")
        bufs = [None if x is None else device_buffer(x, name) for name, x in named]
        present = [b for b in bufs if b is not None]
        devices = {b.device for b in present}
        if len(devices) > 1:
            raise ValueError(f"buffers of one call must be on one device, got cuda:{sorted(devices)}")
        return bufs, present[0]

    @staticmethod
    def _algo(algo):
        """A call's algo= (None: auto); the chooser (csrc/comm/chooser.h) says what it means on the device."""
        if algo is None:
            return "auto"
        if not isinstance(algo, str):
            raise TypeError(f"algo must be a str or None, got {type(algo).__name__}")
        return _C.parse_gpu_call_algo(algo)

    def all_reduce(self, tensor, op, async_op, stream, algo):
        (x,), first = self._bufs(("tensor", tensor))
        self._check("all_reduce", x, redop=op)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.all_reduce(x.ptr, x.count, x.dtype, op, s, self._algo(algo))
        return self._finish(g, w, [x], s, async_op)

    def reduce_scatter(self, output, input, op, async_op, stream, algo):
        (o, i), first = self._bufs(("output", output), ("input", input))
        self._check("reduce_scatter", o, i, redop=op)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.reduce_scatter(o.ptr, o.count, i.ptr, i.count, i.dtype, op, s, self._algo(algo))
        return self._finish(g, w, [o, i], s, async_op)

    def all_gather(self, output, input, async_op, stream, algo):
        (o, i), first = self._bufs(("output", output), ("input", input))
        self._check("all_gather", o, i)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.all_gather(o.ptr, o.count, i.ptr, i.count, i.dtype, s, self._algo(algo))
        return self._finish(g, w, [o, i], s, async_op)

    def broadcast(self, tensor, src, async_op, stream, algo):
        (x,), first = self._bufs(("tensor", tensor))
        src = validate.rank_arg(src, "src")
        self._check("broadcast", x, root=src)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.broadcast(x.ptr, x.count, x.dtype, src, s, self._algo(algo))
        return self._finish(g, w, [x], s, async_op)

    def reduce(self, tensor, dst, op, async_op, stream, algo):
        (x,), first = self._bufs(("tensor", tensor))
        dst = validate.rank_arg(dst, "dst")
        self._check("reduce", x, root=dst, redop=op)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.reduce(x.ptr, x.count, x.dtype, dst, op, s, self._algo(algo))
        return self._finish(g, w, [x], s, async_op)

    def scatter(self, output, input, src, async_op, stream, algo):
        src = validate.rank_arg(src, "src")
        (o, i), first = self._bufs(("output", output), ("input", input if self._comm.rank == src else None))
        self._check("scatter", o, i, root=src)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.scatter(o.ptr, o.count, i.ptr if i else 0, i.count if i else 0, o.dtype, src, s)
        return self._finish(g, w, [o, i], s, async_op)

    def gather(self, output, input, dst, async_op, stream, algo):
        dst = validate.rank_arg(dst, "dst")
        (o, i), first = self._bufs(("output", output if self._comm.rank == dst else None), ("input", input))
        self._check("gather", o, i, root=dst)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.gather(o.ptr if o else 0, o.count if o else 0, i.ptr, i.count, i.dtype, dst, s)
        return self._finish(g, w, [o, i], s, async_op)

    def all_to_all(self, output, input, async_op, stream, algo):
        (o, i), first = self._bufs(("output", output), ("input", input))
        self._check("all_to_all", o, i)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.all_to_all(o.ptr, o.count, i.ptr, i.count, i.dtype, s)
        return self._finish(g, w, [o, i], s, async_op)

    def send(self, tensor, dst, async_op, stream, algo):
        (x,), first = self._bufs(("tensor", tensor))
        dst = validate.rank_arg(dst, "dst")
        self._check("send", x, root=dst)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.send(x.ptr, x.count, x.dtype, dst, s)
        return self._finish(g, w, [x], s, async_op)

    def recv(self, tensor, src, async_op, stream, algo):
        (x,), first = self._bufs(("tensor", tensor))
        src = validate.rank_arg(src, "src")
        self._check("recv", x, root=src)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.recv(x.ptr, x.count, x.dtype, src, s)
        return self._finish(g, w, [x], s, async_op)

    def sendrecv(self, send_tensor, dst, recv_tensor, src, stream):
        (a, b), first = self._bufs(("send_tensor", send_tensor), ("recv_tensor", recv_tensor))
        dst, src = validate.rank_arg(dst, "dst"), validate.rank_arg(src, "src")
        self._check("send", a, root=dst)
        self._check("recv", b, root=src)
        g, s = self.native(first.device), stream_handle(stream, first)
        w = g.sendrecv(a.ptr, a.count, a.dtype, dst, b.ptr, b.count, b.dtype, src, s)
        return self._finish(g, w, [a, b], s, False)

    # -- checks ---------------------------------------------------------------
    def _check(self, op, out, inp=None, root=-1, redop=0):
        """The communicators' one call check (csrc/comm/call_check.h), before anything is queued."""
        def t(b):
            return None if b is None else (b.ptr, b.count, b.dtype)
        _C.check_call(op, self._comm.rank, self._comm.world_size, t(out), t(inp), root, int(redop))



__all__ = ["GpuWork", "available", "compiled", "nccl_version", "TimeoutError"]
