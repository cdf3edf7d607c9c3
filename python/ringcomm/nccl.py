"""NCCL for the GPU path: whether the GPU path is compiled in and can run here,
loading libnccl.so.2 (the copy torch loaded, else an nvidia-nccl wheel's, else the
system's, or RINGCOMM_NCCL_LIBRARY: csrc/transport/nccl/nccl_lib.cpp), and the settings
and unique id rank 0 hands every rank of one NCCL communicator."""
import json
import os

from ringcomm import _C, bootstrap
from ringcomm.errors import RingcommError


def compiled():
    """Whether this build has the GPU path."""
    return hasattr(_C, "GpuCommunicator")


def available():
    """Whether the GPU path can run here: compiled in, and a CUDA device present."""
    return compiled() and _C.cuda_device_count() > 0


def _nccl_search_paths():
    """libnccl.so.2 of installed nvidia-nccl-cu13 / -cu12 wheels (namespace package nvidia.nccl)."""
    import importlib.util

    paths = []
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations if spec else None) or []:
        lib = os.path.join(loc, "lib", "libnccl.so.2")
        if os.path.exists(lib):
            paths.append(lib)
    return paths


_nccl_paths_set = False


def nccl_version():
    """(version, path) of the NCCL library the GPU path uses (loads it)."""
    global _nccl_paths_set
    if not compiled():
        raise RingcommError("ringcomm: this build has no GPU path (no CUDA toolkit at build time)")
    if not _nccl_paths_set:
        _C.nccl_set_search_paths(_nccl_search_paths())
        _nccl_paths_set = True
    return _C.nccl_version()


def _known_algo(device, name):
    """Whether `name` (a value read from the store) is an algorithm `device` runs."""
    try:
        _C.parse_algo(device, name, "algo")
    except (TypeError, ValueError):
        return False
    return True


def agree_settings(store, key, rank, timeout_s, mine, make_uid):
    """The settings every rank of one NCCL communicator uses: rank 0's `mine` (its
    RINGCOMM_GPU_CHUNK_BYTES and RINGCOMM_GPU_ALGO) and a unique id from rank 0's
    `make_uid()`, through `store` under `key`. Ranks that cut the ring's messages
    differently, or ran different families, would wait on each other until the
    watchdog fired."""
    if rank == 0:
        store.set(key, json.dumps({**mine, "uid": make_uid()}))
    bootstrap.wait_keys(store, [key], timeout_s, "waiting for rank 0's NCCL unique id and GPU settings", rank)
    shared = json.loads(bootstrap._text(store.get(key)))
    chunk, algo = shared.get("chunk"), shared.get("algo")
    if not isinstance(chunk, int) or not _known_algo("nccl", algo) or not isinstance(shared.get("uid"), str):
        raise RingcommError(f"ringcomm: rank 0's GPU settings under {key!r} are not what this rank expects "
                            f"(got {sorted(shared)}); do all ranks run the same ringcomm version?")
    return shared
