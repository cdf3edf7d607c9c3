"""Work: the handle of an asynchronous operation."""
from ringcomm import _C, validate


def seconds(timeout, name="timeout"):
    """Seconds a wait may take, from a number or a timedelta (None stays
    None: no limit). As validate.timeout_seconds, except that 0 is allowed
    (a wait that only polls): TypeError for a str or a bool, ValueError for
    nan, inf, a negative value or more than 30 days."""
    if timeout is None:
        return None
    return validate.timeout_seconds(timeout, name, allow_zero=True)


# Returned by every call made with async_op=True: a native type
# (csrc/bindings/bind_work.cpp), so that a small call's async_op=True +
# wait() costs little more than the blocking call.
Work = _C.Work
_C._register_work_seconds(seconds)
