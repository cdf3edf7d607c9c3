"""The cuda_ipc transport on a real GPU: 2, 3 and 4 ranks on the ONE GPU (which NCCL
refuses), every primitive x dtype x op through the schedules against numpy references,
all_reduce under one-shot, two-shot and the ring bit-identical on every rank, a CUDA
graph capture refused with a clear error, and an abort that reaches a rank spinning
in a wait kernel. Skips without a GPU; scripts/gpu_check.sh runs it. The protocol's
logic is tested without a GPU over the host stand-in (tests/test_cuda_ipc.py)."""

import time

import numpy as np
import pytest

import checks
import harness

torch = pytest.importorskip("torch")

from gpu_marks import gpu_marks  # noqa: E402

pytestmark = gpu_marks(torch)

# Ranks sharing a GPU are time-sliced by the driver (every hand-off between ranks may
# wait for a time slice), so worlds 3 and 4 check fewer sizes.
COUNTS = {2: (0, 1, 7, 1000, 70001), 3: (7, 4099), 4: (0, 7, 4099)}
ENV = {"RINGCOMM_IPC_STAGE_BYTES": 1 << 20, "RINGCOMM_IPC_ONESHOT_MAX_BYTES": 4096,
       "RINGCOMM_IPC_TWOSHOT_MAX_BYTES": 1 << 20, "RINGCOMM_GPU_CHUNK_BYTES": 65536}


class GpuCall:
    """checks._case_*'s `call`: the case's CPU buffers go to cuda:0, the call runs
    there, the results come back into the CPU buffers."""

    def __init__(self, comm):
        self.comm = comm

    def op(self, name):
        return name

    def __call__(self, prim, *args, **kw):
        dev = torch.device("cuda", 0)
        moved = []
        for a in args:
            if a is None:
                moved.append(None)
            elif isinstance(a, np.ndarray):
                moved.append(torch.from_numpy(np.ascontiguousarray(a)).to(dev))
            else:
                moved.append(a.contiguous().to(dev))
        getattr(self.comm, prim)(*moved, **kw)
        torch.cuda.synchronize(dev)
        for a, g in zip(args, moved):
            if a is None:
                continue
            if isinstance(a, np.ndarray):
                a[...] = g.cpu().numpy().reshape(a.shape)
            else:
                a.copy_(g.cpu().reshape(a.shape))
        return "gpu cuda_ipc"


def _matrix(comm, want_transport):
    fails = []
    call = GpuCall(comm)
    ws, i = comm.world_size, 0
    torch.cuda.set_device(0)
    # The first GPU call creates the native communicator and picks the transport.
    x = torch.ones(8, device="cuda")
    comm.all_reduce(x)
    got = comm.gpu_transport(0)
    if got != want_transport:
        return [f"GPU calls run over {got}, expected {want_transport}"]
    for prim in checks.PRIMITIVES:
        for dtype in checks.DTYPES:
            for op in (checks.ops_for(dtype) if prim in checks.REDUCING else (None,)):
                for n in COUNTS[ws]:
                    if n > 10000 and dtype not in ("float32", "int64", "bfloat16"):
                        continue
                    i += 1
                    conts = checks.containers_for(dtype)
                    cont, variant, root = conts[i % len(conts)], i // 2, (i // 3) % ws
                    seed = checks.seed_of("gpu-ipc", prim, dtype, op, n, i)
                    desc = f"{prim} {dtype} {op} n={n} root={root}"
                    try:
                        err = checks.run_primitive_case(comm, prim, call, dtype, op, n, cont, variant, seed, root,
                                                           False)
                    except Exception as e:  # noqa: BLE001
                        fails.append(f"{desc}: raised {type(e).__name__}: {checks.first_line(e)}")
                        return fails
                    if err:
                        fails.append(f"{desc}: {err}")
    # send/recv around the ring on the GPU
    r = comm.rank
    for n in (1, 1000, 300007):
        a = torch.arange(n, device="cuda", dtype=torch.int32) + r
        b = torch.full((n,), -1, device="cuda", dtype=torch.int32)
        comm.sendrecv(a, (r + 1) % ws, b, (r - 1) % ws)
        torch.cuda.synchronize()
        if not torch.equal(b.cpu(), torch.arange(n, dtype=torch.int32) + (r - 1) % ws):
            fails.append(f"sendrecv of {n} int32 from rank {(r - 1) % ws}: wrong data")
    return fails


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_sharing_one_gpu_every_primitive(world):
    """world 2 leaves the transport to auto (two ranks on one GPU: cuda_ipc by itself);
    3 and 4 choose it with RINGCOMM_TRANSPORT."""
    env = dict(ENV)
    if world != 2:
        env["RINGCOMM_TRANSPORT"] = "cuda_ipc"
    results = harness.run_ranks(_matrix, world, ("cuda_ipc",), env=env, hard_timeout=150, comm_timeout=60)
    harness.assert_no_failures(results)


def _bits(comm):
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(7 + comm.rank)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in (2, 1001, 65536):
            base = torch.randn(n, generator=g).to(dtype)
            for algo in ("oneshot", "twoshot", "ring"):
                x = base.cuda()
                comm.all_reduce(x, algo=algo)
                torch.cuda.synchronize()
                out[f"{dtype}/{n}/{algo}"] = x.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32) \
                    .numpy().tobytes().hex()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_one_shot_two_shot_and_ring_bit_identical_across_ranks(world):
    results = harness.run_ranks(_bits, world, env={**ENV, "RINGCOMM_TRANSPORT": "cuda_ipc"}, hard_timeout=120,
                                comm_timeout=60)
    fails = []
    for key in results[0]:
        for r in range(1, world):
            if results[r][key] != results[0][key]:
                fails.append(f"{key}: rank {r} differs from rank 0")
        if key.endswith("/oneshot") and results[0][key] != results[0][key.replace("oneshot", "twoshot")]:
            fails.append(f"{key}: one-shot and two-shot differ")
    assert not fails, fails[:20]


def _graph_refused_and_abort(comm):
    import ringcomm

    torch.cuda.set_device(0)
    x = torch.ones(1024, device="cuda")
    comm.all_reduce(x)
    out = {}
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            comm.all_reduce(x)
        out["graph"] = "captured"
    except Exception as e:  # noqa: BLE001
        out["graph"] = f"{type(e).__name__}: {e}"
    # The communicator still works after the refusal.
    x.fill_(1)
    comm.all_reduce(x)
    torch.cuda.synchronize()
    out["after_graph"] = float(x[0])
    # Rank 0 waits in a call rank 1 never makes; rank 0 aborts it from the host.
    ctx = harness.context()
    if comm.rank == 0:
        w = comm.all_reduce(x, async_op=True)
        time.sleep(0.5)
        t = time.monotonic()
        comm.abort()
        try:
            w.synchronize(timeout=20)
            out["abort"] = "completed"
        except ringcomm.RingcommError as e:
            out["abort"] = f"{type(e).__name__}: {e}"
        out["abort_s"] = time.monotonic() - t
        ctx.store.set("aborted", "1")
    else:
        ctx.store.wait(["aborted"])
    return out


def test_graph_capture_is_refused_and_abort_stops_a_spinning_wait():
    r0, r1 = harness.run_ranks(_graph_refused_and_abort, 2, env={**ENV, "RINGCOMM_TRANSPORT": "cuda_ipc"},
                               hard_timeout=120, comm_timeout=30)
    for r in (r0, r1):
        assert "cannot be captured into a CUDA graph" in r["graph"], r
        assert r["after_graph"] == 2.0, r
    assert r0["abort"] != "completed" and r0["abort_s"] < 10, r0
