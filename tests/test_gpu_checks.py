"""What a world-size-1 GPU run of tests/test_gpu.py does not reach, for the one-shot GPU
check (scripts/gpu_check.sh): a real NCCL point-to-point group (self send/recv), graph
capture of the whole ring family, counts above 2**31 elements, mixed alignments of dst / a
/ b (NaN on either side included), and the GPU family rule of csrc/comm/chooser.h on a
real communicator. (The watchdog, close with the last reference in flight and a capture
beside a pending op are tests/test_gpu.py's.) Everything needs a CUDA GPU and skips with
the reason otherwise.
"""

import numpy as np
import pytest

import ringcomm
from ringcomm import ReduceOp, _C

from gpu_marks import gpu_marks

torch = pytest.importorskip("torch")

pytestmark = gpu_marks(torch)

CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3, torch.int8: 4,
         torch.uint8: 5, torch.int32: 6, torch.int64: 7, torch.bool: 8}


@pytest.fixture(scope="module")
def comm():
    from torch.distributed import HashStore

    c = ringcomm.init(rank=0, world_size=1, store=HashStore())
    yield c
    c.close()


def _native(comm):
    return comm._gpu().native(0)


def _stream():
    return torch.cuda.current_stream().cuda_stream


# ------------------------------------------------ a real NCCL group, world size 1

def test_nccl_self_send_recv_group(comm):
    """GpuCommunicator::sendrecv to and from rank 0 itself: the one NCCL point-to-point
    group a single GPU can make (the public send/recv refuse self as the peer)."""
    native = _native(comm)
    for dtype in (torch.float32, torch.int8, torch.bfloat16):
        for n in (1, 1000, (1 << 24) + 3):
            src = (torch.arange(n, device="cuda") % 101).to(dtype)
            dst = torch.zeros(n, dtype=dtype, device="cuda")
            w = native.sendrecv(src.data_ptr(), n, CODES[dtype], 0, dst.data_ptr(), n, CODES[dtype], 0, _stream())
            w.synchronize()
            assert torch.equal(dst, src), f"self send/recv {dtype} n={n}"
    assert native.async_error() == ""


# ------------------------------------------------- graph capture of the ring family

def test_ring_family_in_a_cuda_graph(comm):
    """Every collective of the ring family captured into one graph (ops that only
    move data at world size 1 are device copies; AVG runs the divide kernel), replayed
    with new inputs, with eager ring calls between the replays (the captured calls
    have scratch of their own)."""
    dev = torch.device("cuda", 0)
    n = (1 << 18) + 5
    x = torch.zeros(n, device=dev)
    m = torch.zeros(n, device=dev)
    gathered = torch.zeros(n, device=dev)
    scattered = torch.zeros(n, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        comm.all_reduce(x, algo="ring")  # warm up outside the capture
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_reduce(x, op=ReduceOp.AVG, algo="ring")
        comm.all_reduce(m, op=ReduceOp.MAX)  # auto: the ring family for float MAX
        comm.all_gather(gathered, x, algo="ring")
        comm.reduce_scatter(scattered, gathered, op=ReduceOp.SUM, algo="ring")
        comm.broadcast(scattered, 0, algo="ring")
        comm.reduce(scattered, 0, op=ReduceOp.SUM, algo="ring")
    eager = torch.zeros(n, device=dev)
    for i in range(3):
        x.copy_(torch.arange(n, device=dev) + i)
        m.fill_(float("nan") if i == 1 else i)
        g.replay()
        eager.fill_(i)
        comm.all_gather(torch.empty_like(eager), eager, algo="ring")
        torch.cuda.synchronize(dev)
        want = torch.arange(n, device=dev, dtype=torch.float32) + i
        assert torch.equal(x, want) and torch.equal(gathered, want) and torch.equal(scattered, want), f"replay {i}"
        assert bool(torch.isnan(m).all()) if i == 1 else bool((m == i).all()), f"replay {i}: MAX"
    assert _native(comm).async_error() == ""


# --------------------------------------------------------- counts above 2**31

@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_counts_above_2_to_the_31(comm, dtype):
    """2**31 + 4099 one-byte elements (indices past int32): the reduce and divide
    kernels, aligned (16-byte vectors) and misaligned (every element the scalar way),
    against torch; then the communicator's all_reduce and all_gather of that count."""
    n = (1 << 31) + 4099
    code = CODES[dtype]
    lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256)
    base_a = torch.randint(lo, hi, (n + 1,), dtype=dtype, device="cuda")
    base_b = torch.randint(lo, hi, (n + 1,), dtype=dtype, device="cuda")
    dst = torch.empty(n + 1, dtype=dtype, device="cuda")
    for off in (0, 1):
        a, b, d = base_a[off:off + n], base_b[off:off + n], dst[off:off + n]
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BXOR, ReduceOp.AVG):
            _C.cuda_local_reduce(d.data_ptr(), a.data_ptr(), b.data_ptr(), n, code, int(op), 3, _stream())
            if op == ReduceOp.SUM:
                want = a + b  # wraps, like ringcomm's
            elif op == ReduceOp.MAX:
                want = torch.maximum(a, b)
            elif op == ReduceOp.BXOR:
                want = torch.bitwise_xor(a, b)
            else:  # the wrapped sum, then C division (toward zero) by 3
                want = torch.div((a + b).to(torch.int16), 3, rounding_mode="trunc").to(dtype)
            assert torch.equal(d, want), f"{dtype} {op.name} offset {off}"
            del want
    del base_a, base_b, dst
    torch.cuda.empty_cache()
    x = torch.randint(lo, hi, (n,), dtype=dtype, device="cuda")
    keep = x.clone()
    for algo in ("ring", "nccl"):
        comm.all_reduce(x, op=ReduceOp.SUM, algo=algo)
        assert torch.equal(x, keep), f"all_reduce {algo}"  # world size 1: the input
        out = torch.empty_like(x)
        comm.all_gather(out, x, algo=algo)
        assert torch.equal(out, keep), f"all_gather {algo}"
        del out
    torch.cuda.synchronize()


# ------------------------------------------------ mixed alignments, NaN either side

def _special_pairs(n, dtype, seed):
    """n elements per operand from a grid of NaN, infinities, zeros of both signs and
    numbers, so that NaN meets every value on either side."""
    vals = torch.tensor([float("nan"), 1.0, -2.5, 0.0, -0.0, float("inf"), float("-inf"), 3.0])
    g = torch.Generator().manual_seed(seed)
    ia = torch.randint(0, len(vals), (n,), generator=g)
    ib = torch.randint(0, len(vals), (n,), generator=g)
    return vals[ia].to(dtype), vals[ib].to(dtype)


def _same(a, b):
    """Equal values (NaN equal to NaN, -0.0 to 0.0 alike: MIN/MAX of zeros is not
    fixed by the semantics), exact for integers."""
    a, b = a.cpu(), b.cpu()
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


@pytest.mark.parametrize("offsets", [(0, 1, 0), (1, 0, 2), (3, 0, 0), (0, 0, 5), (7, 7, 3), (2, 2, 2)],
                         ids=lambda o: "dst%d-a%d-b%d" % o)
def test_mixed_alignments(offsets):
    """dst, a and b at different element offsets (so their 16-byte phases differ and
    the kernel must go element by element), every dtype x op, with NaN on either side
    for the floating types: against the CPU kernels (tests/test_nan.py shows those
    propagate NaN)."""
    od, oa, ob = offsets
    stream = _stream()
    fails = []
    for dtype, code in CODES.items():
        for op in ReduceOp:
            if not _C.reduce_op_supported(code, int(op)):
                continue
            for n in (1, 15, 1000, 100003):
                if dtype.is_floating_point:
                    a, b = _special_pairs(n, dtype, n + code)
                else:
                    info = torch.iinfo(dtype) if dtype != torch.bool else None
                    g = torch.Generator().manual_seed(n + code)
                    if info is None:
                        a, b = (torch.randint(0, 2, (n,), generator=g).bool() for _ in range(2))
                    else:
                        a, b = (torch.randint(max(info.min, -(2 ** 31)), min(info.max, 2 ** 31 - 1), (n,),
                                              generator=g, dtype=torch.int64).to(dtype) for _ in range(2))
                want = torch.empty_like(a)
                _C.local_reduce(want, a, b, int(op), 3)
                ga = torch.empty(n + oa, dtype=dtype, device="cuda")[oa:]
                gb = torch.empty(n + ob, dtype=dtype, device="cuda")[ob:]
                gd = torch.empty(n + od, dtype=dtype, device="cuda")[od:]
                ga.copy_(a)
                gb.copy_(b)
                _C.cuda_local_reduce(gd.data_ptr(), ga.data_ptr(), gb.data_ptr(), n, code, int(op), 3, stream)
                # b op a: NaN-ness must not depend on the order.
                swapped = torch.empty_like(gd)
                _C.cuda_local_reduce(swapped.data_ptr(), gb.data_ptr(), ga.data_ptr(), n, code, int(op), 3, stream)
                torch.cuda.synchronize()
                if not _same(gd, want):
                    fails.append(f"{dtype} {op.name} n={n}")
                if dtype.is_floating_point and not torch.equal(torch.isnan(gd), torch.isnan(swapped)):
                    fails.append(f"{dtype} {op.name} n={n}: NaN differs between a op b and b op a")
    assert not fails, f"offsets {offsets}: " + "; ".join(fails[:20])


def test_gpu_family_choice_on_a_real_communicator(comm):
    """The rule of comm/chooser.h as the GPU communicator applies it."""
    native = _native(comm)
    for code in (0, 1, 2, 3):
        for op in (ReduceOp.MIN, ReduceOp.MAX):
            assert native.choose("all_reduce", 64, code, int(op)) == "ring"
            with pytest.raises(ValueError, match="drops NaN"):
                native.choose("all_reduce", 64, code, int(op), algo="nccl")
        assert native.choose("all_reduce", 64, code, int(ReduceOp.SUM)) == "nccl"
        assert native.explain("all_reduce", 64, code, int(ReduceOp.SUM))[0][0] == "nccl"
    x = torch.tensor([1.0, float("nan"), 3.0], device="cuda")
    comm.all_reduce(x, op=ReduceOp.MAX)
    assert bool(torch.isnan(x[1])) and x[0] == 1 and x[2] == 3
    with pytest.raises(ValueError, match="drops NaN"):
        comm.all_reduce(x, op=ReduceOp.MAX, algo="nccl")
    np.testing.assert_array_equal(x.cpu().numpy()[[0, 2]], [1.0, 3.0])
