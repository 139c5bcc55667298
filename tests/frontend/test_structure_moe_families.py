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


def test_gpt_oss_traces_with_sinks_split_with_the_heads():
    g = _traced("GptOssForCausalLM", model_type="gpt_oss", vocab_size=256, hidden_size=72, intermediate_size=48,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                num_experts_per_tok=2, sliding_window=8, max_position_embeddings=64,
                layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False)
    s = g.structure
    assert (s.experts, s.router, s.shared_experts, s.dense_blocks) == ("mlp.experts", "mlp.router", "", ())
    assert (s.attn, s.o, s.attn_norm, s.head_dim) == ("self_attn", "self_attn.o_proj", "input_layernorm", 16)
    # the sinks (heads,) split with the heads over tp (runtime.styles.HeadShardedParams)
    assert s.attn_split and s.head_params == ("self_attn.sinks",) and not any("sinks" in n for n in s.notes)
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


def _tiny(model_type: str, **extra) -> dict:
    return dict(model_type=model_type, vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, **extra)


def test_llama4_blocks_hand_attention_the_stream_by_keyword_and_its_moe_returns_a_tuple():
    """Llama 4 passes its complex rotary table (b, s, d/2) beside ``hidden_states``: the stream is still found by
    keyword (it was taken as positional, and sequence parallelism's PrepareModuleInput failed on zero positional
    inputs); its MoE returns (output, router logits), so sp is not offered, and its experts take one (E * tokens,
    h) tensor, so ep is not offered either: each with its reason, and a pin of either is refused with it."""
    import meshplan as mp
    from meshplan.api import ep_blockers, offered

    cfg = _tiny("llama4_text", head_dim=16, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128)
    with torch.device("meta"):
        model = build({"kind": "hf", "class": "Llama4ForCausalLM", "config": cfg})
    s = trace(model, batch=1, seq_len=16).structure
    assert (s.attn_kwarg, s.attn_tuple, s.mlp, s.experts, s.mlp_tuple) == (
        "hidden_states", True, "feed_forward", "feed_forward.experts", True)
    runtime, why = offered(s, zoo_modules=False, cp_why=(), ep_why=ep_blockers(model, s))
    assert "sp" not in runtime and "ep" not in runtime and "tp" in runtime
    assert any("MLP ('feed_forward') is kept whole over tp and returns a tuple" in w for w in why)
    assert any("Llama4TextExperts.forward(hidden_states) takes neither" in w for w in why)
    for pin, words in (({"ep": 2}, "expert parallelism is not offered"),
                       ({"sp": True, "tp": 2}, "sequence parallelism is not offered")):
        with pytest.raises(ir.PlanError, match=words):
            mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=16, fixed=pin)


def test_a_forward_that_takes_use_cache_through_kwargs_traces_and_the_config_is_left_as_it_was():
    """GraniteMoE's forward passes ``use_cache`` on through ``**kwargs``, under which export cannot key a non-tensor;
    the trace turns the cache off in the config instead, and gives the user's config its value back."""
    with torch.device("meta"):
        model = build({"kind": "hf", "class": "GraniteMoeForCausalLM",
                       "config": _tiny("granitemoe", num_local_experts=4, num_experts_per_tok=2)})
    assert model.config.use_cache is True
    g = trace(model, batch=1, seq_len=16)
    assert (g.structure.experts, g.dims.experts, g.dims.top_k) == ("block_sparse_moe.experts", 4, 2)
    assert model.config.use_cache is True
