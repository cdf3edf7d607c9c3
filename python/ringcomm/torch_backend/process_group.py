"""ProcessGroupRingcomm: a torch.distributed.ProcessGroup over a ringcomm Communicator.

torch calls these methods with group ranks, which are the communicator's
ranks. Every method issues ringcomm operations and returns a RingcommWork.
A call made with opts.asyncOp False (torch's blocking dist.* calls) runs
inline in the calling thread, ringcomm's low-latency path, and returns a
completed Work; otherwise the operations run on the communicator's worker
thread, in issue order.
"""
import math

import torch
import torch.distributed as dist

from ringcomm import validate

from ringcomm.communicator import Communicator
from ringcomm.config import make_config
from ringcomm.reduce_op import ReduceOp
from ringcomm.torch_backend.tensors import Staging, as_movable, as_reducible, flat, reduce_op
from ringcomm.torch_backend.work import Completer, RingcommWork

BACKEND_NAME = "ringcomm"


def _is_async(opts):
    return True if opts is None else bool(getattr(opts, "asyncOp", True))


def _op_of(opts):
    return ReduceOp.SUM if opts is None else reduce_op(opts.reduceOp)


def _root_of(opts):
    return 0 if opts is None else int(opts.rootRank)


def _as_list(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _same_dtype(what, expected, t):
    if t.dtype != expected:
        raise ValueError(f"ringcomm {what}: tensors must share one dtype, got {t.dtype} and {expected}")


class ProcessGroupRingcomm(dist.ProcessGroup):
    """The "ringcomm" torch.distributed backend (CPU tensors, one host).

    Created by torch for init_process_group("ringcomm") and new_group(); it
    can also be built directly from any c10d Store, every rank calling
    ProcessGroupRingcomm(store, rank, size, timeout).
    """

    def __init__(self, store, rank, size, timeout=None, *, group_name=""):
        # Checked here, before torch's constructor turns a bad value into a signature dump.
        rank = validate.index(rank, "rank")
        size = validate.index(size, "size", 1, 2**31 - 1)
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is out of range for size {size}")
        validate.store(store)
        super().__init__(rank, size)
        # torch hands every group its own PrefixStore, but reuses group names
        # after destroy_process_group(): count this rank's groups on the store
        # so that a re-created group never reads its predecessor's keys.
        incarnation = store.add(f"ringcomm/incarnation/{rank}", 1)
        self._comm = Communicator(store, f"ringcomm/{incarnation}", rank, size, make_config(timeout))
        self._group_name = group_name
        self._group_desc = "undefined"
        self._completer = Completer(f"ringcomm-pg-{group_name or incarnation}-completer")
        self._coalesced = None  # Works issued between start_ and end_coalescing

    # -- identity -------------------------------------------------------------
    def getBackendName(self):
        return BACKEND_NAME

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    @property
    def communicator(self):
        """The ringcomm Communicator under this group."""
        return self._comm

    def __repr__(self):
        return f"<ProcessGroupRingcomm {self._group_name!r} rank {self.rank()} of {self.size()}>"

    # -- plumbing -------------------------------------------------------------
    def _launch(self, calls, result, staging, async_op):
        """Issues `calls` (each f(async_op) -> ringcomm.Work or None) in order.

        One blocking call runs inline; otherwise all are issued asynchronously
        (so that sends and receives progress together) and, for a blocking
        torch call, waited for before returning.
        """
        if not async_op and len(calls) == 1:
            calls[0](False)
            staging.finish()
            work = RingcommWork((), result, None, self._completer)
        else:
            works = [w for w in (c(True) for c in calls) if w is not None]
            work = RingcommWork(works, result, staging, self._completer)
            if not async_op:
                work.wait()
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _flat_gather_buffer(self, what, staging, outputs, inp):
        """A flat buffer of size * inp.numel() whose blocks are copied into `outputs`."""
        n = self.size()
        if len(outputs) != n:
            raise ValueError(f"ringcomm {what}: expected {n} output tensors (one per rank), got {len(outputs)}")
        k = inp.numel()
        buf = torch.empty(n * k, dtype=inp.dtype)
        for r, o in enumerate(outputs):
            _same_dtype(what, inp.dtype, o)
            if o.numel() != k:
                raise ValueError(f"ringcomm {what}: output tensor {r} has {o.numel()} elements, "
                                 f"the input has {k}")
            staging.copy_to(buf[r * k:(r + 1) * k], o)
        return buf

    def _concat(self, what, staging, inputs, count, dtype):
        n = self.size()
        if len(inputs) != n:
            raise ValueError(f"ringcomm {what}: expected {n} input tensors (one per rank), got {len(inputs)}")
        for r, t in enumerate(inputs):
            _same_dtype(what, dtype, t)
            if t.numel() != count:
                raise ValueError(f"ringcomm {what}: input tensor {r} has {t.numel()} elements, "
                                 f"expected {count}")
        return torch.cat([flat(staging.dense(t)) for t in inputs]) if inputs else torch.empty(0, dtype=dtype)

    # -- reductions -----------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op_of(opts)
        staging, calls = Staging(), []
        tensors = _as_list(tensors)
        for t in tensors:
            buf, rop = as_reducible(staging.output(t), op)
            calls.append(lambda a, b=buf, o=rop: self._comm.all_reduce(b, o, async_op=a))
        return self._launch(calls, tensors, staging, _is_async(opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        op, root = _op_of(opts), _root_of(opts)
        staging, calls = Staging(), []
        tensors = _as_list(tensors)
        for t in tensors:
            buf, rop = as_reducible(staging.output(t), op)
            calls.append(lambda a, b=buf, o=rop: self._comm.reduce(b, root, o, async_op=a))
        return self._launch(calls, tensors, staging, _is_async(opts))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op_of(opts)
        staging, calls = Staging(), []
        outputs = _as_list(outputs)
        for out, ins in zip(outputs, input_lists):
            src = self._concat("reduce_scatter", staging, ins, out.numel(), out.dtype)
            o, rop = as_reducible(staging.output(out), op)
            i, _ = as_reducible(src, op)
            calls.append(lambda a, o=o, i=i, r=rop: self._comm.reduce_scatter(o, i, r, async_op=a))
        return self._launch(calls, outputs, staging, _is_async(opts))

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts, result=[output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None, result=None):
        op = _op_of(opts)
        staging, calls = Staging(), []
        for out, inp in zip(outputs, inputs):
            _same_dtype("reduce_scatter_tensor", out.dtype, inp)
            o, rop = as_reducible(staging.output(out), op)
            i, _ = as_reducible(staging.dense(inp), op)
            calls.append(lambda a, o=o, i=i, r=rop: self._comm.reduce_scatter(o, i, r, async_op=a))
        return self._launch(calls, outputs if result is None else result, staging, _is_async(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- data movement --------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        root = _root_of(opts)
        staging, calls = Staging(), []
        tensors = _as_list(tensors)
        for t in tensors:
            buf = as_movable(staging.output(t))
            calls.append(lambda a, b=buf: self._comm.broadcast(b, root, async_op=a))
        return self._launch(calls, tensors, staging, _is_async(opts))

    def allgather(self, output_lists, inputs, opts=None):
        staging, calls = Staging(), []
        inputs = _as_list(inputs)
        for outs, inp in zip(output_lists, inputs):
            i = staging.dense(inp)
            buf = self._flat_gather_buffer("all_gather", staging, outs, i)
            calls.append(lambda a, o=as_movable(buf), i=as_movable(i): self._comm.all_gather(o, i, async_op=a))
        return self._launch(calls, output_lists, staging, _is_async(opts))

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        # output_lists[r][j] <- input j of rank r
        staging, calls = Staging(), []
        for j, inp in enumerate(inputs):
            i = staging.dense(inp)
            buf = self._flat_gather_buffer("all_gather_coalesced", staging, [outs[j] for outs in output_lists], i)
            calls.append(lambda a, o=as_movable(buf), i=as_movable(i): self._comm.all_gather(o, i, async_op=a))
        return self._launch(calls, output_lists, staging, _is_async(opts))

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts, result=[output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None, result=None):
        staging, calls = Staging(), []
        for out, inp in zip(outputs, inputs):
            _same_dtype("all_gather_into_tensor", out.dtype, inp)
            o, i = as_movable(staging.output(out)), as_movable(staging.dense(inp))
            calls.append(lambda a, o=o, i=i: self._comm.all_gather(o, i, async_op=a))
        return self._launch(calls, outputs if result is None else result, staging, _is_async(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def scatter(self, outputs, input_lists, opts=None):
        root = _root_of(opts)
        staging, calls = Staging(), []
        outputs = _as_list(outputs)
        for j, out in enumerate(outputs):
            o = staging.output(out)
            src = None
            if self.rank() == root:
                src = as_movable(self._concat("scatter", staging, input_lists[j], out.numel(), out.dtype))
            calls.append(lambda a, o=as_movable(o), s=src: self._comm.scatter(o, s, root, async_op=a))
        return self._launch(calls, outputs, staging, _is_async(opts))

    def gather(self, output_lists, inputs, opts=None):
        root = _root_of(opts)
        staging, calls = Staging(), []
        inputs = _as_list(inputs)
        for j, inp in enumerate(inputs):
            i = staging.dense(inp)
            dst = None
            if self.rank() == root:
                dst = as_movable(self._flat_gather_buffer("gather", staging, output_lists[j], i))
            calls.append(lambda a, d=dst, i=as_movable(i): self._comm.gather(d, i, root, async_op=a))
        return self._launch(calls, output_lists, staging, _is_async(opts))

    def alltoall(self, outputs, inputs, opts=None):
        # Block sizes may differ per pair and no rank knows all of them, so the
        # blocks always travel as sends and receives (which progress together).
        n, me = self.size(), self.rank()
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(f"ringcomm all_to_all: expected {n} input and {n} output tensors, "
                             f"got {len(inputs)} and {len(outputs)}")
        staging = Staging()
        outs = [as_movable(staging.output(t)) for t in outputs]
        ins = [as_movable(staging.dense(t)) for t in inputs]
        for t in inputs + outputs:
            _same_dtype("all_to_all", inputs[0].dtype, t)
        if outs[me].numel() != ins[me].numel():
            raise ValueError(f"ringcomm all_to_all: output tensor {me} has {outputs[me].numel()} elements, "
                             f"input tensor {me} has {inputs[me].numel()}")
        outs[me].copy_(ins[me])
        return self._launch(self._exchange(ins, outs), outputs, staging, _is_async(opts))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        staging = Staging()
        _same_dtype("all_to_all_single", output.dtype, input)
        o, i = staging.output(output), staging.dense(input)
        if not output_split_sizes and not input_split_sizes:
            call = lambda a, o=as_movable(o), i=as_movable(i): self._comm.all_to_all(o, i, async_op=a)  # noqa: E731
            return self._launch([call], [output], staging, _is_async(opts))
        me = self.rank()
        out_rows = self._splits("output", output, output_split_sizes)
        in_rows = self._splits("input", input, input_split_sizes)
        ob, ib = flat(o).view(torch.uint8), flat(i).view(torch.uint8)
        outs = self._blocks(ob, out_rows, output)
        ins = self._blocks(ib, in_rows, input)
        if outs[me].numel() != ins[me].numel():
            raise ValueError(f"ringcomm all_to_all_single: this rank sends itself {in_rows[me]} rows "
                             f"but receives {out_rows[me]}")
        outs[me].copy_(ins[me])
        return self._launch(self._exchange(ins, outs), [output], staging, _is_async(opts))

    alltoall_base = all_to_all_single

    def _splits(self, what, t, sizes):
        n = self.size()
        rows = t.shape[0] if t.dim() else 1
        if not sizes:
            if rows % n:
                raise ValueError(f"ringcomm all_to_all_single: {what} has {rows} rows, "
                                 f"not divisible by the group size {n}")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
            raise ValueError(f"ringcomm all_to_all_single: {what} split sizes {sizes} do not split "
                             f"{rows} rows into {n} blocks")
        return sizes

    @staticmethod
    def _blocks(flat_bytes, rows, t):
        row_bytes = math.prod(t.shape[1:]) * t.element_size() if t.dim() else t.element_size()
        blocks, start = [], 0
        for r in rows:
            blocks.append(flat_bytes[start:start + r * row_bytes])
            start += r * row_bytes
        return blocks

    def _exchange(self, ins, outs):
        """Calls sending ins[p] to p and receiving outs[p] from p, for every peer p."""
        n, me = self.size(), self.rank()
        calls = []
        for k in range(1, n):
            dst, src = (me + k) % n, (me - k) % n
            if ins[dst].numel():
                calls.append(lambda a, b=ins[dst], p=dst: self._comm.send(b, p, async_op=a))
            if outs[src].numel():
                calls.append(lambda a, b=outs[src], p=src: self._comm.recv(b, p, async_op=a))
        return calls

    # -- point to point -------------------------------------------------------
    # Messages between two ranks are matched in issue order; tags are accepted
    # and not used for matching.
    def send(self, tensors, dstRank, tag=0):
        staging, calls = Staging(), []
        tensors = _as_list(tensors)
        for t in tensors:
            buf = as_movable(staging.dense(t))
            calls.append(lambda a, b=buf: self._comm.send(b, int(dstRank), async_op=a))
        return self._launch(calls, tensors, staging, True)

    def recv(self, tensors, srcRank, tag=0):
        staging, calls = Staging(), []
        tensors = _as_list(tensors)
        for t in tensors:
            buf = as_movable(staging.output(t))
            calls.append(lambda a, b=buf: self._comm.recv(b, int(srcRank), async_op=a))
        return self._launch(calls, tensors, staging, True)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("ringcomm: recv from any source is not supported; pass src= to recv/irecv")

    # -- synchronisation ------------------------------------------------------
    def barrier(self, opts=None):
        call = lambda a: self._comm.barrier(async_op=a)  # noqa: E731
        return self._launch([call], [], Staging(), _is_async(opts))

    def start_coalescing(self, device):
        # Operations are issued at once anyway; coalescing only collects
        # their Works so that end_coalescing can return one for all.
        if self._coalesced is not None:
            raise RuntimeError("ringcomm: start_coalescing called twice without end_coalescing")
        self._coalesced = []

    def end_coalescing(self, device):
        works, self._coalesced = self._coalesced or [], None
        # A RingcommWork waits on anything with wait / is_completed / exception.
        return RingcommWork(works, [], None, self._completer)

    # -- lifetime -------------------------------------------------------------
    def shutdown(self):
        """Waits for issued operations and releases the communicator."""
        self._completer.close()
        self._comm.close()

    def abort(self):
        self._comm.abort("the torch process group was aborted")
        self._completer.close()
