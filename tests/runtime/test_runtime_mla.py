"""DeepSeek-V3 (multi-head latent attention, a shared expert beside the routed ones, a leading dense layer)
and GPT-OSS (attention sinks, grouped experts with biases, clamped SwiGLU) as users' own Hugging Face models:
transformers' classes from a tiny config, planned from the traced graph, applied with ``plan.apply`` on 4
gloo processes under ep x dp, and compared with one process training the same model (losses and final
parameters within 1e-5, fp32, 3 AdamW steps). Each rank runs ``user_model_cases.run_cases``."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import meshplan as mp  # noqa: E402
from meshplan.codegen import ExpertParallel, FullyShard, lower  # noqa: E402
from meshplan.runtime.source import build  # noqa: E402
from parity_support import GLOBAL_BATCH, SEQ_LEN, assert_ranks_match, launch  # noqa: E402

import user_model_cases  # noqa: E402

# DeepSeek-V3's layout (arXiv:2412.19437, sec. 2.1 and 4.2) at toy size: q through a low-rank q_lora_rank
# bottleneck, k and v from one compressed kv_lora_rank latent, a rotary part of the key shared by all heads;
# first_k_dense_replace=1 leading dense layer, then MoE layers of 4 routed experts (top 2) and 1 shared expert
DEEPSEEK_V3 = {"kind": "hf", "class": "DeepseekV3ForCausalLM", "config": dict(
    model_type="deepseek_v3", vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
    n_group=1, topk_group=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)}
# GPT-OSS's layout at toy size: head_dim 16 on a hidden size of 72 (not hidden / heads), sliding and full
# attention layers alternating, per-head sinks, 4 grouped experts with biases
GPT_OSS = {"kind": "hf", "class": "GptOssForCausalLM", "config": dict(
    model_type="gpt_oss", vocab_size=256, hidden_size=72, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
    sliding_window=8, max_position_embeddings=64, layer_types=["sliding_attention", "full_attention"],
    tie_word_embeddings=False, attention_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})}
PINS = dict(pp=1, cp=1, tp=1, dp=4, sp=False, recompute="none", num_microbatches=1, micro_batch=2)
CASES = {
    "deepseek-v3 ep2 x dp4 zero0": (DEEPSEEK_V3, dict(ep=2, zero=0)),
    "deepseek-v3 ep4 x dp4 zero3": (DEEPSEEK_V3, dict(ep=4, zero=3)),
    "gpt-oss ep2 x dp4 zero2": (GPT_OSS, dict(ep=2, zero=2)),
}


def _plan(source: dict, **fixed) -> mp.Plan:
    with torch.device("meta"):
        model = build(source)
    return mp.autoparallelize(model, "cpu:1x4", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, fixed={**PINS, **fixed})


@pytest.fixture(scope="module")
def plans() -> dict[str, mp.Plan]:
    return {name: _plan(source, **fixed) for name, (source, fixed) in CASES.items()}


@pytest.fixture(scope="module")
def ranks(plans, tmp_path_factory) -> list[dict]:
    cases = [{"name": name, "plan": plan.to_json(), "vocab": plan.model["vocab"]} for name, plan in plans.items()]
    return launch(tmp_path_factory, 4, "user_model_cases:run_cases", {"cases": cases})


def test_deepseek_structure_names_the_dense_layer_and_the_shared_expert(plans) -> None:
    structure = plans["deepseek-v3 ep2 x dp4 zero0"].structure
    assert structure["experts"] == "mlp.experts" and structure["router"] == "mlp.gate"
    assert structure["dense_blocks"] == [0] and structure["shared_experts"] == "mlp.shared_experts"
    assert structure["attn_norm"] == "input_layernorm" and "q" not in structure  # MLA: attention kept whole
    assert any("multi-head latent attention" in note for note in structure["notes"])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_one_process(plans, ranks, name) -> None:
    plan = plans[name]
    ref_losses, ref_params = user_model_cases.reference(plan.source, plan.model["vocab"])
    assert_ranks_match(ranks, name, ref_losses, ref_params)


def test_experts_split_only_in_moe_blocks(plans) -> None:
    """The lowered program shards the experts of blocks 1 and 2 over ep, and FSDPs them over edp; block 0,
    the leading dense layer, has none (the structure's ``dense_blocks``)."""
    program = lower(plans["deepseek-v3 ep2 x dp4 zero0"])
    split = [s.module for s in program.steps if isinstance(s, ExpertParallel)]
    edp = [s.module for s in program.steps if isinstance(s, FullyShard) and "edp" in s.mesh_axes]
    assert split == edp == ["model.layers.1.mlp.experts", "model.layers.2.mlp.experts"]
