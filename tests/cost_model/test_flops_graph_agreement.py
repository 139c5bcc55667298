"""The closed-form FLOPs (``cost_model.flops``) agree with the traced graph's own count wherever they
apply: per block, the matmuls (and MoE experts) plus the attention core, for the users' models as
their libraries build them (Hugging Face Llama; Qwen3 with its own head_dim, q width 128 on a hidden
size of 64, as GPT-OSS has 64 heads of 64 on 2880; GPT-2's Conv1D; Mixtral's grouped experts) and the
zoo's."""
from __future__ import annotations

import functools

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


@functools.cache  # each model is traced once for the file's tests, which only read the graph
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


DEEPSEEK = dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=128, n_group=1, topk_group=1)


def test_where_the_formula_misses_the_graphs_count_is_used() -> None:
    """DeepSeek-V3's blocks (latent attention's low-rank projections and 24-wide q/k heads, a shared expert
    beside the routed ones, a leading dense layer) are not the family's shapes: the formula alone counts
    about half their FLOPs. The cost model's dims carry the traced blocks' own count (summary.flops_scales),
    matmuls and attention core apart, so its per-layer FLOPs are the graph's, at any sequence length."""
    from meshplan.cost_model.summary import summary_of

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("deepseek_v3",
                                                                                                **DEEPSEEK))
    graph = trace(model, batch=BATCH, seq_len=SEQ)
    dims = summary_of(graph).dims
    assert dims.matmul_scale > 1.5 and dims.core_scale > 1.5, dims
    for seq in (SEQ, 4 * SEQ):
        counted = sum(evaluate(n.flops, batch=BATCH, seq=seq) for b in graph.blocks for n in graph.nodes_of(b)
                      if n.op in COUNTED) / len(graph.blocks)
        assert layer_forward_flops(graph.dims, BATCH, seq) < 0.6 * counted  # the family formula alone
        assert layer_forward_flops(dims, BATCH, seq) == pytest.approx(counted, rel=1e-6)


@pytest.mark.parametrize("name", [*CONFIGS, "zoo llama-tiny", "zoo gpt-tiny", "zoo moe-tiny"])
def test_where_the_formula_holds_it_is_not_scaled(name: str) -> None:
    from meshplan.cost_model.summary import summary_of

    dims = summary_of(_graph(name)).dims
    assert (dims.matmul_scale, dims.core_scale) == (1.0, 1.0), dims


def test_the_report_says_the_graphs_flops_were_used() -> None:
    import meshplan as mp

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("deepseek_v3",
                                                                                                **DEEPSEEK))
    plan = mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=64)
    assert "each block is costed at the traced graph's FLOPs: weight matmuls x1.81" in plan.report()
