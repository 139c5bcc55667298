"""The traced graph of the zoo's tiny models against counts made from the modules themselves."""
from __future__ import annotations

import pytest
import sympy
from torch import nn

from meshplan import ir

SIZES = [(1, 128), (3, 17)]


def _linear_counts(model: nn.Module) -> tuple[int, int]:
    """(weights, biases) of every nn.Linear, counted from the modules, not the graph."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return sum(m.weight.numel() for m in linears), sum(m.bias.numel() for m in linears if m.bias is not None)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_op_kinds_present(traced, name):
    _, graph = traced(name)
    kinds = {n.op for n in graph.nodes}
    assert {ir.OpKind.MATMUL, ir.OpKind.ATTENTION, ir.OpKind.NORM, ir.OpKind.EMBEDDING, ir.OpKind.ELEMENTWISE,
            ir.OpKind.VIEW} <= kinds
    cfg = traced(name)[0].config
    assert sum(n.op == ir.OpKind.ATTENTION for n in graph.nodes) == cfg.layers
    assert sum(n.op == ir.OpKind.EMBEDDING for n in graph.nodes) == (2 if cfg.family == "gpt" else 1)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
@pytest.mark.parametrize("batch, seq", SIZES)
def test_matmul_and_attention_flops_match_the_analytic_count(traced, name, batch, seq):
    model, graph = traced(name)
    cfg = model.config
    tokens = batch * seq
    weights, biases = _linear_counts(model)
    matmul = sum(ir.evaluate(n.flops, batch=batch, seq=seq) for n in graph.nodes if n.op == ir.OpKind.MATMUL)
    assert matmul == 2 * tokens * weights + tokens * biases  # a bias add is one FLOP per output
    attention = sum(ir.evaluate(n.flops, batch=batch, seq=seq) for n in graph.nodes if n.op == ir.OpKind.ATTENTION)
    assert attention == cfg.layers * 4 * batch * cfg.heads * seq * seq * cfg.head_dim  # the full s^2


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "moe-tiny"])
def test_shapes_are_symbolic_in_batch_and_seq(traced, name):
    model, graph = traced(name)
    cfg = model.config
    b, s = ir.BATCH, ir.SEQ
    assert graph.nodes[0].outputs[0] == ir.TensorMeta(shape=(b, s), dtype="int64")
    assert graph.nodes[-1].outputs[0] == ir.TensorMeta(shape=(b, s, cfg.vocab), dtype="float32")
    attn = next(n for n in graph.nodes if n.op == ir.OpKind.ATTENTION)
    assert attn.input_metas[0].shape == (b, cfg.heads, s, cfg.head_dim)
    assert all(n.flops.free_symbols <= {b, s} and n.bytes.free_symbols <= {b, s} for n in graph.nodes)


def test_bytes_count_inputs_params_and_outputs(traced):
    model, graph = traced("llama-tiny")
    h, v = model.config.hidden, model.config.vocab
    b, s = ir.BATCH, ir.SEQ
    logits = graph.nodes[-1]  # (b, s, h) @ (h, v), fp32
    assert logits.params == ("output.weight",) and logits.module_path == "output"
    assert sympy.expand(logits.bytes - 4 * (b * s * h + h * v + b * s * v)) == 0
    assert all(n.bytes == 0 for n in graph.nodes if n.target in ("aten.view.default", "aten.transpose.int"))


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "moe-tiny"])
def test_params_cover_the_whole_model(traced, name):
    model, graph = traced(name)
    assert graph.param_count == sum(p.numel() for p in model.parameters())
    assert {p.name for p in graph.params} == {n for n, _ in model.named_parameters()}
    read = {p for n in graph.nodes for p in n.params}
    assert read == {p.name for p in graph.params}  # every parameter is read by some node


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "moe-tiny"])
def test_blocks_group_each_layer_under_one_kind(traced, name):
    model, graph = traced(name)
    layers = model.config.layers
    assert [b.name for b in graph.blocks] == [f"layers.{i}" for i in range(layers)]
    assert [b.index for b in graph.blocks] == list(range(layers))
    assert graph.block_kinds == ("Block#0",)
    for block in graph.blocks:
        assert all(n.module_path.startswith(block.name) for n in graph.nodes_of(block))
        assert graph.block_params(block) == sum(p.numel() for p in model.layers[block.index].parameters())
    outside = {n.module_path for n in graph.outside_block_nodes if n.op != ir.OpKind.OTHER}
    assert outside <= {"embed.tok", "embed.pos", "embed", "norm", "output"}


def test_module_paths_and_params_name_the_owning_module(traced):
    _, graph = traced("llama-tiny")
    wq = [n for n in graph.nodes if n.module_path == "layers.3.attn.wq"]
    assert len(wq) == 1 and wq[0].op == ir.OpKind.MATMUL and wq[0].params == ("layers.3.attn.wq.weight",)
    names = {n.name for n in graph.nodes}
    assert all(set(n.inputs) <= names for n in graph.nodes)  # inputs name earlier nodes
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    assert all(position[i] < position[n.name] for n in graph.nodes for i in n.inputs)


@pytest.mark.parametrize("batch, seq", SIZES)
def test_moe_layers_are_leaves_with_the_declared_cost(traced, batch, seq):
    model, graph = traced("moe-tiny")
    cfg = model.config
    moe = [n for n in graph.nodes if n.op == ir.OpKind.MOE]
    assert [n.module_path for n in moe] == [f"layers.{i}.mlp" for i in range(cfg.layers)]
    assert all(n.leaf and n.target == "MoE" for n in moe)
    owned = ("router.weight", "experts.w1", "experts.w3", "experts.w2")
    assert moe[2].params == tuple(f"layers.2.mlp.{p}" for p in owned)
    n, h, f = batch * seq, cfg.hidden, cfg.ffn_hidden
    expected = 2 * n * h * cfg.experts + 2 * n * h * f * 3 * cfg.top_k
    assert all(ir.evaluate(node.flops, batch=batch, seq=seq) == expected for node in moe)
    weight_bytes = 4 * sum(p.numel() for p in model.layers[0].mlp.parameters())
    assert ir.evaluate(moe[0].bytes, batch=batch, seq=seq) == weight_bytes + 2 * 4 * n * h
    # nothing inside the MoE was traced: the routing's topk, bincount and index_add are not nodes
    assert not [node for node in graph.nodes if ".mlp." in node.module_path]


def test_dims_come_from_the_config(traced):
    model, graph = traced("moe-tiny")
    cfg = model.config
    assert graph.dims == ir.ModelDims(family="moe", layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                                      kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab,
                                      experts=cfg.experts, top_k=cfg.top_k)
