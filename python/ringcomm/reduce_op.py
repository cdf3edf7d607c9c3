"""Reduce operations. Values match the native core's ReduceOp."""
import enum


class ReduceOp(enum.IntEnum):
    """How all_reduce, reduce and reduce_scatter combine the ranks' values, element by element.

    NaN propagates, with one semantics on every device and algorithm (CPU and GPU,
    ring, one-shot, recursive doubling, Rabenseifner, trees, chains, hierarchical, pull,
    NCCL): a NaN in any rank's input at a position makes that position NaN in the
    result, on every rank that receives it, whatever the order of the fold.

    - SUM, PROD: IEEE arithmetic (NaN in, NaN out; also inf + -inf, 0 * inf). Integers
      wrap around like numpy.
    - MIN, MAX: NaN if any input is NaN, like torch.minimum / torch.maximum and
      numpy.minimum / numpy.maximum (not fmin / fmax, which drop NaN). NCCL's own
      floating-point MIN/MAX drop NaN, so on GPUs ``algo="auto"`` runs ringcomm's
      kernels for them and ``algo="nccl"`` refuses them (ValueError). On bool, MIN is
      logical and, MAX logical or.
    - AVG: SUM, then divided by the world size (NaN stays NaN; integers truncate
      toward zero).
    - BAND, BOR, BXOR: bitwise, on integers and bool.
    """

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


# ReduceOp members, their names in either case, and torch.distributed's
# ReduceOp names all map to the native value.
_BY_KEY = {}
for _op in ReduceOp:
    _BY_KEY[_op] = int(_op)
    _BY_KEY[_op.name.lower()] = int(_op)
    _BY_KEY[_op.name] = int(_op)


def op_value(op):
    """The native value of `op` (a ReduceOp, its name, or torch's ReduceOp)."""
    try:
        return _BY_KEY[op]
    except (KeyError, TypeError):
        pass
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    try:
        return _BY_KEY[name.upper()]
    except KeyError:
        raise ValueError(
            f"op {op!r} is not a reduce operation ringcomm supports; "
            f"expected one of {', '.join(o.name.lower() for o in ReduceOp)}"
        ) from None
