"""Dimensions from a config without tracing, and from the graph of a model with real weights."""
from __future__ import annotations

import copy

import pytest
import torch

from meshplan import ir, zoo
from meshplan.frontend import dims_of, trace


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "moe-tiny", "mixtral-8x7b"])
def test_dims_of_reads_the_config(build, name):
    cfg = zoo.config(name)
    dims = dims_of(build(name, layers=2))
    assert (dims.family, dims.hidden, dims.heads, dims.kv_heads, dims.ffn_hidden, dims.vocab, dims.experts,
            dims.top_k) == (cfg.family, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.ffn_hidden, cfg.vocab,
                            cfg.experts, cfg.top_k)
    assert dims.layers == 2


def test_dims_of_without_config_says_to_trace():
    with pytest.raises(ir.UnsupportedModelError, match="trace"):
        dims_of(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "moe-tiny"])
def test_real_weights_are_untouched_and_dims_inferred_without_config(name):
    torch.manual_seed(0)
    model = zoo.build(name)  # real CPU weights
    config = model.config
    del model.config  # the frontend must read the dimensions off the graph
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    graph = trace(model, batch=2, seq_len=16)
    assert graph.dims == dims_of(type("M", (), {"config": config})())
    assert graph.param_count == sum(p.numel() for p in model.parameters())
    for n, p in model.named_parameters():  # same tensors, same device, same values
        assert id(p) == ids[n] and p.device.type == "cpu"
        torch.testing.assert_close(p.detach(), before[n])
    assert not [m for m in model.modules() if "forward" in vars(m)]  # no leaf patch left behind
    x = torch.randint(0, config.vocab, (2, 16))
    assert model(x).shape == (2, 16, config.vocab)  # still runs, MoE routing included


def test_dims_reject_a_config_missing_required_fields():
    model = copy.copy(torch.nn.Linear(2, 2))
    model.config = {"hidden": 8}
    with pytest.raises(ir.UnsupportedModelError, match=r"lacks \['layers', 'heads', 'vocab'\]"):
        dims_of(model)


def test_a_sliding_window_is_read_only_where_the_config_names_the_layers_that_use_it():
    """``layer_types`` (GPT-OSS, Gemma) says which layers attend ``sliding_window`` positions back; a bare
    ``sliding_window`` (Qwen2 carries one with ``use_sliding_window`` False) is not taken."""
    from meshplan.frontend.dims import dims_from_config

    base = dict(model_type="llama", num_hidden_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=128)
    gemma_like = dims_from_config(dict(base, sliding_window=512, layer_types=["sliding_attention"] * 5
                                       + ["full_attention"]))
    assert (gemma_like.attention_window, gemma_like.windowed_layers) == (512, 5)
    bare = dims_from_config(dict(base, sliding_window=4096, use_sliding_window=False))
    assert (bare.attention_window, bare.windowed_layers) == (0, 0)
    full = dims_from_config(dict(base, sliding_window=512, layer_types=["full_attention"] * 6))
    assert (full.attention_window, full.windowed_layers) == (0, 0)


def _gemma4_config(**extra):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoConfig.for_model(
        "gemma4_text", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, vocab_size=256, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=0,
        pad_token_id=0, **extra)


def test_a_heterogeneous_config_gives_the_mean_of_its_layers_values():
    """Gemma 4 sets ``head_dim`` layer by layer (16 on its sliding layer, 32 on its full one here), and
    transformers refuses the global read (``AmbiguousGlobalPerLayerAttributeError``): the dimension is the mean
    over the layers, so the projections' parameters and FLOPs over the model come out right."""
    from meshplan.frontend.dims import dims_from_config

    config = _gemma4_config()
    assert config.is_heterogeneous and [c.head_dim for c in config.per_layer_config] == [16, 32]
    dims = dims_from_config(config)
    assert (dims.head_dim, dims.heads, dims.kv_heads, dims.layers) == (24, 4, 2, 2)


def test_a_moe_config_naming_its_top_k_its_own_way_plans():
    """Gemma 4's MoE block names its routed experts a token takes ``top_k_experts``: read like
    ``num_experts_per_tok`` (it was 0, and the cost model divided by a matmul of no work)."""
    import meshplan as mp
    from meshplan.frontend.dims import dims_from_config

    config = _gemma4_config(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
    dims = dims_from_config(config)
    assert (dims.experts, dims.top_k) == (4, 2)
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    plan = mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=32, fixed={"dp": 4, "ep": 2, "pp": 1})
    assert (plan.mesh.dp, plan.mesh.ep, plan.model["experts"], plan.model["top_k"]) == (4, 2, 4, 2)
