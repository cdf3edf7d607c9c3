"""Data types and the buffers every backend reads and writes.

All backends of one size share the same buffers, so they see the same memory, the
same alignment and the same warm pages. CPU buffers are page aligned: glibc's memcpy
runs ~3x slower when source and destination sit at different small offsets within a
page (numpy's large arrays start 16 bytes into a page, torch's 64), and a benchmark
should measure the library, not the allocator's luck. A CPU buffer is one block of
memory seen three ways: a torch tensor (gloo, ringcomm), a numpy array of the element
type (checks, MPI reductions) and a numpy byte array (MPI data movement, which then
works for any element type, bfloat16 included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

PAGE = 4096


@dataclass(frozen=True)
class DType:
    name: str              # ringcomm / numpy spelling: float32
    label: str             # nccl-tests spelling for the type column: float
    itemsize: int
    numpy: Optional[str]   # numpy dtype name, None if numpy has none (bfloat16)
    torch: str             # attribute of the torch module
    check: str             # numpy dtype the results are compared in
    floating: bool


DTYPES: Dict[str, DType] = {d.name: d for d in [
    DType("float32", "float", 4, "float32", "float32", "float32", True),
    DType("float64", "double", 8, "float64", "float64", "float64", True),
    DType("float16", "half", 2, "float16", "float16", "float16", True),
    DType("bfloat16", "bfloat16", 2, None, "bfloat16", "float32", True),
    DType("int8", "int8", 1, "int8", "int8", "int8", False),
    DType("uint8", "uint8", 1, "uint8", "uint8", "uint8", False),
    DType("int32", "int32", 4, "int32", "int32", "int32", False),
    DType("int64", "int64", 8, "int64", "int64", "int64", False),
]}

_DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "f32": "float32",
                  "double": "float64", "fp64": "float64", "f64": "float64",
                  "half": "float16", "fp16": "float16", "f16": "float16",
                  "bf16": "bfloat16", "char": "int8", "int": "int32"}


def resolve_dtype(name: str) -> DType:
    key = _DTYPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DTYPES:
        raise ValueError(f"unknown data type {name!r}; expected one of "
                         f"{', '.join(DTYPES)} (or nccl-tests' float, double, half, ...)")
    return DTYPES[key]


def aligned_bytes(nbytes: int) -> np.ndarray:
    """A page-aligned, uninitialised numpy byte array of ``nbytes``."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    offset = (-raw.ctypes.data) % PAGE
    return raw[offset:offset + nbytes]


class Buffer:
    """``count`` elements of ``dtype`` on ``device`` ("cpu" or "cuda:N")."""

    def __init__(self, count: int, dtype: DType, device: str = "cpu"):
        import torch

        self.count = count
        self.dtype = dtype
        self.device = device
        tdtype = getattr(torch, dtype.torch)
        if device == "cpu":
            self.bytes: Optional[np.ndarray] = aligned_bytes(count * dtype.itemsize)
            self.tensor = torch.from_numpy(self.bytes).view(tdtype)
            self.array: Optional[np.ndarray] = (
                self.bytes.view(dtype.numpy) if dtype.numpy else None)
        else:
            self.bytes = None
            self.array = None
            self.tensor = torch.empty(count, dtype=tdtype, device=device)

    def fill(self, values: np.ndarray) -> None:
        """Copy ``values`` (numpy, in ``dtype.check``) into the buffer."""
        import torch

        if self.array is not None:
            np.copyto(self.array, values, casting="unsafe")
        else:
            src = torch.from_numpy(np.ascontiguousarray(values))
            self.tensor.copy_(src.to(self.tensor.dtype))

    def read(self) -> np.ndarray:
        """The contents as numpy in ``dtype.check`` (a view where possible)."""
        import torch

        if self.array is not None:
            return self.array
        t = self.tensor.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()


@dataclass
class Buffers:
    """The buffers of one call: ``input`` is None for in-place primitives."""

    input: Optional[Buffer]
    output: Buffer
