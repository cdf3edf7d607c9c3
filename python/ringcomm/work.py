"""Work: the handle of an asynchronous operation."""
from ringcomm import validate
from ringcomm.errors import CollectiveMismatchError, RevokedError, RingcommError, TimeoutError


def seconds(timeout, name="timeout"):
    """Seconds a wait may take, from a number or a timedelta (None stays
    None: no limit). As validate.timeout_seconds, except that 0 is allowed
    (a wait that only polls): TypeError for a str or a bool, ValueError for
    nan, inf, a negative value or more than 30 days."""
    if timeout is None:
        return None
    return validate.timeout_seconds(timeout, name, allow_zero=True)


class Work:
    """Returned by every call made with async_op=True.

    Operations on one communicator run in the order they were issued. The
    buffers passed to the call are kept alive until it completes.
    """

    __slots__ = ("_native", "_buffers")

    def __init__(self, native, buffers):
        self._native = native
        self._buffers = buffers

    def wait(self, timeout=None):
        """Blocks until the operation completed; raises its error if it failed.

        `timeout` (seconds or timedelta, 0 to poll, None for no limit) bounds
        this wait only: on expiry a ringcomm.TimeoutError is raised and the
        operation keeps running.
        Returns True.
        """
        t = None if timeout is None else seconds(timeout)
        if not self._native.wait(-1.0 if t is None else t):
            raise TimeoutError(
                f"ringcomm: wait for {self._native.what} did not complete within {t} s "
                "(the operation is still running)"
            )
        return True

    def is_completed(self):
        """True once the operation finished, successfully or not."""
        return self._native.is_completed()

    def exception(self):
        """The error the operation failed with, or None."""
        if not self._native.is_completed():
            return None
        msg = self._native.error_message()
        if not msg:
            return None
        if self._native.is_timeout():
            return TimeoutError(msg)
        if self._native.is_revoked():
            return RevokedError(msg)
        return (CollectiveMismatchError if self._native.is_mismatch() else RingcommError)(msg)

    def source_rank(self):
        """A recv's: the rank its message came from (-1 before it completed,
        and for other operations)."""
        return getattr(self._native, "source", -1) if self._native.is_completed() else -1

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<ringcomm.Work {self._native.what} {state}>"
