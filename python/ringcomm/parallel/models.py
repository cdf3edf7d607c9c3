"""Dense reference modules: a small decoder-only transformer.

The tensor-parallel layers in tp.py are built from these (``from_dense``), so a
sharded model starts out equal to a dense one; the tests and the 3D example use
them as the single-process reference. Activations are [batch, seq, hidden].
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """hidden -> ffn -> GELU -> hidden."""

    def __init__(self, hidden, ffn, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=bias)
        self.fc2 = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def attention(q, k, v, n_heads):
    """Causal multi-head attention of [b, s, n_heads * head_dim] projections."""
    b, s, width = q.shape
    hd = width // n_heads

    def heads(t):
        return t.reshape(b, s, n_heads, hd).transpose(1, 2)

    o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    return o.transpose(1, 2).reshape(b, s, width)


class SelfAttention(nn.Module):
    """Causal self-attention; qkv holds the q, k and v projections stacked by rows."""

    def __init__(self, hidden, n_heads, bias=True):
        super().__init__()
        if hidden % n_heads:
            raise ValueError(f"hidden {hidden} is not a multiple of n_heads {n_heads}")
        self.hidden, self.n_heads = hidden, n_heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.hidden, dim=-1)
        return self.proj(attention(q, k, v, self.n_heads))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, hidden, n_heads, ffn=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, n_heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn or 4 * hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token + learned position embedding: [b, s] int64 -> [b, s, hidden]."""

    def __init__(self, vocab, hidden, max_seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_seq, hidden)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(pos)


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(self.ln(x))


def transformer(vocab, hidden, n_heads, n_layers, max_seq, ffn=None):
    """Embedding, n_layers blocks, head, as one nn.Sequential (slice it into stages)."""
    layers = [Embedding(vocab, hidden, max_seq)]
    layers += [Block(hidden, n_heads, ffn) for _ in range(n_layers)]
    layers.append(Head(hidden, vocab))
    return nn.Sequential(*layers)


def lm_loss(logits, targets):
    """Mean next-token cross entropy of [b, s, vocab] logits against [b, s] targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def stage_bounds(n_layers, n_stages):
    """[start, end) of each pipeline stage over len(transformer(...)) = n_layers + 2 modules,
    the blocks divided as evenly as possible (embedding with stage 0, head with the last)."""
    n = n_layers + 2
    if n_stages > n:
        raise ValueError(f"{n_stages} stages for {n} modules")
    base, extra = divmod(n, n_stages)
    bounds, start = [], 0
    for s in range(n_stages):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def init_scale(module, std=0.02):
    """GPT-style small initialisation (keeps a tiny model's first losses near log(vocab))."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
    return module


__all__ = ["MLP", "SelfAttention", "Block", "Embedding", "Head", "transformer", "lm_loss",
           "stage_bounds", "init_scale", "attention"]
