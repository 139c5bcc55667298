"""The fusion pass on traced zoo models and on small hand-built graphs: which chains it finds, and
the bytes it says they save (structural: no kernels run)."""
from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch import nn

from meshplan import ir, zoo
from meshplan.codegen.fusion import always_positive, find_fusions, fusion_names, saved_bytes
from meshplan.codegen.kernels import Kind, Pattern, Step, generate_module, symbol
from meshplan.frontend import trace

B, S = ir.BATCH, ir.SEQ
F32 = 4


def _trace(name: str, **overrides) -> ir.Graph:
    with torch.device("meta"):
        return trace(zoo.build(name, **overrides))


@pytest.fixture(scope="module")
def gpt() -> ir.Graph:
    return _trace("gpt-tiny")


@pytest.fixture(scope="module")
def llama() -> ir.Graph:
    return _trace("llama-tiny")


def _by_pattern(fusions) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in fusions:
        out.setdefault(f.pattern, []).append(f)
    return out


def test_gpt_fuses_bias_gelu_and_add_layernorm_in_every_layer(gpt):
    dims = gpt.dims
    found = _by_pattern(find_fusions(gpt))
    assert set(found) == {"bias_gelu", "add_layernorm"}
    assert len(found["bias_gelu"]) == dims.layers  # fc1's bias + gelu
    assert len(found["add_layernorm"]) == 2 * dims.layers  # each residual add + the norm after it
    # bias + gelu: the pre-activation is neither written by the bias add nor read back by gelu
    assert {f.saved_bytes for f in found["bias_gelu"]} == {2 * F32 * dims.ffn_hidden * B * S}
    # add + norm: the sum is written once (the next residual) and not read back by the norm
    assert {f.saved_bytes for f in found["add_layernorm"]} == {F32 * dims.hidden * B * S}
    assert [f.block for f in found["bias_gelu"]] == [f"layers.{i}" for i in range(dims.layers)]


def test_gpt_bias_gelu_names_its_matmul_bias_and_expression(gpt):
    f = next(f for f in find_fusions(gpt) if f.pattern == "bias_gelu")
    assert f.nodes == ("layers.0/linear_4", "layers.0/gelu_0")
    assert f.args == (("x", "layers.0/linear_4"), ("bias", "layers.0.mlp.fc1.bias"))
    assert f.outputs == (("out", "layers.0/gelu_0"),)
    assert f.expr.subs({symbol("bias"): 0, symbol("x"): 1}).evalf() == pytest.approx(0.5 * (1 + math.tanh(
        math.sqrt(2 / math.pi) * 1.044715)))


def test_embedding_add_with_a_broadcast_position_table_is_not_an_add_norm(gpt):
    """tok (b, s, h) + pos (s, h) then the first norm: the kernel takes equal shapes only."""
    assert all(f.nodes[0] != "add_0" for f in find_fusions(gpt))


def test_llama_fuses_swiglu_and_add_rmsnorm_in_every_layer(llama):
    dims = llama.dims
    fusions = find_fusions(llama)
    found = _by_pattern(fusions)
    assert set(found) == {"swiglu", "add_rmsnorm"}
    assert len(found["swiglu"]) == dims.layers and len(found["add_rmsnorm"]) == 2 * dims.layers
    assert {f.saved_bytes for f in found["swiglu"]} == {2 * F32 * dims.ffn_hidden * B * S}
    assert {f.saved_bytes for f in found["add_rmsnorm"]} == {F32 * dims.hidden * B * S}
    assert saved_bytes(fusions) == dims.layers * F32 * B * S * (2 * dims.ffn_hidden + 2 * dims.hidden)
    swiglu = found["swiglu"][0]
    assert swiglu.args == (("a", "layers.0/linear_4"), ("b", "layers.0/linear_5"))  # gate w1, up w3
    assert fusion_names(fusions) == ("add_rmsnorm", "swiglu")


def test_every_zoo_fusion_saves_and_claims_its_nodes_once(gpt, llama):
    for graph in (gpt, llama):
        fusions = find_fusions(graph)
        nodes = [n for f in fusions for n in f.nodes]
        assert len(nodes) == len(set(nodes))
        assert all(always_positive(f.saved_bytes) and f.unfused_bytes - f.fused_bytes == f.saved_bytes
                   for f in fusions)


def test_generated_module_holds_exactly_the_fused_patterns(llama):
    source = generate_module(find_fusions(llama))
    assert "def swiglu(" in source and "def add_rmsnorm(" in source and "def bias_gelu(" not in source


class _Layer(nn.Module):
    """Hand-written attention (scale, additive causal mask, softmax) and a bias-dropout-residual."""

    def __init__(self, h: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        out = (F.softmax(scores + mask, dim=-1) @ v).transpose(1, 2).reshape(b, s, h)
        return x + F.dropout(self.proj(out), p=0.1, training=True)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = zoo.config("gpt-tiny", hidden=32, heads=2, layers=2, vocab=100)
        self.emb = nn.Embedding(100, 32)
        self.layers = nn.ModuleList(_Layer() for _ in range(2))
        self.out = nn.Linear(32, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def test_handwritten_attention_fuses_scale_mask_softmax_and_bias_dropout_add():
    with torch.device("meta"):
        graph = trace(_Model())
    found = _by_pattern(find_fusions(graph))
    assert set(found) == {"softmax", "bias_dropout_add"}
    assert len(found["softmax"]) == len(found["bias_dropout_add"]) == 2
    heads = 2
    # mul, add, softmax each read and write the (b, heads, s, s) scores: 6 passes; fused: 2
    assert found["softmax"][0].saved_bytes == 4 * F32 * heads * B * S**2
    assert dict(found["softmax"][0].args)["mask"] == "layers.0/triu_0"
    # bias add (2), dropout (2), add (3) full-size passes; fused: x, residual, out (3)
    assert found["bias_dropout_add"][0].saved_bytes == 4 * F32 * 32 * B * S
    # the add after the dropout would also start an add + layernorm: the longer chain, listed first, wins
    assert found["bias_dropout_add"][0].nodes[-1] == "layers.0/add_1"


# -- hand-built graphs ---------------------------------------------------------------------------

H = 16


def _meta(*shape) -> ir.TensorMeta:
    return ir.TensorMeta(shape=shape)


def _node(name: str, target: str, inputs: dict[str, ir.TensorMeta], out: ir.TensorMeta, op=ir.OpKind.ELEMENTWISE,
          params: tuple[str, ...] = (), param_bytes: int = 0) -> ir.Node:
    moved = sum((m.nbytes for m in inputs.values()), sympy.Integer(0)) + out.nbytes + param_bytes
    return ir.Node(name=name, op=op, target=f"aten.{target}.default", inputs=tuple(inputs),
                   input_metas=tuple(inputs.values()), outputs=(out,), bytes=moved, params=params)


def _graph(*nodes: ir.Node, params: tuple[ir.Param, ...] = ()) -> ir.Graph:
    dims = ir.ModelDims(family="llama", layers=1, hidden=H, heads=1, kv_heads=1, ffn_hidden=H, vocab=8)
    return ir.Graph(nodes=nodes, params=params, blocks=(), dims=dims)


def _swiglu_graph(extra_reader: bool) -> ir.Graph:
    t = _meta(B, S, H)
    nodes = [ir.Node(name=n, op=ir.OpKind.OTHER, target="input", outputs=(t,)) for n in ("gate", "up")]
    nodes += [_node("silu", "silu", {"gate": t}, t), _node("mul", "mul", {"up": t, "silu": t}, t)]
    if extra_reader:
        nodes.append(_node("exp", "exp", {"silu": t}, t))
    return _graph(*nodes)


def test_swiglu_matches_either_operand_order():
    (f,) = find_fusions(_swiglu_graph(extra_reader=False))
    assert f.pattern == "swiglu" and f.args == (("a", "gate"), ("b", "up"))
    assert f.unfused_bytes == 5 * F32 * H * B * S and f.fused_bytes == 3 * F32 * H * B * S


def test_an_intermediate_read_outside_the_chain_blocks_the_fusion():
    assert find_fusions(_swiglu_graph(extra_reader=True)) == ()


def test_a_product_of_the_chain_with_itself_is_not_a_swiglu():
    t = _meta(B, S, H)
    square = ir.Node(name="sq", op=ir.OpKind.ELEMENTWISE, target="aten.mul.Tensor", inputs=("silu", "silu"),
                     input_metas=(t, t), outputs=(t,), bytes=3 * t.nbytes)
    graph = _graph(ir.Node(name="gate", op=ir.OpKind.OTHER, target="input", outputs=(t,)),
                   _node("silu", "silu", {"gate": t}, t), square)
    assert find_fusions(graph) == ()  # silu(a) * silu(a): the kernel's b would be its own intermediate


def test_a_chain_that_saves_nothing_is_not_kept():
    t = _meta(B, S, H)
    graph = _graph(ir.Node(name="x", op=ir.OpKind.OTHER, target="input", outputs=(t,)), _node("g", "gelu", {"x": t}, t))
    lone = Pattern(name="lone_gelu", kind=Kind.ELEMENTWISE, steps=(Step(ops=("gelu",), args=("x",)),),
                   expr="gelu_tanh(x)", formula="gelu(x)", source="test")
    assert find_fusions(graph, (lone,)) == ()  # one op: fused and unfused both read x and write once


def test_dropout_add_without_a_bias():
    t = _meta(B, S, H)
    graph = _graph(*(ir.Node(name=n, op=ir.OpKind.OTHER, target="input", outputs=(t,)) for n in ("h", "res")),
                   _node("drop", "dropout", {"h": t}, t), _node("add", "add", {"res": t, "drop": t}, t))
    (f,) = find_fusions(graph)
    assert f.pattern == "dropout_add" and dict(f.args) == {"x": "h", "residual": "res"}
    assert f.saved_bytes == 2 * F32 * H * B * S


@pytest.mark.parametrize("expr, positive", [(B * S, True), (3 * B * S + S**2, True), (B * S - S, False),
                                            (sympy.Integer(0), False)])
def test_always_positive(expr, positive):
    assert always_positive(expr) is positive
