"""The GPU path's plumbing that runs without a GPU: what the build says, how GPU buffers
are recognised and read, and that a machine with no GPU / no NCCL gets clear errors
rather than crashes. (tests/test_gpu.py needs a GPU.)"""

import os
import subprocess
import sys

import numpy as np
import pytest

import ringcomm
from ringcomm import _C, cuda


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


@pytest.mark.skipif(not (cuda.compiled() and os.environ.get("NCCL_HOME")),
                    reason="needs a CUDA build made with NCCL_HOME set (as .ci/run does)")
def test_nccl_declarations_were_checked_against_nccl_h():
    """.ci/run fetches nccl.h and builds with NCCL_HOME: the build must have used it."""
    assert ringcomm.build_info()["nccl_declarations"] == "checked against nccl.h"


def test_gpu_buffers_are_told_apart_from_cpu_ones():
    with pytest.raises(_C.DeviceBufferError):
        _C.buffer_info(FakeCudaArray(4))
    assert issubclass(_C.DeviceBufferError, ValueError)
    assert cuda.is_device_buffer(FakeCudaArray(4))
    assert not cuda.is_device_buffer(np.zeros(4))


def test_cuda_array_interface_is_read():
    b = cuda.device_buffer(FakeCudaArray(10, "<f2", ptr=0x7F0000001000), "x")
    assert (b.ptr, b.count, b.dtype, b.torch) == (0x7F0000001000, 10, 0, False)
    b = cuda.device_buffer(FakeCudaArray(3, "|b1", strides=(1,)), "x")
    assert (b.count, b.dtype) == (3, 8)
    with pytest.raises(ValueError, match="contiguous"):
        cuda.device_buffer(FakeCudaArray(3, "<f4", strides=(8,)), "x")
    with pytest.raises(TypeError, match="typestr"):
        cuda.device_buffer(FakeCudaArray(3, "<c8"), "x")
    with pytest.raises(TypeError, match="CUDA"):
        cuda.device_buffer(np.zeros(3), "x")


def test_streams_are_read():
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    assert cuda.stream_handle(TorchLike(), None) == 1234
    assert cuda.stream_handle(CupyLike(), None) == 99
    assert cuda.stream_handle(7, None) == 7
    with pytest.raises(TypeError):
        cuda.stream_handle("default", None)


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
