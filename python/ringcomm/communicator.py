"""Communicator: a group of ranks and one method per collective.

Ranks are communicator-local everywhere. Calls on one communicator run in the
order they were issued and all ranks must issue the same calls; with
async_op=True a call returns a Work at once and runs on the communicator's
worker thread.
"""
from ringcomm import _C, bootstrap
from ringcomm.errors import RingcommError
from ringcomm.reduce_op import ReduceOp, op_value
from ringcomm.work import Work


class Communicator:
    def __init__(self, store, prefix, rank, world_size, config, ranks=None):
        """Joins the communicator named `prefix` in `store` (all ranks call it)."""
        self._store = store
        self._prefix = prefix
        self._config = config
        self._splits = 0
        self._inflight = []
        self._native = None
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
            }
            infos = bootstrap.exchange(store, prefix, rank, world_size, info, config.timeout_s)
            self._check_peers(rank, info, infos)
            native.connect([i["segment"] if r != rank else "" for r, i in enumerate(infos)])
            # Once every peer has mapped every segment the names can go: a
            # crash after this point leaves nothing behind in /dev/shm.
            bootstrap.barrier(store, prefix, "mapped", rank, world_size, config.timeout_s)
            native.unlink_segment()
        except BaseException:
            native.close()
            raise
        self._native = native

    @staticmethod
    def _check_peers(rank, mine, infos):
        for r, other in enumerate(infos):
            if other["host"] != mine["host"]:
                raise RingcommError(
                    f"ringcomm: rank {r} runs on host {other['host']!r}, rank {rank} on {mine['host']!r}: "
                    "this build connects ranks of one host only (shared memory); the TCP transport "
                    "for several hosts is not available yet"
                )
            for key in ("slot_bytes", "nslots", "ranks"):
                if other[key] != mine[key]:
                    raise ValueError(
                        f"ringcomm: ranks disagree on {key}: rank {r} has {other[key]!r}, "
                        f"rank {rank} has {mine[key]!r}"
                    )

    # -- facts ----------------------------------------------------------------
    @property
    def rank(self):
        return self._native.rank

    @property
    def world_size(self):
        return self._native.world_size

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
    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        """Reduces `tensor` across ranks, in place on every rank."""
        return self._track(self._c().all_reduce(tensor, op_value(op), async_op), tensor)

    def reduce_scatter(self, output, input, op=ReduceOp.SUM, async_op=False):
        """output <- block `rank` of the reduction of every rank's input
        (input holds world_size * len(output) elements)."""
        return self._track(self._c().reduce_scatter(output, input, op_value(op), async_op), output, input)

    def all_gather(self, output, input, async_op=False):
        """output <- every rank's input, in rank order (world_size * len(input))."""
        return self._track(self._c().all_gather(output, input, async_op), output, input)

    def broadcast(self, tensor, src=0, async_op=False):
        """tensor <- src's tensor, on every rank."""
        return self._track(self._c().broadcast(tensor, int(src), async_op), tensor)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        """dst's tensor <- the reduction of every rank's tensor (others unchanged)."""
        return self._track(self._c().reduce(tensor, int(dst), op_value(op), async_op), tensor)

    def scatter(self, output, input=None, src=0, async_op=False):
        """output <- block `rank` of src's input (input is only read on src)."""
        return self._track(self._c().scatter(output, input, int(src), async_op), output, input)

    def gather(self, output, input, dst=0, async_op=False):
        """dst's output <- every rank's input in rank order (output only used on dst)."""
        return self._track(self._c().gather(output, input, int(dst), async_op), output, input)

    def all_to_all(self, output, input, async_op=False):
        """Block i of input goes to rank i; block j of output comes from rank j."""
        return self._track(self._c().all_to_all(output, input, async_op), output, input)

    def send(self, tensor, dst, async_op=False):
        """Sends tensor to rank dst (async_op=True: isend)."""
        return self._track(self._c().send(tensor, int(dst), async_op), tensor)

    def recv(self, tensor, src, async_op=False):
        """Receives into tensor from rank src (async_op=True: irecv)."""
        return self._track(self._c().recv(tensor, int(src), async_op), tensor)

    def isend(self, tensor, dst):
        return self.send(tensor, dst, async_op=True)

    def irecv(self, tensor, src):
        return self.recv(tensor, src, async_op=True)

    def barrier(self, async_op=False):
        """Returns once every rank has entered the barrier."""
        return self._track(self._c().barrier(async_op))

    # -- groups and lifetime --------------------------------------------------
    def split(self, ranks):
        """A new communicator over `ranks` (called by every rank of this one).

        New rank i is old rank ranks[i]. Returns None on ranks not in the list.
        """
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"split: ranks {ranks} contain duplicates")
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"split: ranks {bad} are out of range for world size {self.world_size}")
        if not ranks:
            raise ValueError("split: ranks is empty")
        self._c()
        self._splits += 1
        prefix = f"{self._prefix}/split{self._splits}"
        if self.rank not in ranks:
            return None
        return Communicator(self._store, prefix, ranks.index(self.rank), len(ranks), self._config, ranks)

    def close(self):
        """Waits for issued operations, then releases the shared memory."""
        native, self._native = self._native, None
        if native is not None:
            native.close()
        self._inflight = []

    def abort(self, reason="aborted by the user"):
        """Fails this communicator at once; peers waiting on it fail too."""
        if self._native is not None:
            self._native.abort(reason)

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
