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
  at memory_gbps; the last stage also computes the logits.
- pipeline (1F1B, Narayanan et al. 2021 sec. 2.2): a step is (m + (p-1)/v) micro-batch
  times of the slowest stage, the bubble (p-1)/v of them (m micro-batches, v
  interleaved chunks per stage); interleaving multiplies the stage-to-stage traffic by v.
- TP: per layer and micro-batch, 2 all_reduces of b s h activations in the forward, 2 in
  the backward, 2 more with recompute (Shoeybi et al. 2019, fig. 4); on the critical path.
- PP: per micro-batch and stage boundary one activation forward and one gradient back,
  b s h / t per TP rank (the scatter / gather of Narayanan et al. 2021 sec. 4.1).
- DP: the gradients' all_reduce (ZeRO 0), reduce_scatter + all_gather of the
  parameters (ZeRO 1), a reduce_scatter per micro-batch (ZeRO 2) and two all_gathers of
  the parameters per micro-batch (ZeRO 3) (Rajbhandari et al. 2020, sec. 7); the
  gradient reductions overlap the backward they follow (the last micro-batch's for
  ZeRO 0/1, each micro-batch's for 2/3), ZeRO 3's gathers the forward / backward they
  prefetch for; what does not fit under that compute is exposed.
- collective times: ringcomm's cost model (csrc/comm/cost_model.h) over the real
  placement of each group's ranks on the nodes (tp fastest, then dp, then pp:
  parallel/mesh.py layout_ranks), with the cluster's link parameters (a --simulate
  preset, a --calibrate file or a communicator's own).
- memory (mixed-precision Adam, Rajbhandari et al. 2020 sec. 3.1): parameters 2 bytes,
  gradients 2, optimizer state 12 (fp32 master, momentum, variance) per parameter of
  the device, divided by dp where the ZeRO stage shards them (1: the optimizer state;
  2: + gradients; 3: + parameters); activations per layer and micro-batch s b h (10 +
  24/t + 5 a s/(h t)) bytes, 2 s b h with full recompute plus one layer's full set
  during its recompute (Korthikanti et al. 2022, Table 2 without sequence parallelism);
  the first stage holds min(m, p) micro-batches in flight under 1F1B, times (1 +
  (p-1)/(p v)) interleaved (ibid., sec. 4.2.3); the last stage's logits 6 b s V / t
  (fp16 and the fp32 softmax); buffers: the stage-to-stage send and receive, ZeRO 2/3's
  two gradient buckets, ZeRO 3's gathered layer and the prefetched one. A layout fits
  when the total is at most `usable_fraction` of the device's memory (the rest: the
  runtime's context and fragmentation).
"""
import dataclasses
import json
import math
from typing import Dict, Optional

_BYTES_ACT = 2  # fp16 / bf16 activations and gradients on the wire


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
        if self.memory_gbps < 0 or self.memory_passes < 0:
            raise ValueError("Cluster: memory_gbps and memory_passes must be >= 0")
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

    @classmethod
    def measured_here(cls, comm, model, micro_batch=1, tp=1, memory_gb=None, repeats=5):
        """This machine as one node of comm.world_size CPU ranks: the compute rate a GEMM
        of the model's shapes reaches here (gemm_efficiency 1: the rate is the achieved
        one), the links of comm's own cost model, the memory available."""
        import os
        import time

        import torch

        h, f = model.hidden, model.f
        x = torch.randn(micro_batch * model.seq_len, h)
        w = torch.randn(h, max(1, f // tp))
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            x @ w
            best = min(best, time.perf_counter() - t0)
        tflops = 2 * x.shape[0] * h * w.shape[1] / best / 1e12
        if memory_gb is None:
            memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9 / comm.world_size
        return cls(nodes=1, devices_per_node=comm.world_size, device_memory_gb=memory_gb, peak_tflops=tflops,
                   params=comm.cost_params(), gemm_efficiency=1.0)


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
    comm_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
    hidden_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
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
                f"{m.get('params', 0) / gb:.2f}, grads {m.get('grads', 0) / gb:.2f}, optimizer "
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
        self._models = {}
        self._cache = {}

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
            self._cache[ck] = min(t for _, t in model.predict(op, int(nbytes)) if t == t)
        return self._cache[ck]

    def p2p(self, a, b, nbytes):
        """One message from rank a to rank b: alpha + bytes x beta of the link between them."""
        if nbytes <= 0:
            return 0.0
        link = self._params["intra" if a // self._dpn == b // self._dpn else "inter"]
        return link["alpha"] + nbytes * link["beta"]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


CONSTRAINTS = ("tp", "pp", "dp", "zero_stage", "micro_batch", "interleave", "recompute")


def plan(model, cluster, global_batch, max_micro_batch=16, max_interleave=1, dp_overlap=True, **constraints):
    """Every layout of `model` on `cluster` for `global_batch` sequences per step, the
    ones that fit first, fastest first, then the rest with their reason. `constraints`
    fix any of tp, pp, dp, zero_stage, micro_batch, interleave, recompute (a value, or a
    list of values to choose among). interleave > 1 (Narayanan et al.'s interleaved
    1F1B) is considered up to `max_interleave` (1 by default: ringcomm's and DeepSpeed's
    pipelines do not interleave). dp_overlap=False: the data-parallel reductions run
    after the backward instead of under it (Megatron-LM of 2021 did; ringcomm's
    DataParallel and ZeroDataParallel overlap them)."""
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
                                                dp_overlap))
    out.sort(key=lambda lay: (not lay.fits, lay.step_seconds))
    return out


def _predict(model, cluster, coll, global_batch, tp, pp, dp, b, m, v, zero, recompute, dp_overlap=True):
    from ringcomm.parallel.mesh import layout_ranks

    lay = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero, micro_batch=b, interleave=v, recompute=recompute,
                 microbatches=m, global_batch=global_batch, sources=dict(SOURCES))
    h, s, a, V, L = model.hidden, model.seq_len, model.heads, model.vocab, model.layers
    rate = cluster.peak_tflops * 1e12 * cluster.gemm_efficiency
    tp_groups, pp_groups, dp_groups = layout_ranks(cluster.devices, tp, pp, dp)
    tp_g, pp_g, dp_g = tp_groups[0], pp_groups[0], dp_groups[0]
    layers_per_stage = math.ceil(L / pp)
    tokens = b * s

    # Compute per micro-batch of the slowest (last) stage: its layers and the logits.
    f_layers = layers_per_stage * model.layer_forward_flops_per_token() * tokens / tp
    f_logits = model.logits_forward_flops_per_token() * tokens / tp
    per_layer_full = s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))  # Korthikanti et al.'s bytes
    t_mem = (layers_per_stage * per_layer_full * cluster.memory_passes / (cluster.memory_gbps * 1e9)
             if cluster.memory_gbps else 0.0)
    t_layers = f_layers / rate + t_mem
    t_f = t_layers + f_logits / rate
    t_b = 2 * t_f + (t_layers if recompute else 0.0)
    # TP: 2 all_reduces of b s h per layer forward, 2 backward, 2 more to recompute.
    ar = coll.seconds("all_reduce", tp_g, tokens * h * _BYTES_ACT)
    t_tp = layers_per_stage * ar * (6 if recompute else 4)
    # PP: an activation forward and a gradient back per micro-batch and boundary (x v).
    t_pp = 0.0
    if pp > 1:
        hop = max(coll.p2p(pp_g[i], pp_g[i + 1], tokens * h * _BYTES_ACT / tp) for i in range(pp - 1))
        t_pp = 2 * hop * v
    t_mb = t_f + t_b + t_tp + t_pp
    bubble = (pp - 1) / v * t_mb
    t_pipe = m * t_mb + bubble

    # DP / ZeRO over the dp group, per device of the first stage (it holds the embeddings).
    first = layers_per_stage * model.layer_params() + model.embedding_params()
    last = layers_per_stage * model.layer_params() + model.head_params() + (model.vocab * model.hidden
                                                                            if model.tied else 0)
    psi = (max(first, last) if pp > 1 else model.params()) / tp
    grad_bytes = psi * _BYTES_ACT
    layer_bytes = model.layer_params() / tp * _BYTES_ACT
    if zero == 0:
        dp_total = coll.seconds("all_reduce", dp_g, grad_bytes)
        dp_hidden = min(dp_total, t_b)
    elif zero == 1:
        rs = coll.seconds("reduce_scatter", dp_g, grad_bytes)
        ag = coll.seconds("all_gather", dp_g, grad_bytes)
        dp_total = rs + ag
        dp_hidden = min(rs, t_b)  # the reduce overlaps the last backward; the gather follows the step
    else:
        rs = coll.seconds("reduce_scatter", dp_g, grad_bytes) * m
        dp_total, dp_hidden = rs, min(rs, m * t_b)
        if zero == 3:
            ag = 2 * m * coll.seconds("all_gather", dp_g, grad_bytes)
            dp_total += ag
            dp_hidden += min(ag, m * (t_f + t_b))
    if not dp_overlap:
        dp_hidden = 0.0
    lay.comm_seconds = {"tp": m * t_tp, "pp": m * t_pp, "dp": dp_total}
    lay.hidden_seconds = {"tp": 0.0, "pp": 0.0, "dp": dp_hidden}
    lay.compute_seconds = m * (t_f + t_b)
    lay.step_seconds = t_pipe + (dp_total - dp_hidden)
    lay.bubble_seconds = bubble
    lay.bubble_fraction = bubble / lay.step_seconds if lay.step_seconds else 0.0
    flops_model, flops_hw = model.flops(global_batch, recompute)
    n = cluster.devices
    lay.tflops_per_device = flops_model / lay.step_seconds / n / 1e12
    lay.hardware_tflops_per_device = flops_hw / lay.step_seconds / n / 1e12

    # Memory of the first stage's device (the embeddings, the most micro-batches in flight),
    # and the last stage's logits where they weigh more.
    from ringcomm.parallel.zero import paper_memory_bytes  # the one rule (ZeRO paper, sec. 5)

    mem_params, mem_grads, mem_opt = paper_memory_bytes(psi, dp, zero)
    in_flight = min(m, pp) * ((1 + (pp - 1) / (pp * v)) if v > 1 else 1)
    if recompute:
        act = in_flight * layers_per_stage * 2 * s * b * h + per_layer_full
    else:
        act = in_flight * layers_per_stage * per_layer_full
    logits = 6 * b * s * V / tp
    act_last = (act if pp == 1 else 0) + logits
    buffers = (2 * tokens * h * _BYTES_ACT / tp if pp > 1 else 0)
    if zero >= 2:
        buffers += 2 * min(grad_bytes, 25e6)  # two gradient buckets in flight
    if zero == 3:
        buffers += 2 * layer_bytes  # the gathered layer and the prefetched one
    activations = max(act, act_last)
    total = mem_params + mem_grads + mem_opt + activations + buffers
    lay.memory_bytes = {"params": mem_params, "grads": mem_grads, "optimizer_state": mem_opt,
                        "activations": activations, "buffers": buffers, "total": total}
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
