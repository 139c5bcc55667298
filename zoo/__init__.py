"""The model zoo: GPT, Llama and MoE families by name or by config, buildable on the meta device."""
from __future__ import annotations

from typing import Any

from .config import FAMILIES, ModelConfig, config, names, param_count
from .models import Transformer, loss_fn


def build(name: str, **overrides: Any) -> Transformer:
    """A zoo model by name, e.g. ``build("llama3-8b", layers=4)``. Build under ``torch.device("meta")``
    to allocate nothing."""
    return Transformer(config(name, **overrides))


def build_from_config(cfg: dict[str, Any] | ModelConfig) -> Transformer:
    return Transformer(cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg))


__all__ = ["FAMILIES", "ModelConfig", "Transformer", "build", "build_from_config", "config", "loss_fn", "names",
           "param_count"]
