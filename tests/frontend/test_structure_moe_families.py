"""MoE families beyond Mixtral, as transformers builds them: DeepSeek-V3 (multi-head latent attention,
shared experts, leading dense layers; Kimi K2 and Moonlight are the same architecture) and GPT-OSS
(eager attention with per-head sinks, grouped experts with biases). The structure the frontend finds
from the traced graph, and ``ModelStructure.dense_blocks`` as a value."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from meshplan import ir  # noqa: E402
from meshplan.frontend import trace  # noqa: E402
from meshplan.runtime.source import build  # noqa: E402


def _traced(cls: str, **config) -> ir.Graph:
    with torch.device("meta"):
        model = build({"kind": "hf", "class": cls, "config": config})
    return trace(model, batch=1, seq_len=16)


def _deepseek(**overrides) -> dict:
    return dict(model_type="deepseek_v3", vocab_size=256, hidden_size=64, intermediate_size=128,
                moe_intermediate_size=32, num_hidden_layers=4, first_k_dense_replace=2, n_routed_experts=4,
                n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, num_attention_heads=4,
                num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                v_head_dim=16, max_position_embeddings=64, tie_word_embeddings=False, **overrides)


@pytest.mark.parametrize("q_lora_rank", [32, None])  # V3 / Kimi K2 compress q too; V2-Lite and Moonlight do not
def test_deepseek_v3_dense_layers_experts_and_shared_expert(q_lora_rank):
    s = _traced("DeepseekV3ForCausalLM", **_deepseek(q_lora_rank=q_lora_rank)).structure
    assert (s.blocks, s.num_blocks, s.dense_blocks, s.expert_blocks()) == ("model.layers", 4, (0, 1), (2, 3))
    assert (s.experts, s.router, s.shared_experts) == ("mlp.experts", "mlp.gate", "mlp.shared_experts")
    assert (s.attn, s.o, s.attn_norm, s.mlp_norm) == ("self_attn", "self_attn.o_proj", "input_layernorm",
                                                      "post_attention_layernorm")
    assert not s.attn_split and s.head_dim == 24  # qk_nope + qk_rope: q's width per head
    dims = _traced("DeepseekV3ForCausalLM", **_deepseek(q_lora_rank=q_lora_rank)).dims
    assert (dims.expert_bias, dims.glu_limit) == (False, 0.0)  # no bias on its experts, no clamp
    assert any("'self_attn.kv_b_proj'" in n and "multi-head latent attention" in n for n in s.notes)


def test_gpt_oss_traces_with_sinks_kept_whole():
    g = _traced("GptOssForCausalLM", model_type="gpt_oss", vocab_size=256, hidden_size=72, intermediate_size=48,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                num_experts_per_tok=2, sliding_window=8, max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False)
    s = g.structure
    assert (s.experts, s.router, s.shared_experts, s.dense_blocks) == ("mlp.experts", "mlp.router", "", ())
    assert (s.attn, s.o, s.attn_norm, s.head_dim) == ("self_attn", "self_attn.o_proj", "input_layernorm", 16)
    assert not s.attn_split and any("['sinks']" in n for n in s.notes)  # heads split would need sinks split
    assert (g.dims.experts, g.dims.top_k, g.dims.head_dim, g.dims.hidden) == (4, 2, 16, 72)
    # the experts' biases are found among their parameters, the GLU's clamp read from swiglu_limit (default 7.0)
    assert (g.dims.expert_bias, g.dims.glu_limit) == (True, 7.0)


def test_dense_blocks_round_trip_and_are_checked():
    s = ir.ModelStructure(blocks="model.layers", num_blocks=3, experts="mlp.experts", dense_blocks=[0])
    assert ir.ModelStructure.from_dict(s.to_dict()) == s and s.expert_blocks() == (1, 2)
    with pytest.raises(ir.InvalidPlanError, match=r"dense_blocks: \[3\] must be block indices below num_blocks\(3\)"):
        ir.ModelStructure(blocks="model.layers", num_blocks=3, experts="mlp.experts", dense_blocks=(3,))
    with pytest.raises(ir.InvalidPlanError, match="of a model with experts"):
        ir.ModelStructure(blocks="model.layers", num_blocks=3, dense_blocks=(0,))
