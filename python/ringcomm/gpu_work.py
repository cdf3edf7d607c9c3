"""GpuWork: the handle of an asynchronous GPU operation (async_op=True); its stream
semantics are ringcomm/cuda.py's."""
from ringcomm.errors import RingcommError, TimeoutError  # noqa: A004
from ringcomm.gpu_buffers import current_stream, stream_handle
from ringcomm.work import seconds


class GpuWork:
    """The handle of an asynchronous GPU operation (async_op=True)."""

    __slots__ = ("_native", "_buffers", "_device", "_torch")

    def __init__(self, native, buffers, device, torch_buffers):
        self._native = native
        self._buffers = buffers
        self._device = device
        self._torch = torch_buffers

    def wait(self, timeout=None, stream=None):
        """Makes `stream` (default: the current stream of the tensors' framework on their
        device) wait for the operation. Without `timeout` the host does not block; with one
        (seconds or timedelta, 0 to poll) the host first waits that long for the operation
        to finish, as torch's Work.wait(timeout), and raises ringcomm.TimeoutError if it
        did not (the operation keeps running; the watchdog still bounds it). Raises the
        operation's error when it is known to have failed. Returns True."""
        t = seconds(timeout)
        if t is not None and not self._native.wait_host(t):
            raise TimeoutError(f"ringcomm: wait for {self._native.what} did not complete within {t} s "
                               "(the operation is still running)")
        if stream is None:
            handle = current_stream(self._device, self._torch)
        else:
            handle = stream_handle(stream, None)
        self._native.wait_stream(handle)  # raises the operation's error first
        return True

    def synchronize(self, timeout=None):
        """Blocks the host until the operation finished (TimeoutError after `timeout`
        seconds, default the communicator's; the NCCL communicator is then aborted).
        Raises the operation's error if it failed."""
        t = seconds(timeout)
        self._native.synchronize(-1.0 if t is None else t)
        return True

    def is_completed(self):
        """True once the operation finished, successfully or not (see exception())."""
        return bool(self._native.error()) or self._native.is_completed()

    def exception(self):
        """The error the operation failed with (the watchdog's timeout, an NCCL error,
        an abort), or None."""
        msg = self._native.error()
        if not msg:
            return None
        cls = TimeoutError if self._native.error_is_timeout() else RingcommError
        return cls(f"ringcomm: {self._native.what} failed: {msg}")

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<ringcomm.GpuWork {self._native.what} on cuda:{self._device} {state}>"
