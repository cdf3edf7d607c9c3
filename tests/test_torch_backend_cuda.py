"""CUDA tensors through the "ringcomm" torch.distributed backend (needs a GPU).

The backend registers for "cpu" and "cuda"; CUDA tensors go to ringcomm's GPU
path with the stream semantics of torch's NCCL backend: a call is ordered
after the work already queued on the current stream, a blocking call makes
the current stream wait for it (the host does not), and `Work.wait()` of an
async call makes the current stream wait. Results are compared with gloo on
CPU copies of the same inputs. World size 1 runs over NCCL; world size 2 on
one GPU over cuda_ipc (NCCL refuses two ranks on one GPU), on two over NCCL.

The plumbing that needs no GPU (registration, device lookups, the routing of
tensors by device) is checked in test_torch_backend_lookups.py.
"""
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

import harness  # noqa: E402
from gpu_marks import gpu_marks  # noqa: E402

pytestmark = gpu_marks(torch)


def _cases(_comm):
    import torch.distributed as dist

    import ringcomm.torch_backend  # noqa: F401

    ctx = harness.context()
    rank, ws = ctx.rank, ctx.world_size
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("ringcomm", store=ctx.store, rank=rank, world_size=ws, timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    fails = []

    def same(name, got, want):
        got = got.cpu()
        if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
            fails.append(f"{name}: got {got.flatten()[:6].tolist()}, gloo {want.flatten()[:6].tolist()}")

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        base = (torch.arange(1000) % 7 - 3 + rank).to(dtype)
        want = base.clone()
        dist.all_reduce(want, group=gloo)
        # Ordered after the current stream's work: the fill runs behind a long kernel.
        x = torch.empty(1000, dtype=dtype, device=dev)
        torch.cuda._sleep(50_000_000)
        x.copy_(base, non_blocking=True)
        dist.all_reduce(x)
        same(f"all_reduce {dtype} after queued work", x, want)
        # async: the current stream waits in wait(); the host did not.
        y = base.to(dev)
        w = dist.all_reduce(y, async_op=True)
        w.wait()
        y.add_(1)
        same(f"all_reduce {dtype} async then add", y, want + 1)
        torch.cuda.synchronize()
        if not w.is_completed():
            fails.append(f"all_reduce {dtype}: is_completed() False after synchronize")

    src = torch.arange(12, dtype=torch.float32) + 100 * rank
    outs_want = [torch.empty(12) for _ in range(ws)]
    dist.all_gather(outs_want, src, group=gloo)
    outs = [torch.empty(12, device=dev) for _ in range(ws)]
    w = dist.all_gather(outs, src.to(dev), async_op=True)
    w.wait()
    for r in range(ws):
        same(f"all_gather list [{r}]", outs[r], outs_want[r])
    flat = torch.empty(12 * ws, device=dev)
    dist.all_gather_into_tensor(flat, src.to(dev))
    same("all_gather_into_tensor", flat, torch.cat(outs_want))
    big = torch.arange(4 * ws, dtype=torch.float32) * (rank + 1)
    rs_want = torch.empty(4)
    dist.reduce_scatter_tensor(rs_want, big, group=gloo)
    rs = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(rs, big.to(dev))
    same("reduce_scatter_tensor", rs, rs_want)
    b = (torch.arange(6, dtype=torch.float32) + rank).to(dev)
    dist.broadcast(b, 0)
    same("broadcast", b, torch.arange(6, dtype=torch.float32))
    # Non-contiguous: staged on the device and copied back on the current stream.
    nc = (torch.arange(20, dtype=torch.float32).view(4, 5) + rank).to(dev).t()
    nc_want = (torch.arange(20, dtype=torch.float32).view(4, 5) + rank).t().contiguous()
    dist.all_reduce(nc_want, group=gloo)
    dist.all_reduce(nc)
    same("all_reduce non-contiguous", nc, nc_want)
    dist.barrier()
    dist.destroy_process_group()
    return fails


@pytest.mark.parametrize("world_size", (1, 2))
def test_cuda_tensors_through_the_backend(world_size):
    # With fewer GPUs than ranks, ranks share a GPU: ringcomm's GPU path then
    # takes its cuda_ipc transport (NCCL refuses two ranks on one GPU).
    harness.assert_no_failures(harness.run_ranks(_cases, world_size, (), init=False, hard_timeout=180))
