"""Which transport GPU calls run over (ringcomm/cuda_ipc.py pick_gpu_transport), the
cuda_ipc settings' checks, and that transport="cuda_ipc" leaves CPU buffers on the
CPU transports. No GPU needed."""

import numpy as np
import pytest

import harness
import ringcomm
from ringcomm import cuda_ipc
from ringcomm.errors import RingcommError


def _infos(*pairs):
    return [{"host": h, "gpu": g} for h, g in pairs]


def test_nccl_unless_ranks_share_a_gpu():
    assert cuda_ipc.pick_gpu_transport("auto", _infos(("a", "0"), ("a", "1"))) == "nccl"
    assert cuda_ipc.pick_gpu_transport("auto", _infos(("a", "0"), ("b", "0"))) == "nccl"  # other hosts
    assert cuda_ipc.pick_gpu_transport("auto", _infos(("a", "0"), ("a", "1"), ("a", "0"))) == "cuda_ipc"
    assert cuda_ipc.pick_gpu_transport("shm", _infos(("a", "0"), ("a", "0"))) == "cuda_ipc"
    with pytest.raises(RingcommError, match="ranks 0 and 2 share one GPU"):
        cuda_ipc.pick_gpu_transport("auto", _infos(("a", "0"), ("b", "0"), ("a", "0")))


def test_cuda_ipc_by_choice_on_one_host_only():
    assert cuda_ipc.pick_gpu_transport("cuda_ipc", _infos(("a", "0"), ("a", "1"))) == "cuda_ipc"
    assert cuda_ipc.pick_gpu_transport("cuda_ipc", _infos(("a", "0"),)) == "cuda_ipc"
    with pytest.raises(RingcommError, match="reaches the ranks of one host"):
        cuda_ipc.pick_gpu_transport("cuda_ipc", _infos(("a", "0"), ("b", "1")))


@pytest.mark.parametrize("var,value,says", [
    ("RINGCOMM_IPC_SLOT_BYTES", "100", "multiple of 64"),
    ("RINGCOMM_IPC_STAGE_BYTES", "x", "not an integer"),
    ("RINGCOMM_IPC_NSLOTS", "0", "between 1 and 64"),
    ("RINGCOMM_IPC_ONESHOT_MAX_BYTES", "-1", "must not be negative"),
])
def test_bad_settings_name_the_variable(monkeypatch, var, value, says):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=says) as ei:
        cuda_ipc.settings()
    assert var in str(ei.value)


def test_transport_cuda_ipc_is_accepted_and_others_are_refused():
    assert ringcomm.config.make_config(transport="cuda_ipc").transport == "cuda_ipc"
    with pytest.raises(ValueError, match="transport"):
        ringcomm.config.make_config(transport="cuda-ipc")


def _cpu_buffers_under_cuda_ipc(comm):
    x = np.arange(1000, dtype=np.float32) + comm.rank
    comm.all_reduce(x)
    ws = comm.world_size
    return bool(np.array_equal(x, np.arange(1000, dtype=np.float32) * ws + sum(range(ws)))), comm.transports


def test_cpu_buffers_under_transport_cuda_ipc_go_over_shared_memory():
    results = harness.run_ranks(_cpu_buffers_under_cuda_ipc, 3, env={"RINGCOMM_TRANSPORT": "cuda_ipc"},
                                hard_timeout=60)
    for r, (ok, transports) in enumerate(results):
        assert ok, f"rank {r}: wrong all_reduce result"
        assert [t for i, t in enumerate(transports) if i != r] == ["shm", "shm"], transports
