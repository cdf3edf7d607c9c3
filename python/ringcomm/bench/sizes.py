"""Message sizes, spelled and stepped the way nccl-tests does it.

``-b 8 -e 128M -f 2`` means 8 B, 16 B, ... 128 MiB. A suffix K, M or G (either case)
multiplies by 1024, 1024**2 or 1024**3; a fraction is allowed before it ("0.5M").
With a step factor of 1 the sizes grow by ``stepbytes`` instead (nccl-tests ``-i``).
"""

from __future__ import annotations

import re
from typing import List

_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: "str | int") -> int:
    """Bytes from "8", "1K", "256M", "1G", "0.5M" (binary units, like nccl-tests)."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r}: expected a number with an optional "
                         "K, M or G suffix, e.g. 8, 64K, 256M, 1G")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def format_size(nbytes: int) -> str:
    """Short human label: 8 B, 64 KiB, 256 MiB (exact powers only get a unit)."""
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def size_list(minbytes: int, maxbytes: int, stepfactor: int = 2,
              stepbytes: int = 1024 * 1024) -> List[int]:
    """The sizes nccl-tests sweeps: multiply by stepfactor, or add stepbytes if it is 1."""
    if minbytes < 1:
        raise ValueError(f"minbytes must be >= 1, got {minbytes}")
    if maxbytes < minbytes:
        raise ValueError(f"maxbytes ({maxbytes}) is smaller than minbytes ({minbytes})")
    if stepfactor < 1:
        raise ValueError(f"stepfactor must be >= 1, got {stepfactor}")
    if stepfactor == 1 and stepbytes < 1:
        raise ValueError(f"stepbytes must be >= 1 when stepfactor is 1, got {stepbytes}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size = size * stepfactor if stepfactor > 1 else size + stepbytes
    return sizes
