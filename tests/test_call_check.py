"""The one call check (csrc/comm/call_check.h) and the one algorithm chooser
(csrc/comm/chooser.h).

Every communicator (CPU, GPU over NCCL, GPU over cuda_ipc), the plan checker
and the Python layers run the same check; here each rule is tried through the
binding on every rank of a few world sizes (the root-only rules differ on the
root), and a CPU communicator of world size 1 is shown to raise the very
message the binding raises, so the two cannot drift apart. The chooser is
asked for every device: the CPU through Communicator.explain, the GPU devices
without a GPU.
"""
import numpy as np
import pytest
import torch.distributed as dist

import ringcomm
from ringcomm import _C
from ringcomm.config import make_config

F32, F64, I32 = 2, 3, 6
SUM, AVG, BAND = 0, 4, 5


def buf(count, dtype=F32, at=1 << 20):
    return (at, count, dtype)


def check(op, rank, world, out, inp=None, root=-1, redop=SUM):
    _C.check_call(op, rank, world, out, inp, root, redop)


def refused(exc, fragment, *args, **kw):
    with pytest.raises(exc) as e:
        check(*args, **kw)
    assert fragment in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_valid_calls_pass_on_every_rank(world):
    n = 6
    for r in range(world):
        check("all_reduce", r, world, buf(n))
        check("reduce_scatter", r, world, buf(n), buf(n * world, at=1 << 30))
        check("all_gather", r, world, buf(n * world), buf(n, at=1 << 30))
        # the in-place forms: this rank's block of the other buffer
        check("reduce_scatter", r, world, buf(n, at=(1 << 20) + r * n * 4), buf(n * world))
        check("all_gather", r, world, buf(n * world), buf(n, at=(1 << 20) + r * n * 4))
        check("all_to_all", r, world, buf(n * world), buf(n * world, at=1 << 30))
        for root in range(world):
            check("broadcast", r, world, buf(n), root=root)
            check("reduce", r, world, buf(n), root=root)
            # only the root's input (scatter) / output (gather) is looked at
            check("scatter", r, world, buf(n), buf(n * world, at=1 << 30) if r == root else None, root=root)
            check("gather", r, world, buf(n * world) if r == root else None, buf(n, at=1 << 30), root=root)
        check("barrier", r, world, None)
        if world > 1:
            check("send", r, world, buf(n), root=(r + 1) % world)
            check("recv", r, world, buf(n), root=(r + 1) % world)
            check("recv", r, world, buf(n), root=-1)  # any source


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rule_is_refused_with_the_argument_named(rank):
    w = 2
    refused(TypeError, "output has dtype float32 but input has dtype float64; they must match",
            "reduce_scatter", rank, w, buf(4), buf(8, F64, at=1 << 30))
    refused(TypeError, "they must match", "all_gather", rank, w, buf(8), buf(4, I32, at=1 << 30))
    refused(TypeError, "they must match", "all_to_all", rank, w, buf(8), buf(8, F64, at=1 << 30))
    refused(ValueError, "input must hold world_size * output elements (2 * 4 = 8), got 7",
            "reduce_scatter", rank, w, buf(4), buf(7, at=1 << 30))
    refused(ValueError, "output must hold world_size * input elements (2 * 4 = 8), got 9",
            "all_gather", rank, w, buf(9), buf(4, at=1 << 30))
    refused(ValueError, "must divide evenly by world size 2", "all_to_all", rank, w, buf(7), buf(7, at=1 << 30))
    refused(ValueError, "output and input must hold the same number of elements, got 8 and 6",
            "all_to_all", rank, w, buf(8), buf(6, at=1 << 30))
    refused(ValueError, "in-place is not supported", "all_to_all", rank, w, buf(8), buf(8, at=(1 << 20) + 4))
    other = 1 - rank
    refused(ValueError, f"output overlaps input but is not input's block of rank {rank}",
            "reduce_scatter", rank, w, buf(4, at=(1 << 20) + other * 16), buf(8))
    refused(ValueError, f"input overlaps output but is not output's block of rank {rank}",
            "all_gather", rank, w, buf(8), buf(4, at=(1 << 20) + other * 16))
    refused(ValueError, "tensor is required, got None", "all_reduce", rank, w, None)
    refused(ValueError, "input is required, got None", "reduce_scatter", rank, w, buf(4), None)
    refused(ValueError, "src 2 is out of range for a communicator of world size 2", "broadcast", rank, w, buf(4),
            root=2)
    refused(ValueError, "dst -1 is out of range", "reduce", rank, w, buf(4), root=-1)
    refused(ValueError, "src 5 is out of range", "scatter", rank, w, buf(4), buf(8, at=1 << 30), root=5)
    refused(ValueError, "dst 3 is out of range", "gather", rank, w, buf(8), buf(4, at=1 << 30), root=3)
    refused(ValueError, f"dst {rank} is this rank; send/recv need another rank", "send", rank, w, buf(4), root=rank)
    refused(ValueError, "src 7 is out of range", "recv", rank, w, buf(4), root=7)
    refused(ValueError, "reduce op band is not defined for float32", "all_reduce", rank, w, buf(4), redop=BAND)
    refused(ValueError, "invalid reduce op code 99", "all_reduce", rank, w, buf(4), redop=99)


def test_rooted_buffers_are_checked_on_the_root_only():
    w = 3
    # a wrong-sized input on a non-root rank of scatter is never read
    check("scatter", 1, w, buf(4), buf(5, at=1 << 30), root=0)
    refused(ValueError, "input must hold world_size * output elements (3 * 4 = 12), got 5",
            "scatter", 0, w, buf(4), buf(5, at=1 << 30), root=0)
    refused(ValueError, "input (on the src rank) is required", "scatter", 0, w, buf(4), None, root=0)
    check("gather", 2, w, None, buf(4, at=1 << 30), root=0)
    refused(ValueError, "output (on the dst rank) is required", "gather", 0, w, None, buf(4, at=1 << 30), root=0)
    refused(TypeError, "they must match", "gather", 0, w, buf(12, F64), buf(4, at=1 << 30), root=0)


def test_any_source_needs_a_peer():
    refused(ValueError, "no other rank to receive from", "recv", 0, 1, buf(4), root=-1)


def test_binding_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        check("allreduce", 0, 1, buf(4))
    with pytest.raises(ValueError, match="is not a DataType"):
        check("all_reduce", 0, 1, (0, 4, 42))
    with pytest.raises(TypeError):
        check("all_reduce", 0, 1, (0, 4))
    with pytest.raises(ValueError, match="rank 3 is out of range"):
        check("all_reduce", 3, 2, buf(4))
    _C.check_same_dtype("x", "float32", "float32")
    with pytest.raises(TypeError, match="x: output has dtype float32 but input has dtype int64; they must match"):
        _C.check_same_dtype("x", "float32", "int64")


@pytest.fixture
def comm(monkeypatch):
    for name in ("RINGCOMM_ALGO", "RINGCOMM_GPU_ALGO", "RINGCOMM_IPC_ALGO"):
        monkeypatch.delenv(name, raising=False)
    c = ringcomm.Communicator(dist.HashStore(), "callcheck", 0, 1, make_config(timeout=10))
    yield c
    c.close()


def _message(fn):
    with pytest.raises((TypeError, ValueError)) as e:
        fn()
    return type(e.value), str(e.value)


def test_the_communicator_raises_what_the_check_raises(comm):
    """A CPU call and the binding give the same exception and words: one rule, one place."""
    a = np.zeros(4, np.float32)
    b = np.zeros(5, np.float32)
    c64 = np.zeros(4, np.float64)
    ptr = lambda x: (x.ctypes.data, x.size, {np.float32: F32, np.float64: F64}[x.dtype.type])  # noqa: E731
    cases = [
        (lambda: comm.reduce_scatter(a, b), lambda: check("reduce_scatter", 0, 1, ptr(a), ptr(b))),
        (lambda: comm.all_gather(b, a), lambda: check("all_gather", 0, 1, ptr(b), ptr(a))),
        (lambda: comm.all_gather(c64, a), lambda: check("all_gather", 0, 1, ptr(c64), ptr(a))),
        (lambda: comm.broadcast(a, 1), lambda: check("broadcast", 0, 1, ptr(a), root=1)),
        (lambda: comm.reduce(a, 3), lambda: check("reduce", 0, 1, ptr(a), root=3)),
        (lambda: comm.send(a, 0), lambda: check("send", 0, 1, ptr(a), root=0)),
        (lambda: comm.recv(a), lambda: check("recv", 0, 1, ptr(a), root=-1)),
        (lambda: comm.all_to_all(a, a), lambda: check("all_to_all", 0, 1, ptr(a), ptr(a))),
    ]
    for call, binding in cases:
        assert _message(call) == _message(binding)


def test_explain_reads_the_chooser_on_every_device(comm, monkeypatch):
    cpu = comm.explain("all_reduce", 1 << 20)
    assert cpu and all(isinstance(t, float) for _, t in cpu)
    assert comm.explain("all_reduce", 1 << 20, device="nccl")[0][0] == "nccl"
    ipc = [name for name, _ in comm.explain("all_reduce", 1024, device="cuda_ipc")]
    assert ipc[0] == "oneshot" and set(ipc) == {"oneshot", "twoshot", "ring"}
    assert comm.explain("all_reduce", 1 << 30, device="cuda_ipc")[0][0] == "ring"
    assert comm.explain("broadcast", 1024, device="cuda_ipc") == [("ring", pytest.approx(float("nan"), nan_ok=True))]
    monkeypatch.setenv("RINGCOMM_GPU_ALGO", "ring")
    assert comm.explain("all_reduce", 1 << 20, device="nccl")[0][0] == "ring"
    with pytest.raises(ValueError, match="device must be one of"):
        comm.explain("all_reduce", 4, device="gpu")


def test_gpu_choice_per_device():
    ch = _C.choose_algo
    # NCCL: its own collective where it reduces alike, ringcomm's kernels where it does not
    assert ch("nccl", "all_reduce", 4, F32, SUM) == "nccl"
    assert ch("nccl", "all_reduce", 4, F32, 3) == "ring"  # MAX: NCCL drops NaN
    assert ch("nccl", "all_gather", 4, F32) == "nccl"
    assert ch("nccl", "all_reduce", 4, F32, SUM, algo="ring") == "ring"
    # cuda_ipc: one-shot, two-shot, ring by size and thresholds; forced protocols bounded by the stage
    kw = dict(one_shot_max=1024, two_shot_max=16384, stage_bytes=65536)
    assert [ch("cuda_ipc", "all_reduce", b, F32, **kw) for b in (0, 1024, 1025, 16384, 16385)] == \
        ["oneshot", "oneshot", "twoshot", "twoshot", "ring"]
    assert ch("cuda_ipc", "all_reduce", 16385, F32, algo="oneshot", **kw) == "oneshot"
    assert ch("cuda_ipc", "all_reduce", 4, F32, configured="ring", **kw) == "ring"
    with pytest.raises(ValueError, match="exceeds the IPC stage of 65536 bytes"):
        ch("cuda_ipc", "all_reduce", 65537, F32, algo="twoshot", **kw)
    with pytest.raises(ValueError, match="is an all_reduce protocol"):
        ch("cuda_ipc", "broadcast", 4, F32, algo="oneshot", **kw)
    assert ch("cuda_ipc", "reduce_scatter", 4, F32, **kw) == "ring"
    with pytest.raises(ValueError, match="needs the communicator's cost model"):
        ch("cpu", "all_reduce", 4, F32)


def test_algorithm_names_are_parsed_once():
    assert _C.parse_algo("cpu", "bruck", "RINGCOMM_ALGO") == "bruck"
    assert _C.parse_algo("nccl", "", "RINGCOMM_GPU_ALGO") == "auto"
    with pytest.raises(ValueError, match="RINGCOMM_GPU_ALGO='tree' is not one of auto, nccl, ring"):
        _C.parse_algo("nccl", "tree", "RINGCOMM_GPU_ALGO")
    with pytest.raises(ValueError, match="RINGCOMM_IPC_ALGO='nccl' is not one of auto, oneshot, twoshot, ring"):
        _C.parse_algo("cuda_ipc", "nccl", "RINGCOMM_IPC_ALGO")
    with pytest.raises(ValueError, match="RINGCOMM_ALGO='nccl' is not one of"):
        _C.parse_algo("cpu", "nccl", "RINGCOMM_ALGO")
    with pytest.raises(ValueError, match="not one of auto, nccl, ring"):
        _C.parse_gpu_call_algo("bruck")


def test_cpu_refuses_gpu_algorithm_names(monkeypatch):
    monkeypatch.setenv("RINGCOMM_ALGO", "nccl")
    with pytest.raises(ValueError, match="runs on GPU buffers only"):
        ringcomm.Communicator(dist.HashStore(), "gpuname", 0, 1, make_config(timeout=10))
