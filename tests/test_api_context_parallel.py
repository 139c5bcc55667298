"""Context parallelism on a user's model at planning time: offered where the runtime can run it (an
attention module that calls SDPA, a forward that takes ``position_ids``, a sliding window no shorter
than the sequence), and otherwise not offered, with the reason in the report. The runtime side
(losses and parameters against one process) is tests/runtime/test_runtime_user_models.py."""
from __future__ import annotations

import pytest
import torch

import meshplan as mp
from meshplan.api import cp_blockers
from meshplan.frontend import trace

import user_models

transformers = pytest.importorskip("transformers")


def _blockers(model: torch.nn.Module, seq_len: int = 32) -> tuple[str, ...]:
    return cp_blockers(model, trace(model, batch=1, seq_len=16), seq_len)


def _hf(config_class, **config) -> torch.nn.Module:
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config_class(**{**user_models.hf_llama_config(), **config}))


def test_hf_llama_with_sdpa_attention_can_run_it() -> None:
    assert _blockers(_hf(transformers.LlamaConfig)) == ()


def test_attention_that_calls_no_sdpa_is_named() -> None:
    (why,) = _blockers(_hf(transformers.LlamaConfig, attn_implementation="eager"))
    assert "'model.layers.0.self_attn' calls no scaled_dot_product_attention" in why


def test_a_sliding_window_shorter_than_the_sequence_is_named() -> None:
    mistral = _hf(transformers.MistralConfig, sliding_window=16)
    assert _blockers(mistral, seq_len=16) == ()
    (why,) = _blockers(mistral, seq_len=32)
    assert "sliding-window attention (16 tokens) is shorter than the sequence (32)" in why


def test_positions_computed_inside_the_forward_are_named() -> None:
    """nanoGPT adds its learned positions from arange(t) of the local tokens: no position_ids to give."""
    with torch.device("meta"):
        model = user_models.nanogpt(n_layer=2, n_head=4, n_embd=32)
    why = _blockers(model)
    assert any("learned position embedding 'transformer.wpe'" in w for w in why)
    assert any("NanoGPT.forward takes no position_ids" in w for w in why)
    plan = mp.autoparallelize(model, "cpu:1x2", global_batch=4, seq_len=16, fixed={"dp": 2, "tp": 1, "zero": 0})
    assert "context parallelism is not offered: the learned position embedding" in plan.report()


def test_hf_llama_3_8b_at_64k_tokens_is_planned_with_context_parallelism() -> None:
    """Llama-3-8B's sizes at 65,536 tokens per sequence on 64 H100s: one sequence's activations do not
    fit one GPU's share without splitting the sequence, and the plan splits it over cp."""
    model = _hf(transformers.LlamaConfig, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072)
    plan = mp.autoparallelize(model, "h100-sxm:8x8", global_batch=64, seq_len=65536, fixed={"tp": 2, "pp": 1})
    assert plan.mesh.cp > 1, plan.summary()
    assert "context parallelism is not offered" not in plan.report()
    assert plan.source["kind"] == "hf"
