"""Model configs (zoo.ModelConfig, what --model-config reads): strict types and bounded sizes, with the
field, the value and the rule in the error. The bounds are ir/schema.py's MODEL_LIMITS, shared with plans."""
from __future__ import annotations

import pytest

from meshplan import ir, zoo
from meshplan.ir.schema import MODEL_LIMITS

GOOD = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "max_seq_len": 128}


@pytest.mark.parametrize("edit, message", [
    ({"layers": True}, "layers must be an integer from 1 to 1024, got True (bool)"),
    ({"layers": 4.0}, "layers must be an integer from 1 to 1024, got 4.0 (float)"),
    ({"hidden": "64"}, "hidden must be an integer from 1 to 1048576, got '64' (str)"),
    ({"heads": 0}, "heads must be from 1 to 16384, got 0"),
    ({"vocab": -5}, "vocab must be from 1 to 16777216, got -5"),
    ({"layers": 6_000_000}, "layers must be from 1 to 1024, got 6000000; larger than any model meshplan plans for "
     "(the deepest transformer trained so far, DeepNet (2022), has 1,000 layers), check it for a typo"),
    ({"max_seq_len": 2**40}, "max_seq_len must be from 1 to 16777216"),
    ({"heads": 5}, "hidden(64) must divide by heads(5)"),
    ({"kv_heads": 3}, "heads(4) must divide by kv_heads(3)"),
    ({"ffn_hidden": 2**22 + 1}, "ffn_hidden must be from 0 to 4194304, got 4194305"),
    ({"family": ["gpt"]}, "family ['gpt'] is not one of"),
    ({"name": 7}, "name must be a string"),
    ({"experts": 2}, "experts/top_k are only for family 'moe'"),
    ({"head_dim": -1}, "head_dim must be from 0 to 16384, got -1"),
    ({"head_dim": 16.0}, "head_dim must be an integer from 0 to 16384, got 16.0 (float)"),
])
def test_bad_model_configs_name_field_value_and_rule(edit, message) -> None:
    with pytest.raises(ir.UnknownModelError) as err:
        zoo.ModelConfig.from_dict({**GOOD, **edit})
    assert message in str(err.value) and str(err.value).startswith("model config")


def test_every_zoo_preset_is_within_the_limits() -> None:
    for name in zoo.names():
        cfg = zoo.config(name)
        for field, (least, most) in MODEL_LIMITS.items():
            assert least <= getattr(cfg, field) <= most, (name, field)


def test_limits_accept_the_largest_allowed_model() -> None:
    cfg = zoo.ModelConfig.from_dict({**GOOD, "layers": MODEL_LIMITS["layers"][1]})
    assert cfg.layers == 1024


def test_head_dim_is_a_model_dimension_of_its_own() -> None:
    # Qwen3's MoE models: heads of 128 on a hidden that is not heads x 128; hidden need not divide by heads then
    for fam in ("gpt", "llama", "moe"):
        base = zoo.config(f"{fam}-tiny").to_dict()
        cfg = zoo.ModelConfig.from_dict({**base, "head_dim": 24, "heads": 3, "kv_heads": 3 if fam == "gpt" else 1})
        model = zoo.build_from_config(cfg)
        assert model.layers[0].attn.wq.out_features == 3 * 24 and model.layers[0].attn.wo.in_features == 3 * 24
        assert sum(p.numel() for p in model.parameters()) == zoo.param_count(cfg)
        assert zoo.ModelConfig.from_dict(cfg.to_dict()) == cfg
    implied = zoo.config("llama-tiny")
    assert implied.head_dim == 16 and "head_dim" not in implied.to_dict()  # plans of zoo models stay as they were
    assert zoo.ModelConfig.from_dict({**implied.to_dict(), "head_dim": 16}).to_dict() == implied.to_dict()
