"""ringcomm: ring collectives over shared memory (and, later, TCP and NCCL).

    import ringcomm
    comm = ringcomm.init()                 # under torchrun, or init(rank=, world_size=, store=)
    ringcomm.all_reduce(x)                 # numpy arrays and torch tensors, in place
    work = ringcomm.all_gather(out, x, async_op=True); work.wait()
    ringcomm.finalize()
"""
from ringcomm import cuda
from ringcomm._C import build_info
from ringcomm.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    explain,
    finalize,
    gather,
    get_default,
    init,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
    sendrecv,
)
from ringcomm.communicator import ANY_SOURCE, Communicator
from ringcomm.errors import CollectiveMismatchError, RevokedError, RingcommError, TimeoutError
from ringcomm.reduce_op import ReduceOp
from ringcomm.work import Work

__version__ = "0.1.0"

__all__ = [
    "ANY_SOURCE",
    "CollectiveMismatchError",
    "Communicator",
    "ReduceOp",
    "RevokedError",
    "RingcommError",
    "TimeoutError",
    "Work",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "build_info",
    "cuda",
    "explain",
    "finalize",
    "gather",
    "get_default",
    "init",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
    "sendrecv",
]
