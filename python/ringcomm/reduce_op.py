"""Reduce operations. Values match the native core's ReduceOp."""
import enum


class ReduceOp(enum.IntEnum):
    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4  # sum, then divided by the world size (integers truncate toward zero)
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
