"""Models the frontend cannot follow: a clear error naming the module, or a leaf by a user's rule."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from meshplan import ir
from meshplan.frontend import LeafCost, LeafRule, qualname, trace


class DataDependentGate(nn.Module):
    """Branches on a tensor's value, which no meta trace can decide."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.proj(x)
        return x


class Layer(nn.Module):
    def __init__(self, gated: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = DataDependentGate() if gated else nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.lin(x))


class Toy(nn.Module):
    """Three layers, the middle one gated; a dict config."""

    def __init__(self) -> None:
        super().__init__()
        self.config = {"family": "toy", "layers": 3, "hidden": 8, "heads": 1, "vocab": 10}
        self.emb = nn.Embedding(10, 8)
        self.layers = nn.ModuleList([Layer(False), Layer(True), Layer(False)])
        self.out = nn.Linear(8, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def test_an_untraceable_module_is_named_in_the_error():
    with pytest.raises(ir.UnsupportedModelError) as caught:
        trace(Toy())
    message = str(caught.value)
    assert "'layers.1.gate'" in message and qualname(DataDependentGate) in message
    assert "leaf_rules" in message  # says what to do
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no torch traceback chained


def test_a_leaf_rule_keeps_a_user_module_whole():
    def gate_cost(module, ins, outs):
        return LeafCost(flops=2 * ins[0].numel * 8, bytes=ins[0].nbytes + outs[0].nbytes)

    rule = LeafRule(op=ir.OpKind.OTHER, cost=gate_cost)
    graph = trace(Toy(), leaf_rules={qualname(DataDependentGate): rule})
    leaves = [n for n in graph.nodes if n.leaf]
    assert [(n.module_path, n.target) for n in leaves] == [("layers.1.gate", "DataDependentGate")]
    assert leaves[0].params == ("layers.1.gate.proj.weight", "layers.1.gate.proj.bias")
    assert ir.evaluate(leaves[0].flops, batch=2, seq=5) == 2 * 10 * 8 * 8
    assert [b.kind for b in graph.blocks] == ["Layer#0", "Layer#1", "Layer#0"]
    assert graph.dims.family == "toy" and graph.dims.kv_heads == 1 and graph.dims.ffn_hidden == 32


class FixedBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.emb(tokens).view(2, tokens.shape[1], 8)  # only right for a batch of 2


class LoopOverSequence(nn.Module):
    """A Python loop over the positions (Jamba's slow Mamba scan): torch fixes the sequence size while tracing."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        return torch.stack([x[:, i] for i in range(x.shape[1])], dim=1)


def test_a_forward_that_fixes_the_batch_size_is_refused():
    with pytest.raises(ir.UnsupportedModelError, match="fixes the batch size"):
        trace(FixedBatch(), batch=2)


def test_a_forward_that_fixes_the_sequence_size_is_refused_naming_its_line():
    """Not only that the size is fixed, but where: the model's own line, from the trace's stack when torch fixed it."""
    with pytest.raises(ir.UnsupportedModelError, match=r"fixes the sequence size to \d+ at test_untraceable\.py:\d+ "
                                                        r"`return torch\.stack\(\[x\[:, i\] for i in range"):
        trace(LoopOverSequence())
    import logging

    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    assert not any(type(h).__name__ == "_Specializations" for h in logger.handlers)  # torch's handlers are back


def test_a_model_without_config_or_attention_still_traces_and_says_what_it_lacks():
    toy = Toy()
    del toy.config
    rule = LeafRule(op=ir.OpKind.OTHER, cost=lambda m, ins, outs: LeafCost(flops=0, bytes=0))
    graph = trace(toy, leaf_rules={qualname(DataDependentGate): rule})
    dims = graph.dims
    assert (dims.heads, dims.head_dim, dims.hidden, dims.vocab, dims.layers) == (0, 0, 8, 10, 3)
    assert graph.structure.blocks == "layers" and graph.structure.embed == "emb" and graph.structure.head == "out"
    assert any(note.startswith("layers.*: no attention") for note in graph.structure.notes)
