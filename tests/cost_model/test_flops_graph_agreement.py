"""The closed-form FLOPs (``cost_model.flops``) agree with the traced graph's own count wherever they
apply: per block, the matmuls (and MoE experts) plus the attention core, for the users' models as
their libraries build them (Hugging Face Llama; Qwen3 with its own head_dim, q width 128 on a hidden
size of 64, as GPT-OSS has 64 heads of 64 on 2880; GPT-2's Conv1D; Mixtral's grouped experts) and the
zoo's."""
from __future__ import annotations

import pytest
import torch

from meshplan import zoo
from meshplan.cost_model.flops import layer_forward_flops, layer_params
from meshplan.frontend import trace
from meshplan.ir import OpKind, evaluate

transformers = pytest.importorskip("transformers")

BATCH, SEQ = 2, 64

CONFIGS = {
    "hf llama": ("llama", dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)),
    "hf qwen3 (head_dim 32 on hidden 64)": ("qwen3", dict(
        vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=128)),
    "hf gpt2 (Conv1D)": ("gpt2", dict(vocab_size=256, n_embd=64, n_layer=3, n_head=4, n_positions=128)),
    "hf mixtral (grouped experts)": ("mixtral", dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128)),
}
COUNTED = (OpKind.MATMUL, OpKind.ATTENTION, OpKind.MOE)


def _graph(name: str):
    if name.startswith("zoo"):
        with torch.device("meta"):
            return trace(zoo.build(name.split()[1]), batch=BATCH, seq_len=SEQ)
    model_type, cfg = CONFIGS[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg))
    return trace(model, batch=BATCH, seq_len=SEQ)


@pytest.mark.parametrize("name", [*CONFIGS, "zoo llama-tiny", "zoo gpt-tiny", "zoo moe-tiny"])
def test_block_flops_and_params_agree_with_the_graph(name: str) -> None:
    graph = _graph(name)
    block = graph.blocks[1]
    counted = sum(evaluate(n.flops, batch=BATCH, seq=SEQ) for n in graph.nodes_of(block) if n.op in COUNTED)
    formula = layer_forward_flops(graph.dims, BATCH, SEQ)
    # addmm counts its bias add (tokens x out features): GPT-2's biases are 0.5% here, the formula has none
    assert counted == pytest.approx(formula, rel=1e-3 if graph.dims.family != "gpt" else 6e-3), (name, graph.dims)
    by_name = {p.name: p.numel for p in graph.params}
    assert sum(by_name[p] for p in block.params) == pytest.approx(layer_params(graph.dims), rel=0.02), graph.dims


def test_the_formula_is_wrong_without_head_dim() -> None:
    """The check can fail: with q width taken as the hidden size (the old formula), Qwen3's shape misses."""
    import dataclasses

    graph = _graph("hf qwen3 (head_dim 32 on hidden 64)")
    block = graph.blocks[1]
    counted = sum(evaluate(n.flops, batch=BATCH, seq=SEQ) for n in graph.nodes_of(block) if n.op in COUNTED)
    as_if_hidden = dataclasses.replace(graph.dims, head_dim=graph.dims.hidden // graph.dims.heads)
    assert layer_forward_flops(as_if_hidden, BATCH, SEQ) != pytest.approx(counted, rel=1e-2)
