"""The marks every GPU test module carries: skipped, with the reason, where this
build has no GPU path, ringcomm sees no device, or torch has no CUDA."""

import pytest

import ringcomm


def gpu_marks(torch):
    return [
        pytest.mark.cuda,
        pytest.mark.skipif(not ringcomm.cuda.compiled(),
                           reason="this build has no GPU path (no CUDA toolkit at build time)"),
        pytest.mark.skipif(not ringcomm.cuda.available(), reason="no CUDA device (ringcomm sees none)"),
        pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA"),
    ]
