"""ringcomm's ZeroDataParallel side by side with torch's ZeroRedundancyOptimizer (ZeRO-1,
with DDP) and FSDP2 (fully_shard, ZeRO-3), over the ringcomm torch backend and over gloo.

    python benchmarks/zero_compare.py                 # world 2, 4 x Linear(1024, 1024)
    python benchmarks/zero_compare.py --world 4 --steps 20

Every rank builds the same model (same seed) and trains it with AdamW on its rows of the
same global batches; every row of the table must give the same losses (the largest
relative difference from the first row is printed). Step time: forward + backward +
optimizer step, the slowest rank's, median over the steps after --warmup (a barrier
starts each). Peak tensor memory: bytes held in the implementation's tensors before a
step (parameters, gradients, optimizer state; ZeroDataParallel.memory_bytes()) plus the
largest rise during one profiled step, from the profiler's allocation events
(torch.profiler, profile_memory=True): what the c10 allocator gave out, per rank, max
over ranks (the profiler does not see frees of blocks allocated before the profiled step
began, so the rise is an upper bound). Not a test: timings on a shared machine are noisy.
"""
import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta

ROWS = (("ringcomm ZeroDataParallel stage 1", "native", "z1"),
        ("ringcomm ZeroDataParallel stage 2", "native", "z2"),
        ("ringcomm ZeroDataParallel stage 3", "native", "z3"),
        ("torch DDP + ZeroRedundancyOptimizer", "pg", "zro"),
        ("torch FSDP2 fully_shard", "pg", "fsdp2"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(cfg):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    layers = []
    for _ in range(cfg["layers"]):
        layers += [nn.Linear(cfg["width"], cfg["width"]), nn.Tanh()]
    return nn.Sequential(*layers)


def _held_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = getattr(t, "_local_tensor", t)  # a DTensor holds its shard
        s = local.untyped_storage()
        if s.data_ptr() not in seen and s.nbytes():
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def _build(kind, comm, cfg):
    """(callable model, step(), zero_grad(), held-bytes())."""
    import torch
    import torch.distributed as dist

    model = _model(cfg)
    lr = cfg["lr"]
    if kind in ("z1", "z2", "z3"):
        from ringcomm.parallel import ZeroDataParallel

        z = ZeroDataParallel(model, comm, stage=int(kind[1]), optimizer_class=torch.optim.AdamW, lr=lr,
                             bucket_cap_mb=cfg["bucket_mb"])
        return z, z.step, lambda: z.zero_grad(set_to_none=True), lambda: z.memory_bytes()["total"]
    if kind == "zro":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, gradient_as_bucket_view=True, bucket_cap_mb=cfg["bucket_mb"])
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)

        def held():
            state = [v for st in opt.optim.state.values() for v in st.values() if torch.is_tensor(v)]
            return _held_bytes([p for p in model.parameters()] + [p.grad for p in model.parameters()]
                               + state)
        return ddp, opt.step, lambda: opt.zero_grad(set_to_none=False), held
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)

        def held():
            state = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
            return _held_bytes([p for p in model.parameters()] + [p.grad for p in model.parameters()]
                               + state)
        return model, opt.step, lambda: opt.zero_grad(set_to_none=True), held
    raise ValueError(kind)


def _peak_rise(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def _rank_main(rank, world, port, backend, kinds, cfg, q):
    try:
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        import ringcomm
        import ringcomm.torch_backend  # noqa: F401  registers "ringcomm"

        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=300))
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world)
        comm = ringcomm.init(rank=rank, world_size=world, store=dist.PrefixStore("native", store),
                             timeout=120.0)
        g = torch.Generator().manual_seed(1)
        rows = cfg["batch"] * world
        data = [(torch.randn(rows, cfg["width"], generator=g), torch.randn(rows, cfg["width"], generator=g))
                for _ in range(cfg["steps"])]
        mine = slice(rank * cfg["batch"], (rank + 1) * cfg["batch"])
        out = {}
        for kind in kinds:
            model, step, zero_grad, held = _build(kind, comm, cfg)
            losses, times, peak = [], [], None
            for i, (x, y) in enumerate(data):
                def one():
                    loss = F.mse_loss(model(x[mine]), y[mine])
                    loss.backward()
                    step()
                    zero_grad()
                    return loss.detach()
                dist.barrier()
                if i == cfg["warmup"]:  # one profiled step (not timed)
                    before = held()
                    box = []
                    peak = before + _peak_rise(lambda: box.append(one()))
                    loss = box[0]
                else:
                    t0 = time.perf_counter()
                    loss = one()
                    if i > cfg["warmup"]:
                        times.append(time.perf_counter() - t0)
                total = loss.reshape(1).clone()
                dist.all_reduce(total)
                losses.append(float(total) / world)
            out[kind] = {"losses": losses, "times": times, "peak": peak, "held": held()}
            del model
        q.put((rank, True, out))
        comm.close()
        dist.destroy_process_group()
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


def run(world, backend, kinds, cfg, timeout=900):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, backend, kinds, cfg, q), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    res = {}
    try:
        deadline = time.monotonic() + timeout
        while len(res) < world:
            rank, ok, payload = q.get(timeout=max(1.0, deadline - time.monotonic()))
            if not ok:
                raise RuntimeError(f"{backend}: rank {rank} failed:\n{payload}")
            res[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
                p.join()
    return [res[r] for r in range(world)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16, help="rows per rank")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--bucket-mb", type=float, default=4.0,
                    help="bucket cap of ZeroDataParallel and DDP (MiB)")
    args = ap.parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("layers", "width", "batch", "steps", "warmup", "lr",
                                         "bucket_mb")}
    nparams = args.layers * (args.width ** 2 + args.width)
    print(f"# world {args.world}, {args.layers} x Linear({args.width}, {args.width}) + Tanh, "
          f"{nparams / 1e6:.2f} M parameters fp32, AdamW, {args.batch} rows per rank, buckets of "
          f"{args.bucket_mb:g} MiB, "
          f"{args.steps} steps; step time median after {args.warmup} warm-up steps (slowest rank); "
          f"peak = held before a step + largest rise during one (max over ranks)")
    table = []
    natives = [k for _, w, k in ROWS if w == "native"]
    pgs = [k for _, w, k in ROWS if w == "pg"]
    for backend in ("ringcomm", "gloo"):
        kinds = (natives if backend == "ringcomm" else []) + pgs
        res = run(args.world, backend, kinds, cfg)
        for label, where, kind in ROWS:
            if kind not in kinds:
                continue
            step = statistics.median(max(ts) for ts in zip(*(r[kind]["times"] for r in res)))
            peak = max(r[kind]["peak"] for r in res)
            held = max(r[kind]["held"] for r in res)
            name = label if where == "native" else f"{label} [{backend} backend]"
            table.append((name, res[0][kind]["losses"], step, held, peak))
    base = table[0][1]
    print(f"  {'implementation':<58s} {'loss 0':>8s} {'loss end':>8s} {'max rel diff':>12s} "
          f"{'step ms':>8s} {'held MiB':>8s} {'peak MiB':>8s}")
    for name, losses, step, held, peak in table:
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, base))
        print(f"  {name:<58s} {losses[0]:8.5f} {losses[-1]:8.5f} {diff:12.2e} {step * 1e3:8.1f} "
              f"{held / 2 ** 20:8.2f} {peak / 2 ** 20:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
