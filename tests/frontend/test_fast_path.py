"""The fast path (trace two layers, copy the second) against a full trace of every layer."""
from __future__ import annotations

import importlib

import pytest

from meshplan.frontend import trace
from meshplan.zoo.models import GeluMLP

# the module, not the function the package exports under the same name
_trace_impl = importlib.import_module("meshplan.frontend.trace")


def _layers_traced(monkeypatch) -> list[int]:
    """Record how many layers each export sees."""
    seen: list[int] = []
    export_meta = _trace_impl.export_meta

    def spy(model, **kwargs):
        seen.append(len(model.layers))
        return export_meta(model, **kwargs)
    monkeypatch.setattr(_trace_impl, "export_meta", spy)
    return seen


@pytest.mark.parametrize("name, layers", [("llama-tiny", 6), ("moe-tiny", 5)])
def test_fast_path_equals_the_full_trace(monkeypatch, build, name, layers):
    model = build(name, layers=layers)
    seen = _layers_traced(monkeypatch)
    fast = trace(model)
    full = trace(model, fast=False)
    assert seen == [2, layers]  # the fast path traced two layers, the full trace all of them
    assert len(fast.nodes) == len(full.nodes)
    assert fast.total_flops() == full.total_flops()
    assert fast.param_count == full.param_count == sum(p.numel() for p in model.parameters())
    assert fast.nodes == full.nodes  # names, inputs, shapes, costs, module paths, params: all equal
    assert fast.blocks == full.blocks and fast.dims == full.dims


def test_a_different_layer_turns_the_fast_path_off_and_gets_its_own_kind(monkeypatch, build):
    model = build("llama-tiny", layers=4)
    model.layers[3].mlp = GeluMLP(model.config).to("meta")  # same sizes, another MLP
    seen = _layers_traced(monkeypatch)
    graph = trace(model)
    assert seen == [4]
    assert [b.kind for b in graph.blocks] == ["Block#0", "Block#0", "Block#0", "Block#1"]
    assert graph.param_count == sum(p.numel() for p in model.parameters())
    gelu = [n for n in graph.nodes if n.target == "aten.gelu.default"]
    assert [n.module_path for n in gelu] == ["layers.3.mlp"]
