"""The GPU path's plumbing that runs without a GPU: what the build says, how GPU buffers
are recognised and read, and that a machine with no GPU / no NCCL gets clear errors
rather than crashes. (tests/test_gpu.py needs a GPU.)"""

import os
import subprocess
import sys
import time

import numpy as np

import pytest

import ringcomm
from ringcomm import _C, _C_testing, cuda, gpu_buffers, nccl


class FakeDevice:
    id = 0


class FakeCudaArray:
    """Looks like a cupy array to the buffer readers (cupy's .device.id included);
    never dereferenced here."""

    device = FakeDevice()

    def __init__(self, n, typestr="<f4", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": typestr,
                                         "strides": strides, "version": 3}


def test_build_info_says_what_was_compiled():
    info = ringcomm.build_info()
    assert info["cuda"] is cuda.compiled()
    if info["cuda"]:
        assert {"cuda_toolkit", "cuda_archs", "nccl_declarations"} <= set(info)
        assert "80" in info["cuda_archs"] and "90" in info["cuda_archs"]
    assert info["gpu_transports"] == (("nccl", "cuda_ipc") if info["cuda"] else ())


@pytest.mark.skipif(not (cuda.compiled() and os.environ.get("NCCL_HOME")),
                    reason="needs a CUDA build made with NCCL_HOME set (as .ci/run does)")
def test_nccl_declarations_were_checked_against_nccl_h():
    """.ci/run fetches nccl.h and builds with NCCL_HOME: the build must have used it."""
    assert ringcomm.build_info()["nccl_declarations"] == "checked against nccl.h"


def test_gpu_buffers_are_told_apart_from_cpu_ones():
    with pytest.raises(_C.DeviceBufferError):
        _C.buffer_info(FakeCudaArray(4))
    assert issubclass(_C.DeviceBufferError, ValueError)
    assert gpu_buffers.is_device_buffer(FakeCudaArray(4))
    assert not gpu_buffers.is_device_buffer(np.zeros(4))


def test_cuda_array_interface_is_read():
    b = gpu_buffers.device_buffer(FakeCudaArray(10, "<f2", ptr=0x7F0000001000), "x")
    assert (b.ptr, b.count, b.dtype, b.torch) == (0x7F0000001000, 10, 0, False)
    b = gpu_buffers.device_buffer(FakeCudaArray(3, "|b1", strides=(1,)), "x")
    assert (b.count, b.dtype) == (3, 8)
    with pytest.raises(ValueError, match="contiguous"):
        gpu_buffers.device_buffer(FakeCudaArray(3, "<f4", strides=(8,)), "x")
    with pytest.raises(TypeError, match="typestr"):
        gpu_buffers.device_buffer(FakeCudaArray(3, "<c8"), "x")
    with pytest.raises(TypeError, match="CUDA"):
        gpu_buffers.device_buffer(np.zeros(3), "x")


def test_streams_are_read():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    assert gpu_buffers.stream_handle(TorchLike(), None) == 1234
    assert gpu_buffers.stream_handle(CupyLike(), None) == 99
    assert gpu_buffers.stream_handle(7, None) == 7
    with pytest.raises(TypeError):
        gpu_buffers.stream_handle("default", None)


@pytest.mark.skipif(not cuda.compiled(), reason="this build has no GPU path")
def test_missing_nccl_is_a_clear_error():
    """In a fresh process: one that already loaded NCCL keeps it."""
    r = subprocess.run([sys.executable, "-c", "import ringcomm; ringcomm.cuda.nccl_version()"],
                       env={**os.environ, "RINGCOMM_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "RingcommError" in r.stderr and "/nonexistent/libnccl.so.2" in r.stderr, r.stderr[-500:]


def test_gpu_call_without_gpu_fails_cleanly():
    """On this machine a GPU buffer reaches the GPU path and fails with a RingcommError
    (no GPU / no NCCL / no GPU path compiled), never a crash; the CPU path still works."""
    from torch.distributed import HashStore

    with ringcomm.init(rank=0, world_size=1, store=HashStore()) as comm:
        if not cuda.available():
            with pytest.raises(ringcomm.RingcommError):
                comm.all_reduce(FakeCudaArray(4))
        with pytest.raises(ValueError, match="stream= and algo= apply to GPU buffers"):
            comm.all_reduce(np.zeros(4, np.float32), stream=0)
        with pytest.raises(ValueError, match="stream= and algo= apply to GPU buffers"):
            comm.broadcast(np.zeros(4, np.float32), algo="nccl")
        x = np.ones(4, np.float32)
        comm.all_reduce(x)
        assert (x == 1).all()


def test_gpu_algo_environment_is_checked(monkeypatch):
    from torch.distributed import HashStore

    monkeypatch.setenv("RINGCOMM_GPU_ALGO", "fast")
    with ringcomm.init(rank=0, world_size=1, store=HashStore()) as comm:
        with pytest.raises(ValueError, match="RINGCOMM_GPU_ALGO"):
            comm.all_reduce(FakeCudaArray(4))


# ------------------------------------------- the GPU communicator's fault bookkeeping
# (csrc/comm/fault_state.h, used by GpuCommunicator; driven here through test hooks)

def test_an_error_covers_the_calls_not_seen_finished():
    """After ncclCommAbort every event completes: the error, not the event, says which
    calls failed. Calls 1-3 were seen finished when the error came; 4 and 5 fail."""
    f = _C_testing._FaultRecord()
    assert not f.failed() and f.error_of(4) == ""
    assert f.set("all_reduce timed out", True, 3)
    assert not f.set("a later error", False, 5)  # the first error wins
    assert f.failed() and f.message() == "all_reduce timed out" and f.timeout()
    assert [f.error_of(s) for s in (1, 3)] == ["", ""]
    assert [f.error_of(s) for s in (4, 5, 9)] == ["all_reduce timed out"] * 3
    assert f.error_of(0) == ""  # captured into a CUDA graph: no event, no verdict


def test_abort_waits_for_the_users_of_the_handle():
    g = _C_testing._AbortGate()
    assert g.enter() and g.enter()
    g.abort()  # two users inside: the teardown waits
    assert g.aborted() and g.teardowns == 0
    assert not g.enter()  # no new user once an abort is pending
    g.leave()
    assert g.teardowns == 0
    g.leave()  # the last one out runs it, with nobody inside
    assert (g.teardowns, g.users_at_teardown) == (1, 0)
    g.abort()
    g.retire()  # aborted: nothing to destroy
    assert (g.teardowns, g.destroys) == (1, 0)

    g = _C_testing._AbortGate()
    g.abort()  # nobody inside: at once
    assert g.teardowns == 1 and not g.enter()

    g = _C_testing._AbortGate()
    assert g.enter()
    g.leave()
    g.retire()  # a clean close destroys once; an abort after it does nothing
    g.abort()
    assert (g.teardowns, g.destroys) == (0, 1) and not g.enter()


def test_abort_never_frees_the_handle_under_a_call_queuing_on_it():
    """Threads queue on the handle in a loop while another aborts: no use of a dead
    handle, one teardown (a gate that tore down at once finds dozens)."""
    for _ in range(3):
        dead, uses, teardowns = _C_testing._abort_gate_race(4, 20000)
        assert uses > 0 and dead == 0 and teardowns == 1, (dead, uses, teardowns)


# ----------------------------------------------------- GpuWork over a fake native layer

class FakeNativeWork:
    """The native GpuWork's surface, scripted: `done` (event completed), `error` (the
    communicator's verdict on this call), how long wait_host would take."""

    what = "all_reduce"
    captured = False

    def __init__(self, done=False, error="", timeout_error=False, finishes_after=None):
        self.done, self._error, self._timeout = done, error, timeout_error
        self.finishes_after = finishes_after  # seconds wait_host needs; None: never
        self.waited_stream = []
        self.host_waits = []

    def is_completed(self):
        return self.done

    def error(self):
        return self._error

    def error_is_timeout(self):
        return self._timeout

    def wait_host(self, timeout_s):
        self.host_waits.append(timeout_s)
        if self._error:
            raise ringcomm.RingcommError(f"ringcomm: all_reduce on rank 0 failed: {self._error}")
        return self.finishes_after is not None and self.finishes_after <= timeout_s

    def wait_stream(self, handle):
        if self._error:
            raise ringcomm.RingcommError(f"ringcomm: all_reduce on rank 0 failed: {self._error}")
        self.waited_stream.append(handle)


def test_gpu_work_wait_honours_its_timeout():
    n = FakeNativeWork(finishes_after=None)
    w = cuda.GpuWork(n, (), 0, False)
    with pytest.raises(ringcomm.TimeoutError, match="within 0.25 s"):
        w.wait(timeout=0.25)
    assert n.host_waits == [0.25] and n.waited_stream == []  # no stream wait after a timeout
    n = FakeNativeWork(finishes_after=0.1)
    w = cuda.GpuWork(n, (), 0, False)
    assert w.wait(timeout=1, stream=1234) is True
    assert n.host_waits == [1.0] and n.waited_stream == [1234]
    # No timeout: the host never blocks, only the stream waits.
    n = FakeNativeWork()
    assert cuda.GpuWork(n, (), 0, False).wait(stream=7) is True
    assert n.host_waits == [] and n.waited_stream == [7]
    with pytest.raises(ValueError):
        cuda.GpuWork(n, (), 0, False).wait(timeout=-1)


def test_gpu_work_reports_an_aborted_call():
    """The event completed (NCCL aborted, kernels exited), but the call failed."""
    n = FakeNativeWork(done=True, error="all_reduce did not finish within 2 s", timeout_error=True)
    w = cuda.GpuWork(n, (), 0, False)
    assert w.is_completed()
    e = w.exception()
    assert isinstance(e, ringcomm.TimeoutError) and "within 2 s" in str(e)
    with pytest.raises(ringcomm.RingcommError, match="within 2 s"):
        w.wait(stream=3)
    with pytest.raises(ringcomm.RingcommError, match="within 2 s"):
        w.wait(timeout=5)
    # An NCCL error: a RingcommError that is no timeout; failed is completed even
    # while the event has not completed yet.
    n = FakeNativeWork(done=False, error="NCCL: remote process exited")
    e = cuda.GpuWork(n, (), 0, False).exception()
    assert type(e) is ringcomm.RingcommError and "remote process exited" in str(e)
    assert cuda.GpuWork(n, (), 0, False).is_completed()
    # Success, and pending.
    assert cuda.GpuWork(FakeNativeWork(done=True), (), 0, False).exception() is None
    w = cuda.GpuWork(FakeNativeWork(done=False), (), 0, False)
    assert not w.is_completed() and w.exception() is None


# --------------------------------------- GpuPath: buffer references and settings

class FakeComm:
    rank, world_size, _prefix = 0, 1, "t"

    class _config:
        timeout_s = 10.0
        transport = "auto"


class FakeTorchTensor:
    """A torch-like buffer: record_stream must not be called (defect 1 of issue 13)."""

    def record_stream(self, stream):
        raise AssertionError("record_stream called: torch would keep an event on the comm stream")


class FakeNativeComm:
    device, stream = 0, 0xABC
    over_ipc = False

    def __init__(self, path, fail_close=False, over_ipc=False, error=""):
        self.path, self.fail_close = path, fail_close
        self.over_ipc, self.error = over_ipc, error
        self.refs_at_close = None
        self.closed_at = None

    def async_error(self):
        return self.error

    def close(self):
        self.closed_at = time.monotonic()
        self.refs_at_close = len(self.path._inflight)
        if self.fail_close:
            raise ringcomm.RingcommError("ringcomm: cudaStreamSynchronize (close) failed")


def test_buffers_are_held_until_the_event_completed_then_close():
    import weakref

    path = cuda.GpuPath(FakeComm())
    g = FakeNativeComm(path)
    path._natives[0] = g

    class Obj(FakeTorchTensor):
        pass

    a, b = Obj(), Obj()
    ra, rb = weakref.ref(a), weakref.ref(b)
    w1, w2 = FakeNativeWork(), FakeNativeWork()
    path._finish(g, w1, [gpu_buffers.DeviceBuffer(a, 1, 1, 2, 0, True)], 5, False)  # sync: the caller stream waits
    assert w1.waited_stream == [5]
    path._finish(g, w2, [gpu_buffers.DeviceBuffer(b, 2, 1, 2, 0, True)], 5, True)
    del a, b
    assert ra() is not None and rb() is not None  # in flight: held
    w1.done = True
    path._finish(g, FakeNativeWork(), [None], 5, False)  # prunes the finished front
    assert ra() is None and rb() is not None
    path.close()  # the native close drains the stream before the references go
    assert g.refs_at_close == 2 and rb() is None and path._inflight == []


def test_cuda_ipc_close_waits_for_every_peer_before_freeing():
    """A cuda_ipc rank's buffers are read by its peers: close() frees them only once
    every peer finished its calls too (a handshake through the store, bounded), and
    not at all after a failure (the peers' kernels stop at the abort word)."""
    import threading

    from torch.distributed import HashStore

    store = HashStore()

    class Comm(FakeComm):
        world_size = 2

        def __init__(self, rank):
            self.rank, self._store = rank, store

    paths, natives = [], []
    for r in range(2):
        p = cuda.GpuPath(Comm(r))
        g = FakeNativeComm(p, over_ipc=True)
        p._natives[0], p._ipc_prefix[0] = g, "t/cuda_ipc/0"
        paths.append(p)
        natives.append(g)
    t = threading.Thread(target=paths[0].close)
    t.start()
    time.sleep(0.3)
    assert natives[0].closed_at is None, "rank 0 freed its buffers while rank 1 was still running"
    start = time.monotonic()
    paths[1].close()
    t.join(5)
    assert not t.is_alive() and natives[0].closed_at is not None and natives[0].closed_at >= start
    assert natives[1].closed_at is not None

    # After a failure: no wait at all.
    p = cuda.GpuPath(Comm(0))
    g = FakeNativeComm(p, over_ipc=True, error="rank 1 aborted")
    p._natives[0], p._ipc_prefix[0] = g, "t/cuda_ipc/1"
    start = time.monotonic()
    p.close()
    assert g.closed_at is not None and time.monotonic() - start < 1.0

    # A peer that never comes: close goes on after the bound.
    p = cuda.GpuPath(Comm(0))
    p.CLOSE_WAIT_S = 0.5
    g = FakeNativeComm(p, over_ipc=True)
    p._natives[0], p._ipc_prefix[0] = g, "t/cuda_ipc/2"
    start = time.monotonic()
    p.close()
    took = time.monotonic() - start
    assert g.closed_at is not None and 0.4 <= took < 3.0, took


def test_a_close_that_fails_never_frees_the_buffers():
    import weakref

    path = cuda.GpuPath(FakeComm())
    g = FakeNativeComm(path, fail_close=True)
    path._natives[0] = g
    obj = FakeTorchTensor()
    ref = weakref.ref(obj)
    path._finish(g, FakeNativeWork(), [gpu_buffers.DeviceBuffer(obj, 1, 1, 2, 0, True)], 5, False)
    del obj
    with pytest.raises(ringcomm.RingcommError):
        path.close()
    assert ref() is not None and path._natives == {}
    cuda._held_forever.clear()


def test_gpu_settings_are_rank_0s_on_every_rank():
    """RINGCOMM_GPU_ALGO / _CHUNK_BYTES differ between ranks: every rank gets rank 0's
    (ranks running different families would wait on each other until the watchdog)."""
    import threading

    from torch.distributed import HashStore

    store = HashStore()
    got = {}

    def rank(r, mine):
        got[r] = nccl.agree_settings(store, "t/nccl/0", r, 10.0, mine, lambda: "00ff")

    ts = [threading.Thread(target=rank, args=(1, {"chunk": 1 << 20, "algo": "ring"})),
          threading.Thread(target=rank, args=(2, {"chunk": 64, "algo": "auto"})),
          threading.Thread(target=rank, args=(0, {"chunk": 4 << 20, "algo": "nccl"}))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    want = {"chunk": 4 << 20, "algo": "nccl", "uid": "00ff"}
    assert got == {0: want, 1: want, 2: want}
    # What an older rank 0 wrote (no algo): a clear error, not a silent default.
    store.set("t/nccl/1", '{"uid": "00", "chunk": 64}')
    with pytest.raises(ringcomm.RingcommError, match="same ringcomm version"):
        nccl.agree_settings(store, "t/nccl/1", 1, 10.0, {"chunk": 64, "algo": "auto"}, lambda: "")


def test_gpu_settings_wait_is_bounded():
    from torch.distributed import HashStore

    with pytest.raises(ringcomm.TimeoutError):
        nccl.agree_settings(HashStore(), "t/nccl/0", 1, 0.3, {"chunk": 64, "algo": "auto"}, lambda: "")


def test_each_rank_builds_its_nccl_communicator_with_rank_0s_settings(monkeypatch):
    """GpuPath.native() passes the agreed settings on, not its own environment's."""
    import threading

    from torch.distributed import HashStore

    made = []

    class FakeC:
        parse_algo = staticmethod(_C.parse_algo)  # the real name parser

        @staticmethod
        def cuda_pci_bus_id(device):  # each rank its own GPU (rank 1 native()s on a thread)
            return "0000:01:00.0" if threading.current_thread() is threading.main_thread() else "0000:02:00.0"

        @staticmethod
        def nccl_unique_id():
            return b"\x01\x02"

        @staticmethod
        def GpuCommunicator(rank, ws, device, uid, timeout_s, chunk, algo):
            made.append((rank, uid, chunk, algo))
            return object()

    monkeypatch.setattr(cuda, "_C", FakeC)
    monkeypatch.setattr(cuda, "nccl_version", lambda: (0, ""))
    store = HashStore()

    def comm(rank):
        c = FakeComm()
        c.rank, c.world_size, c._store = rank, 2, store
        return c

    monkeypatch.setenv("RINGCOMM_GPU_ALGO", "nccl")
    monkeypatch.setenv("RINGCOMM_GPU_CHUNK_BYTES", str(1 << 20))
    p0 = cuda.GpuPath(comm(0))
    monkeypatch.setenv("RINGCOMM_GPU_ALGO", "ring")
    monkeypatch.setenv("RINGCOMM_GPU_CHUNK_BYTES", "4096")
    p1 = cuda.GpuPath(comm(1))
    t = threading.Thread(target=p1.native, args=(0,))
    t.start()
    p0.native(0)
    t.join(30)
    assert sorted(made) == [(0, b"\x01\x02", 1 << 20, "nccl"), (1, b"\x01\x02", 1 << 20, "nccl")]


def test_ranks_sharing_a_gpu_build_a_cuda_ipc_communicator(monkeypatch):
    """Two ranks whose device is one GPU (the same PCI bus id): GpuPath.native() makes
    cuda_ipc communicators with the agreed settings (the slot is the GPU chunk), exchanges their handles through the
    store and lets them go after every rank mapped every buffer; NCCL is never loaded."""
    import threading

    from torch.distributed import HashStore

    made, steps = [], []

    class FakeIpc:
        over_ipc = True

        def __init__(self, rank):
            self.rank = rank

        def handle(self):
            return f"0:0000:01:00.0:{self.rank:02x}"

        def connect(self, handles):
            steps.append((self.rank, "connect", tuple(handles)))

        def exported(self):
            steps.append((self.rank, "exported"))

    class FakeGpuCommunicator:
        @staticmethod
        def over_cuda_ipc(rank, ws, device, timeout_s, slot, nslots, stage, one, two, algo):
            made.append((rank, ws, slot, nslots, stage, one, two, algo))
            return FakeIpc(rank)

    class FakeC:
        GpuCommunicator = FakeGpuCommunicator
        parse_algo = staticmethod(_C.parse_algo)  # the real name parser

        @staticmethod
        def cuda_pci_bus_id(device):
            return "0000:01:00.0"

    def no_nccl():
        raise AssertionError("NCCL must not be loaded for ranks sharing a GPU")

    monkeypatch.setattr(cuda, "_C", FakeC)
    monkeypatch.setattr(cuda, "nccl_version", no_nccl)
    store = HashStore()

    def comm(rank):
        c = FakeComm()
        c.rank, c.world_size, c._store = rank, 2, store
        return c

    monkeypatch.setenv("RINGCOMM_IPC_STAGE_BYTES", str(1 << 20))
    monkeypatch.setenv("RINGCOMM_IPC_ALGO", "twoshot")
    p0 = cuda.GpuPath(comm(0))
    t = threading.Thread(target=p0.native, args=(0,))
    t.start()
    p1 = cuda.GpuPath(comm(1))
    p1.native(0)
    t.join(30)
    assert sorted(made) == [(r, 2, 4 << 20, 4, 1 << 20, 256 << 10, 4 << 20, "twoshot") for r in (0, 1)]
    handles = ("0:0000:01:00.0:00", "0:0000:01:00.0:01")
    assert sorted(steps) == [(0, "connect", handles), (0, "exported"), (1, "connect", handles), (1, "exported")]
    assert p0.transport(0) == p1.transport(0) == "cuda_ipc" and p0.transport(1) is None
