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
from ringcomm.errors import RingcommError, TimeoutError
from ringcomm.work import seconds

_TORCH_DTYPES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3,
                 "int8": 4, "uint8": 5, "int32": 6, "int64": 7, "bool": 8}
_TYPESTRS = {"f2": 0, "f4": 2, "f8": 3, "i1": 4, "u1": 5, "i4": 6, "i8": 7, "b1": 8}
DEFAULT_CHUNK_BYTES = 4 << 20


def _known_algo(device, name):
    """Whether `name` (a value read from the store) is an algorithm `device` runs."""
    try:
        _C.parse_algo(device, name, "algo")
    except (TypeError, ValueError):
        return False
    return True


def compiled():
    """Whether this build has the GPU path."""
    return hasattr(_C, "GpuCommunicator")


def available():
    """Whether the GPU path can run here: compiled in, and a CUDA device present."""
    return compiled() and _C.cuda_device_count() > 0


def _nccl_search_paths():
    """libnccl.so.2 of installed nvidia-nccl-cu13 / -cu12 wheels (namespace package nvidia.nccl)."""
    import importlib.util

    paths = []
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations if spec else None) or []:
        lib = os.path.join(loc, "lib", "libnccl.so.2")
        if os.path.exists(lib):
            paths.append(lib)
    return paths


_nccl_paths_set = False


def nccl_version():
    """(version, path) of the NCCL library the GPU path uses (loads it)."""
    global _nccl_paths_set
    if not compiled():
        raise RingcommError("ringcomm: this build has no GPU path (no CUDA toolkit at build time)")
    if not _nccl_paths_set:
        _C.nccl_set_search_paths(_nccl_search_paths())
        _nccl_paths_set = True
    return _C.nccl_version()


def _host():
    return bootstrap.host_identity()


def bootstrap_exchange(store, prefix, rank, world_size, info, timeout_s):
    """Every rank's {"host", "gpu"} for pick_gpu_transport (checked like socket data)."""
    schema = {"host": validate.text(1024), "gpu": validate.text(64)}
    return bootstrap.exchange(store, prefix, rank, world_size, info, timeout_s, schema=schema)


class DeviceBuffer:
    """A contiguous CUDA buffer: pointer, element count, ringcomm dtype code, device."""

    __slots__ = ("obj", "ptr", "count", "dtype", "device", "torch")

    def __init__(self, obj, ptr, count, dtype, device, torch_tensor):
        self.obj, self.ptr, self.count, self.dtype, self.device = obj, ptr, count, dtype, device
        self.torch = torch_tensor


def _torch():
    import sys

    return sys.modules.get("torch")


def device_buffer(x, arg):
    """Reads a CUDA tensor / array; raises TypeError / ValueError naming `arg`."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cuda:
            raise ValueError(f"{arg} is on {x.device}; the other buffers of this call are on a CUDA device")
        if not x.is_contiguous():
            raise ValueError(f"{arg} must be contiguous (call .contiguous() first)")
        name = str(x.dtype).rsplit(".", 1)[-1]
        if name not in _TORCH_DTYPES:
            raise TypeError(f"{arg} has unsupported dtype {x.dtype}")
        return DeviceBuffer(x, x.data_ptr(), x.numel(), _TORCH_DTYPES[name], x.device.index, True)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, _readonly = cai["data"]
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
        if typestr[0] == ">" or typestr[1:] not in _TYPESTRS:
            raise TypeError(f"{arg} has unsupported typestr {typestr!r}")
        count = 1
        for d in shape:
            count *= int(d)
        strides = cai.get("strides")
        if strides is not None:
            expect = int(typestr[2:])
            for d, s in zip(reversed(shape), reversed(strides)):
                if d > 1 and s != expect:
                    raise ValueError(f"{arg} must be C-contiguous")
                expect *= d
        device = getattr(getattr(x, "device", None), "id", None)
        if device is None:
            device = _C.cuda_pointer_device(ptr) if ptr else 0
        return DeviceBuffer(x, ptr, count, _TYPESTRS[typestr[1:]], device, False)
    if hasattr(x, "__dlpack_device__") and torch is not None:
        dev_type, _ = x.__dlpack_device__()
        if dev_type == 2:  # kDLCUDA
            return device_buffer(torch.from_dlpack(x), arg)
    raise TypeError(f"{arg} must be a CUDA torch tensor or an object with __cuda_array_interface__ "
                    f"(cupy), got {type(x).__name__}")


def is_device_buffer(x):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.is_cuda
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if hasattr(x, "__dlpack_device__"):
        try:
            return x.__dlpack_device__()[0] == 2
        except Exception:  # noqa: BLE001
            return False
    return False


def current_stream(device, prefer_torch):
    """The framework's current stream on `device` (torch's for torch tensors, else
    cupy's when cupy is loaded, else the legacy default stream 0)."""
    import sys

    torch = _torch()
    if prefer_torch and torch is not None:
        return torch.cuda.current_stream(device).cuda_stream
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().ptr
    return 0


def stream_handle(stream, buf):
    """The cudaStream_t (int) a call on `buf` is ordered after."""
    if stream is None:
        return current_stream(buf.device, buf.torch)
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    raise TypeError(f"stream must be an int handle, a torch.cuda.Stream or a cupy Stream, got {type(stream).__name__}")


class GpuWork:
    """The handle of an asynchronous GPU operation (async_op=True)."""

    __slots__ = ("_native", "_buffers", "_device", "_torch")

    def __init__(self, native, buffers, device, torch_buffers):
        self._native = native
        self._buffers = buffers
        self._device = device
        self._torch = torch_buffers

    def wait(self, timeout=None, stream=None):
        """Makes `stream` (default: the current stream of the tensors' framework on their
        device) wait for the operation. Without `timeout` the host does not block; with one
        (seconds or timedelta, 0 to poll) the host first waits that long for the operation
        to finish, as torch's Work.wait(timeout), and raises ringcomm.TimeoutError if it
        did not (the operation keeps running; the watchdog still bounds it). Raises the
        operation's error when it is known to have failed. Returns True."""
        t = seconds(timeout)
        if t is not None and not self._native.wait_host(t):
            raise TimeoutError(f"ringcomm: wait for {self._native.what} did not complete within {t} s "
                               "(the operation is still running)")
        if stream is None:
            handle = current_stream(self._device, self._torch)
        else:
            handle = stream_handle(stream, None)
        self._native.wait_stream(handle)  # raises the operation's error first
        return True

    def synchronize(self, timeout=None):
        """Blocks the host until the operation finished (TimeoutError after `timeout`
        seconds, default the communicator's; the NCCL communicator is then aborted).
        Raises the operation's error if it failed."""
        t = seconds(timeout)
        self._native.synchronize(-1.0 if t is None else t)
        return True

    def is_completed(self):
        """True once the operation finished, successfully or not (see exception())."""
        return bool(self._native.error()) or self._native.is_completed()

    def exception(self):
        """The error the operation failed with (the watchdog's timeout, an NCCL error,
        an abort), or None."""
        msg = self._native.error()
        if not msg:
            return None
        cls = TimeoutError if self._native.error_is_timeout() else RingcommError
        return cls(f"ringcomm: {self._native.what} failed: {msg}")

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<ringcomm.GpuWork {self._native.what} on cuda:{self._device} {state}>"


# Buffers of calls whose stream close() could not drain (a CUDA error): the GPU may
# still write them, so their memory must never return to the allocator.
_held_forever = []


def agree_settings(store, key, rank, timeout_s, mine, make_uid):
    """The settings every rank of one NCCL communicator uses: rank 0's `mine` (its
    RINGCOMM_GPU_CHUNK_BYTES and RINGCOMM_GPU_ALGO) and a unique id from rank 0's
    `make_uid()`, through `store` under `key`. Ranks that cut the ring's messages
    differently, or ran different families, would wait on each other until the
    watchdog fired."""
    import json

    from ringcomm import bootstrap

    if rank == 0:
        store.set(key, json.dumps({**mine, "uid": make_uid()}))
    bootstrap.wait_keys(store, [key], timeout_s, "waiting for rank 0's NCCL unique id and GPU settings", rank)
    shared = json.loads(bootstrap._text(store.get(key)))
    chunk, algo = shared.get("chunk"), shared.get("algo")
    if not isinstance(chunk, int) or not _known_algo("nccl", algo) or not isinstance(shared.get("uid"), str):
        raise RingcommError(f"ringcomm: rank 0's GPU settings under {key!r} are not what this rank expects "
                            f"(got {sorted(shared)}); do all ranks run the same ringcomm version?")
    return shared


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
