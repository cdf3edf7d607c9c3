"""Choosing the 3D layout: every TP x PP x DP x ZeRO layout of a transformer on a
cluster, its memory per device and its step time, predicted from ringcomm's cost
model (the links) and the device's GEMM rate (the compute).

    from ringcomm.parallel import Cluster, Transformer, plan
    gpt = Transformer(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
    dgx = Cluster(nodes=8, devices_per_node=8, device_memory_gb=80, peak_tflops=312,
                  preset="dgx-a100-ib200")
    layouts = plan(gpt, dgx, global_batch=1536)
    best = layouts[0]                 # fastest that fits; the ones that do not fit come last
    print(best.describe()); print(best.deepspeed_config()); print(best.ringcomm_calls())

The formulas and where they come from (every Layout carries them in `sources`):

- parameters: 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) for an FFN of 4h, in general
  per layer 4h^2 + 4h (attention) + 2 h f + f + h (MLP) + 4h (two LayerNorms), plus
  the embeddings (V + s) h and the final LayerNorm (Narayanan et al. 2021, sec. 5.1).
- FLOPs: a layer's forward is 2 x (4h^2 + 2hf) + 4sh per token (24h^2 + 4sh for f = 4h),
  the logits 2hV; backward twice the forward; recompute adds one forward of the layers:
  72 B s l h^2 (1 + s/(6h) + V/(16 l h)) model FLOPs per iteration, 96 ... with
  recompute (Narayanan et al. 2021, eq. 3). TFLOP/s per device counts model FLOPs
  (`tflops_per_device`) and, with recompute, the hardware FLOPs too
  (`hardware_tflops_per_device`, what Narayanan et al. report).
- compute time: FLOPs / (peak x gemm_efficiency), per stage and micro-batch, plus the
  memory-bound work: memory_passes x a layer's activation bytes (Korthikanti et al.)
  at memory_gbps (memory_passes_beyond x the bytes past memory_passes_bytes, where
  measured: activations that leave the caches); the last stage also computes the
  logits. Per micro-batch and stage a fixed cost besides (Cluster.layer_overhead_seconds
  a layer, microbatch_overhead_seconds a stage: launches and dispatch that do not grow
  with the batch; 0 unless measured).
- optimizer: the step over the parameters the device updates (its shard under ZeRO),
  optimizer_seconds_per_param, or Adam's 28 bytes per parameter at memory_gbps.
- devices that share processors (Cluster.cores: CPU ranks): the step is at least the
  node's work -- every device's compute, communication and optimizer step -- over the
  cores (with Cluster.shared, the compute timed as it runs with every device at once:
  the time slicing and the contention for caches and memory in it), and each
  collective or message waits sync_seconds more (a peer off the core); under ZeRO 3
  each unit's gather or reduction adds zero3_unit_seconds of wall time where measured
  (the hooks, the waits, the rescheduling of ranks that share cores). The step is the
  larger of the two bounds (Layout.bounds_seconds): where a pipeline's bubble leaves
  cores idle the truth lies above both, and this model under-predicts (by up to ~25%
  measured here).
- pipeline (1F1B, Narayanan et al. 2021 sec. 2.2): a step is (m + (p-1)/v) micro-batch
  times of the slowest stage, the bubble (p-1)/v of them (m micro-batches, v
  interleaved chunks per stage); interleaving multiplies the stage-to-stage traffic by v.
- TP: per layer and micro-batch, 2 all_reduces of b s h activations in the forward, 2 in
  the backward, 2 more with recompute (Shoeybi et al. 2019, fig. 4); on the critical path.
- PP: per micro-batch and stage boundary one activation forward and one gradient back,
  b s h / t per TP rank (the scatter / gather of Narayanan et al. 2021 sec. 4.1).
- DP: the gradients' all_reduce (ZeRO 0), reduce_scatter + all_gather of the
  parameters (ZeRO 1 and 2), two all_gathers of the parameters per micro-batch and a
  reduce_scatter (ZeRO 3, a collective per module with parameters) (Rajbhandari et al.
  2020, sec. 7). runtime="ringcomm": one reduction per step (the Pipeline runs the other
  backwards under no_sync); runtime="deepspeed": ZeRO 2/3 reduce after every
  micro-batch. The reductions overlap the backward they follow, ZeRO 3's gathers the
  forward / backward they prefetch for, where the cluster overlaps (Cluster.overlap);
  what does not fit under that compute is exposed.
- collective times: ringcomm's cost model (csrc/comm/cost_model.h) over the real
  placement of each group's ranks on the nodes (tp fastest, then dp, then pp:
  parallel/mesh.py layout_ranks), with the cluster's link parameters (a --simulate
  preset, a --calibrate file or a communicator's own).
- memory (mixed-precision Adam, Rajbhandari et al. 2020 sec. 3.1): parameters 2 bytes,
  gradients 2, optimizer state 12 (fp32 master, momentum, variance) per parameter of
  the device (precision="fp32": 4, 4 and 8), divided by dp where the ZeRO stage shards
  them (1: the optimizer state; 2: + gradients; 3: + parameters); activations per layer
  and micro-batch s b h (10 + 24/t + 5 a s/(h t)) bytes, 2 s b h with full recompute
  plus one layer's full set during its recompute (Korthikanti et al. 2022, Table 2
  without sequence parallelism; activations="fused": s b h (4 + (4 + 2f/h)/t) elements,
  what autograd keeps for ringcomm.parallel.models.Block); the first stage holds min(m,
  p) micro-batches in flight under 1F1B, times (1 + (p-1)/(p v)) interleaved (ibid., sec.
  4.2.3), and beside them the gradients a step holds only while it runs (ZeRO 2's
  buckets; ZeRO 2/3's gradients accumulated in full under no_sync); the last stage's
  logits 6 b s V / t (fp16 and the fp32 softmax; 8 b s V / t in fp32: the softmax and
  its gradient); ZeRO 2/3's gradient shard is made by the step's reduction, after the
  activations' peak (zero_grad(set_to_none=True) frees it between steps); buffers: the stage-to-stage send and receive, the buckets' reduce
  outputs, ZeRO 3's gathered units, and the scratch ringcomm keeps for the algorithm
  the cost model picks (call_plan.cpp). A layout fits when the total is at most
  `usable_fraction` of the device's memory (the rest: the runtime's context and
  fragmentation).
"""
import dataclasses
import json
import math
from typing import Dict, Optional

# Bytes per element of what a precision keeps: activations (and what crosses the wire:
# activations, their gradients, the parameters' gradients), parameters, gradients, and the
# optimizer's state per parameter (Adam: mixed precision keeps an fp32 master, momentum
# and variance, K = 12; fp32 training steps the parameters themselves, K = 8).
PRECISIONS = {"bf16": {"act": 2, "params": 2, "grads": 2, "K": 12},
              "fp32": {"act": 4, "params": 4, "grads": 4, "K": 8}}
_ADAM_BYTES = 28  # an Adam step reads param, grad, momentum, variance and writes three of them
ACTIVATIONS = ("megatron", "fused")
# The C heap a ringcomm communicator holds besides its transport's mapped segments
# (measured: 0.33-0.46 MB at 1 to 4 ranks; tests/test_planner.py counts it in a run).
_COMM_HEAP = 0.4e6
RUNTIMES = ("ringcomm", "megatron", "deepspeed")


def _torch_dtype(precision):
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]


def _layer_activation_bytes(model, b, t, precision, activations):
    """Bytes one layer keeps for its backward, per micro-batch of b sequences on a device
    of a TP group of t. "megatron": Korthikanti et al. 2022, Table 2 without sequence
    parallelism, s b h (10 + 24/t + 5 a s/(h t)) for 16-bit activations with dropout
    masks and the attention scores kept (scaled by the element size for fp32);
    "fused": a fused attention that keeps no scores and no dropout (torch's
    scaled_dot_product_attention, ringcomm.parallel.models.Block): the layer's input,
    two LayerNorm outputs and the residual, replicated over the TP group, and q k v,
    the attention output, fc1 and GELU outputs, split over it -- s b h (4 + (4 + 2 f/h)/t)
    elements (checked against the tensors autograd saves, tests/test_planner.py)."""
    h, s, a = model.hidden, model.seq_len, model.heads
    e = PRECISIONS[precision]["act"]
    if activations == "megatron":
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) * e / 2
    return s * b * h * (4 + (4 + 2 * model.f / h) / t) * e


@dataclasses.dataclass(frozen=True)
class Transformer:
    """A GPT-style decoder: `layers` blocks of attention (`heads` heads) and an MLP of
    `ffn` (default 4 x hidden), learned position embeddings, the output projection tied
    to the token embedding (`tied`, as GPT-2 and Megatron-LM) or its own V x h + V."""
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn: Optional[int] = None
    tied: bool = True

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Transformer: {name} must be a positive integer, got {v!r}")
        if self.ffn is not None and (not isinstance(self.ffn, int) or self.ffn < 1):
            raise ValueError(f"Transformer: ffn must be a positive integer, got {self.ffn!r}")
        if self.hidden % self.heads:
            raise ValueError(f"Transformer: hidden {self.hidden} does not divide by heads {self.heads}")

    @property
    def f(self):
        return self.ffn if self.ffn is not None else 4 * self.hidden

    def layer_params(self):
        h, f = self.hidden, self.f
        return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h

    def embedding_params(self):
        return (self.vocab + self.seq_len) * self.hidden

    def head_params(self):
        """The output projection's own parameters (0 when tied) and the final LayerNorm."""
        return 2 * self.hidden + (0 if self.tied else self.vocab * self.hidden + self.vocab)

    def params(self):
        return self.layers * self.layer_params() + self.embedding_params() + self.head_params()

    def layer_forward_flops_per_token(self):
        h, f, s = self.hidden, self.f, self.seq_len
        return 2 * (4 * h * h + 2 * h * f) + 4 * s * h

    def logits_forward_flops_per_token(self):
        return 2 * self.hidden * self.vocab

    def flops(self, sequences, recompute=False):
        """(model FLOPs, hardware FLOPs) of one training iteration over `sequences`."""
        tokens = sequences * self.seq_len
        fwd_layers = self.layers * self.layer_forward_flops_per_token() * tokens
        fwd_logits = self.logits_forward_flops_per_token() * tokens
        model = 3 * (fwd_layers + fwd_logits)
        return model, model + (fwd_layers if recompute else 0)

    @classmethod
    def from_module(cls, module, seq_len=None):
        """The shapes of a torch module: a Hugging Face causal LM (its `config`: n_layer /
        num_hidden_layers, n_embd / hidden_size, n_head / num_attention_heads, vocab_size,
        n_positions / max_position_embeddings, n_inner / intermediate_size) or a
        ringcomm.parallel.models.transformer."""
        cfg = getattr(module, "config", None)
        if cfg is not None:
            def pick(*names):
                for n in names:
                    v = getattr(cfg, n, None)
                    if v is not None:
                        return v
                return None
            return cls(layers=pick("n_layer", "num_hidden_layers"), hidden=pick("n_embd", "hidden_size"),
                       heads=pick("n_head", "num_attention_heads"), vocab=pick("vocab_size"),
                       seq_len=seq_len or pick("n_positions", "max_position_embeddings"),
                       ffn=pick("n_inner", "intermediate_size"))
        import torch

        embeds = [m for m in module.modules() if isinstance(m, torch.nn.Embedding)]
        blocks = [m for m in module.modules() if hasattr(m, "attn") and hasattr(m, "mlp")]
        if len(embeds) < 2 or not blocks:
            raise ValueError("Transformer.from_module: no token and position embeddings and blocks "
                             "(attn, mlp) found; give the shapes to Transformer(...)")
        tok, pos = max(embeds, key=lambda e: e.num_embeddings), min(embeds, key=lambda e: e.num_embeddings)
        attn = blocks[0].attn
        heads = getattr(attn, "heads", None) or getattr(attn, "n_heads", None) or getattr(attn, "num_heads", None)
        linears = [m for m in blocks[0].mlp.modules() if isinstance(m, torch.nn.Linear)]
        out = [m for m in module.modules() if isinstance(m, torch.nn.Linear) and m.out_features == tok.num_embeddings]
        tied = not out or out[-1].weight is tok.weight
        return cls(layers=len(blocks), hidden=tok.embedding_dim, heads=int(heads), vocab=tok.num_embeddings,
                   seq_len=seq_len or pos.num_embeddings, ffn=linears[0].out_features if linears else None,
                   tied=tied)


@dataclasses.dataclass
class Cluster:
    """`nodes` x `devices_per_node` devices of `device_memory_gb` GB (10^9 bytes) and
    `peak_tflops` dense TFLOP/s, of which GEMMs achieve `gemm_efficiency`; links from a
    `--simulate` preset (ringcomm.bench.simulate.PRESETS), or `params` (a dict as
    Communicator.cost_params() returns, or the path of a `--calibrate` file)."""
    nodes: int
    devices_per_node: int
    device_memory_gb: float
    peak_tflops: float
    preset: Optional[str] = None
    params: object = None
    gemm_efficiency: float = 0.5
    usable_fraction: float = 0.9
    # Memory-bound work (LayerNorm, softmax, GeLU, dropout, residuals): `memory_passes`
    # reads or writes of a layer's activations (Korthikanti et al.'s bytes) per forward,
    # at `memory_gbps` (0: not modelled).
    memory_gbps: float = 0.0
    memory_passes: float = 0.0
    # Where a layer's activations outgrow the caches: `memory_passes_beyond` passes over
    # the bytes beyond `memory_passes_bytes` of a layer (None: memory_passes throughout).
    memory_passes_beyond: Optional[float] = None
    memory_passes_bytes: float = 0.0
    # The optimizer's step: seconds per parameter of the shard a device updates (None:
    # 28 bytes of Adam's traffic per parameter at memory_gbps, 0 without memory_gbps).
    optimizer_seconds_per_param: Optional[float] = None
    # Whether communication can run under compute (a GPU's copy engines and NICs do);
    # False where the same cores copy and compute (CPU ranks at least as many as cores).
    overlap: bool = True
    # What a layer's forward and backward cost per micro-batch beyond its FLOPs and bytes
    # (kernel launches, the interpreter): seconds.
    layer_overhead_seconds: float = 0.0
    # Processors the devices of a node share (CPU ranks); None: each device computes on
    # its own. With cores, a step takes at least the node's work (every device's compute,
    # copies and optimizer) divided by the cores.
    cores: Optional[int] = None
    # A micro-batch's forward and backward on a stage beyond its layers' and logits' work
    # (embedding, loss, starting the backward): seconds.
    microbatch_overhead_seconds: float = 0.0
    # What each collective or message adds on top of the cost model's figure (ranks
    # sharing cores wait for a peer to be scheduled): seconds, for two ranks, and for all
    # the node's devices (sync_seconds_world; a group in between: interpolated by size).
    sync_seconds: float = 0.0
    sync_seconds_world: Optional[float] = None
    # Devices sharing cores (CPU ranks): the figures of one device while every device of
    # the node computes at once (peak_tflops, memory_gbps, memory_passes,
    # layer_overhead_seconds, microbatch_overhead_seconds, optimizer_seconds_per_param;
    # each rank's own wall time, so the time slicing and the contention for caches and
    # memory are in them). With them the step's cores bound is the node's work timed as
    # it runs together, not the devices' work alone x devices / cores (None).
    shared: Optional[Dict[str, float]] = None
    # ZeRO 3 on devices sharing cores: the wall time each gather or reduction of a unit
    # adds to a step beyond its bytes (the hooks, the waits, the rescheduling), measured
    # with ranks in groups of two and in one group of the node's devices at once
    # (zero3_unit_seconds_world; a group in between: interpolated by size). 0: only the
    # collectives' latency and sync_seconds.
    zero3_unit_seconds: float = 0.0
    zero3_unit_seconds_world: Optional[float] = None

    SHARED_FIELDS = ("peak_tflops", "memory_gbps", "memory_passes", "memory_passes_beyond",
                     "layer_overhead_seconds", "microbatch_overhead_seconds", "optimizer_seconds_per_param")

    def __post_init__(self):
        for name in ("nodes", "devices_per_node"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Cluster: {name} must be a positive integer, got {v!r}")
        for name in ("device_memory_gb", "peak_tflops"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Cluster: {name} must be positive, got {getattr(self, name)!r}")
        if not 0 < self.gemm_efficiency <= 1 or not 0 < self.usable_fraction <= 1:
            raise ValueError("Cluster: gemm_efficiency and usable_fraction must be in (0, 1]")
        if self.memory_gbps < 0 or self.memory_passes < 0 or self.memory_passes_bytes < 0:
            raise ValueError("Cluster: memory_gbps, memory_passes and memory_passes_bytes must be >= 0")
        if self.memory_passes_beyond is not None and not self.memory_passes_beyond >= 0:
            raise ValueError(f"Cluster: memory_passes_beyond must be >= 0 or None, got {self.memory_passes_beyond!r}")
        if self.optimizer_seconds_per_param is not None and not self.optimizer_seconds_per_param >= 0:
            raise ValueError("Cluster: optimizer_seconds_per_param must be >= 0")
        for name in ("layer_overhead_seconds", "microbatch_overhead_seconds", "sync_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Cluster: {name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("sync_seconds_world", "zero3_unit_seconds", "zero3_unit_seconds_world"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"Cluster: {name} must be >= 0, got {v!r}")
        if self.shared is not None:
            if not isinstance(self.shared, dict):
                raise ValueError(f"Cluster: shared must be a dict of {', '.join(self.SHARED_FIELDS)}, "
                                 f"got {self.shared!r}")
            unknown = set(self.shared) - set(self.SHARED_FIELDS)
            if unknown:
                raise ValueError(f"Cluster: shared has unknown fields {sorted(unknown)} (known: "
                                 f"{', '.join(self.SHARED_FIELDS)})")
            for k, v in self.shared.items():
                if k == "memory_passes_beyond" and v is None:
                    continue
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                if not ok or (k == "peak_tflops" and not v > 0):
                    raise ValueError(f"Cluster: shared[{k!r}] must be a number >= 0 (peak_tflops > 0), "
                                     f"got {v!r}")
        if self.cores is not None and (not isinstance(self.cores, int) or self.cores < 1):
            raise ValueError(f"Cluster: cores must be a positive integer or None, got {self.cores!r}")
        if self.preset is not None and self.params is not None:
            raise ValueError("Cluster: give preset or params, not both")
        self._link_params = self._resolve_params()

    @property
    def devices(self):
        return self.nodes * self.devices_per_node

    def _resolve_params(self):
        from ringcomm import cost_model

        if self.preset is not None:
            from ringcomm.bench.simulate import PRESETS

            if self.preset not in PRESETS:
                raise ValueError(f"Cluster: no preset {self.preset!r} (have {sorted(PRESETS)})")
            p = dict(PRESETS[self.preset].params)
        elif isinstance(self.params, str):
            p = cost_model.load(self.params)
        elif self.params is not None:
            p = dict(self.params)
        else:
            p = cost_model.default_params()
        p = dict(p)
        p["fits"] = []  # a fit is of the topology it was measured on, not of these groups
        return cost_model.check_params(p)

    @property
    def link_params(self):
        return self._link_params

    def optimizer_seconds(self, params):
        """Seconds of the optimizer's step over `params` parameters."""
        if self.optimizer_seconds_per_param is not None:
            return params * self.optimizer_seconds_per_param
        return params * _ADAM_BYTES / (self.memory_gbps * 1e9) if self.memory_gbps else 0.0

    def as_dict(self):
        """The fields (links as a dict): Cluster(**c.as_dict()) is c again."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if d["preset"] is None:
            d["params"] = dict(self.link_params)
        return d

    @classmethod
    def measured_here(cls, comm, model, micro_batch=None, precision="bf16", memory_gb=None, seconds=0.3):
        """This machine as one node of comm.world_size CPU ranks (a call of every rank):

        - peak_tflops: the rate of the model's GEMMs (a layer's four weight shapes at
          `micro_batch` sequences, default 4), gemm_efficiency 1 (the rate is the
          achieved one);
        - memory_gbps: a copy of 64 MiB per rank (read + write bytes per second);
        - one real layer (ringcomm.parallel.models.Block, forward and backward) at 1 and
          16 sequences, t(b) = c0 + c1 b: layer_overhead_seconds is c0 (the
          per-op cost that does not grow with the batch: the interpreter and dispatch),
          memory_passes what c1 takes beyond the GEMMs at that rate, in passes over the
          layer's activation bytes at memory_gbps (LayerNorms, softmax, GELU, residuals);
          memory_passes_beyond the same from 16 to 32 sequences (memory_passes_bytes: a
          16-sequence layer's activation bytes);
        - microbatch_overhead_seconds: a two-layer model of these shapes against two of
          its layers alone, call by call in turns, less the logits' GEMMs;
        - optimizer_seconds_per_param: a step of torch's AdamW;
        - the links: comm's own cost model; overlap: off when there are at least as many
          ranks as cores (the copies run on the cores that compute);
        - device_memory_gb: the machine's memory divided by the ranks (or memory_gb).

        Each figure is rank 0's median over repeats of about `seconds`, the other ranks
        waiting: the rate of a rank with a core to itself. `shared`: the same figures
        with every rank measuring at once for ranks / cores times as long, each rank's
        mean averaged over the ranks (the rate of a rank while the node is busy: the
        time slicing and the contention for caches and memory are in it). cores: the
        processors this process may run on, which every rank shares (the step's second
        bound). sync_seconds and
        zero3_unit_seconds (every rank at once, in pairs and in one group of the world):
        what a collective between bursts of compute, and a ZeRO 3 unit's gather or
        reduction, add to the wall time."""
        import copy
        import os
        import time

        import torch

        from ringcomm.parallel import models as _models
        from ringcomm.parallel.models import Block

        dtype = _torch_dtype(precision)
        h, f, s = model.hidden, model.f, model.seq_len
        b = micro_batch or 4
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

        def mid(xs):
            return sorted(xs)[len(xs) // 2]

        def timed(fn, together=False, value=False):
            # Alone: rank 0 measures, the others wait; the median call. Together: every
            # rank calls fn for the same time at once (fn holds no collective: the counts
            # may differ); the mean call, as the time slices fall (a call the scheduler
            # interrupts is part of the rate: a median would leave it out). value: fn
            # returns the figure itself.
            out = torch.zeros(1, dtype=torch.float64)
            comm.barrier()
            if together or comm.rank == 0:
                fn()
                times = []
                t0 = time.perf_counter()
                # Together, ranks / cores times as long: as many calls as alone.
                window = seconds * (max(1.0, comm.world_size / cores) if together else 1.0)
                while time.perf_counter() - t0 < window or len(times) < 3:
                    t1 = time.perf_counter()
                    got = fn()
                    times.append(got if value else time.perf_counter() - t1)
                out[0] = sum(times) / len(times) if together else mid(times)
            if together:
                comm.all_reduce(out)
                return float(out[0]) / comm.world_size
            comm.broadcast(out, src=0)
            return float(out[0])

        tokens = b * s
        shapes = [(h, 3 * h), (h, h), (h, f), (f, h)]
        ws = [torch.randn(k, n, dtype=dtype) for k, n in shapes]
        xs = {k: torch.randn(tokens, k, dtype=dtype) for k in (h, f)}
        gemm_flops = sum(2 * tokens * k * n for k, n in shapes)
        src = torch.empty(16 << 20, dtype=torch.float32)
        dst = torch.empty_like(src)
        src.fill_(1.0)
        block = Block(h, model.heads, f).to(dtype)
        two = _models.transformer(model.vocab, h, model.heads, 2, s, f).to(dtype)
        sizes = (1, 16)
        n_opt = 1 << 20
        p = torch.nn.Parameter(torch.randn(n_opt))
        p.grad = torch.randn(n_opt)
        opt = torch.optim.AdamW([p], lr=1e-4)
        opt.step()

        def layer_line(together):
            # One real layer at 1, 16 and 32 sequences, t(b) = c0 + c1 b through the first
            # two: c0 the per-op cost that does not grow with the batch (the interpreter
            # and dispatch here; kernel launches on a GPU). (Through both ends, the line is
            # within 8% of the layer at 4 and 8 here; a least-squares line missed b = 1 by
            # 30%.) Beyond 16, slope c2 (at 32 sequences the layer ran 28% above the line
            # here: its activations leave the caches).
            per_b = []
            for bb in sizes + (2 * sizes[1],):
                inp = torch.randn(bb, s, h, dtype=dtype, requires_grad=True)
                per_b.append(timed(lambda: block(inp).sum().backward(), together))
            c1 = max(0.0, (per_b[1] - per_b[0]) / (sizes[1] - sizes[0]))
            c2 = max(0.0, (per_b[2] - per_b[1]) / sizes[1])
            return max(0.0, per_b[0] - c1), c1, c2

        def rest(tflops, together):
            # A micro-batch's cost beyond its layers and logits GEMMs: embedding, final
            # LayerNorm, loss, the backward's start -- a two-layer model of these shapes
            # at 1 and 16 sequences, less two of its layers run alone, call by call in
            # turns (a small difference of large times: taken pairwise, so that a drift
            # of the machine's speed falls on both).
            out = []
            for bb in sizes:
                tok = torch.randint(0, model.vocab, (bb, s))
                inp = torch.randn(bb, s, h, dtype=dtype, requires_grad=True)

                def pair():
                    t0 = time.perf_counter()
                    _models.lm_loss(two(tok).float(), tok).backward()
                    t1 = time.perf_counter()
                    block(block(inp)).sum().backward()
                    return (t1 - t0) - (time.perf_counter() - t1)

                diff = timed(pair, together, value=True)
                out.append(diff - 3 * model.logits_forward_flops_per_token() * bb * s / (tflops * 1e12))
            return max(0.0, sum(out) / len(out))

        # Alone: the GEMMs' rate, the copy bandwidth, the layer's line; what c1 takes beyond
        # the GEMMs is memory-bound work (LayerNorms, softmax, GELU, residuals), in passes
        # over the activation bytes at memory_gbps.
        tflops = gemm_flops / timed(lambda: [xs[k] @ w for (k, _), w in zip(shapes, ws)]) / 1e12
        gbps = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src)) / 1e9
        c0, c1, c2 = layer_line(False)
        flops_fb = 3 * model.layer_forward_flops_per_token() * s  # one sequence
        act = _layer_activation_bytes(model, 1, 1, precision, "fused")

        def passes_of(slope, tf, gb):
            return max(0.0, (slope - flops_fb / (tf * 1e12)) / 3 / (act / (gb * 1e9)))

        passes = passes_of(c1, tflops, gbps)
        alone = {"peak_tflops": tflops, "memory_gbps": gbps, "memory_passes": passes,
                 "memory_passes_beyond": passes_of(c2, tflops, gbps),
                 "layer_overhead_seconds": c0, "microbatch_overhead_seconds": rest(tflops, False),
                 "optimizer_seconds_per_param": timed(opt.step) / n_opt}
        # Together: the layer's line again; its per-sequence part slows by k = c1'/c1, the
        # GEMMs and the memory-bound work alike (their split is the one measured alone:
        # rates divided by k), its fixed part is the line's own.
        c0_s, c1_s, c2_s = layer_line(True)
        k = c1_s / c1 if c1 > 0 else 1.0
        shared = {"peak_tflops": tflops / k, "memory_gbps": gbps / k, "memory_passes": passes,
                  "memory_passes_beyond": passes_of(c2_s, tflops / k, gbps / k),
                  "layer_overhead_seconds": c0_s, "microbatch_overhead_seconds": rest(tflops / k, True),
                  "optimizer_seconds_per_param": timed(opt.step, True) / n_opt}

        def group_of(g):
            """This rank's group when the world splits into groups of g consecutive ranks."""
            if g == comm.world_size:
                return comm
            group = None
            for first in range(0, comm.world_size, g):
                got = comm.split(list(range(first, first + g)))
                if got is not None:
                    group = got
            return group

        # What a collective costs when the ranks share cores and compute between calls (a
        # peer may be off the core: its wake-up, not the wire, is the latency; the more
        # peers a call waits for, the longer): every rank at once, 30 rounds of a few
        # GEMMs, with and without an 8-byte all_reduce in groups of g ranks after each;
        # five such pairs, alternating, the median of their differences per round.
        # And what a ZeRO 3 unit's collective adds: a step of the two-layer model (one
        # micro-batch of b sequences) under ZeroDataParallel stage 3 against stage 1 over
        # the same group, alternating, the difference per unit and collective (stage 3
        # gathers every unit twice and reduces it once a step; stage 1 reduces and
        # gathers one bucket). For g = 2 (pairs) and g = the world.
        tiny = torch.zeros(2)
        xb = torch.randn(4 * s, h, dtype=dtype)
        tok_b = torch.randint(0, model.vocab, (b, s))

        def rounds(group, with_sync):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(30):
                for _ in range(4):
                    xb @ ws[2]
                if with_sync:
                    group.all_reduce(tiny)
            out = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            comm.all_reduce(out, op="max")
            return float(out[0])

        def zero3_unit(group):
            from ringcomm.parallel.zero import ZeroDataParallel

            zs = {st: ZeroDataParallel(copy.deepcopy(two), group, stage=st, lr=1e-4) for st in (1, 3)}
            times = {1: [], 3: []}
            for i in range(8):
                for st, z in zs.items():
                    comm.barrier()
                    t0 = time.perf_counter()
                    _models.lm_loss(z(tok_b).float(), tok_b).backward()
                    z.step()
                    z.zero_grad(set_to_none=True)
                    if i >= 2:  # the first steps allocate
                        times[st].append(time.perf_counter() - t0)
            units = len(zs[3].units)
            for z in zs.values():
                z.remove_hooks()
            out = torch.tensor([mid(times[3]) - mid(times[1])], dtype=torch.float64)
            comm.all_reduce(out)
            return max(0.0, float(out[0]) / comm.world_size / (3 * units))

        sync, unit = {}, {}
        for g in sorted({2, comm.world_size}):
            if g < 2 or g > comm.world_size or comm.world_size % g:
                continue
            group = group_of(g)
            rounds(group, True)
            diffs = sorted(rounds(group, True) - rounds(group, False) for _ in range(5))
            sync[g] = max(0.0, diffs[2] / 30)
            unit[g] = zero3_unit(group)
            if group is not comm:
                group.close()

        if memory_gb is None:
            memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9 / comm.world_size
        return cls(nodes=1, devices_per_node=comm.world_size, device_memory_gb=memory_gb,
                   params=comm.cost_params(), gemm_efficiency=1.0, **alone, shared=shared,
                   memory_passes_bytes=sizes[1] * act,
                   sync_seconds=sync.get(2, 0.0), sync_seconds_world=sync.get(comm.world_size, 0.0),
                   zero3_unit_seconds=unit.get(2, 0.0), zero3_unit_seconds_world=unit.get(comm.world_size, 0.0),
                   overlap=comm.world_size < cores, cores=cores)


@dataclasses.dataclass
class Layout:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    micro_batch: int
    interleave: int
    recompute: bool
    microbatches: int = 0
    step_seconds: float = math.inf
    tflops_per_device: float = 0.0
    hardware_tflops_per_device: float = 0.0
    memory_bytes: Dict[str, float] = dataclasses.field(default_factory=dict)
    fits: bool = False
    reason: str = ""
    bubble_seconds: float = 0.0
    bubble_fraction: float = 0.0
    compute_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    comm_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
    hidden_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
    # The step's bounds: "critical_path" (the pipeline, the exposed communication, the
    # optimizer) and, for devices sharing cores, "cores" (the node's work as it runs
    # together); step_seconds is the larger.
    bounds_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
    global_batch: int = 0
    sources: Dict[str, str] = dataclasses.field(default_factory=dict)

    def describe(self):
        gb = 1e9
        m = self.memory_bytes
        comm = ", ".join(f"{k} {v * 1e3:.1f} ms ({self.hidden_seconds.get(k, 0) * 1e3:.1f} hidden)"
                         for k, v in self.comm_seconds.items() if v)
        return (f"tp {self.tp} x pp {self.pp} x dp {self.dp}, ZeRO {self.zero_stage}, micro-batch {self.micro_batch}"
                f" x {self.microbatches}, interleave {self.interleave}, recompute {self.recompute}: "
                f"{self.step_seconds:.3f} s/step, {self.tflops_per_device:.1f} model TFLOP/s per device"
                + (f" ({self.hardware_tflops_per_device:.1f} hardware)" if self.recompute else "")
                + f", bubble {self.bubble_fraction:.1%}; memory {m.get('total', 0) / gb:.2f} GB (params "
                f"{m.get('params', 0) / gb:.2f}, grads {m.get('grads', 0) / gb:.2f}"
                + (f" + {m['step_gradients'] / gb:.2f} during the step" if m.get("step_gradients") else "")
                + ", optimizer "
                f"{m.get('optimizer_state', 0) / gb:.2f}, activations {m.get('activations', 0) / gb:.2f}, buffers "
                f"{m.get('buffers', 0) / gb:.2f})" + (f"; comm: {comm}" if comm else "")
                + ("" if self.fits else f"; does not fit: {self.reason}"))

    def deepspeed_config(self):
        """The DeepSpeed config of this layout (a dict; json.dumps it). DeepSpeed's pipeline
        engine takes ZeRO stage 0 or 1 only and no interleaving: a layout beyond that is
        written anyway, with "_ringcomm_note" saying what DeepSpeed would refuse."""
        cfg = {
            "train_batch_size": self.global_batch,
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.microbatches,
            "zero_optimization": {"stage": self.zero_stage},
            "bf16": {"enabled": True},
            "pipeline": {"pipe_parallel_size": self.pp, "model_parallel_size": self.tp},
            "activation_checkpointing": {"partition_activations": False,
                                         "contiguous_memory_optimization": False} if self.recompute else {},
        }
        notes = []
        if self.pp > 1 and self.zero_stage > 1:
            notes.append("DeepSpeed's PipelineEngine refuses ZeRO stages 2 and 3 (ringcomm's Pipeline over "
                         "ZeroDataParallel runs them)")
        if self.interleave > 1:
            notes.append("DeepSpeed's pipeline has no interleaved schedule (Megatron-LM's "
                         "--num-layers-per-virtual-pipeline-stage does)")
        if notes:
            cfg["_ringcomm_note"] = "; ".join(notes)
        return cfg

    def ringcomm_calls(self):
        """The ringcomm.parallel calls that run this layout (as source text)."""
        wrap = (f"ZeroDataParallel(stage, g.dp, stage={self.zero_stage}, mixed_precision=\"bf16\", lr=1e-4)"
                if self.zero_stage else "DataParallel(stage, g.dp)")
        lines = [
            "import ringcomm",
            "from ringcomm.parallel import DataParallel, Pipeline, ZeroDataParallel, split_3d, tensor_parallel",
            "comm = ringcomm.init()",
            f"g = split_3d(comm, tp={self.tp}, pp={self.pp})  # dp = {self.dp}",
            "stage = tensor_parallel(my_stage_of_the_model, g.tp)  # this rank's pp stage, "
            f"{'Megatron column/row split' if self.tp > 1 else 'tp 1: unchanged'}",
            f"model = {wrap}",
            f"pipe = Pipeline(model, g.pp, \"1f1b\", n_microbatches={self.microbatches}, loss_fn=loss)",
            f"losses = pipe.step(tokens, target)  # tokens: this dp rank's {self.micro_batch * self.microbatches}"
            " sequences",
            "model.step(); model.zero_grad()" if self.zero_stage else "model.finish(); opt.step()",
        ]
        if self.recompute:
            lines.append("# recompute: wrap each block's forward in torch.utils.checkpoint.checkpoint")
        if self.interleave > 1:
            lines.append(f"# interleave {self.interleave}: ringcomm's Pipeline has one stage per rank (gpipe, "
                         "1f1b); run it as interleave 1, or with torch.distributed.pipelining's "
                         "ScheduleInterleaved1F1B over the ringcomm backend")
        return "\n".join(lines)

    def as_dict(self):
        return dataclasses.asdict(self)


SOURCES = {
    "params": "Narayanan et al. 2021 (Megatron-LM on A100s), sec. 5.1",
    "flops": "Narayanan et al. 2021, eq. 3 (model FLOPs 72 B s l h^2 (...), 96 with recompute)",
    "bubble": "Narayanan et al. 2021, sec. 2.2: (p-1)/v micro-batch times of a step of m + (p-1)/v",
    "tp_comm": "Shoeybi et al. 2019 (Megatron-LM), fig. 4: 2 all_reduces forward, 2 backward per layer",
    "pp_comm": "Narayanan et al. 2021, sec. 4.1: scatter/gather of b s h / t per TP rank",
    "dp_comm": "Rajbhandari et al. 2020 (ZeRO), sec. 7: volumes per stage",
    "memory_states": "Rajbhandari et al. 2020, sec. 3.1 and 5: 2 + 2 + 12 bytes per parameter",
    "memory_activations": "Korthikanti et al. 2022, Table 2 and sec. 4.2.3",
    "collectives": "ringcomm's cost model (csrc/comm/cost_model.h) over each group's placement",
}


class _Collectives:
    """Predicted seconds of a collective over a group's ranks (memoised per placement)."""

    def __init__(self, cluster):
        from ringcomm import cost_model

        self._cm = cost_model
        self._params = cluster.link_params
        self._dpn = cluster.devices_per_node
        self._sync = self._pair_world(cluster.sync_seconds, cluster.sync_seconds_world)
        self._unit = self._pair_world(cluster.zero3_unit_seconds, cluster.zero3_unit_seconds_world)
        self._models = {}
        self._cache = {}

    def _pair_world(self, pair, world):
        """A figure measured for 2 ranks and for all of a node's devices: linear in
        between (the world's is the pair's where not measured)."""
        world = pair if world is None else world

        def at(n):
            if n <= 2 or self._dpn <= 2:
                return pair
            return pair + (world - pair) * min(1.0, (n - 2) / (self._dpn - 2))
        return at

    def sync(self, n):
        """The scheduling wait of a call among n ranks (Cluster.sync_seconds)."""
        return self._sync(n)

    def zero3_unit(self, n):
        """What a ZeRO 3 unit's collective among n ranks adds to the wall time
        (Cluster.zero3_unit_seconds)."""
        return self._unit(n)

    def _model(self, ranks):
        labels = tuple(r // self._dpn for r in ranks)
        # Host labels renumbered from 0 in order of appearance (the model's hosts).
        seen = {}
        key = tuple(seen.setdefault(h, len(seen)) for h in labels)
        if key not in self._models:
            self._models[key] = self._cm.model(list(key), params=self._params)
        return key, self._models[key]

    def seconds(self, op, ranks, nbytes):
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        key, model = self._model(ranks)
        ck = (op, key, int(nbytes))
        if ck not in self._cache:
            self._cache[ck] = min(t for _, t in model.predict(op, int(nbytes)) if t == t) + self.sync(len(ranks))
        return self._cache[ck]

    def scratch(self, op, ranks, nbytes):
        """Bytes of scratch ringcomm keeps for the algorithm the cost model picks (a
        communicator keeps its largest: csrc/comm/call_plan.cpp scratch_bytes)."""
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        _, model = self._model(ranks)
        # The first of the fastest, as the model orders them (the communicator's pick on a tie).
        algo = min((x for x in model.predict(op, int(nbytes)) if x[1] == x[1]), key=lambda x: x[1],
                   default=(None, 0))[0]
        n = len(ranks)
        if op == "all_reduce":
            return {"oneshot": n * nbytes, "recursive_doubling": nbytes, "rabenseifner": nbytes}.get(algo, 0.0)
        if op == "reduce_scatter" and algo == "hierarchical":
            return n * nbytes
        return 0.0

    def p2p(self, a, b, nbytes):
        """One message from rank a to rank b: alpha + bytes x beta of the link between them."""
        if nbytes <= 0:
            return 0.0
        link = self._params["intra" if a // self._dpn == b // self._dpn else "inter"]
        return link["alpha"] + nbytes * link["beta"] + self._sync(2)


def _stages(layers, pp, runtime):
    """(layers, holds the embedding, holds the head) of each of pp stages."""
    if runtime == "ringcomm":
        # As ringcomm.parallel.models.stage_bounds: L + 2 modules, the first `extra` stages
        # one more, the embedding first and the head last.
        base, extra = divmod(layers + 2, pp)
        out, start = [], 0
        for i in range(pp):
            end = start + base + (1 if i < extra else 0)
            n = sum(1 for j in range(start, end) if 1 <= j <= layers)
            out.append((n, start == 0, end == layers + 2))
            start = end
        return out
    per = math.ceil(layers / pp)
    return [(per, i == 0, i == pp - 1) for i in range(pp)]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


CONSTRAINTS = ("tp", "pp", "dp", "zero_stage", "micro_batch", "interleave", "recompute")


def plan(model, cluster, global_batch, max_micro_batch=16, max_interleave=1, dp_overlap=True, precision="bf16",
         activations="megatron", runtime="ringcomm", **constraints):
    """Every layout of `model` on `cluster` for `global_batch` sequences per step, the
    ones that fit first, fastest first, then the rest with their reason. `constraints`
    fix any of tp, pp, dp, zero_stage, micro_batch, interleave, recompute (a value, or a
    list of values to choose among). interleave > 1 (Narayanan et al.'s interleaved
    1F1B) is considered up to `max_interleave` (1 by default: ringcomm's and DeepSpeed's
    pipelines do not interleave). dp_overlap=False: the data-parallel reductions run
    after the backward instead of under it (Megatron-LM of 2021 did; ringcomm's
    DataParallel and ZeroDataParallel overlap them).

    precision: "bf16" (mixed precision: 16-bit parameters, gradients and activations,
    fp32 Adam state) or "fp32". activations: "megatron" (Korthikanti et al.'s bytes) or
    "fused" (a fused attention without dropout, as ringcomm.parallel.models). runtime:
    "ringcomm" (its Pipeline runs every backward but the last under no_sync, so ZeRO 2/3
    hold the full gradients while micro-batches accumulate and reduce once per step) or
    "deepspeed" (ZeRO 2/3 reduce-scatter after every micro-batch and keep only the
    shard)."""
    if precision not in PRECISIONS:
        raise ValueError(f"plan: precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"plan: activations must be one of {ACTIVATIONS}, got {activations!r}")
    if runtime not in RUNTIMES:
        raise ValueError(f"plan: runtime must be one of {RUNTIMES}, got {runtime!r}")
    if not isinstance(model, Transformer) or not isinstance(cluster, Cluster):
        raise TypeError("plan(model, cluster, ...): a Transformer and a Cluster")
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
    unknown = set(constraints) - set(CONSTRAINTS)
    if unknown:
        raise ValueError(f"plan: unknown constraints {sorted(unknown)} (known: {', '.join(CONSTRAINTS)})")

    def allowed(name, default):
        if name not in constraints or constraints[name] is None:
            return default
        v = constraints[name]
        vals = list(v) if isinstance(v, (list, tuple, set)) else [v]
        return [x for x in default if x in vals] if name != "recompute" else [bool(x) for x in vals]

    n = cluster.devices
    coll = _Collectives(cluster)
    out = []
    for tp in allowed("tp", [d for d in _divisors(n) if model.heads % d == 0]):
        for pp in allowed("pp", [d for d in _divisors(n // tp) if d <= model.layers]):
            dp = n // (tp * pp)
            if dp not in allowed("dp", [dp]):
                continue
            for b in allowed("micro_batch", [d for d in _divisors(global_batch) if d <= max_micro_batch]):
                if global_batch % (dp * b):
                    continue
                m = global_batch // (dp * b)
                for v in allowed("interleave", [x for x in (1, 2, 4, 8) if x <= max_interleave]):
                    if v > 1 and (pp == 1 or m % pp or model.layers % (pp * v)):
                        continue
                    for zero in allowed("zero_stage", [0, 1, 2, 3]):
                        if zero and dp == 1:
                            continue  # nothing to shard over
                        for rc in allowed("recompute", [False, True]):
                            out.append(_predict(model, cluster, coll, global_batch, tp, pp, dp, b, m, v, zero, rc,
                                                dp_overlap, precision, activations, runtime))
    out.sort(key=lambda lay: (not lay.fits, lay.step_seconds))
    return out


def _predict(model, cluster, coll, global_batch, tp, pp, dp, b, m, v, zero, recompute, dp_overlap=True,
             precision="bf16", activations="megatron", runtime="ringcomm"):
    from ringcomm.parallel.mesh import layout_ranks

    lay = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch=b, interleave=v, recompute=recompute,
                 microbatches=m, global_batch=global_batch, sources=dict(SOURCES))
    h, s, a, V, L = model.hidden, model.seq_len, model.heads, model.vocab, model.layers
    tp_groups, pp_groups, dp_groups = layout_ranks(cluster.devices, tp, pp, dp)
    tp_g, pp_g, dp_g = tp_groups[0], pp_groups[0], dp_groups[0]
    tokens = b * s
    # Each stage's (layers, embedding?, head?): ringcomm's Pipeline over
    # models.stage_bounds cuts the L + 2 modules evenly; the uniform split of Megatron-LM
    # and DeepSpeed gives every stage ceil(L / p) layers beside the embedding / logits.
    stages = _stages(L, pp, runtime)
    layers_per_stage = max(n for n, _, _ in stages)

    prec = PRECISIONS[precision]
    e = prec["act"]
    per_layer_full = _layer_activation_bytes(model, b, tp, precision, activations)
    f_layer = model.layer_forward_flops_per_token() * tokens / tp
    # ringcomm's tensor_parallel leaves the embedding and head whole on every TP rank.
    vocab_replicated = runtime == "ringcomm"
    vtp = 1 if vocab_replicated else tp

    def compute_rates(fig):
        """(a layer's forward, the logits' forward, a micro-batch's overhead) from a set of
        the cluster's compute figures (its own, or those of Cluster.shared)."""
        r = fig["peak_tflops"] * 1e12 * cluster.gemm_efficiency
        beyond, edge = fig["memory_passes_beyond"], cluster.memory_passes_bytes
        if beyond is None or not edge:
            passes_bytes = per_layer_full * fig["memory_passes"]
        else:  # the bytes past the caches' edge at their own rate
            passes_bytes = min(per_layer_full, edge) * fig["memory_passes"] + max(0.0, per_layer_full - edge) * beyond
        t_l = (f_layer / r + fig["layer_overhead_seconds"] / 3
               + (passes_bytes / (fig["memory_gbps"] * 1e9) if fig["memory_gbps"] else 0.0))
        return t_l, model.logits_forward_flops_per_token() * tokens / vtp / r, fig["microbatch_overhead_seconds"]

    own = {k: getattr(cluster, k) for k in Cluster.SHARED_FIELDS}
    t_layer, t_logits, t_over = compute_rates(own)
    # TP: 2 all_reduces of b s h per layer forward, 2 backward, 2 more to recompute.
    ar = coll.seconds("all_reduce", tp_g, tokens * h * e)
    # PP: an activation forward and a gradient back per micro-batch and boundary (x v).
    t_pp = 0.0
    if pp > 1:
        hop = max(coll.p2p(pp_g[i], pp_g[i + 1], tokens * h * e / tp) for i in range(pp - 1))
        t_pp = 2 * hop * v + coll.p2p(pp_g[0], pp_g[1], 64) * v  # + the activation's header

    def micro_batch_time(n_layers, head, rates=None):
        t_lay, t_log, t_ov = rates or (t_layer, t_logits, t_over)
        t_f = n_layers * t_lay + (t_log if head else 0.0) + t_ov / 3
        t_b = 2 * t_f + (n_layers * t_lay if recompute else 0.0)
        t_tp = n_layers * ar * (6 if recompute else 4)
        return t_f, t_b, t_tp, t_f + t_b + t_tp + t_pp

    per_stage = [micro_batch_time(n, head) for n, _, head in stages]
    slowest = max(range(pp), key=lambda i: per_stage[i][3])
    t_f, t_b, t_tp, t_mb = per_stage[slowest]
    if runtime == "ringcomm":
        # 1F1B over unequal stages: the slowest runs its m micro-batches, the others fill
        # and drain around it ((m + p - 1) t when the stages are equal).
        t_pipe = m * t_mb + sum(x[3] for x in per_stage) - t_mb
    else:
        t_pipe = (m + (pp - 1) / v) * t_mb  # Narayanan et al.: the slowest stage, (p-1)/v in the bubble
    bubble = t_pipe - m * t_mb

    # DP / ZeRO over the dp group, per device of the first stage (it holds the embeddings).
    def stage_params(n_layers, emb, head):
        """Parameters of a stage's device: the layers split over TP, the embedding and
        head split too (Megatron's vocabulary-parallel ones) or, under ringcomm's
        tensor_parallel, replicated."""
        ends = ((model.embedding_params() if emb else 0)
                + (model.head_params() + (model.vocab * model.hidden if model.tied and pp > 1 else 0)
                   if head else 0))
        return n_layers * model.layer_params() / tp + ends / (1 if vocab_replicated else tp)

    psi = max(stage_params(*st) for st in stages)
    grad_bytes = psi * e
    layer_bytes = model.layer_params() / tp * prec["params"]
    # How many reductions a step makes: ringcomm's Pipeline reduces once (the last
    # backward; the others run under no_sync), DeepSpeed's ZeRO 2/3 after every micro-batch.
    reductions = m if (runtime != "ringcomm" and zero >= 2) else 1
    u3 = 0.0
    if zero == 0:
        dp_total = coll.seconds("all_reduce", dp_g, grad_bytes)
        dp_hidden = min(dp_total, t_b)
    else:
        # ZeRO 3 gathers and reduces a unit per module that holds parameters (six a
        # layer: two LayerNorms, qkv, proj, fc1, fc2; and the embedding / head's), each
        # its own collective: their latency counts, not only their bytes.
        units = 6 * layers_per_stage + 2 if zero == 3 else 1
        # Where measured (Cluster.zero3_unit_seconds: ranks sharing cores), what a unit's
        # collective adds to the wall time replaces the generic scheduling wait.
        u3 = coll.zero3_unit(len(dp_g)) if zero == 3 else 0.0
        extra = u3 - coll.sync(len(dp_g)) if u3 else 0.0
        rs = units * (coll.seconds("reduce_scatter", dp_g, grad_bytes / units) + extra) * reductions
        dp_total, dp_hidden = rs, min(rs, reductions * t_b)  # each reduce under the backward it follows
        if zero in (1, 2):
            dp_total += coll.seconds("all_gather", dp_g, psi * prec["params"])  # after the step
        else:
            ag = 2 * m * units * (coll.seconds("all_gather", dp_g, psi * prec["params"] / units) + extra)
            dp_total += ag
            dp_hidden += min(ag, m * (t_f + t_b))  # prefetched under forward and backward
    if not (dp_overlap and cluster.overlap):
        dp_hidden = 0.0
    # The optimizer steps the shard the device owns (all of psi without ZeRO).
    t_opt = cluster.optimizer_seconds(psi / dp if zero else psi)
    lay.comm_seconds = {"tp": m * t_tp, "pp": m * t_pp, "dp": dp_total}
    lay.hidden_seconds = {"tp": 0.0, "pp": 0.0, "dp": dp_hidden}
    lay.compute_seconds = m * (t_f + t_b)
    lay.optimizer_seconds = t_opt
    lay.step_seconds = t_pipe + (dp_total - dp_hidden) + t_opt
    lay.bounds_seconds = {"critical_path": lay.step_seconds}
    if cluster.cores:
        # Devices sharing processors: the node's work over its cores bounds the step too.
        # Waiting for a peer to be scheduled holds no core: the node's work leaves it out.
        s_tp = coll.sync(len(tp_g)) if tp > 1 else 0.0
        s_dp = coll.sync(len(dp_g)) if dp > 1 else 0.0
        s_pp = coll.sync(2) if pp > 1 else 0.0
        waits_mb = [n * (6 if recompute else 4) * s_tp + 3 * v * s_pp for n, _, _ in stages]
        if zero == 0:
            dp_calls = 1
        elif zero in (1, 2):
            dp_calls = reductions + 1
        else:
            dp_calls = units * (reductions + 2 * m)
        # ZeRO 3's measured per-unit figure is wall time of ranks running together: on top.
        wall = dp_calls * u3 if u3 else 0.0
        comm_work = (m * sum(x[3] - x[0] - x[1] - w for x, w in zip(per_stage, waits_mb)) / pp
                     + dp_total - dp_calls * (u3 if u3 else s_dp))
        share = cluster.devices_per_node / cluster.cores
        if cluster.shared:
            # The compute as it runs with every device at once (Cluster.shared): wall time.
            fig = dict(own, **cluster.shared)
            rates = compute_rates(fig)
            busy = [micro_batch_time(n, head, rates) for n, _, head in stages]
            per_param = fig["optimizer_seconds_per_param"]
            opt_s = share * t_opt if per_param is None else per_param * (psi / dp if zero else psi)
            wall += m * sum(x[0] + x[1] for x in busy) / pp + opt_s
            work = comm_work
        else:
            work = comm_work + m * sum(x[0] + x[1] for x in per_stage) / pp + t_opt
        lay.bounds_seconds["cores"] = share * work + wall
        lay.step_seconds = max(lay.bounds_seconds.values())
    lay.bubble_seconds = bubble
    lay.bubble_fraction = bubble / lay.step_seconds if lay.step_seconds else 0.0
    flops_model, flops_hw = model.flops(global_batch, recompute)
    n = cluster.devices
    lay.tflops_per_device = flops_model / lay.step_seconds / n / 1e12
    lay.hardware_tflops_per_device = flops_hw / lay.step_seconds / n / 1e12

    # Memory of each stage's device, the fullest reported: its parameters' states, the
    # micro-batches it holds in flight (1F1B: p - s on stage s), the last stage's logits.
    def stage_memory(i, n_layers, emb, head):
        p_s = stage_params(n_layers, emb, head)
        g_bytes = p_s * e
        mem_params = p_s * prec["params"] / (dp if zero == 3 else 1)
        mem_grads = p_s * prec["grads"] / (dp if zero >= 2 else 1)
        # ZeRO 2/3 under ringcomm's Pipeline accumulate the micro-batches' gradients in
        # full (no_sync) until the last backward reduces them; ZeRO 2's buckets (25 MiB,
        # two in flight) are allocated as that backward starts: both are held beside the
        # activations still in flight.
        acc = p_s * prec["grads"] if (zero >= 2 and reductions == 1 and m > 1) else 0.0
        bucket = min(2 * 25 * 2 ** 20, g_bytes) if zero == 2 else 0.0
        mem_opt = prec["K"] * p_s / (dp if zero >= 1 else 1)
        per_mb = n_layers * (2 * s * b * h * e / 2 if recompute else per_layer_full)
        k = min(m, pp - i) * ((1 + (pp - 1) / (pp * v)) if v > 1 else 1)
        # The peak among: k micro-batches in flight before the first backward; after it,
        # with the accumulated gradients (k again in flight if more forwards follow); the
        # last backward's start, one micro-batch in flight beside the gradients and the
        # buckets it fills.
        steady = (k * per_mb if m > k else (k - 1) * per_mb) + acc if acc else 0.0
        act = max(k * per_mb, steady, per_mb + acc + bucket)
        transient = act - k * per_mb if act > k * per_mb else 0.0
        act += per_layer_full if recompute else 0.0  # one layer's full set while it is recomputed
        if head:
            act += (6 if precision == "bf16" else 2 * e) * b * s * V / vtp  # logits (and softmax)
        buffers = 2 * tokens * h * e / tp if pp > 1 else 0.0  # the stage-to-stage send / receive
        if runtime == "ringcomm":  # the scratch a communicator keeps for its largest call's algorithm
            buffers += 3 * _COMM_HEAP  # and the TP, PP and DP communicators themselves
            buffers += coll.scratch("all_reduce", tp_g, tokens * h * e)
            buffers += coll.scratch("all_reduce" if zero == 0 else "reduce_scatter", dp_g,
                                    min(25 * 2 ** 20, g_bytes))
        if zero == 3:
            if runtime == "ringcomm":
                # A unit per module: the one computing and the prefetched one gathered, and
                # the unit whose gradients are being reduced (its bucket and output).
                widest = max(3 * h * h, h * model.f) / tp
                buffers += 2 * widest * prec["params"] + widest * prec["grads"] * (1 + 1 / dp)
            else:
                buffers += 2 * layer_bytes + min(2 * 25 * 2 ** 20, g_bytes) * (1 + 1 / dp)
        # ZeRO 2/3's gradient shard is made by the step's reduction, once the activations
        # are gone (a step starting with zero_grad(set_to_none=True), torch's default, frees
        # it): it does not add to the activations' peak.
        held = act + (mem_grads if zero < 2 else 0.0)
        if zero >= 2:
            held = max(held, mem_grads + bucket)
        return {"params": mem_params, "grads": mem_grads, "optimizer_state": mem_opt,
                "step_gradients": transient, "activations": act - transient, "buffers": buffers,
                "total": mem_params + mem_opt + held + buffers}

    lay.memory_bytes = max((stage_memory(i, *st) for i, st in enumerate(stages)), key=lambda d: d["total"])
    total = lay.memory_bytes["total"]
    cap = cluster.device_memory_gb * 1e9 * cluster.usable_fraction
    lay.fits = total <= cap
    if not lay.fits:
        lay.reason = (f"{total / 1e9:.1f} GB per device > {cap / 1e9:.1f} GB usable "
                      f"({cluster.usable_fraction:.0%} of {cluster.device_memory_gb:g} GB)")
    if model.heads % tp:
        lay.fits, lay.reason = False, f"heads {model.heads} do not divide by tp {tp}"
    return lay


def to_json(layouts):
    return json.dumps([lay.as_dict() for lay in layouts], indent=1)
