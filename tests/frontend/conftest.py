"""Traced zoo graphs shared by the frontend tests (each trace takes about a second)."""
from __future__ import annotations

import pytest
import torch

from meshplan import zoo
from meshplan.frontend import trace


def meta_model(name: str, **overrides: object) -> torch.nn.Module:
    with torch.device("meta"):
        return zoo.build(name, **overrides)


@pytest.fixture(scope="session")
def build():
    """zoo.build on the meta device."""
    return meta_model


@pytest.fixture(scope="session")
def traced():
    """name -> (meta model, its graph) for gpt-tiny, llama-tiny and moe-tiny, traced once."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            model = meta_model(name)
            cache[name] = (model, trace(model))
        return cache[name]
    return get
