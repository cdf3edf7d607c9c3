"""The memory kernels alone, in this process (no ranks): the streaming copy large
messages are received with."""

import numpy as np
import pytest

from ringcomm import _C


@pytest.mark.parametrize("dst_off,src_off", [(0, 0), (3, 3), (1, 0), (0, 7), (15, 9), (64, 48)])
def test_copy_streaming_any_alignment(dst_off, src_off):
    rng = np.random.default_rng(dst_off * 100 + src_off)
    for n in (0, 1, 15, 16, 63, 64, 65, 1000, 4096 + 17, (1 << 20) + 5):
        src_base = rng.integers(0, 256, n + 128, dtype=np.uint8)
        dst_base = np.full(n + 128, 0xAB, np.uint8)
        src = src_base[src_off:src_off + n]
        dst = dst_base[dst_off:dst_off + n]
        _C.copy_streaming(dst, src)
        assert np.array_equal(dst, src), (n, dst_off, src_off)
        # Nothing outside the destination is touched.
        assert (dst_base[:dst_off] == 0xAB).all() and (dst_base[dst_off + n:] == 0xAB).all()


def test_copy_streaming_checks_sizes():
    with pytest.raises(ValueError):
        _C.copy_streaming(np.zeros(4, np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(ValueError):
        _C.copy_streaming(np.zeros(4, np.uint8)[:0].reshape(0), np.zeros(1, np.uint8))
