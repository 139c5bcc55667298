"""Plain-PyTorch transformers: GPT, Llama and a Llama-style MoE.

Written the way tensor parallelism expects (torchtitan's convention): head counts come from
``view(b, s, -1, head_dim)`` so that a column-sharded projection with fewer local heads just
works, and every projection is its own ``nn.Linear`` with a stable name:

    embed.tok, embed.pos (gpt)          layers.N.attn_norm, layers.N.attn.{wq,wk,wv,wo}
    layers.N.mlp_norm                   layers.N.mlp.{fc1,fc2} (gpt) | {w1,w2,w3} (llama)
    layers.N.mlp.{router,experts} (moe) norm, output
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden) if cfg.family == "gpt" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)  # (b, s) -> (b, s, h)
        if self.pos is not None:
            x = x + self.pos(self.positions(tokens.shape[1], tokens.device))
        return x

    def positions(self, s: int, device: torch.device) -> torch.Tensor:
        """Positions of the ``s`` tokens in their sequences: 0..s-1. (Context parallelism holds part of
        each sequence and gives that part's global positions instead: ``meshplan.runtime.context``.)"""
        return torch.arange(s, device=device)


def rope_tables(head_dim: int, max_seq_len: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of rotary embeddings (Su et al. 2021), each (max_seq_len, head_dim/2)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (b, s, heads, hd); rotate pairs (x0, x1) of the head dimension
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s_ = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x0 * c - x1 * s_, x0 * s_ + x1 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.family == "gpt"
        self.head_dim = cfg.head_dim
        self.kv_groups = cfg.heads // cfg.kv_heads
        self.wq = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=bias)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=bias)
        self.rope = cfg.family != "gpt"
        if self.rope:
            cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)  # (b, s, heads, hd)
        k = self.wk(x).view(b, s, -1, self.head_dim)  # (b, s, kv_heads, hd)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            cos, sin = self.rope_rows(s)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.wo(self.attend(q, k, v).reshape(b, s, -1))

    def rope_rows(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at the positions of the ``s`` tokens: rows 0..s-1, each (s, hd/2). (Context
        parallelism gives the rows of its tokens' global positions: ``meshplan.runtime.context``.)"""
        return self.rope_cos[:s], self.rope_sin[:s]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention: q (b, s, heads, hd), k and v (b, s, kv_heads, hd) -> (b, s, heads, hd)."""
        if self.kv_groups > 1:
            k = k.repeat_interleave(self.kv_groups, dim=2)
            v = v.repeat_interleave(self.kv_groups, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, s, hd)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


class GeluMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn_hidden)
        self.fc2 = nn.Linear(cfg.ffn_hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))  # (b, s, h) @ (h, f) @ (f, h)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Experts(nn.Module):
    """``experts`` SwiGLU FFNs stored as stacked weights, so expert parallelism shards dim 0."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, h, f = cfg.experts, cfg.hidden, cfg.ffn_hidden
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w3 = nn.Parameter(torch.empty(e, h, f))
        self.w2 = nn.Parameter(torch.empty(e, f, h))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens sorted by expert, (n, h); counts[e] tokens go to local expert e."""
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            outs.append((F.silu(xe @ self.w1[e]) * (xe @ self.w3[e])) @ self.w2[e])
            start += n
        return torch.cat(outs) if outs else x[:0]


class MoE(nn.Module):
    """Top-k routed experts (Shazeer et al. 2017; Mixtral's softmax-then-top-k renormalized)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.num_experts = cfg.experts
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = Experts(cfg)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32)  # (n, experts)
        weights, idx = probs.topk(self.top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        weights, idx = self.route(flat)  # (n, k)
        order = idx.flatten().argsort(stable=True)  # token-slots grouped by expert
        counts = torch.bincount(idx.flatten(), minlength=self.num_experts).tolist()
        token_of_slot = order // self.top_k
        out_sorted = self.experts(flat[token_of_slot], counts)
        out = torch.zeros_like(flat)
        out.index_add_(0, token_of_slot, out_sorted * weights.flatten()[order, None])
        return out.view(b, s, h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        norm = nn.LayerNorm if cfg.family == "gpt" else nn.RMSNorm
        self.attn_norm = norm(cfg.hidden)
        self.attn = Attention(cfg)
        self.mlp_norm = norm(cfg.hidden)
        self.mlp = {"gpt": GeluMLP, "llama": SwiGLU, "moe": MoE}[cfg.family](cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h = self.residual_norm(x, self.attn(self.attn_norm(x)))
        return x + self.mlp(h)

    def residual_norm(self, x: torch.Tensor, attn_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention output added to the stream, and the sum normalized for the MLP: (sum, mlp_norm(sum)).
        One method, so that a fused kernel can replace both with one pass (``codegen.fused``: add_rmsnorm,
        add_layernorm); parameters stay where they are (``mlp_norm.weight``)."""
        x = x + attn_out  # (b, s, h)
        return x, self.mlp_norm(x)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = (nn.LayerNorm if cfg.family == "gpt" else nn.RMSNorm)(cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def init_weights(self) -> None:
        """GPT-2 style: N(0, 0.02), output projections of each residual branch scaled by 1/sqrt(2L)."""
        std_out = 0.02 / math.sqrt(2 * self.config.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
            elif name.endswith(("wo.weight", "fc2.weight", "w2.weight", "experts.w2")):
                nn.init.normal_(p, std=std_out)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (b, s, h)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))  # (b, s, vocab)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, in fp32. Logits a tensor-parallel head leaves sharded over the vocabulary
    (a DTensor) are gathered whole first; ``meshplan.runtime.token_cross_entropy`` computes the same loss
    vocab-parallel, without gathering them."""
    if hasattr(logits, "full_tensor"):  # a DTensor
        logits = logits.full_tensor()
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
