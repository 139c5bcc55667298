"""Models of the kinds users bring, written the way their authors write them: the examples the README,
the benches and the tests plan, emit and run. Each builder function is importable as
``user_models:<name>`` (with this folder on ``PYTHONPATH``), so a plan can name it as its source:

    meshplan plan --model user_models:nanogpt --model-kwargs '{"n_layer": 12}' --cluster cpu:1x4 ...

``TitanLlama`` follows torchtitan's llama3 (``torchtitan/models/llama3/model/model.py``): layers in an
``nn.ModuleDict`` keyed "0".."n-1", ``tok_embeddings``, ``attention.wq/wk/wv/wo``,
``feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``, ``norm``, ``output``, rotary embeddings
in complex form computed once at the root. ``NanoGPT`` follows Karpathy's nanoGPT ``model.py``:
``transformer.wte/wpe/h/ln_f``, one ``c_attn`` Linear(h, 3h) for q, k and v split by ``split``,
``lm_head`` tied to ``wte``. ``mlp_stack`` is an ``nn.Sequential`` on float features. The
``hf_*_config`` functions give tiny Hugging Face configs (``transformers.AutoConfig.for_model``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs).float())


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: xq.shape[1]].view(1, xq.shape[1], 1, xq_.shape[-1])
    return (torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk))


class TitanAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        xk, xv = (t.repeat_interleave(rep, dim=2) for t in (xk, xv))
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class TitanFeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanBlock(nn.Module):
    def __init__(self, layer_id: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention = TitanAttention(dim, n_heads, n_kv_heads, head_dim)
        self.feed_forward = TitanFeedForward(dim, ffn)
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """No ``.config``: the frontend reads the dims off the graph."""

    def __init__(self, *, dim: int = 48, n_layers: int = 4, n_heads: int = 4, n_kv_heads: int = 2,
                 head_dim: int = 16, ffn: int = 96, vocab: int = 128, max_seq_len: int = 64) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(head_dim, max_seq_len * 2), persistent=False)
        self.layers = nn.ModuleDict({str(i): TitanBlock(i, dim, n_heads, n_kv_heads, head_dim, ffn)
                                     for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class NanoBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, *, vocab_size: int = 96, block_size: int = 64, n_layer: int = 3, n_head: int = 12,
                 n_embd: int = 48) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([NanoBlock(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def mlp_stack(features: int = 32, hidden: int = 64, classes: int = 10) -> nn.Sequential:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


BUILT: list[str] = []  # the builders called in this process (a test checks that a plan's builder ran)


def nanogpt(**sizes: int) -> NanoGPT:
    BUILT.append("nanogpt")
    return NanoGPT(**sizes)


def titan_llama(**sizes: int) -> TitanLlama:
    BUILT.append("titan_llama")
    return TitanLlama(**sizes)


def hf_llama_config(**overrides) -> dict:
    return dict(dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     tie_word_embeddings=False), **overrides)


def hf_minimax_config(**overrides) -> dict:
    """MiniMax: softmax attention (q, k, v, o) in block 0, lightning attention (a fused qkv_proj) in block 1, and
    routed experts in both."""
    return hf_llama_config(**dict(dict(model_type="minimax", head_dim=16, pad_token_id=0, num_local_experts=4,
                                       num_experts_per_tok=2), **overrides))


def hf_gpt2_config(**overrides) -> dict:
    return dict(model_type="gpt2", vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides)


def hf_falcon_config(**overrides) -> dict:
    """Falcon: its blocks return a tuple the model takes [0] of, and its head is tied."""
    return dict(model_type="falcon", vocab_size=256, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                hidden_dropout=0.0, attention_dropout=0.0, **overrides)


def hf_phi3_config(**overrides) -> dict:
    """Phi-3: a fused q/k/v projection and a fused gate and up projection (``gate_up_proj``, chunked in two)."""
    return dict(model_type="phi3", vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64, pad_token_id=0,
                resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, **overrides)


def hf_bloom_config(**overrides) -> dict:
    """BLOOM: a layer norm on the embedding's output, outside the blocks (``word_embeddings_layernorm``)."""
    return dict(model_type="bloom", vocab_size=256, hidden_size=64, n_head=4, n_layer=2, hidden_dropout=0.0,
                attention_dropout=0.0, **overrides)


def hf_opt_config(**overrides) -> dict:
    return dict(model_type="opt", vocab_size=256, hidden_size=64, ffn_dim=128, word_embed_proj_dim=64,
                num_attention_heads=4, num_hidden_layers=2, max_position_embeddings=64, dropout=0.0,
                attention_dropout=0.0, **overrides)


def hf_mixtral_config(**overrides) -> dict:
    return dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4,
                num_experts_per_tok=2, router_jitter_noise=0.0, **overrides)
