"""ringcomm.parallel: data, tensor and pipeline parallelism against single-process references.

One spawned group per world size (2 and 4) runs every section; each test reports one
section. All comparisons are allclose against a dense model computed on every rank
(float64 where the layer allows it), never timings.
"""
import copy
import os
import sys

import pytest

import harness

WORLD_SIZES = [2, 4]
SECTIONS = ("dp", "tp", "pp", "3d")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _close(fail, what, got, want, rtol=1e-7, atol=1e-9):
    import torch

    if got is None or want is None:
        if not (got is None and want is None):
            fail(f"{what}: got {'None' if got is None else 'a tensor'}, "
                 f"expected {'None' if want is None else 'a tensor'}")
        return
    if got.shape != want.shape:
        fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    elif not torch.allclose(got, want, rtol=rtol, atol=atol):
        err = (got - want).abs().max().item()
        fail(f"{what}: max abs difference {err:.3g} (scale {want.abs().max().item():.3g})")


# ------------------------------------------------------------------------- DP

def _mlp(seed, extra_unused=False):
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                                     nn.Linear(16, 4))
            if extra_unused:  # registered last: in the first bucket, never gets a gradient
                self.unused = nn.Linear(4, 4)

        def forward(self, x):
            return self.net(x)

    torch.manual_seed(seed)
    return Net().double()


def section_dp(comm, fail):
    import torch
    import torch.nn.functional as F
    from ringcomm.parallel import DataParallel

    r, ws = comm.rank, comm.world_size
    per_rank, steps = 4, 3
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(ws * per_rank, 8, generator=gen, dtype=torch.float64) for _ in range(steps)]
    ys = [torch.randn(ws * per_rank, 4, generator=gen, dtype=torch.float64) for _ in range(steps)]
    mine = slice(r * per_rank, (r + 1) * per_rank)

    def reference(micro):
        """Dense SGD on the whole batch; `micro` micro-batches accumulated per step."""
        ref = _mlp(100)
        opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for s in range(steps):
            opt.zero_grad()
            for m in range(micro):
                x, y = xs[(s + m) % steps], ys[(s + m) % steps]
                F.mse_loss(ref(x), y).backward()
            opt.step()
        return ref

    for variant in ("overlap", "after_backward", "optimizer_hook", "no_sync", "unused"):
        micro = 3 if variant == "no_sync" else 1
        local = _mlp(100 + r, extra_unused=variant == "unused")  # rank 0's init must win
        dp = DataParallel(local, comm, bucket_cap_mb=600 / 2 ** 20,
                          overlap=variant != "after_backward")
        opt = torch.optim.SGD(dp.parameters(), lr=0.1, momentum=0.9)
        if variant == "optimizer_hook":
            dp.attach_optimizer(opt)
        n_params = sum(1 for p in local.parameters() if p.requires_grad)
        for s in range(steps):
            opt.zero_grad(set_to_none=s % 2 == 0)
            for m in range(micro):
                x, y = xs[(s + m) % steps][mine], ys[(s + m) % steps][mine]
                if m < micro - 1:
                    with dp.no_sync():
                        F.mse_loss(dp(x), y).backward()
                        if dp.events and any(e[0] == "launch" for e in dp.events):
                            fail(f"{variant}: a bucket was reduced inside no_sync()")
                else:
                    F.mse_loss(dp(x), y).backward()
            ev = list(dp.events)
            if variant != "optimizer_hook":
                dp.finish()
            opt.step()
            if s == 0 and variant in ("overlap", "no_sync"):
                grads = [i for i, e in enumerate(ev) if e[0] == "grad"]
                launches = [(i, e[1]) for i, e in enumerate(ev) if e[0] == "launch"]
                if len(dp.buckets) < 3:
                    fail(f"{variant}: expected several buckets, got {len(dp.buckets)}")
                if [b for _, b in launches] != list(range(len(dp.buckets))):
                    fail(f"{variant}: buckets launched in order {[b for _, b in launches]}")
                elif launches[0][0] > grads[-1] or len(grads) != n_params:
                    fail(f"{variant}: first bucket launched at event {launches[0][0]}, after the "
                         f"last of {len(grads)} gradient hooks (event {grads[-1]}): no overlap")
                elif sum(1 for i, _ in launches if i < grads[-1]) < len(dp.buckets) - 1:
                    fail(f"{variant}: only {sum(1 for i, _ in launches if i < grads[-1])} of "
                         f"{len(dp.buckets)} buckets launched before backward ended: {ev}")
            if s == 0 and variant == "after_backward" and any(e[0] == "launch" for e in ev):
                fail("overlap=False launched a bucket during backward")
        ref = reference(micro)
        if variant == "unused":
            for name, p in local.unused.named_parameters():
                if p.grad is None or p.grad.abs().max() != 0:
                    fail(f"unused parameter {name} should have a zero gradient, has {p.grad}")
        used = [(n, p) for n, p in local.named_parameters() if not n.startswith("unused")]
        for (name, p), q in zip(used, ref.parameters()):
            _close(fail, f"DP {variant} ws={ws}: parameter {name} after {steps} steps", p.detach(),
                   q.detach(), rtol=1e-10, atol=1e-12)
        dp.remove_hooks()


# ------------------------------------------------------------------------- TP

def _grad_module(dense):
    """A copy of dense whose parameters hold dense's gradients."""
    import torch

    g = copy.deepcopy(dense)
    with torch.no_grad():
        for p, q in zip(g.parameters(), dense.parameters()):
            p.copy_(q.grad)
    return g


def _check_tp_module(comm, fail, name, dense, make_tp, x, gy, sp):
    """Forward, input gradient and every parameter gradient of the TP module vs dense."""
    import torch
    from ringcomm.parallel import split_sequence, sync_sequence_parallel_grads

    dense.zero_grad()
    xd = x.clone().requires_grad_(True)
    yd = dense(xd)
    yd.backward(gy)
    tp = make_tp(dense)
    expected = make_tp(_grad_module(dense))  # the same sharding applied to dense's grads
    if sp:
        xt = split_sequence(x, comm, 1).requires_grad_(True)
        yt = tp(xt)
        yt.backward(split_sequence(gy, comm, 1))
        sync_sequence_parallel_grads(tp, comm)
        want_y, want_gx = split_sequence(yd.detach(), comm, 1), split_sequence(xd.grad, comm, 1)
    else:
        xt = x.clone().requires_grad_(True)
        yt = tp(xt)
        yt.backward(gy)
        want_y, want_gx = yd.detach(), xd.grad
    what = f"TP {name} ws={comm.world_size}{' sequence-parallel' if sp else ''}"
    _close(fail, f"{what}: output", yt.detach(), want_y)
    _close(fail, f"{what}: input grad", xt.grad, want_gx)
    pairs = list(zip(tp.named_parameters(), expected.parameters()))
    if len(pairs) != len(list(dense.parameters())):
        fail(f"{what}: {len(pairs)} parameters, the dense module has {len(list(dense.parameters()))}")
    for (pname, p), e in pairs:
        _close(fail, f"{what}: grad of {pname}", p.grad, e.detach())


def section_tp(comm, fail):
    import torch
    import torch.nn as nn
    from ringcomm.parallel import (ColumnParallelLinear, RowParallelLinear, TensorParallelAttention,
                                   TensorParallelMLP, models, tensor_parallel)

    torch.manual_seed(5)  # same dense modules and data on every rank
    hidden, heads, ffn, b, s = 16, 4, 32, 2, 8
    x = torch.randn(b, s, hidden, dtype=torch.float64)
    gy = torch.randn(b, s, hidden, dtype=torch.float64)
    mlp = models.MLP(hidden, ffn).double()
    attn = models.SelfAttention(hidden, heads).double()
    block = models.Block(hidden, heads, ffn).double()
    for sp in (False, True):
        _check_tp_module(comm, fail, "MLP", mlp,
                         lambda d: TensorParallelMLP.from_dense(d, comm, sequence_parallel=sp),
                         x, gy, sp)
        _check_tp_module(comm, fail, "attention", attn,
                         lambda d: TensorParallelAttention.from_dense(d, comm, sequence_parallel=sp),
                         x, gy, sp)
        _check_tp_module(comm, fail, "block", block,
                         lambda d: tensor_parallel(d, comm, sequence_parallel=sp), x, gy, sp)
    # The other ends of the column / row linears: gathered output, unsplit input.
    lin = nn.Linear(hidden, 12).double()
    gy12 = torch.randn(b, s, 12, dtype=torch.float64)
    _check_tp_module(comm, fail, "column gather_output", lin,
                     lambda d: ColumnParallelLinear.from_dense(d, comm, gather_output=True),
                     x, gy12, False)
    _check_tp_module(comm, fail, "row input_is_parallel=False", lin,
                     lambda d: RowParallelLinear.from_dense(d, comm, input_is_parallel=False),
                     x, gy12, False)


# ------------------------------------------------------------------------- PP

def section_pp(comm, fail):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from ringcomm.parallel import Pipeline

    S, st = comm.world_size, comm.rank
    K = 6 if S == 4 else 4
    torch.manual_seed(9)
    layers = []
    for i in range(2 * S):
        layers += [nn.Linear(8, 8 if i < 2 * S - 1 else 3), nn.Tanh()]
    dense = nn.Sequential(*layers).double()
    x = torch.randn(2 * K, 8, dtype=torch.float64)
    t = torch.randn(2 * K, 3, dtype=torch.float64)
    want_losses = [F.mse_loss(dense(xi), ti) for xi, ti in zip(x.chunk(K), t.chunk(K))]
    torch.stack(want_losses).mean().backward()
    stage_layers = slice(4 * st, 4 * st + 4)
    want_grads = [p.grad.clone() for p in dense[stage_layers].parameters()]
    for schedule in ("gpipe", "1f1b"):
        stage = copy.deepcopy(dense[stage_layers])
        stage.zero_grad(set_to_none=True)
        pipe = Pipeline(stage, comm, schedule, K, loss_fn=F.mse_loss)
        for rep in range(2):  # a second step accumulates: gradients double
            losses = pipe.step(x if st == 0 else None, t if st == S - 1 else None)
            what = f"PP {schedule} S={S} K={K} stage {st} step {rep}"
            if st == S - 1:
                if len(losses) != K:
                    fail(f"{what}: {len(losses)} losses, expected {K}")
                for i, (got, want) in enumerate(zip(losses, want_losses)):
                    _close(fail, f"{what}: loss of micro-batch {i}", got, want.detach())
            elif losses is not None:
                fail(f"{what}: a stage other than the last returned losses")
            for j, (p, want) in enumerate(zip(stage.parameters(), want_grads)):
                _close(fail, f"{what}: grad of parameter {j}", p.grad, want * (rep + 1))
            limit = K if schedule == "gpipe" else S - st
            if pipe.max_in_flight != limit:
                fail(f"{what}: {pipe.max_in_flight} micro-batches in flight at the peak, "
                     f"expected {limit}")
            if schedule == "1f1b" and pipe.max_in_flight > S:
                fail(f"{what}: 1F1B held {pipe.max_in_flight} > S={S} micro-batches")
    # Activations whose shape changes between steps travel with their header.
    stage = copy.deepcopy(dense[stage_layers])
    pipe = Pipeline(stage, comm, "1f1b", 2, loss_fn=F.mse_loss)
    for rows in (2, 6):
        losses = pipe.step(x[:rows] if st == 0 else None, t[:rows] if st == S - 1 else None)
        if st == S - 1:
            want = [F.mse_loss(dense(xi), ti).detach() for xi, ti in zip(x[:rows].chunk(2),
                                                                        t[:rows].chunk(2))]
            for got, w in zip(losses, want):
                _close(fail, f"PP batch of {rows}: loss", got, w)


# ------------------------------------------------------------------------- 3D

def section_3d(comm, fail):
    """The example's training loop on every (tp, pp, dp) layout of this world size,
    against dense training of the same model on the whole batch."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import train_3d

    ws = comm.world_size
    layouts = [(ws, 1), (1, ws)] if ws == 2 else [(2, 2), (1, 2), (2, 1)]
    for tp, pp in layouts:
        schedule = "gpipe" if (tp, pp) == (1, 2) else "1f1b"
        losses, ref = train_3d.train(comm, tp, pp, check=True, steps=3, schedule=schedule,
                                     layers=2, hidden=16, seq=8)
        for i, (a, b) in enumerate(zip(losses, ref)):
            if abs(a - b) > 1e-4 * abs(b):
                fail(f"3D tp={tp} pp={pp} dp={ws // (tp * pp)} {schedule}: step {i} loss {a:.6f}, "
                     f"dense training {b:.6f}")


# ---------------------------------------------------------------- rank function

def _all_sections(comm):
    return harness.run_sections(comm, SECTIONS, {n: globals()[f"section_{n}"] for n in SECTIONS},
                                tracebacks=True)


_results = harness.cached_groups(_all_sections, comm_timeout=20.0, hard_timeout=90)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_data_parallel(world_size):
    harness.assert_no_failures([r["dp"] for r in _results(world_size)])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tensor_parallel(world_size):
    harness.assert_no_failures([r["tp"] for r in _results(world_size)])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_pipeline(world_size):
    harness.assert_no_failures([r["pp"] for r in _results(world_size)])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_3d_matches_dense_training(world_size):
    harness.assert_no_failures([r["3d"] for r in _results(world_size)])


# ----------------------------------------------------- pure parts, no processes

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_schedule_order(schedule):
    from ringcomm.parallel import schedule_order

    for S in (1, 2, 3, 4):
        for K in (1, 2, 3, 5, 8):
            for s in range(S):
                order = schedule_order(schedule, s, S, K)
                assert sorted(order) == sorted([("F", i) for i in range(K)] + [("B", i) for i in range(K)])
                assert [i for k, i in order if k == "F"] == list(range(K))
                assert [i for k, i in order if k == "B"] == list(range(K))
                live = peak = 0
                for k, i in order:
                    assert k == "F" or ("F", i) in order[:order.index((k, i))]
                    live += 1 if k == "F" else -1
                    peak = max(peak, live)
                assert peak == (K if schedule == "gpipe" else min(S - s, K))


def test_layout_ranks():
    from ringcomm.parallel import layout_ranks

    tp, pp, dp = layout_ranks(8, 2, 2, 2)
    assert tp == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pp == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert dp == [[0, 2], [1, 3], [4, 6], [5, 7]]
    for groups in (tp, pp, dp):
        assert sorted(r for g in groups for r in g) == list(range(8))
    with pytest.raises(ValueError, match="differs from the world size"):
        layout_ranks(6, 2, 2, 2)


class Group:  # what the TP layers read of a communicator at construction
    world_size, rank = 2, 0


def test_parallel_marks_survive_copies():
    """Gradient clipping tells sharded from replicated parameters by the marks the TP
    layers set; copy.deepcopy and pickle drop a Parameter's attributes, so the layers
    set them again when restored."""
    import io
    import pickle

    import torch

    from ringcomm.parallel import clip
    from ringcomm.parallel.tp import ColumnParallelLinear, RowParallelLinear

    def marks(m):
        return [(n, clip.is_tensor_parallel(p), bool(getattr(p, "sequence_parallel", False)))
                for n, p in m.named_parameters()]

    m = torch.nn.Sequential(ColumnParallelLinear(4, 4, Group()),
                            RowParallelLinear(4, 4, Group(), sequence_parallel=True))
    want = [("0.weight", True, False), ("0.bias", True, False), ("1.weight", True, False),
            ("1.bias", False, True)]
    assert marks(m) == want
    assert marks(copy.deepcopy(m)) == want
    buf = io.BytesIO()
    pickle.dump(m, buf)
    assert marks(pickle.loads(buf.getvalue())) == want


def test_clip_grad_norm_without_groups_is_torchs():
    import torch

    from ringcomm.parallel import clip_grad_norm_

    for norm_type in (2.0, 1.0, 3.5, float("inf")):
        torch.manual_seed(0)
        a = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        for p, q in zip(a, b):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        got = clip_grad_norm_(a, 0.7, norm_type)
        want = torch.nn.utils.clip_grad_norm_(b, 0.7, norm_type)
        assert torch.allclose(got, want, rtol=1e-6), (norm_type, got, want)
        for p, q in zip(a, b):
            assert torch.allclose(p.grad, q.grad, rtol=1e-6)
    with pytest.raises(ValueError, match="norm_type"):
        clip_grad_norm_(a, 1.0, -1)
