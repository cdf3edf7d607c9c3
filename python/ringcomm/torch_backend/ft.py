"""ringcomm under torchft: a process group that implements torchft's interface.

    from ringcomm.torch_backend.ft import ProcessGroupRingcommFT
    manager = torchft.Manager(pg=ProcessGroupRingcommFT(), ...)

torchft reconfigures its process group on every new quorum: configure() gets
a store address with a prefix of its own (host:port/prefix), this rank and
the world size. Each configure() aborts the communicator of the last quorum
(never waits on it) and builds a new "ringcomm" process group over that
store. abort() fails the calls in flight at once (torchft aborts on a
timeout or an error); errored() reports the error a call met, which makes
torchft's Manager skip the step (should_commit) and reconfigure.

Needs torchft (pip install torchft).
"""
from datetime import timedelta

import torch.distributed as dist

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # pragma: no cover - exercised where torchft is absent
    raise ImportError("ringcomm.torch_backend.ft needs torchft (pip install torchft)") from e

from ringcomm.errors import RingcommError
from ringcomm.torch_backend.process_group import ProcessGroupRingcomm


class _ReportingWork(dist._Work):
    """A Work whose wait() reports a failure by its future, not by raising.

    torchft's Manager waits for a Work, then chains its future through
    wrap_future, which turns an error into a skipped step (report_error) and
    hands DDP the tensor; a wait() that raises stops it before the future is
    chained, and torchft's DDP comm hook then finds no future at all."""

    def __init__(self, work):
        super().__init__()
        self._work = work

    def wait(self, timeout=None):
        try:
            return self._work.wait(timeout)
        except RingcommError:
            if not self._work.is_completed():
                raise  # the wait's own timeout: still running
            return False  # failed: the future carries the error

    def get_future(self):
        return self._work.get_future()

    def is_completed(self):
        return self._work.is_completed()

    def is_success(self):
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def block_current_stream(self):
        self.wait()


class ProcessGroupRingcommFT(ProcessGroupWrapper):
    """A reconfigurable ringcomm process group for torchft's Manager (CPU tensors)."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._configures = 0

    def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
        self._configures += 1
        return ProcessGroupRingcomm(store, rank, world_size, self._timeout,
                                    group_name=f"torchft-ringcomm-{self._configures}")

    def getBackendName(self) -> str:
        return "torchft-ringcomm"

    def _wrap_work(self, work, opts):
        return _ReportingWork(work)

    def errored(self):
        """The error a call of the current quorum's group met (None if none)."""
        pg = self._pg
        if pg is None:
            return None
        native = pg.communicator._native
        if native is None:
            return None
        message = native.error()
        return RingcommError(f"ringcomm: {message}") if message else None

    def abort(self, errored: bool = True) -> None:
        """Aborts the current group (its calls in flight raise at once) and drops it."""
        pg = self._pg
        super().abort(errored)
        if pg is not None:
            pg.shutdown()

    def shutdown(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.abort()
            pg.shutdown()
