"""GPU buffers and streams as the GPU path reads them: CUDA torch tensors, objects with
``__cuda_array_interface__`` (cupy) and CUDA DLPack objects become (pointer, count,
dtype code, device); a call's stream is the caller's (``stream=``) or the framework's
current one. The dtype codes are csrc/include/ringcomm/types.h's DataType."""
import sys

from ringcomm import _C

_TORCH_DTYPES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3,
                 "int8": 4, "uint8": 5, "int32": 6, "int64": 7, "bool": 8}
_TYPESTRS = {"f2": 0, "f4": 2, "f8": 3, "i1": 4, "u1": 5, "i4": 6, "i8": 7, "b1": 8}


class DeviceBuffer:
    """A contiguous CUDA buffer: pointer, element count, ringcomm dtype code, device."""

    __slots__ = ("obj", "ptr", "count", "dtype", "device", "torch")

    def __init__(self, obj, ptr, count, dtype, device, torch_tensor):
        self.obj, self.ptr, self.count, self.dtype, self.device = obj, ptr, count, dtype, device
        self.torch = torch_tensor


def _torch():
    return sys.modules.get("torch")


def device_buffer(x, arg):
    """Reads a CUDA tensor / array; raises TypeError / ValueError naming `arg`."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cuda:
            raise ValueError(f"{arg} is on {x.device}; the other buffers of this call are on a CUDA device")
        if not x.is_contiguous():
            raise ValueError(f"{arg} must be contiguous (call .contiguous() first)")
        name = str(x.dtype).rsplit(".", 1)[-1]
        if name not in _TORCH_DTYPES:
            raise TypeError(f"{arg} has unsupported dtype {x.dtype}")
        return DeviceBuffer(x, x.data_ptr(), x.numel(), _TORCH_DTYPES[name], x.device.index, True)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, _readonly = cai["data"]
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
        if typestr[0] == ">" or typestr[1:] not in _TYPESTRS:
            raise TypeError(f"{arg} has unsupported typestr {typestr!r}")
        count = 1
        for d in shape:
            count *= int(d)
        strides = cai.get("strides")
        if strides is not None:
            expect = int(typestr[2:])
            for d, s in zip(reversed(shape), reversed(strides)):
                if d > 1 and s != expect:
                    raise ValueError(f"{arg} must be C-contiguous")
                expect *= d
        device = getattr(getattr(x, "device", None), "id", None)
        if device is None:
            device = _C.cuda_pointer_device(ptr) if ptr else 0
        return DeviceBuffer(x, ptr, count, _TYPESTRS[typestr[1:]], device, False)
    if hasattr(x, "__dlpack_device__") and torch is not None:
        dev_type, _ = x.__dlpack_device__()
        if dev_type == 2:  # kDLCUDA
            return device_buffer(torch.from_dlpack(x), arg)
    raise TypeError(f"{arg} must be a CUDA torch tensor or an object with __cuda_array_interface__ "
                    f"(cupy), got {type(x).__name__}")


def is_device_buffer(x):
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return x.is_cuda
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if hasattr(x, "__dlpack_device__"):
        try:
            return x.__dlpack_device__()[0] == 2
        except Exception:  # noqa: BLE001
            return False
    return False


def current_stream(device, prefer_torch):
    """The framework's current stream on `device` (torch's for torch tensors, else
    cupy's when cupy is loaded, else the legacy default stream 0)."""
    torch = _torch()
    if prefer_torch and torch is not None:
        return torch.cuda.current_stream(device).cuda_stream
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().ptr
    return 0


def stream_handle(stream, buf):
    """The cudaStream_t (int) a call on `buf` is ordered after."""
    if stream is None:
        return current_stream(buf.device, buf.torch)
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h
    raise TypeError(f"stream must be an int handle, a torch.cuda.Stream or a cupy Stream, got {type(stream).__name__}")
