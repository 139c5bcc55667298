"""The fast path (trace a few layers, copy them for the rest) against a full trace of every layer."""
from __future__ import annotations

import importlib

import pytest

from meshplan.frontend import trace
from meshplan.frontend.fastpath import layer_pattern
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


def _same_graph(fast, full) -> None:
    assert fast.nodes == full.nodes  # names, inputs, shapes, costs, module paths, params: all equal
    assert fast.blocks == full.blocks and fast.dims == full.dims and fast.structure == full.structure


@pytest.mark.parametrize("gelu_layers, layers, traced", [
    ((1, 3, 5, 7), 8, 4),  # alternating (GPT-OSS's sliding and full attention, Gemma's local and global)
    ((0,), 6, 3),  # one leading layer of its own, then a stack (DeepSeek-V3's dense layers before the MoE)
    ((0, 1, 3, 5), 7, 5),  # a leading layer, then a period of two
])
def test_a_repeating_pattern_traces_one_prefix_and_two_periods(monkeypatch, build, gelu_layers, layers, traced):
    model = build("llama-tiny", layers=layers)
    for i in gelu_layers:
        model.layers[i].mlp = GeluMLP(model.config).to("meta")  # same sizes, another MLP
    seen = _layers_traced(monkeypatch)
    fast = trace(model)
    full = trace(model, fast=False)
    assert seen == [traced, layers]
    _same_graph(fast, full)
    kinds = [b.kind for b in full.blocks]
    assert [kinds[i] for i in gelu_layers] == [kinds[gelu_layers[0]]] * len(gelu_layers) and len(set(kinds)) == 2


@pytest.mark.parametrize("kinds, pattern", [
    ([0, 0, 0, 0], (0, 1)), ([0, 1, 0, 1, 0], (0, 2)), ([2, 0, 0, 0, 0], (1, 1)), ([0, 0, 0, 1], None),
    ([0, 1, 0], None),  # prefix + two periods would be the whole stack: nothing to copy
    ([0, 1, 1, 0, 1, 1, 0], (0, 3)), ([5, 5, 0, 1, 0, 1, 0, 1], (2, 2))])
def test_layer_pattern_is_the_shortest_trace_that_explains_the_stack(kinds, pattern):
    assert layer_pattern(kinds) == pattern


def test_hugging_face_gpt_oss_alternating_attention_takes_the_fast_path(monkeypatch):
    """transformers' GPT-OSS gives even layers sliding-window attention and odd ones full attention
    (``config.layer_types``): the layers differ in ``sliding_window``, so a period of two is traced."""
    pytest.importorskip("transformers")
    import torch

    from meshplan.runtime.source import build as build_source

    config = dict(model_type="gpt_oss", vocab_size=256, hidden_size=72, intermediate_size=48, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                  sliding_window=8, max_position_embeddings=64, tie_word_embeddings=False,
                  layer_types=["sliding_attention", "full_attention"] * 3)
    with torch.device("meta"):
        model = build_source({"kind": "hf", "class": "GptOssForCausalLM", "config": config})
    seen: list[int] = []
    export_meta = _trace_impl.export_meta

    def spy(m, **kwargs):
        seen.append(len(m.model.layers))
        return export_meta(m, **kwargs)
    monkeypatch.setattr(_trace_impl, "export_meta", spy)
    fast = trace(model, batch=1, seq_len=16)
    full = trace(model, batch=1, seq_len=16, fast=False)
    assert seen == [4, 6]
    _same_graph(fast, full)
    # the config names each layer's kind: 3 of the 6 attend 8 positions back (ModelDims.attention_window)
    assert (fast.dims.attention_window, fast.dims.windowed_layers) == (8, 3)
