"""Module-level API: init() / finalize() and one function per collective,
using the communicator from init() unless `comm=` is given (torch.distributed
style)."""
import atexit
import sys
import time

from ringcomm import bootstrap, validate
from ringcomm.communicator import Communicator
from ringcomm.config import make_config
from ringcomm.errors import RingcommError
from ringcomm.reduce_op import ReduceOp

_default = None
_generation = 0
# The native core counts ranks in a C int.
MAX_WORLD_SIZE = (1 << 31) - 1


def init(rank=None, world_size=None, store=None, timeout=None, *, algo=None, transport=None, join=None,
         token=None):
    """Creates a communicator over all ranks and makes it the default.

    Every keyword is optional: rank and world_size come from RANK and
    WORLD_SIZE, the store from MASTER_ADDR / MASTER_PORT (a TCPStore, exactly
    as torchrun sets them up), timeout (seconds or timedelta) from
    RINGCOMM_TIMEOUT (default 300 s). `store` may be any torch.distributed
    Store (or any object with set, get, wait and check). `algo` (or
    RINGCOMM_ALGO) forces algorithms: one name for every op that has it
    (ring, oneshot, recursive_doubling, tree, pull) or "op:name,..." per op.
    `transport` (or RINGCOMM_TRANSPORT): "auto" uses shared memory between
    ranks of one host and TCP between hosts; "tcp" uses TCP for every peer;
    "shm" refuses ranks on other hosts; "cuda_ipc" sends GPU buffers over CUDA
    IPC among the ranks of one host (also ranks sharing one GPU, which NCCL
    refuses; under "auto" such ranks get cuda_ipc by themselves), CPU buffers
    as "auto". Bad arguments (and environment
    settings) raise TypeError / ValueError naming them before anything is
    sent.

    `join` (a job name, e.g. "default"): this process is a replacement that
    joins a running communicator instead: it waits (up to the timeout) until
    the members call comm.grow(job=join), and gets its rank and world size
    from them (rank and world_size must be left out). `store` is the
    members' store (or the one MASTER_ADDR / MASTER_PORT name); `token` (or
    RINGCOMM_JOIN_TOKEN) answers the members' challenge when they grow with one.
    """
    global _default, _generation
    config = make_config(timeout, algo, transport)
    if join is not None:
        from ringcomm import recovery
        from ringcomm.communicator import _job_name

        if rank is not None or world_size is not None:
            raise ValueError("init(join=...): leave rank and world_size out; the members assign them")
        job = _job_name(join)
        if store is not None:
            validate.store(store)
        else:
            store = bootstrap.store_from_env(1, 2, config.timeout_s)  # a client of the members' store
        comm = recovery.join(store, job, config, config.timeout_s, recovery.join_token(token))
        _default = comm
        return comm
    rank = bootstrap.env_int("RANK") if rank is None else validate.index(rank, "rank")
    world_size = bootstrap.env_int("WORLD_SIZE") if world_size is None else validate.index(world_size, "world_size")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be at most {MAX_WORLD_SIZE}, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}")
    if store is not None:
        validate.store(store)
    if store is None:
        store = bootstrap.store_from_env(rank, world_size, config.timeout_s)
    _generation += 1
    comm = Communicator(store, f"ringcomm/{bootstrap.attempt()}{_generation}", rank, world_size, config)
    _default = comm
    return comm


def get_default():
    """The communicator from the last init() (RingcommError if none)."""
    if _default is None or _default._native is None:
        raise RingcommError("ringcomm: no communicator: call ringcomm.init() first (or pass comm=)")
    return _default


def explain(op, nbytes, comm=None):
    """The algorithms `op` could run for `nbytes` on `comm` (default: init()'s)
    as (name, predicted seconds) pairs, what the call would run first; see
    Communicator.explain."""
    return (comm if comm is not None else get_default()).explain(op, nbytes)


def finalize():
    """Closes the default communicator."""
    global _default
    comm, _default = _default, None
    if comm is not None:
        comm.close()


# How long the exit handler lets operations still in flight finish before
# it aborts them: long enough for peers that are merely a little behind,
# far below any timeout.
EXIT_GRACE_S = 1.0


def _at_exit():
    """Interpreter exit: operations still in flight (an async op never
    waited for, one a peer never joins) get EXIT_GRACE_S to finish; then a
    warning names them and the communicator is aborted, so neither this
    process nor its peers wait for the timeout. Every communicator closes."""
    from ringcomm import communicator as _cm

    comms = list(_cm._live)
    deadline = time.monotonic() + EXIT_GRACE_S
    for comm in comms:
        try:
            pending = comm.in_flight()
            while pending and time.monotonic() < deadline:
                time.sleep(0.005)
                pending = comm.in_flight()
            if pending:
                shown = ", ".join(pending[:4]) + (", ..." if len(pending) > 4 else "")
                sys.stderr.write(
                    f"ringcomm: warning: interpreter exit on rank {comm.rank} with {len(pending)} operation(s) "
                    f"still in flight ({shown}); aborting the communicator\n")
                sys.stderr.flush()
                comm.abort(f"rank {comm.rank}'s interpreter exited with {len(pending)} operation(s) in flight "
                           f"({shown})")
        except Exception:  # noqa: BLE001 - exit must go on
            pass
    finalize()
    for comm in comms:
        try:
            comm.close()
        except Exception:  # noqa: BLE001
            pass


atexit.register(_at_exit)


def _comm(comm):
    return comm if comm is not None else get_default()


def all_reduce(tensor, op=ReduceOp.SUM, comm=None, async_op=False):
    return (comm if comm is not None else get_default()).all_reduce(tensor, op, async_op)


def reduce_scatter(output, input, op=ReduceOp.SUM, comm=None, async_op=False):
    return _comm(comm).reduce_scatter(output, input, op, async_op)


def all_gather(output, input, comm=None, async_op=False):
    return _comm(comm).all_gather(output, input, async_op)


def broadcast(tensor, src=0, comm=None, async_op=False):
    return _comm(comm).broadcast(tensor, src, async_op)


def reduce(tensor, dst=0, op=ReduceOp.SUM, comm=None, async_op=False):
    return _comm(comm).reduce(tensor, dst, op, async_op)


def scatter(output, input=None, src=0, comm=None, async_op=False):
    return _comm(comm).scatter(output, input, src, async_op)


def gather(output, input, dst=0, comm=None, async_op=False):
    return _comm(comm).gather(output, input, dst, async_op)


def all_to_all(output, input, comm=None, async_op=False):
    return _comm(comm).all_to_all(output, input, async_op)


def send(tensor, dst, comm=None, async_op=False, tag=0):
    return _comm(comm).send(tensor, dst, async_op, tag=tag)


def recv(tensor, src=None, comm=None, async_op=False, tag=0):
    """Returns the rank the message came from (a Work with async_op)."""
    return _comm(comm).recv(tensor, src, async_op, tag=tag)


def sendrecv(send_tensor, dst, recv_tensor, src, comm=None):
    return _comm(comm).sendrecv(send_tensor, dst, recv_tensor, src)


def barrier(comm=None, async_op=False):
    return _comm(comm).barrier(async_op)
