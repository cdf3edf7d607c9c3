"""The 3D layout planner (ringcomm.parallel.planner, ringcomm-plan).

Its formulas against the papers they come from (Narayanan et al. 2021's parameter
and FLOP counts), against the modules they describe (parameter counts of ringcomm's
own transformer and of a transformers GPT-2), against ZeroDataParallel's
memory_bytes() on 2 ranks for ZeRO 1-3, and the search itself: constraints, order,
the bubble, what does not fit and why, the DeepSpeed config and the calls it writes,
the command line (good and bad arguments).
"""
import json
import math
import time

import pytest
import torch

import harness
from ringcomm.parallel import Cluster, Transformer, models, plan
from ringcomm.parallel.plan_cli import main as plan_main

GPT3 = Transformer(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)


def test_parameters_and_flops_are_the_papers():
    for m in (GPT3, Transformer(24, 2304, 24, 2048, 51200), Transformer(128, 25600, 160, 2048, 51200)):
        l, h, s, V = m.layers, m.hidden, m.seq_len, m.vocab
        paper = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
        assert m.params() - 2 * h == pytest.approx(paper, rel=1e-12)  # (+ the final LayerNorm: the paper omits it)
        B = 512
        model, hw = m.flops(B, recompute=True)
        assert hw == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)), rel=1e-12)
        # Without the recompute: 3/4 of the layers' part, the logits' forward and backward as they are.
        assert model == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V, rel=1e-12)
        assert m.flops(B)[1] == model
    assert GPT3.params() == pytest.approx(174.6e9, rel=1e-3)  # "175B"


def test_shapes_read_from_modules():
    dense = models.transformer(vocab=50, hidden=32, n_heads=4, n_layers=3, max_seq=16, ffn=48)
    t = Transformer.from_module(dense)
    assert (t.layers, t.hidden, t.heads, t.vocab, t.seq_len, t.f, t.tied) == (3, 32, 4, 50, 16, 48, False)
    assert t.params() == sum(p.numel() for p in dense.parameters())
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    gpt2 = transformers.GPT2LMHeadModel(cfg)
    t = Transformer.from_module(gpt2)
    assert (t.layers, t.hidden, t.heads, t.vocab, t.seq_len, t.tied) == (2, 32, 4, 64, 16, True)
    assert t.params() == sum(p.numel() for p in gpt2.parameters())


def test_bad_shapes_and_clusters_are_refused():
    with pytest.raises(ValueError, match="hidden 10 does not divide by heads 3"):
        Transformer(2, 10, 3, 8, 8)
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        Transformer(0, 8, 2, 8, 8)
    with pytest.raises(ValueError, match="no preset 'nope'"):
        Cluster(1, 8, 80, 312, preset="nope")
    with pytest.raises(ValueError, match="gemm_efficiency"):
        Cluster(1, 8, 80, 312, gemm_efficiency=1.5)
    with pytest.raises(ValueError, match="unknown constraints"):
        plan(GPT3, Cluster(8, 8, 80, 312), 1536, tensor=4)
    with pytest.raises(ValueError, match="global_batch"):
        plan(GPT3, Cluster(8, 8, 80, 312), 0)


def test_the_search_its_order_and_its_constraints():
    dgx = Cluster(nodes=8, devices_per_node=8, device_memory_gb=80, peak_tflops=312, preset="dgx-a100-ib200",
                  gemm_efficiency=0.7, memory_gbps=2039, memory_passes=2)
    layouts = plan(GPT3, dgx, 1536)
    fit = [lay for lay in layouts if lay.fits]
    assert fit and len(fit) < len(layouts)
    assert layouts[:len(fit)] == fit  # the ones that fit first
    steps = [lay.step_seconds for lay in fit]
    assert steps == sorted(steps)
    for lay in layouts:
        assert lay.tp * lay.pp * lay.dp == 64 and lay.micro_batch * lay.microbatches * lay.dp == 1536
        mem = lay.memory_bytes
        parts = sum(v for k, v in mem.items() if k != "total")
        if lay.zero_stage < 2:
            assert mem["total"] == pytest.approx(parts)
        else:  # the gradient shard is made after the activations' peak
            assert parts - mem["grads"] - 1 <= mem["total"] <= parts
        assert lay.fits == (lay.memory_bytes["total"] <= 80e9 * 0.9)
        if not lay.fits:
            assert "GB per device >" in lay.reason
        assert lay.tflops_per_device <= lay.hardware_tflops_per_device <= 312 * 0.7 + 1e-9
    # The classic layout, fixed: only it, and it fits with ZeRO-1 and recompute.
    classic = plan(GPT3, dgx, 1536, tp=4, pp=8, zero_stage=1, recompute=True)
    assert {(lay.tp, lay.pp, lay.dp, lay.zero_stage, lay.recompute) for lay in classic} == {(4, 8, 2, 1, True)}
    assert any(lay.fits for lay in classic)
    # Without recompute and without ZeRO it does not fit in 80 GB (activations and states).
    plain = plan(GPT3, dgx, 1536, tp=4, pp=8, zero_stage=0, recompute=False)
    assert not any(lay.fits for lay in plain)
    # A list of values is a choice among them.
    some = plan(GPT3, dgx, 1536, tp=[4, 8], pp=8)
    assert {lay.tp for lay in some} == {4, 8}


def test_the_bubble_is_p_minus_1_micro_batch_times():
    # Free links (no communication time): the step is (m + p - 1) micro-batch times.
    link = {"alpha": 1e-9, "beta": 1e-15, "overhead": 0}
    free = {"intra": link, "inter": link, "gamma": 1e-15}
    small = Transformer(8, 1024, 8, 512, 1000)
    c = Cluster(1, 4, 1000, 100, params=free)
    for m in (1, 4, 16):
        lay = plan(small, c, m, tp=1, pp=4, micro_batch=1, zero_stage=0, recompute=False, runtime="megatron")[0]
        assert lay.microbatches == m
        assert lay.bubble_fraction == pytest.approx(3 / (m + 3), rel=1e-4)
        assert lay.comm_seconds["pp"] < 1e-4 * lay.step_seconds
    # ringcomm's Pipeline cuts the 10 modules (embedding, 8 layers, head) 3/3/2/2: stages of
    # 2, 3, 2 and 1 layers (+ the logits); the slowest runs m micro-batches, the others fill
    # and drain around it.
    from ringcomm.parallel.planner import _stages
    assert _stages(8, 4, "ringcomm") == [(2, True, False), (3, False, False), (2, False, False), (1, False, True)]
    for L in range(1, 13):  # the same cut as models.stage_bounds
        for pp in range(1, L + 1):
            got = _stages(L, pp, "ringcomm")
            want = [(sum(1 <= j <= L for j in range(a, b)), a == 0, b == L + 2) for a, b in models.stage_bounds(L, pp)]
            assert got == want, (L, pp)
    assert _stages(8, 4, "megatron") == [(2, True, False), (2, False, False), (2, False, False), (2, False, True)]
    for m in (1, 4, 16):
        lay = plan(small, c, m, tp=1, pp=4, micro_batch=1, zero_stage=0, recompute=False)[0]
        layer = small.layer_forward_flops_per_token()
        logits = small.logits_forward_flops_per_token()
        stages = [2 * layer, 3 * layer, 2 * layer, layer + logits]
        want = (sum(stages) - max(stages)) / (m * max(stages) + sum(stages) - max(stages))
        assert lay.bubble_fraction == pytest.approx(want, rel=1e-3)


def test_deepspeed_config_and_ringcomm_calls():
    dgx = Cluster(8, 8, 80, 312, preset="dgx-a100-ib200")
    lay = plan(GPT3, dgx, 1536, tp=4, pp=8, zero_stage=1, recompute=True, micro_batch=2)[0]
    cfg = lay.deepspeed_config()
    assert cfg["train_batch_size"] == 1536
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["gradient_accumulation_steps"] == 1536 // (2 * 2)
    assert cfg["zero_optimization"]["stage"] == 1
    assert cfg["pipeline"] == {"pipe_parallel_size": 8, "model_parallel_size": 4}
    assert "_ringcomm_note" not in cfg
    z3 = plan(GPT3, dgx, 1536, tp=4, pp=8, zero_stage=3)[0].deepspeed_config()
    assert "refuses ZeRO stages 2 and 3" in z3["_ringcomm_note"]
    calls = lay.ringcomm_calls()
    assert "split_3d(comm, tp=4, pp=8)" in calls and "ZeroDataParallel(stage, g.dp, stage=1" in calls
    assert "n_microbatches=384" in calls
    compile(calls.replace("my_stage_of_the_model", "None"), "calls", "exec")  # valid Python


def test_command_line(tmp_path, capsys):
    out_json, out_ds = tmp_path / "all.json", tmp_path / "ds.json"
    args = ["--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048", "--vocab", "51200",
            "--nodes", "8", "--devices-per-node", "8", "--memory-gb", "80", "--peak-tflops", "312",
            "--preset", "dgx-a100-ib200", "--global-batch", "1536", "--top", "3"]
    assert plan_main(args + ["--json", str(out_json), "--deepspeed", str(out_ds)]) == 0
    text = capsys.readouterr().out
    assert "layouts fit" in text and "split_3d" in text
    every = json.loads(out_json.read_text())
    assert every and every[0]["fits"] and "memory_bytes" in every[0]
    assert json.loads(out_ds.read_text())["train_batch_size"] == 1536
    assert plan_main(args + ["--tp", "4", "--pp", "8", "--zero", "0", "--recompute", "0"]) == 1  # nothing fits
    assert plan_main(args[:-4] + ["--global-batch", "0"]) == 2
    assert "global_batch must be a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_main(args + ["--recompute", "maybe"])


# -- memory against ZeroDataParallel on 2 ranks ------------------------------------------

def _zero_memory(comm):
    from ringcomm.parallel import ZeroDataParallel

    out = {}
    for stage in (1, 2, 3):
        torch.manual_seed(0)
        dense = models.transformer(vocab=256, hidden=64, n_heads=4, n_layers=4, max_seq=32)
        z = ZeroDataParallel(dense, comm, stage=stage, mixed_precision="bf16", lr=1e-3)
        tokens = torch.randint(0, 256, (2, 32))
        loss = models.lm_loss(z(tokens), tokens)
        loss.backward()
        z.step()
        z.zero_grad()
        out[stage] = z.memory_bytes()
    return out


def test_memory_states_match_zero_data_parallel():
    res = harness.run_ranks(_zero_memory, 2, comm_timeout=60.0, hard_timeout=240)
    dense = models.transformer(vocab=256, hidden=64, n_heads=4, n_layers=4, max_seq=32)
    model = Transformer.from_module(dense)
    cluster = Cluster(1, 2, 1000, 1)
    fails = []
    for stage in (1, 2, 3):
        lay = plan(model, cluster, 2, tp=1, pp=1, zero_stage=stage, recompute=False, micro_batch=1)[0]
        for key in ("params", "grads", "optimizer_state"):
            got = res[0][stage][key]
            want = lay.memory_bytes[key]
            if not math.isclose(got, want, rel_tol=0.10):
                fails.append(f"ZeRO {stage} {key}: ZeroDataParallel {got} B, planner {want:.0f} B")
    assert not fails, "\n".join(fails)


# -- activations, memory and the bubble against what runs ------------------------------

def _saved_bytes(module, x):
    """Bytes of the distinct storages autograd saves in module(x) for the backward, the
    parameters left out (they are not activations)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def test_fused_activation_bytes_are_what_autograd_saves():
    from ringcomm.parallel.models import Block
    from ringcomm.parallel.planner import _layer_activation_bytes

    for h, heads, f, b, s in ((64, 4, None, 2, 16), (96, 3, 200, 3, 8), (128, 8, 512, 1, 32)):
        model = Transformer(1, h, heads, s, 100, ffn=f)
        block = Block(h, heads, f)
        x = torch.randn(b, s, h, requires_grad=True)
        got = _saved_bytes(block, x)
        want = _layer_activation_bytes(model, b, 1, "fp32", "fused")
        # The formula leaves out the LayerNorms' mean / rstd and attention's logsumexp
        # (b s (4 + heads) floats): under 2% of a layer.
        assert want <= got <= 1.02 * want, (h, heads, f, b, s, got, want)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got16 = _saved_bytes(block.to(torch.bfloat16), x.detach().bfloat16().requires_grad_())
        assert got16 == pytest.approx(_layer_activation_bytes(model, b, 1, "bf16", "fused"), rel=0.03)


def test_planner_arguments_are_checked():
    c = Cluster(1, 2, 100, 1)
    tiny = Transformer(2, 16, 2, 8, 32)
    with pytest.raises(ValueError, match="precision must be one of"):
        plan(tiny, c, 2, precision="fp8")
    with pytest.raises(ValueError, match="activations must be one of"):
        plan(tiny, c, 2, activations="flash")
    with pytest.raises(ValueError, match="runtime must be one of"):
        plan(tiny, c, 2, runtime="gloo")
    with pytest.raises(ValueError, match="optimizer_seconds_per_param"):
        Cluster(1, 2, 100, 1, optimizer_seconds_per_param=-1.0)
    # as_dict round-trips, links included.
    assert Cluster(**c.as_dict()).as_dict() == c.as_dict()


def test_shared_cores_figures_and_zero3_units():
    """Cluster.shared: the compute as it runs with every device at once. Figures that
    are the alone ones slowed by devices / cores (perfect time slicing) give the old
    bound, devices x work / cores, to the rounding; slower ones a slower step. ZeRO 3's
    measured unit cost adds its wall time per unit collective."""
    m = Transformer(4, 64, 2, 16, 128)
    own = dict(peak_tflops=0.1, memory_gbps=20.0, memory_passes=2.0, layer_overhead_seconds=1e-3,
               microbatch_overhead_seconds=2e-3, optimizer_seconds_per_param=5e-9)
    base = dict(nodes=1, devices_per_node=4, device_memory_gb=8, gemm_efficiency=1.0, cores=2, overlap=False,
                **own)
    kw = dict(tp=1, pp=2, zero_stage=1, micro_batch=2, recompute=False, precision="fp32", activations="fused")
    alone = plan(m, Cluster(**base), 16, **kw)[0]
    k = 4 / 2
    sliced = dict(peak_tflops=0.1 / k, memory_gbps=20.0 / k, memory_passes=2.0, layer_overhead_seconds=1e-3 * k,
                  microbatch_overhead_seconds=2e-3 * k, optimizer_seconds_per_param=5e-9 * k)
    same = plan(m, Cluster(**base, shared=sliced), 16, **kw)[0]
    assert same.step_seconds == pytest.approx(alone.step_seconds, rel=1e-9)
    slow = dict(sliced, peak_tflops=0.1 / (2 * k), layer_overhead_seconds=2e-3 * k)
    assert plan(m, Cluster(**base, shared=slow), 16, **kw)[0].step_seconds > 1.3 * alone.step_seconds
    # ZeRO 3: (1 reduction + 2 gathers per micro-batch) x units, each adding zero3_unit_seconds.
    z3 = dict(kw, zero_stage=3)
    before = plan(m, Cluster(**base, shared=sliced), 16, **z3)[0]
    after = plan(m, Cluster(**base, shared=sliced, zero3_unit_seconds=1e-3, zero3_unit_seconds_world=1e-3),
                 16, **z3)[0]
    units = 6 * 2 + 2  # two layers a stage (stage_bounds: 3 of the 6 modules each), + 2
    calls = units * (1 + 2 * before.microbatches)
    assert after.step_seconds - before.step_seconds == pytest.approx(calls * 1e-3, rel=0.05)
    # A partial shared set: the rest from the cluster's own figures (the optimizer's
    # step by Adam's bytes, time-sliced, where no rate is given).
    partial = plan(m, Cluster(**dict(base, optimizer_seconds_per_param=None), shared={"peak_tflops": 0.05}), 16,
                   **kw)[0]
    assert partial.optimizer_seconds > 0 and partial.bounds_seconds["cores"] > k * partial.optimizer_seconds
    # What a Cluster refuses, and the round trip.
    with pytest.raises(ValueError, match="shared has unknown fields"):
        Cluster(**base, shared={"tflops": 1.0})
    with pytest.raises(ValueError, match=r"shared\['peak_tflops'\] must be"):
        Cluster(**base, shared={"peak_tflops": 0.0})
    with pytest.raises(ValueError, match="shared must be a dict"):
        Cluster(**base, shared=[1.0])
    with pytest.raises(ValueError, match="zero3_unit_seconds must be >= 0"):
        Cluster(**base, zero3_unit_seconds=-1.0)
    c = Cluster(**base, shared=sliced, zero3_unit_seconds=1e-3)
    assert Cluster(**c.as_dict()).as_dict() == c.as_dict()


def test_accumulation_under_no_sync_holds_full_gradients():
    # ringcomm's Pipeline runs every backward but the last under no_sync: ZeRO 2/3 keep the
    # full gradients while micro-batches accumulate; DeepSpeed reduces each one.
    c = Cluster(1, 4, 1000, 100)
    m = Transformer(4, 256, 4, 64, 512)
    kw = dict(tp=1, pp=1, zero_stage=2, micro_batch=1, recompute=False)
    ring = plan(m, c, 16, runtime="ringcomm", **kw)[0]
    ds = plan(m, c, 16, runtime="deepspeed", **kw)[0]
    psi = m.params()
    shard, full = 2 * psi / 4, 2 * psi  # bf16 gradients; one bucket holds them all (< 25 MiB)
    # Between steps each holds the shard; during the step ringcomm's also holds the full
    # gradients accumulated under no_sync beside the bucket the last backward fills.
    assert ring.memory_bytes["grads"] == pytest.approx(shard) == ds.memory_bytes["grads"]
    assert ring.memory_bytes["step_gradients"] == pytest.approx(full + full)
    assert ds.memory_bytes["step_gradients"] == pytest.approx(full)  # the bucket
    one = plan(m, c, 4, runtime="ringcomm", **kw)[0]  # one micro-batch: nothing accumulates
    assert one.microbatches == 1 and one.memory_bytes["step_gradients"] == pytest.approx(full)
    assert ds.comm_seconds["dp"] > ring.comm_seconds["dp"]  # a reduce_scatter per micro-batch


# Small enough for CI, large enough that the states and activations dominate what the
# heap holds besides them: 4 layers of 128, fp32 AdamW, world 2.
_SMALL = dict(vocab=512, hidden=256, heads=4, layers=4, seq=32)
_LAYOUTS = ((2, 1, 1, 0, 2), (1, 2, 1, 0, 4), (1, 1, 2, 0, 1), (1, 1, 2, 1, 2), (1, 1, 2, 2, 1),
            (1, 1, 2, 2, 2), (1, 1, 2, 3, 2))


def _measured(comm):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import train_3d
    from ringcomm.parallel.pp import Pipeline

    # What a process allocates once (AdamW's first import, the first TP / PP groups'
    # buffers, the kernels' workspaces) goes before any baseline: one unmeasured run.
    train_3d.train(comm, 2, 1, 1, steps=1, microbatches=2, batch=8, **_SMALL)
    train_3d.train(comm, 1, 2, 1, steps=1, microbatches=2, batch=8, **_SMALL)
    rows = []
    for (tp, pp, dp, zero, m) in _LAYOUTS:
        rep = {"measure": True}
        train_3d.train(comm, tp, pp, dp, zero=zero, report=rep, steps=2, microbatches=m, batch=8, **_SMALL)
        rows.append(rep["peak_bytes"])
    # The bubble: two stages that sleep (their compute leaves the cores free, as a GPU
    # kernel does), 4 micro-batches; the first stage's idle time against (p-1)/(m+p-1).
    stage = torch.nn.Linear(4, 4)

    class Sleepy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = stage

        def forward(self, x):
            time.sleep(0.02)
            return _SleepBackward.apply(self.lin(x))

    pipe = Pipeline(Sleepy(), comm, "1f1b", 4, loss_fn=lambda y, t: (y - t).square().mean())
    idle = []
    for _ in range(3):
        comm.barrier()
        pipe.step(torch.randn(8, 4) if comm.rank == 0 else None, torch.randn(8, 4) if comm.rank == 1 else None)
        idle.append(pipe.stats["wait_s"] / pipe.stats["step_s"])
    # This machine as the planner's cluster (after the memory rows: it allocates).
    model = Transformer(_SMALL["layers"], _SMALL["hidden"], _SMALL["heads"], _SMALL["seq"], _SMALL["vocab"],
                        tied=False)
    here = Cluster.measured_here(comm, model, precision="fp32", seconds=0.05).as_dict()
    return rows, sorted(idle)[1], here


class _SleepBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.04)  # a backward of twice the forward
        return g


def test_memory_and_bubble_against_training_here():
    res = harness.run_ranks(_measured, 2, comm_timeout=60.0, hard_timeout=300)
    model = Transformer(_SMALL["layers"], _SMALL["hidden"], _SMALL["heads"], _SMALL["seq"], _SMALL["vocab"],
                        tied=False)
    cluster = Cluster(1, 2, 1000, 1)
    fails = []
    for i, (tp, pp, dp, zero, m) in enumerate(_LAYOUTS):
        lay = plan(model, cluster, 8, tp=tp, pp=pp, zero_stage=zero, micro_batch=8 // (dp * m),
                   recompute=False, precision="fp32", activations="fused")[0]
        got = max(res[r][0][i] for r in range(2))
        want = lay.memory_bytes["total"]
        if not math.isclose(got, want, rel_tol=0.10):
            fails.append(f"tp {tp} pp {pp} dp {dp} ZeRO {zero} m {m}: measured {got / 1e6:.2f} MB, "
                         f"planner {want / 1e6:.2f} MB ({want / got - 1:+.1%})")
    assert not fails, "\n".join(fails)
    # Stage 0 of 2 waits (p-1) micro-batch times of m + p - 1: 1/5 of the step.
    free = {"intra": {"alpha": 1e-9, "beta": 1e-15, "overhead": 0}, "inter": {"alpha": 1e-9, "beta": 1e-15,
                                                                            "overhead": 0}, "gamma": 1e-15}
    want = plan(Transformer(2, 64, 2, 8, 8), Cluster(1, 2, 1000, 1, params=free), 4, tp=1, pp=2, micro_batch=1,
                zero_stage=0, recompute=False, runtime="megatron")[0].bubble_fraction
    assert want == pytest.approx(0.2, rel=0.02)
    idle = res[0][1]
    assert 0.6 * want <= idle <= 1.6 * want, f"stage 0 idle {idle:.1%} of the step, the model's bubble {want:.1%}"
    # Cluster.measured_here: every rank returns the same cluster; its figures are there
    # and sane (the rates positive, the shared ones no faster than one core's worth).
    here = [r[2] for r in res]
    assert here[0] == here[1]
    c = Cluster(**here[0])
    assert c.devices_per_node == 2 and c.cores >= 1 and c.peak_tflops > 0 and c.memory_gbps > 0
    assert set(c.shared) == set(Cluster.SHARED_FIELDS)
    assert 0 < c.shared["peak_tflops"] <= 2 * c.peak_tflops
    assert c.shared["optimizer_seconds_per_param"] > 0 and c.optimizer_seconds_per_param > 0
    assert c.zero3_unit_seconds >= 0 and c.zero3_unit_seconds_world == c.zero3_unit_seconds  # world 2: pairs
    assert plan(model, c, 8, tp=1, pp=1, zero_stage=3, micro_batch=4, precision="fp32")[0].step_seconds > 0
