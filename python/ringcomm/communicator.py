"""Communicator: a group of ranks and one method per collective.

Ranks are communicator-local everywhere. Calls on one communicator run in the
order they were issued and all ranks must issue the same calls; with
async_op=True a call returns a Work at once and runs on the communicator's
worker thread.
"""
import os

from ringcomm import _C, bootstrap, validate
from ringcomm._C import DeviceBufferError as _DeviceBuffer
from ringcomm.errors import RingcommError
from ringcomm.reduce_op import ReduceOp, op_value

_OP_VALUE = {op: int(op) for op in ReduceOp}
from ringcomm.work import Work


class Communicator:
    def __init__(self, store, prefix, rank, world_size, config, ranks=None):
        """Joins the communicator named `prefix` in `store` (all ranks call it)."""
        self._rank, self._world_size = rank, world_size  # still known once closed
        self._store = store
        self._prefix = prefix
        self._config = config
        self._splits = 0
        self._inflight = []
        self._native = None
        self._gpu_path = None
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
        native = _C.Communicator(rank, world_size, config)
        try:
            info = {
                "host": bootstrap.host_identity(),
                "segment": native.segment_name(),
                "slot_bytes": config.slot_bytes,
                "nslots": config.nslots,
                "ranks": ranks,
                "transport": config.transport,
            }
            if config.transport != "shm" and world_size > 1:
                # Who is on another host is only known after the exchange, so
                # every rank listens (and rank 0 draws the secret) up front.
                addr = bootstrap.socket_address(store)
                info["tcp"] = [addr, native.listen_tcp(addr)]
                if rank == 0:
                    info["secret"] = bootstrap.draw_secret()
            infos = bootstrap.exchange(store, prefix, rank, world_size, info, config.timeout_s)
            self._check_peers(rank, info, infos)
            tcp = [r != rank and "tcp" in info and (config.transport == "tcp" or i["host"] != info["host"])
                   for r, i in enumerate(infos)]
            native.connect([i["segment"] if r != rank and not tcp[r] else "" for r, i in enumerate(infos)])
            if "tcp" in info:
                native.connect_tcp([i["tcp"][0] if tcp[r] else "" for r, i in enumerate(infos)],
                                   [int(i["tcp"][1]) if tcp[r] else 0 for r, i in enumerate(infos)],
                                   bytes.fromhex(infos[0]["secret"]))
            # Once every peer has mapped every segment the names can go: a
            # crash after this point leaves nothing behind in /dev/shm.
            bootstrap.barrier(store, prefix, "mapped", rank, world_size, config.timeout_s)
            native.unlink_segment()
            # Single-copy pull schedules need every rank able to read every
            # peer's memory; all ranks must agree, or their schedules differ.
            can_pull = config.pull and native.probe_pull()
            pulls = bootstrap.exchange(store, f"{prefix}/pull", rank, world_size, can_pull, config.timeout_s)
            native.set_pull(all(pulls))
            self._tune_waiting(native, info, infos, config, any(tcp))
        except BaseException:
            native.close()
            raise
        self._native = native

    @staticmethod
    def _tune_waiting(native, mine, infos, config, uses_tcp=False):
        """No busy spinning when this host runs more ranks than it has cores
        (unless RINGCOMM_SPIN_US says otherwise): a spinning rank would only
        keep the peer it waits for off the CPU. A rank with TCP peers also has
        an I/O thread doing its socket work: count it, and do not yield-spin
        either (measured on 2 cores, 2 ranks over TCP: large broadcasts ~4.0
        GB/s sleeping at once, ~2.9 yielding, ~3.3 spinning)."""
        if os.environ.get("RINGCOMM_SPIN_US"):
            return
        local = sum(1 for i in infos if i["host"] == mine["host"])
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        if local * (2 if uses_tcp else 1) > cores:
            yield_us = 0.0 if uses_tcp and not os.environ.get("RINGCOMM_YIELD_US") else config.yield_us
            native.set_wait(0.0, yield_us)

    @staticmethod
    def _check_peers(rank, mine, infos):
        for r, other in enumerate(infos):
            if other["host"] != mine["host"] and mine["transport"] == "shm":
                raise RingcommError(
                    f"ringcomm: rank {r} runs on host {other['host']!r}, rank {rank} on {mine['host']!r}, "
                    "but the transport is shm (shared memory, one host only): use RINGCOMM_TRANSPORT=auto "
                    "or tcp"
                )
            for key in ("slot_bytes", "nslots", "ranks", "transport"):
                if other[key] != mine[key]:
                    raise ValueError(
                        f"ringcomm: ranks disagree on {key}: rank {r} has {other[key]!r}, "
                        f"rank {rank} has {mine[key]!r}"
                    )

    # -- facts ----------------------------------------------------------------
    @property
    def rank(self):
        return self._rank

    @property
    def world_size(self):
        return self._world_size

    @property
    def pull_enabled(self):
        """Whether large messages move by single-copy pulls (cross-memory attach)."""
        return self._native.pull_enabled

    @property
    def transports(self):
        """How this rank reaches each rank: "shm", "tcp" ("self" for itself)."""
        native = self._c()
        return [native.transport_of(r) for r in range(native.world_size)]

    @property
    def timeout(self):
        """Seconds any blocking wait of this communicator may take."""
        return self._config.timeout_s

    def __repr__(self):
        state = "closed" if self._native is None or self._native.closed else "open"
        return f"<ringcomm.Communicator rank {self.rank} of {self.world_size}, {state}>"

    # -- plumbing -------------------------------------------------------------
    def _c(self):
        if self._native is None:
            raise RingcommError("ringcomm: the communicator is closed")
        return self._native

    def _track(self, native_work, *buffers):
        if native_work is None:
            return None
        if self._inflight:
            self._inflight = [w for w in self._inflight if not w.is_completed()]
        work = Work(native_work, buffers)
        self._inflight.append(work)
        return work

    # -- collectives ----------------------------------------------------------
    # Every collective takes numpy arrays and CPU tensors (the shared-memory / TCP
    # path) or CUDA tensors and arrays (the GPU path, ringcomm/cuda.py: `stream=`
    # orders the call after that stream's work, default the framework's current
    # stream; `algo=` picks "nccl" or "ring" for that call). The native CPU call
    # tells a GPU buffer apart by raising DeviceBufferError, so CPU calls pay
    # nothing for the GPU path.

    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False, stream=None, algo=None):
        """Reduces `tensor` across ranks, in place on every rank."""
        # The latency-critical call: no helper calls on the synchronous path.
        if stream is None and algo is None:
            native = self._native
            if native is None:
                self._c()
            try:
                w = native.all_reduce(tensor, _OP_VALUE.get(op) if type(op) is ReduceOp else op_value(op),
                                      async_op)
                return w if w is None else self._track(w, tensor)
            except _DeviceBuffer:
                pass
        return self._gpu().all_reduce(tensor, op_value(op), async_op, stream, algo)

    def reduce_scatter(self, output, input, op=ReduceOp.SUM, async_op=False, stream=None, algo=None):
        """output <- block `rank` of the reduction of every rank's input
        (input holds world_size * len(output) elements)."""
        if stream is None and algo is None:
            try:
                w = self._c().reduce_scatter(output, input, op_value(op), async_op)
                return w if w is None else self._track(w, output, input)
            except _DeviceBuffer:
                pass
        return self._gpu().reduce_scatter(output, input, op_value(op), async_op, stream, algo)

    def all_gather(self, output, input, async_op=False, stream=None, algo=None):
        """output <- every rank's input, in rank order (world_size * len(input))."""
        if stream is None and algo is None:
            try:
                w = self._c().all_gather(output, input, async_op)
                return w if w is None else self._track(w, output, input)
            except _DeviceBuffer:
                pass
        return self._gpu().all_gather(output, input, async_op, stream, algo)

    def broadcast(self, tensor, src=0, async_op=False, stream=None, algo=None):
        """tensor <- src's tensor, on every rank."""
        if stream is None and algo is None:
            try:
                w = self._c().broadcast(tensor, validate.index(src, "src", 0, self._world_size - 1), async_op)
                return w if w is None else self._track(w, tensor)
            except _DeviceBuffer:
                pass
        return self._gpu().broadcast(tensor, src, async_op, stream, algo)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False, stream=None, algo=None):
        """dst's tensor <- the reduction of every rank's tensor (others unchanged)."""
        if stream is None and algo is None:
            try:
                w = self._c().reduce(tensor, validate.index(dst, "dst", 0, self._world_size - 1), op_value(op), async_op)
                return w if w is None else self._track(w, tensor)
            except _DeviceBuffer:
                pass
        return self._gpu().reduce(tensor, dst, op_value(op), async_op, stream, algo)

    def scatter(self, output, input=None, src=0, async_op=False, stream=None, algo=None):
        """output <- block `rank` of src's input (input is only read on src)."""
        if stream is None and algo is None:
            try:
                w = self._c().scatter(output, input, validate.index(src, "src", 0, self._world_size - 1), async_op)
                return w if w is None else self._track(w, output, input)
            except _DeviceBuffer:
                pass
        return self._gpu().scatter(output, input, src, async_op, stream, algo)

    def gather(self, output, input, dst=0, async_op=False, stream=None, algo=None):
        """dst's output <- every rank's input in rank order (output only used on dst)."""
        if stream is None and algo is None:
            try:
                w = self._c().gather(output, input, validate.index(dst, "dst", 0, self._world_size - 1), async_op)
                return w if w is None else self._track(w, output, input)
            except _DeviceBuffer:
                pass
        return self._gpu().gather(output, input, dst, async_op, stream, algo)

    def all_to_all(self, output, input, async_op=False, stream=None, algo=None):
        """Block i of input goes to rank i; block j of output comes from rank j."""
        if stream is None and algo is None:
            try:
                w = self._c().all_to_all(output, input, async_op)
                return w if w is None else self._track(w, output, input)
            except _DeviceBuffer:
                pass
        return self._gpu().all_to_all(output, input, async_op, stream, algo)

    def send(self, tensor, dst, async_op=False, stream=None):
        """Sends tensor to rank dst (async_op=True: isend)."""
        if stream is None:
            try:
                w = self._c().send(tensor, validate.index(dst, "dst", 0, self._world_size - 1), async_op)
                return w if w is None else self._track(w, tensor)
            except _DeviceBuffer:
                pass
        return self._gpu().send(tensor, dst, async_op, stream, None)

    def recv(self, tensor, src, async_op=False, stream=None):
        """Receives into tensor from rank src (async_op=True: irecv)."""
        if stream is None:
            try:
                w = self._c().recv(tensor, validate.index(src, "src", 0, self._world_size - 1), async_op)
                return w if w is None else self._track(w, tensor)
            except _DeviceBuffer:
                pass
        return self._gpu().recv(tensor, src, async_op, stream, None)

    def _gpu(self):
        g = self._gpu_path
        if g is None:
            self._c()
            from ringcomm.cuda import GpuPath

            g = self._gpu_path = GpuPath(self)
        return g

    def sendrecv(self, send_tensor, dst, recv_tensor, src, stream=None):
        """Sends send_tensor to dst while receiving recv_tensor from src (both
        progress together, like a batch_isend_irecv of the two); returns when
        both are done (GPU buffers: one NCCL group, stream-ordered like the
        other GPU calls)."""
        if stream is None:
            try:
                self._c().sendrecv(send_tensor, validate.index(dst, "dst", 0, self._world_size - 1), recv_tensor,
                                   validate.index(src, "src", 0, self._world_size - 1))
                return
            except _DeviceBuffer:
                pass
        self._gpu().sendrecv(send_tensor, dst, recv_tensor, src, stream)

    def isend(self, tensor, dst):
        return self.send(tensor, dst, async_op=True)

    def irecv(self, tensor, src):
        return self.recv(tensor, src, async_op=True)

    def barrier(self, async_op=False):
        """Returns once every rank has entered the barrier."""
        w = self._c().barrier(async_op)
        return w if w is None else self._track(w)

    # -- groups and lifetime --------------------------------------------------
    def split(self, ranks):
        """A new communicator over `ranks` (called by every rank of this one).

        New rank i is old rank ranks[i]. Returns None on ranks not in the list.
        """
        self._c()
        ranks = validate.indices(ranks, "ranks")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"split: ranks {ranks} contain duplicates")
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"split: ranks {bad} are out of range for world size {self.world_size}")
        if not ranks:
            raise ValueError("split: ranks is empty")
        self._splits += 1
        prefix = f"{self._prefix}/split{self._splits}"
        if self.rank not in ranks:
            return None
        return Communicator(self._store, prefix, ranks.index(self.rank), len(ranks), self._config, ranks)

    def close(self):
        """Waits for issued operations, then releases the shared memory."""
        native, self._native = self._native, None
        gpu, self._gpu_path = self._gpu_path, None
        if gpu is not None:
            gpu.close()
        if native is not None:
            native.close()
        self._inflight = []

    def abort(self, reason="aborted by the user"):
        """Fails this communicator at once; peers waiting on it fail too."""
        if self._gpu_path is not None:
            self._gpu_path.abort(reason)
        if self._native is not None:
            self._native.abort(reason)

    def __copy__(self):
        return self  # a handle to shared native resources: copies share it

    def __deepcopy__(self, memo):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
