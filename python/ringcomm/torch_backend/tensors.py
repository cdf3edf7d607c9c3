"""Torch tensors and reduce ops -> what the ringcomm core accepts.

The core takes contiguous CPU buffers of nine dtypes. Here torch's wider
world is mapped onto it:

- non-contiguous tensors are copied to contiguous ones and copied back once
  the operation completed (`Staging`);
- collectives that only move data (broadcast, all_gather, scatter, gather,
  all_to_all, send/recv) move any dtype, as bytes when the core has no such
  dtype (int16, uint16..uint64, complex, float8, ...);
- reductions of complex tensors with SUM / AVG reduce their real view;
  bool SUM / PRODUCT / BXOR are done as OR / AND / XOR (what gloo does);
- torch's RedOpType maps onto ringcomm.ReduceOp, and anything else
  (PREMUL_SUM) raises a ValueError naming the op.
"""
import torch
from torch.distributed import ReduceOp as TorchReduceOp

from ringcomm.reduce_op import ReduceOp

CORE_DTYPES = frozenset((
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
))

_RED = TorchReduceOp.RedOpType
_OPS = {
    _RED.SUM: ReduceOp.SUM,
    _RED.PRODUCT: ReduceOp.PROD,
    _RED.MIN: ReduceOp.MIN,
    _RED.MAX: ReduceOp.MAX,
    _RED.AVG: ReduceOp.AVG,
    _RED.BAND: ReduceOp.BAND,
    _RED.BOR: ReduceOp.BOR,
    _RED.BXOR: ReduceOp.BXOR,
}
_BOOL_OPS = {ReduceOp.SUM: ReduceOp.BOR, ReduceOp.PROD: ReduceOp.BAND}


def reduce_op(op):
    """ringcomm.ReduceOp for torch's ReduceOp / RedOpType (ValueError for others)."""
    kind = getattr(op, "op", op)  # a ReduceOp object carries its RedOpType in .op
    try:
        return _OPS[kind]
    except (KeyError, TypeError):
        pass
    name = getattr(kind, "name", None) or str(kind)
    supported = ", ".join(f"ReduceOp.{k.name}" for k in _OPS)
    raise ValueError(f"ringcomm: ReduceOp.{name.rsplit('.', 1)[-1]} is not supported; "
                     f"the ringcomm backend reduces with {supported}")


class Staging:
    """Dense stand-ins for tensors, and the copies back once an op completed.

    Every tensor handed to the core goes through `dense()` (inputs) or
    `output()` (tensors the op writes); `finish()` copies the results into
    non-contiguous originals. All tensors of one call must be on one device
    (`device`: "cpu" or a CUDA device). For CUDA tensors the copies are
    ordered on the current stream, like the op itself.
    """

    __slots__ = ("_back", "device")

    def __init__(self):
        self._back = []
        self.device = None

    def dense(self, t):
        """A contiguous tensor holding t's values (t itself when it is contiguous)."""
        _check_device(t)
        if self.device is None:
            self.device = t.device
        elif t.device != self.device:
            raise ValueError(f"ringcomm: one call's tensors must be on one device, got {self.device} and {t.device}")
        t = t.detach()
        return t if t.is_contiguous() else t.contiguous()

    def output(self, t):
        """A contiguous tensor the op may write; its values reach t in finish()."""
        d = self.dense(t)
        if not t.is_contiguous():
            self._back.append((d, t))
        return d

    def copy_to(self, src, dst):
        """After the op: dst <- src, a contiguous tensor of as many elements."""
        self._back.append((src, dst))

    def finish(self):
        for src, dst in self._back:
            dst.detach().copy_(src.view(dst.shape))
        self._back = []

    @property
    def empty(self):
        return not self._back

    @property
    def on_gpu(self):
        return self.device is not None and self.device.type == "cuda"

    def empty_like_flat(self, n, dtype):
        """A new 1-D tensor of n elements on the call's device."""
        return torch.empty(n, dtype=dtype, device=self.device or "cpu")


def _check_device(t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ringcomm: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"ringcomm: a {t.layout} tensor was given; of the sparse layouts the ringcomm "
                         "backend takes sparse COO tensors in all_reduce (SUM) only, as gloo does")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"ringcomm: tensor is on {t.device}; the ringcomm torch backend serves CPU "
                         "and CUDA tensors")


def flat(t):
    """1-D view of a contiguous tensor (0-dim tensors become one element)."""
    return t.reshape(-1)


def as_movable(t):
    """1-D view of a contiguous tensor in a dtype the core can move (bytes if needed)."""
    f = flat(t)
    return f if f.dtype in CORE_DTYPES else f.view(torch.uint8)


def as_reducible(t, op):
    """(1-D view the core reduces, ringcomm op) for a contiguous tensor and a ringcomm op."""
    f = flat(t)
    if f.is_complex():
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise ValueError(f"ringcomm: ReduceOp.{op.name} is not defined on complex tensors "
                             f"({t.dtype}); only SUM and AVG are")
        return torch.view_as_real(f).reshape(-1), op
    if f.dtype == torch.bool:
        if op == ReduceOp.BXOR:
            return f.view(torch.uint8), op
        if op == ReduceOp.AVG:
            raise ValueError("ringcomm: ReduceOp.AVG is not defined on bool tensors")
        return f, _BOOL_OPS.get(op, op)
    if f.dtype not in CORE_DTYPES:
        raise TypeError(f"ringcomm: cannot reduce {t.dtype} tensors; the ringcomm backend reduces "
                        "float16, bfloat16, float32, float64, int8, uint8, int32, int64 and bool")
    return f, op
