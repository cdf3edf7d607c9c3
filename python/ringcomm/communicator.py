"""Communicator: a group of ranks and one method per collective.

Ranks are communicator-local everywhere. Calls on one communicator run in the
order they were issued and all ranks must issue the same calls; with
async_op=True a call returns a Work at once and runs on the communicator's
worker thread.
"""
import os
import sys
import weakref

from ringcomm import _C, bootstrap, cost_model, recovery, validate
from ringcomm._C import DeviceBufferError as _DeviceBuffer
from ringcomm.errors import CollectiveMismatchError, RingcommError
from ringcomm.reduce_op import ReduceOp, op_value

from ringcomm import work as _work  # noqa: F401  (registers ringcomm.Work, what async calls return)

_OP_VALUE = {op: int(op) for op in ReduceOp}

# recv(src=ANY_SOURCE) (or src=None) takes a message from any rank.
ANY_SOURCE = _C.ANY_SOURCE


_TAG_MIN, _TAG_MAX = -(2**63), 2**63 - 1


def _plain_tag(tag):
    return type(tag) is int and _TAG_MIN <= tag <= _TAG_MAX


def _tag(tag):
    """A send/recv tag: any 64-bit signed integer (a plain int passes with one look)."""
    if _plain_tag(tag):
        return tag
    return validate.index(tag, "tag", _TAG_MIN, _TAG_MAX)


def plain_p2p_args(peer, tag):
    """Whether a send/recv's peer (None: any source) and tag reach the native
    call unchanged through send() and recv()'s checks (plain ints in range),
    so that a caller that checked this may call the native send/recv itself."""
    return (peer is None or validate.plain_rank(peer)) and _plain_tag(tag)


def _gpu_default_tag(tag, what):
    if tag != 0:
        raise ValueError(f"{what}: tags are not supported for GPU buffers (NCCL matches in issue order); "
                         f"got tag {tag}")


def _my_cpus():
    """The CPUs this process may run on (its affinity), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cores_contended(rank, infos, uses_tcp=False):
    """Whether the ranks of this host that compete for this rank's cores
    outnumber those cores. Competitors: the ranks whose CPU sets overlap this
    rank's, directly or through other ranks' (so every rank of such a group
    decides alike); a launcher that pins each rank to its own core (Intel
    MPI's mpiexec, mpirun --bind-to core) leaves every rank alone on its core,
    however many ranks the host runs. A rank with TCP peers counts twice (its
    I/O thread)."""
    mine = infos[rank]
    ranks, cpus = 1, set(mine["cpus"])
    rest = [i for r, i in enumerate(infos) if r != rank and i["host"] == mine["host"]]
    grew = True
    while grew:
        grew = False
        for i in list(rest):
            if cpus.intersection(i["cpus"]):
                ranks += 1
                cpus.update(i["cpus"])
                rest.remove(i)
                grew = True
    return ranks * (2 if uses_tcp else 1) > len(cpus)


# What each rank publishes in the store at init, checked like socket data
# (validate.record): a malformed record is a RingcommError naming its rank.
_CENSUS_SCHEMA = {
    "host": validate.text(1024),
    "pid": validate.integer(1, 2**63 - 1),
    "pidns": validate.integer(0, 2**64 - 1),
    "cpus": validate.list_of(validate.integer(0, 1 << 20), 1 << 16),
    "slot_bytes": validate.integer(64, 1 << 30),
    "nslots": validate.integer(3, 4096),
    "ranks": validate.optional(validate.list_of(validate.integer(0, 2**31 - 1), 1 << 24)),
    "transport": validate.one_of("auto", "shm", "tcp", "cuda_ipc"),
    "check_agreement": validate.boolean(),
    "autotune": validate.boolean(),
    "cost_model": validate.one_of("measure", "default", "file"),
    "cost_model_error": validate.optional(validate.text(1000)),
    "ring_order": validate.one_of("host", "rank"),
    "tcp": validate.optional(validate.pair(validate.text(255), validate.integer(1, 65535))),
    "secret": validate.optional(validate.hex_text(32)),
}
_SPLIT_SCHEMA = {
    "ranks": validate.optional(validate.list_of(validate.integer(0, 2**31 - 1), 1 << 24)),
    "error": validate.optional(validate.text(1000)),
}
_SEGMENT_SCHEMA = {"segment": validate.text(128, pattern=r"/ringcomm-[0-9]+-[0-9]+-[0-9a-f]{32}")}

_EXPLAINABLE = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "scatter", "gather",
                "all_to_all", "barrier")

# Every open communicator, for the exit handler (collectives.py).
_live = weakref.WeakSet()


def _job_name(job):
    if not isinstance(job, str) or not job or len(job) > 200 or "/" in job or not job.isprintable():
        raise ValueError(f"job must be a non-empty printable name of at most 200 characters without '/', got {job!r}")
    return job


def _alive_from(gone, rank, world_size):
    """An `alive` callback for bootstrap.wait_keys from gone(r) (None: none)."""
    if gone is None:
        return None

    def alive(missing):
        for r in range(world_size):
            if r != rank and missing(r):
                why = gone(r)
                if why:
                    raise RingcommError(f"ringcomm: rank {r} is gone ({why}); rank {rank} gives up joining")

    return alive


class Communicator:
    def __init__(self, store, prefix, rank, world_size, config, ranks=None, cost_params=None, gone=None):
        """Joins the communicator named `prefix` in `store` (all ranks call it).
        `cost_params`: the cost model's parameters, agreed already (a split
        inherits its parent's); else as config.cost_model says. `gone(r)`:
        why rank r is known to be gone, or "" (shrink passes what its parent
        knows, so that a member that dies before it joins is noticed at once)."""
        self._rank, self._world_size = rank, world_size  # still known once closed
        self._store = store
        self._prefix = prefix
        self._config = config
        self._splits = 0
        self._agreements = 0  # agree() calls (each has its own keys in the store)
        self._shrinks = 0  # shrink attempts (each builds under its own prefix)
        self._grows = 0  # grow() calls that admitted someone
        self._found_dead = {}  # rank -> why, as agreements found them
        self._census = None  # every rank's census record (host, pid): liveness evidence for agree()
        self._waiting = "spin"  # how waiting ranks wait (_tune_waiting)
        self._ranks = ranks  # the ranks of the communicator this one was split / shrunk from
        self._parent_ranks = None  # shrink(): the parent's rank of each rank
        self._native = None
        self._gpu_path = None
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
        native = _C.Communicator(rank, world_size, config)
        mode = config.cost_model if config.cost_model in ("measure", "default") else "file"
        given, given_error = None, None
        if cost_params is None and mode == "file" and rank == 0:
            try:
                given = cost_model.load(config.cost_model)
            except ValueError as e:
                given_error = str(e)[:1000]
        known_segments = []  # local peers' segment names: removed by survivors if init fails
        try:
            # 1. Census: who runs where. Segments are sized after it, for the
            # peers actually on this host (never for the world size).
            info = {
                "host": bootstrap.host_identity(),
                "pid": os.getpid(),
                "pidns": bootstrap.pid_namespace(),
                "cpus": _my_cpus(),
                "slot_bytes": config.slot_bytes,
                "nslots": config.nslots,
                "ranks": ranks,
                "transport": config.transport,
                "check_agreement": config.check_agreement,
                "autotune": config.autotune,
                "cost_model": mode,
                "cost_model_error": given_error,
                "ring_order": config.ring_order,
            }
            if config.transport != "shm" and world_size > 1:
                # Who is on another host is only known after the exchange, so
                # every rank listens (and rank 0 draws the secret) up front.
                addr = bootstrap.socket_address(store)
                info["tcp"] = [addr, native.listen_tcp(addr)]
                if rank == 0:
                    info["secret"] = bootstrap.draw_secret()
            infos = bootstrap.exchange(store, prefix, rank, world_size, info, config.timeout_s,
                                       schema=_CENSUS_SCHEMA, alive=_alive_from(gone, rank, world_size))
            self._check_peers(rank, info, infos)
            self._census = infos
            if infos[0]["cost_model_error"] is not None:
                raise ValueError(f"ringcomm: RINGCOMM_COST_MODEL on rank 0: {infos[0]['cost_model_error']}")
            if "tcp" in info and "secret" not in infos[0]:
                raise RingcommError("ringcomm: rank 0's record in the store has no TCP secret")
            tcp = [r != rank and "tcp" in info and (config.transport == "tcp" or i["host"] != info["host"])
                   for r, i in enumerate(infos)]
            if any(tcp[r] and infos[r].get("tcp") is None for r in range(world_size)):
                bad = [r for r in range(world_size) if tcp[r] and infos[r].get("tcp") is None]
                raise RingcommError(f"ringcomm: rank(s) {bad} published no TCP address but must be reached over TCP")
            local = [r for r in range(world_size) if not tcp[r]]
            labels = self.host_labels(infos)
            if config.ring_order == "host":
                native.set_ring_order(self.host_contiguous_order(infos))
            native.set_topology(labels)
            alive = bootstrap.liveness_check(rank, infos, local)
            # 2. Shared memory among the ranks of this host.
            name = native.create_segment(local)
            names = [""] * world_size
            if len(local) > 1:
                got = bootstrap.exchange(store, f"{prefix}/shm", rank, world_size, {"segment": name},
                                         config.timeout_s, schema=_SEGMENT_SCHEMA, alive=alive, members=local)
                for r, rec in got.items():
                    if r != rank:
                        names[r] = rec["segment"]
                        known_segments.append(rec["segment"])
                native.connect(names)
                # Once every local peer has mapped this segment its name can
                # go: a crash after this point leaves nothing in /dev/shm.
                bootstrap.barrier(store, prefix, "mapped", rank, world_size, config.timeout_s,
                                  members=local, alive=alive)
                native.unlink_segment()
            else:
                native.connect(names)
            # 3. TCP to the ranks of other hosts.
            if "tcp" in info:
                native.connect_tcp([infos[r]["tcp"][0] if tcp[r] else "" for r in range(world_size)],
                                   [infos[r]["tcp"][1] if tcp[r] else 0 for r in range(world_size)],
                                   bytes.fromhex(infos[0]["secret"]))
            native.finish_init()
            # Single-copy pull schedules need every rank able to read every
            # peer's memory; all ranks must agree, or their schedules differ.
            can_pull = config.pull and native.probe_pull()
            pulls = bootstrap.exchange(store, f"{prefix}/pull", rank, world_size, can_pull, config.timeout_s,
                                       alive=_alive_from(lambda r: (gone and gone(r)) or native.peer_gone(r),
                                                         rank, world_size))
            native.set_pull(all(p is True for p in pulls))
            # 4. The cost model's parameters, the same on every rank.
            if cost_params is not None:
                native.set_cost_params(cost_model.for_topology(cost_params, world_size, labels))
            else:
                cost_model.agree(native, store, f"{prefix}/cost", rank, world_size, mode, given, labels,
                                 config.timeout_s)
            self._waiting = self._tune_waiting(native, rank, infos, config, any(tcp))
        except BaseException:
            # A peer that died during init cannot unlink its own segment.
            native.unlink_segment()
            for n in known_segments:
                _C.unlink_segment_name(n)
            _C.sweep_segments()
            native.close()
            raise
        self._native = native
        _live.add(self)

    @staticmethod
    def host_contiguous_order(infos):
        """The ring's order: hosts in the order of their lowest rank, the ranks of
        each host next to each other in rank order. Rings and chains then cross
        the network once per host boundary whatever the placement (ranks 0, 2
        on one host and 1, 3 on another: 0 2 1 3, two network hops, not four).
        Every rank computes the same order from the census."""
        return [r for members in cost_model.ranks_by_host(Communicator.host_labels(infos)) for r in members]

    @staticmethod
    def host_labels(infos):
        """Each rank's host as a number (equal: same host), for the topology."""
        index = {}
        return [index.setdefault(info["host"], len(index)) for info in infos]

    @staticmethod
    def _tune_waiting(native, rank, infos, config, uses_tcp=False):
        """No busy spinning when the ranks that may run on this rank's cores
        outnumber those cores (unless RINGCOMM_SPIN_US says otherwise): a
        spinning rank would only keep the peer it waits for off the CPU. A rank
        with TCP peers also has an I/O thread doing its socket work: count it,
        and do not yield-spin either (measured on 2 cores, 2 ranks over TCP:
        large broadcasts ~4.0 GB/s sleeping at once, ~2.9 yielding, ~3.3
        spinning). Returns the wait chosen: "spin" (the configured policy),
        "yield" or "sleep"."""
        if os.environ.get("RINGCOMM_SPIN_US"):
            return "spin" if config.spin_us > 0 else "yield"
        if not cores_contended(rank, infos, uses_tcp):
            return "spin"
        yield_us = 0.0 if uses_tcp and not os.environ.get("RINGCOMM_YIELD_US") else config.yield_us
        native.set_wait(0.0, yield_us)
        return "yield" if yield_us > 0 else "sleep"

    @staticmethod
    def _check_peers(rank, mine, infos):
        for r, other in enumerate(infos):
            if other["host"] != mine["host"] and mine["transport"] == "shm":
                raise RingcommError(
                    f"ringcomm: rank {r} runs on host {other['host']!r}, rank {rank} on {mine['host']!r}, "
                    "but the transport is shm (shared memory, one host only): use RINGCOMM_TRANSPORT=auto "
                    "or tcp"
                )
            for key in ("slot_bytes", "nslots", "ranks", "transport", "check_agreement", "autotune", "cost_model",
                        "ring_order"):
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
    def ring_order(self):
        """The ranks in the order ring and chain schedules visit them (host-contiguous)."""
        return list(self._c().ring_order)

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
                return native.all_reduce(tensor, _OP_VALUE.get(op) if type(op) is ReduceOp else op_value(op),
                                         async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().all_reduce(tensor, op_value(op), async_op, stream, algo)

    def reduce_scatter(self, output, input, op=ReduceOp.SUM, async_op=False, stream=None, algo=None):
        """output <- block `rank` of the reduction of every rank's input
        (input holds world_size * len(output) elements)."""
        if stream is None and algo is None:
            try:
                return self._c().reduce_scatter(output, input, op_value(op), async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().reduce_scatter(output, input, op_value(op), async_op, stream, algo)

    def all_gather(self, output, input, async_op=False, stream=None, algo=None):
        """output <- every rank's input, in rank order (world_size * len(input))."""
        if stream is None and algo is None:
            try:
                return self._c().all_gather(output, input, async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().all_gather(output, input, async_op, stream, algo)

    def broadcast(self, tensor, src=0, async_op=False, stream=None, algo=None):
        """tensor <- src's tensor, on every rank."""
        if stream is None and algo is None:
            try:
                return self._c().broadcast(tensor, validate.rank_arg(src, "src"), async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().broadcast(tensor, src, async_op, stream, algo)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False, stream=None, algo=None):
        """dst's tensor <- the reduction of every rank's tensor (others unchanged)."""
        if stream is None and algo is None:
            try:
                return self._c().reduce(tensor, validate.rank_arg(dst, "dst"), op_value(op), async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().reduce(tensor, dst, op_value(op), async_op, stream, algo)

    def scatter(self, output, input=None, src=0, async_op=False, stream=None, algo=None):
        """output <- block `rank` of src's input (input is only read on src)."""
        if stream is None and algo is None:
            try:
                return self._c().scatter(output, input, validate.rank_arg(src, "src"), async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().scatter(output, input, src, async_op, stream, algo)

    def gather(self, output, input, dst=0, async_op=False, stream=None, algo=None):
        """dst's output <- every rank's input in rank order (output only used on dst)."""
        if stream is None and algo is None:
            try:
                return self._c().gather(output, input, validate.rank_arg(dst, "dst"), async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().gather(output, input, dst, async_op, stream, algo)

    def all_to_all(self, output, input, async_op=False, stream=None, algo=None):
        """Block i of input goes to rank i; block j of output comes from rank j."""
        if stream is None and algo is None:
            try:
                return self._c().all_to_all(output, input, async_op)
            except _DeviceBuffer:
                pass
        return self._gpu().all_to_all(output, input, async_op, stream, algo)

    def send(self, tensor, dst, async_op=False, stream=None, tag=0):
        """Sends tensor to rank dst (async_op=True: isend). The receiver's
        recv with the same tag (or any recv from any source with that tag)
        takes it; messages of one tag arrive in the order they were sent."""
        tag = _tag(tag)
        if stream is None:
            try:
                return self._c().send(tensor, validate.rank_arg(dst, "dst"), tag, async_op)
            except _DeviceBuffer:
                pass
        _gpu_default_tag(tag, "send")
        return self._gpu().send(tensor, dst, async_op, stream, None)

    def recv(self, tensor, src=None, async_op=False, stream=None, tag=0):
        """Receives into tensor the oldest message from rank src with `tag`
        (src None or ringcomm.ANY_SOURCE: from any rank). Returns the rank the
        message came from; with async_op=True (irecv) a Work whose
        source_rank() says it once complete."""
        tag = _tag(tag)
        src = ANY_SOURCE if src is None else validate.rank_arg(src, "src")
        if stream is None:
            try:
                return self._c().recv(tensor, src, tag, async_op)
            except _DeviceBuffer:
                pass
        _gpu_default_tag(tag, "recv")
        if src == ANY_SOURCE:
            raise ValueError("recv from any source: not supported for GPU buffers; pass src")
        w = self._gpu().recv(tensor, src, async_op, stream, None)
        return src if w is None else w

    def gpu_transport(self, device):
        """What this communicator's calls on CUDA device `device` run over: "nccl" or
        "cuda_ipc" (ringcomm/cuda_ipc.py pick_gpu_transport: ranks sharing a GPU, or
        transport="cuda_ipc"); None before its first call on that device."""
        return None if self._gpu_path is None else self._gpu_path.transport(device)

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
                self._c().sendrecv(send_tensor, validate.rank_arg(dst, "dst"), recv_tensor,
                                   validate.rank_arg(src, "src"))
                return
            except _DeviceBuffer:
                pass
        self._gpu().sendrecv(send_tensor, dst, recv_tensor, src, stream)

    def isend(self, tensor, dst, tag=0):
        return self.send(tensor, dst, async_op=True, tag=tag)

    def irecv(self, tensor, src=None, tag=0):
        return self.recv(tensor, src, async_op=True, tag=tag)

    def barrier(self, async_op=False):
        """Returns once every rank has entered the barrier."""
        return self._c().barrier(async_op)

    # -- groups and lifetime --------------------------------------------------
    def split(self, ranks):
        """A new communicator over `ranks` (called by every rank of this one).

        New rank i is old rank ranks[i]. Returns None on ranks not in the list.
        Every rank must pass the same list: the ranks compare their lists
        (through the store) and all raise CollectiveMismatchError if they
        differ, before any returns.
        """
        self._c()
        problem = None
        try:
            ranks = validate.indices(ranks, "ranks")
            if not ranks:
                raise ValueError("split: ranks is empty")
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"split: ranks {ranks} contain duplicates")
            bad = [r for r in ranks if not 0 <= r < self.world_size]
            if bad:
                raise ValueError(f"split: ranks {bad} are out of range for world size {self.world_size}")
        except (TypeError, ValueError) as e:
            problem = e
        self._splits += 1
        prefix = f"{self._prefix}/split{self._splits}"
        asked = None if problem is not None else ranks
        mine = {"ranks": asked, "error": None if problem is None else str(problem)[:500]}
        got = bootstrap.exchange(self._store, f"{prefix}/ask", self.rank, self.world_size, mine,
                                 self._config.timeout_s, schema=_SPLIT_SCHEMA)
        if problem is not None:
            raise problem
        differ = [r for r, g in enumerate(got) if g["ranks"] != asked]
        if differ:
            def said(r):
                g = got[r]
                return f"ranks {g['ranks']}" if g["ranks"] is not None else f"an invalid list ({g['error']})"
            others = "; ".join(f"rank {r} asked for {said(r)}" for r in differ[:8])
            raise CollectiveMismatchError(
                f"ringcomm: split (split #{self._splits} of this communicator) disagreement: rank {self.rank} "
                f"asked for ranks {asked}, but {others}; every rank must pass the same list"
            )
        if self.rank not in ranks:
            return None
        return Communicator(self._store, prefix, ranks.index(self.rank), len(ranks), self._config, ranks,
                            cost_params=self._c().cost_params())

    # -- the cost model -------------------------------------------------------
    def explain(self, op, nbytes, device="cpu"):
        """Every algorithm `op` could run here for `nbytes` (the size
        nccl-tests reports: the buffer of all_reduce, broadcast and reduce,
        all ranks' data for reduce_scatter, all_gather, scatter, gather and
        all_to_all) as (name, predicted seconds) pairs: what the call would
        run first (picked by the model, or forced by RINGCOMM_ALGO / algo=),
        then the others, fastest first. NaN: not modelled (pull, and every
        GPU candidate: no GPU link is measured).

        device: "cpu" (this communicator's CPU calls, its cost model), or
        "nccl" / "cuda_ipc" (a float32 SUM call on GPU buffers over that
        transport, under RINGCOMM_GPU_ALGO / RINGCOMM_IPC_ALGO and the IPC
        thresholds): one chooser decides for every device
        (csrc/comm/chooser.h)."""
        op = validate.choice(op, "op", _EXPLAINABLE)
        nbytes = validate.index(nbytes, "nbytes", lo=0, hi=(1 << 63) - 1)
        device = validate.choice(device, "device", ("cpu", "nccl", "cuda_ipc"))
        if device == "cpu":
            return [(name, float(t)) for name, t in self._c().explain(op, nbytes)]
        if op == "barrier":
            raise ValueError("barrier on GPU buffers: there is none (barrier is a CPU call)")
        float32 = 2
        if device == "nccl":
            configured = os.environ.get("RINGCOMM_GPU_ALGO", "auto") or "auto"
            return [(n, float(t)) for n, t in _C.explain_algo("nccl", op, nbytes, float32, configured=configured)]
        from ringcomm import cuda_ipc

        s = cuda_ipc.settings(None)
        configured = os.environ.get("RINGCOMM_IPC_ALGO", "auto") or "auto"
        return [(n, float(t)) for n, t in _C.explain_algo("cuda_ipc", op, nbytes, float32, configured=configured,
                                                          one_shot_max=s["one_shot_max"],
                                                          two_shot_max=s["two_shot_max"],
                                                          stage_bytes=s["stage_bytes"])]

    def tuning(self):
        """What `auto`'s tuner (RINGCOMM_AUTOTUNE) stands at, per call signature
        it has seen: dicts of op, nbytes (as explain() counts them), state
        ("model": the model's pick, its calls within 1.3x of the prediction;
        "exploring"; "tuned": the fastest measured, kept), runs (the family
        the next call runs), model_pick and predicted_s (the model's),
        kept_s (tuned: the ranks' agreed median time it was kept with),
        explorations and measured (the last exploration: (family, agreed
        median seconds) per candidate). The same on every rank. Empty when
        the tuner is off, at world size 1, or for ops forced by RINGCOMM_ALGO."""
        return list(self._c().tuning())

    def cost_params(self):
        """The cost model's parameters (the same on every rank) and where they came from."""
        return self._c().cost_params()

    def set_cost_params(self, params):
        """Plans with `params` (as cost_params() returns them, or a file's) from
        now on; every rank must pass the same (a fit of another topology is
        left out, as from a file). Returns them as the model holds them."""
        params = cost_model.check_params(params, "set_cost_params")
        self._c().set_cost_params(cost_model.for_topology(params, self.world_size, self.host_of()))
        return self.cost_params()

    def recalibrate(self):
        """Measures the cost model's parameters again (a call of every rank, as
        at init) and uses them; returns them."""
        self._calibrations = getattr(self, "_calibrations", 0) + 1
        return cost_model.agree(self._c(), self._store, f"{self._prefix}/cost/again{self._calibrations}", self.rank,
                                self.world_size, "measure", None, self.host_of(), self._config.timeout_s)

    # -- the plan cache -------------------------------------------------------
    def plan_cache_stats(self):
        """How this rank's CPU calls were planned (csrc/comm/plan_cache.h): a dict
        with 'hits' (a kept plan run as it stands on the call's buffers),
        'misses' (planned and kept), 'uncached' (planned, never kept: plans
        over the step budget), 'evictions', 'entries' and 'steps' (held now)
        and 'capacity' (RINGCOMM_PLAN_CACHE; 0: off). Every collective and
        barrier is counted; send/recv and the GPU path plan nothing here."""
        return dict(self._c().plan_cache_stats())

    def host_of(self):
        """Each rank's host, numbered 0.. in the order of its lowest rank."""
        return list(self._c().host_of())

    def in_flight(self):
        """The operations issued and not finished yet, oldest first ("all_reduce (seq 4)")."""
        native = self._native
        return [] if native is None else list(native.in_flight())

    def close(self):
        """Releases the communicator; idempotent and safe from any thread.

        Asynchronous operations nobody waits for are completed first (bounded
        by the timeout). A call that another thread is running or waiting for
        right now is aborted instead: it raises RingcommError at once, and
        the peers fail too (they would wait for this rank otherwise). Peers
        still waiting for this rank after a clean close raise at once, naming it.
        """
        native, self._native = self._native, None
        _live.discard(self)
        gpu, self._gpu_path = self._gpu_path, None
        if gpu is not None:
            gpu.close()
        if native is not None:
            native.close()
        _C._sweep_works()  # the buffers of dropped Works, now completed or failed

    # -- fault recovery (ringcomm/recovery.py) --------------------------------
    def revoke(self, reason=""):
        """Revokes the communicator, from any rank and any thread: every rank's
        calls in flight on it and later raise ringcomm.RevokedError within
        milliseconds. agree() and shrink() still work on it."""
        if not isinstance(reason, str):
            raise TypeError(f"revoke: reason must be a str, got {type(reason).__name__}")
        if self._gpu_path is not None:
            self._gpu_path.abort(f"revoked: {reason}" if reason else "revoked")
        native = self._native
        if native is None:
            raise RingcommError("ringcomm: revoke: the communicator is closed")
        native.revoke(reason)

    def agree(self, flag=True, timeout=None):
        """Fault-tolerant agreement among the live ranks (every live rank calls
        it; it works on a revoked or failed communicator). Returns (the AND
        of every live rank's flag, the sorted ranks found gone): the same on
        every survivor, also when a rank dies while it runs. A bool flag gives
        a bool; an int flag (0 .. 2**63 - 1) the bitwise AND. A rank that is
        merely slow is waited for, up to `timeout` (default: the
        communicator's), then counted as gone."""
        if isinstance(flag, bool):
            value = int(flag)
        else:
            value = validate.index(flag, "flag", lo=0, hi=(1 << 63) - 1)
        timeout_s = self._config.timeout_s if timeout is None else validate.timeout_seconds(timeout)
        self._agreements += 1
        liveness = recovery.Liveness(self._native, self._census, self.rank, self._found_dead)
        votes, dead = recovery.agree(self._store, f"{self._prefix}/agree{self._agreements}", self.rank,
                                     range(self.world_size), str(value), liveness, timeout_s,
                                     parse=recovery.flag_vote)
        self._found_dead.update(dead)
        result = (1 << 63) - 1
        for v in votes.values():
            result &= v
        return (bool(result) if isinstance(flag, bool) else result), sorted(dead)

    def shrink(self, exclude=None, timeout=None):
        """A new communicator of the survivors, called by the survivors only
        (it works on a revoked or failed communicator, and on a shrunk one).
        `exclude`: ranks to leave out (every survivor passes the same list;
        default none); ranks found gone are left out too. New rank i is this
        communicator's rank parent_ranks[i] (contiguous, in the old order).
        This communicator is revoked (calls in flight on it raise
        RevokedError), never waited on; close it when done with it."""
        if exclude is not None:
            exclude = validate.indices(exclude, "exclude")
            bad = [r for r in exclude if not 0 <= r < self.world_size]
            if bad:
                raise ValueError(f"shrink: exclude ranks {bad} are out of range for world size {self.world_size}")
        timeout_s = self._config.timeout_s if timeout is None else validate.timeout_seconds(timeout)
        return recovery.shrink(self, exclude, timeout_s)

    def grow(self, count=None, job="default", timeout=None, token=None):
        """Admits processes waiting in ringcomm.init(join=job): called by every
        rank of this (healthy) communicator at the same point, e.g. a step
        boundary. Returns the grown communicator (this one's ranks keep their
        numbers; joiners get the next ones, in arrival order), or this one
        when nobody waits. `count`: admit at most this many (default: all
        waiting). `token` (or RINGCOMM_JOIN_TOKEN): admit only joiners that
        prove they hold it (an HMAC answer to a random challenge; the token
        never enters the store); the others are refused, and the members go
        on. This communicator stays open: close it once done with it."""
        if count is not None:
            count = validate.index(count, "count", lo=1)
        job = _job_name(job)
        timeout_s = self._config.timeout_s if timeout is None else validate.timeout_seconds(timeout)
        return recovery.grow(self, count, job, timeout_s, recovery.join_token(token))

    @property
    def parent_ranks(self):
        """For a communicator shrink() returned: the parent's rank of each of
        its ranks (None otherwise)."""
        return None if self._parent_ranks is None else list(self._parent_ranks)

    def abort(self, reason="aborted by the user"):
        """Fails this communicator at once; a call blocked in another thread
        raises within milliseconds, and peers waiting on it fail too."""
        if self._gpu_path is not None:
            self._gpu_path.abort(reason)
        native = self._native
        if native is not None:
            native.abort(str(reason))

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
