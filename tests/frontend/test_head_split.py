"""A head split that would change what attention computes is found before any plan uses it: OPT's Hugging Face
attention reshapes q, k and v by ``(bsz, -1, num_heads, head_dim)``, its whole head count, so a tensor-parallel
rank's half of the heads would fold the sequence in two (no error, another model). Llama's reshapes by ``-1`` heads.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from meshplan.frontend import trace
from meshplan.frontend import head_split
from meshplan.frontend.head_split import heads_split_cleanly
from meshplan.runtime.source import build

from user_models import hf_llama_config, hf_opt_config

pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def _hf(cls: str, config: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return build({"kind": "hf", "class": cls, "config": config})


def test_opt_attention_is_kept_whole_and_llama_s_is_split() -> None:
    opt = _hf("OPTForCausalLM", hf_opt_config())
    s = trace(opt, seq_len=32).structure
    assert (s.q, s.o) == ("self_attn.q_proj", "self_attn.out_proj")  # found: separate projections
    assert s.attn_whole and not s.attn_split and s.tp_linears()["attn"] is None
    assert any("whole head count" in n for n in s.notes)
    assert not heads_split_cleanly(opt, dataclasses.replace(s, attn_whole=False))  # the probe's own answer
    llama = _hf("LlamaForCausalLM", hf_llama_config())
    ls = trace(llama, seq_len=32).structure
    assert not ls.attn_whole and ls.attn_split and heads_split_cleanly(llama, ls)
    whole, split = (head_split._attention_shapes(llama, ls, split=h) for h in (False, True))
    assert whole and split and len(whole) == len(split)  # the probe ran Llama's attention both ways


def test_olmo2_s_whole_width_q_norm_splits_with_its_projections() -> None:
    """OLMo 2 normalizes q and k over all heads at once (``q_norm`` of width heads x head_dim): the norm is found as
    one over q_proj's and k_proj's whole outputs (``ModelStructure.feature_norms``), so tp splits its weight as their
    features are and reduces its statistics (``runtime.styles.FeatureShardedNorm``); the probe runs the half-width
    attention with the half-width norms and finds the heads split cleanly."""
    import transformers

    config = transformers.Olmo2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64)
    s = trace(_hf("Olmo2ForCausalLM", config.to_dict()), seq_len=32).structure
    assert s.feature_norms == ("self_attn.q_norm", "self_attn.k_norm") and not s.head_norms, s
    assert s.attn_split and not s.attn_whole and s.tp_linears()["attn"] is not None, s.notes
    assert not any("q_norm" in n for n in s.notes), s.notes


def test_gpt_neox_s_fused_qkv_by_heads_is_split_and_falcon_s_fixed_head_count_is_not() -> None:
    """GPT-NeoX's one query_key_value projection is read as view(b, s, -1, 3 * head_dim): each head's q, k and v side
    by side, so a row split hands a rank whole heads (``ModelStructure.qkv_grouped``) and tp splits it. Falcon's new
    decoder groups its q, k, v by kv head too, but reshapes by its whole head count later: the probe keeps it whole."""
    import transformers

    neox = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_hidden_layers=2, max_position_embeddings=64)
    s = trace(_hf("GPTNeoXForCausalLM", neox.to_dict()), seq_len=32).structure
    assert s.qkv == "attention.query_key_value" and s.qkv_grouped and s.attn_split and not s.attn_whole, s.notes
    assert s.tp_linears()["attn"] == (("attention.query_key_value",), "attention.dense")
    falcon = transformers.FalconConfig(vocab_size=256, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                                       num_hidden_layers=2, new_decoder_architecture=True)
    f = trace(_hf("FalconForCausalLM", falcon.to_dict()), seq_len=32).structure
    assert f.qkv_grouped and f.attn_whole and not f.attn_split and f.tp_linears()["attn"] is None
