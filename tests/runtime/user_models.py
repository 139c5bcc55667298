"""Models of the kinds users bring, built small for the parity tests: tiny Hugging Face configs (built
inside the tests, nothing downloaded) and a hand-written nanoGPT. Each builder is importable as
``user_models:<name>`` so that a plan can name it as its source."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
BUILT: list[str] = []  # the builders called in this process (a test checks that a plan's builder ran)


def hf_llama_config() -> dict:
    return dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def hf_gpt2_config() -> dict:
    return dict(model_type="gpt2", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def hf_model(config: dict) -> nn.Module:
    import transformers

    data = dict(config)
    cfg = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    return transformers.AutoModelForCausalLM.from_config(cfg)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one fused projection makes q, k and v."""

    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)  # (b, s, 3h) -> 3 x (b, s, h)
        q, k, v = (t.view(b, s, self.n_head, h // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, head_dim)
        return self.c_proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
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
    """Karpathy's nanoGPT layout: ``transformer.{wte, wpe, h, ln_f}`` and a head tied to ``wte``."""

    def __init__(self, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, block_size: int = 64,
                 vocab_size: int = VOCAB) -> None:
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def nanogpt(n_layer: int = 2, n_embd: int = 64, n_head: int = 4) -> NanoGPT:
    BUILT.append("nanogpt")
    return NanoGPT(n_layer=n_layer, n_embd=n_embd, n_head=n_head)


def hf_mixtral_config() -> dict:
    return dict(model_type="mixtral", vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4,
                num_experts_per_tok=2, router_jitter_noise=0.0)
