"""Model configurations of the zoo: plain values, validated, with the names users know."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..ir.errors import UnknownModelError
from ..ir.limits import REASONS
from ..ir.schema import MODEL_LIMITS, short_repr

FAMILIES = ("gpt", "llama", "moe")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int = 0  # 0 means equal to heads (no grouped-query attention)
    ffn_hidden: int = 0  # 0 means 4 * hidden
    vocab: int
    max_seq_len: int
    experts: int = 0
    top_k: int = 0
    # attention head width; 0 means hidden // heads. Set where it is not: Qwen3's MoE models have heads of
    # 128 on a hidden of 2048 (32 heads) or 4096 (64 heads), GPT-OSS 64 heads of 64 on 2880
    head_dim: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise UnknownModelError(f"model config: family {short_repr(self.family)} is not one of {FAMILIES}")
        if not isinstance(self.name, str) or len(self.name) > 200:
            raise UnknownModelError(f"model config: name must be a string of at most 200 characters, "
                                    f"got {short_repr(self.name)}")
        for f, (least, most) in MODEL_LIMITS.items():
            _check_size(f, getattr(self, f), least, most)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        _check_size("ffn_hidden", self.ffn_hidden, *MODEL_LIMITS["ffn_hidden"])
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise UnknownModelError(f"model config: hidden({self.hidden}) must divide by heads({self.heads}), "
                                        f"or give head_dim (the width of one attention head)")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise UnknownModelError(f"model config: heads({self.heads}) must divide by kv_heads({self.kv_heads})")
        if self.family == "moe":
            if self.experts < 2 or not 1 <= self.top_k <= self.experts:
                raise UnknownModelError(f"model config: a moe model needs experts >= 2 and 1 <= top_k <= experts, "
                                        f"got experts={self.experts}, top_k={self.top_k}")
        elif self.experts or self.top_k:
            raise UnknownModelError(f"model config: experts/top_k are only for family 'moe', not {self.family!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as given: head_dim only where it is not hidden // heads."""
        implied = self.hidden // self.heads if self.hidden % self.heads == 0 else 0
        return {k: v for k, v in asdict(self).items()
                if (v or k in ("experts", "top_k")) and not (k == "head_dim" and v == implied)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise UnknownModelError(f"a model config must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UnknownModelError(f"model config: unknown field(s) {unknown}; expected among {sorted(known)}")
        missing = sorted({"family", "layers", "hidden", "heads", "vocab", "max_seq_len"} - set(data))
        if missing:
            raise UnknownModelError(f"model config: missing field(s) {missing}")
        return cls(**data)


def _check_size(name: str, value: Any, least: int, most: int) -> None:
    """An integer in [least, most] (ir/schema.py MODEL_LIMITS): ``true``, ``2.0`` or ``"4"`` are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnknownModelError(f"model config: {name} must be an integer from {least} to {most}, "
                                f"got {short_repr(value)} ({type(value).__name__})")
    if not least <= value <= most:
        why = f" ({REASONS[name]})" if name in REASONS else ""
        raise UnknownModelError(f"model config: {name} must be from {least} to {most}, got {short_repr(value)}"
                                + (f"; larger than any model meshplan plans for{why}, check it for a typo"
                                   if value > most else ""))


_PRESETS: dict[str, dict[str, Any]] = {
    # tiny models for tests: a few hundred thousand parameters
    "gpt-tiny": dict(family="gpt", layers=4, hidden=64, heads=4, vocab=512, max_seq_len=128),
    "llama-tiny": dict(family="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=160, vocab=512,
                       max_seq_len=128),
    "moe-tiny": dict(family="moe", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, vocab=512,
                     max_seq_len=128, experts=4, top_k=2),
    # GPT-2 (Radford et al. 2019)
    "gpt2-small": dict(family="gpt", layers=12, hidden=768, heads=12, vocab=50257, max_seq_len=1024),
    # GPT-3 (Brown et al. 2020, Table 2.1); vocabulary padded to 51200 as Megatron-LM does
    "gpt3-1.3b": dict(family="gpt", layers=24, hidden=2048, heads=16, vocab=51200, max_seq_len=2048),
    "gpt3-175b": dict(family="gpt", layers=96, hidden=12288, heads=96, vocab=51200, max_seq_len=2048),
    # Llama 3 (Dubey et al. 2024, Table 3)
    "llama3-8b": dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                      vocab=128256, max_seq_len=131072),
    "llama3-70b": dict(family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                       vocab=128256, max_seq_len=131072),
    "llama3-405b": dict(family="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248,
                        vocab=128256, max_seq_len=131072),
    # Mixtral 8x7B (Jiang et al. 2024)
    "mixtral-8x7b": dict(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=32000, max_seq_len=32768, experts=8, top_k=2),
}


def names() -> tuple[str, ...]:
    return tuple(_PRESETS)


def config(name: str, **overrides: Any) -> ModelConfig:
    if name not in _PRESETS:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(_PRESETS)} "
                                "(or pass a config: --model-config FILE)")
    return ModelConfig.from_dict({**_PRESETS[name], "name": name, **overrides})


def param_count(cfg: ModelConfig) -> int:
    """Parameters of the model ``build`` makes, counted without building it."""
    h, f, v = cfg.hidden, cfg.ffn_hidden, cfg.vocab
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    bias = cfg.family == "gpt"
    attn = h * q * 2 + h * kv * 2 + (q + h + 2 * kv if bias else 0)
    if cfg.family == "gpt":
        mlp = 2 * h * f + (f + h)
        norms = 4 * h
    elif cfg.family == "llama":
        mlp = 3 * h * f
        norms = 2 * h
    else:
        mlp = cfg.experts * 3 * h * f + h * cfg.experts
        norms = 2 * h
    emb = v * h + (cfg.max_seq_len * h if cfg.family == "gpt" else 0)
    final_norm = 2 * h if cfg.family == "gpt" else h
    return emb + cfg.layers * (attn + mlp + norms) + final_norm + v * h
