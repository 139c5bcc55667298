"""Where a model comes from (``plan.source``), and building it again from there.

A plan records its model's source so that ``emit``, ``meshplan run`` and ``plan.apply`` in another
process rebuild that very model, never a zoo stand-in of the same sizes:

    {"kind": "zoo", "name": "llama3-8b"}                  meshplan.zoo.build(name)
    {"kind": "zoo", "config": {...}}                     meshplan.zoo.build_from_config(config)
    {"kind": "hf", "class": "LlamaForCausalLM", "config": {...}}
                                                         transformers' class built from the inline config
    {"kind": "builder", "target": "pkg.module:function", "kwargs": {...}}
                                                         the user's function, called with the keyword arguments
    {"kind": "module"}                                   a model only the caller holds: plan.apply works on it,
                                                         emit and run need one of the sources above

Reading a source imports only what it names: ``transformers`` for "hf", the builder's module for
"builder" (a target must be dotted identifiers, ``pkg.module:function``; nothing is evaluated).
"""
from __future__ import annotations

import importlib
import json
import math
import re
from typing import Any

from torch import nn

from ..ir import UnsupportedModelError
from ..ir.limits import MODEL_LIMITS

TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
KINDS = ("zoo", "hf", "builder", "module")


def is_hf(model: nn.Module) -> bool:
    """A Hugging Face transformers model (duck-typed: no import of transformers)."""
    return type(model).__module__.startswith("transformers.") and hasattr(getattr(model, "config", None), "to_dict")


# transformers' own spelling of the floats JSON has no literal for (its config.json: Nemotron-H's
# ``time_step_limit`` [0.0, {"__float__": "Infinity"}]), kept in plans so that they stay strict JSON
FLOAT_TAG = "__float__"
SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _tagged_floats(value: Any) -> Any:
    """``value`` with each infinite or NaN float spelled ``{"__float__": "Infinity"}`` (transformers' way)."""
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    if isinstance(value, dict):
        return {k: _tagged_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tagged_floats(v) for v in value]
    return value


def _untagged_floats(value: Any) -> Any:
    """``_tagged_floats`` undone: what transformers' ``from_pretrained`` reads back from its config.json."""
    if isinstance(value, dict):
        if set(value) == {FLOAT_TAG} and value[FLOAT_TAG] in SPECIAL_FLOATS:
            return SPECIAL_FLOATS[value[FLOAT_TAG]]
        return {k: _untagged_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged_floats(v) for v in value]
    return value


def hf_config_dict(config: Any) -> dict[str, Any]:
    """A transformers config as plain JSON data (what ``from_dict`` takes back), infinite and NaN floats
    spelled as transformers' config.json spells them."""
    data = config.to_dict()
    return _tagged_floats(json.loads(json.dumps(data, default=str)))


def builder_source(target: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    if not isinstance(target, str) or not TARGET.match(target):
        raise UnsupportedModelError(f"a model builder must be 'package.module:function' (dotted identifiers), got "
                                    f"{target!r}")
    kwargs = dict(kwargs or {})
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnsupportedModelError(f"the builder's keyword arguments must be plain JSON data (they are saved in the "
                                    f"plan): {exc}") from None
    return {"kind": "builder", "target": target, "kwargs": kwargs}


def load_function(target: str) -> Any:
    """``"pkg.module:function"`` -> the function, with an error that says what did not import."""
    builder_source(target)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnsupportedModelError(f"model builder {target!r}: cannot import {module_name!r} ({exc}); install it or "
                                    "put it on PYTHONPATH") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UnsupportedModelError(f"model builder {target!r}: {module_name} has no function {attr!r}")
    return fn


def hf_class(source: dict[str, Any]) -> Any:
    """The transformers class a "hf" source names (or AutoModelForCausalLM's choice for its config)."""
    try:
        import transformers
    except ImportError:
        raise UnsupportedModelError("this plan's model is a Hugging Face model: pip install transformers") from None
    name = source.get("class") or "AutoModelForCausalLM"
    cls = getattr(transformers, name, None) if isinstance(name, str) and IDENTIFIER.match(name) else None
    if cls is None:
        raise UnsupportedModelError(f"transformers {transformers.__version__} has no model class {name!r}; "
                                    "upgrade transformers, or plan with a builder 'pkg.module:function'")
    return cls


def hf_config(source: dict[str, Any]) -> Any:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = _untagged_floats(dict(source.get("config") or {}))
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(f"the Hugging Face config's model_type {model_type!r} is not one transformers "
                                    f"{transformers.__version__} knows; upgrade transformers or fix the config")
    try:
        config = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    except Exception as exc:  # noqa: BLE001 - transformers validates fields with its own error types
        raise UnsupportedModelError(f"the Hugging Face {model_type} config does not fit transformers "
                                    f"{transformers.__version__}'s {model_type} model: {exc}; fix the config") from None
    check_hf_sizes(config)
    return config


# the sizes of a Hugging Face config that decide how much the model builds, under the plan's bounds
# (ir/limits.py MODEL_LIMITS): a config with 10^6 layers would otherwise build modules for minutes on meta
HF_SIZES = {"num_hidden_layers": "layers", "n_layer": "layers", "num_layers": "layers", "hidden_size": "hidden",
            "n_embd": "hidden", "num_attention_heads": "heads", "n_head": "heads", "num_key_value_heads": "kv_heads",
            "intermediate_size": "ffn_hidden", "vocab_size": "vocab", "num_local_experts": "experts",
            "n_routed_experts": "experts", "num_experts": "experts"}


def check_hf_sizes(config: Any) -> None:
    """Refuse a Hugging Face config whose sizes exceed meshplan's bounds, naming the field, value and bound
    (the text config of a multimodal model too)."""
    configs = [config]
    text = getattr(config, "get_text_config", None)
    if callable(text):
        try:
            inner = text()
        except Exception:  # noqa: BLE001 - a config without a text part is checked as it is
            inner = None
        if inner is not None and inner is not config:
            configs.append(inner)
    for cfg in configs:
        for field, kind in HF_SIZES.items():
            value = getattr(cfg, field, None)
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            least, most = MODEL_LIMITS[kind]
            if not least <= value <= most:
                raise UnsupportedModelError(f"the Hugging Face config's {field} = {value} is outside "
                                            f"{least}..{most}, meshplan's bound on a model's {kind}; "
                                            "fix the config")


def build(source: dict[str, Any]) -> nn.Module:
    """The model of ``source``, built on the current default device (build under ``torch.device("meta")``
    to allocate nothing)."""
    kind = source.get("kind")
    if kind == "zoo":  # named, not imported: the runtime does not depend on the zoo
        if source.get("name"):
            return load_function("meshplan.zoo:build")(source["name"])
        return load_function("meshplan.zoo:build_from_config")(source["config"])
    if kind == "hf":
        cls = hf_class(source)
        config = hf_config(source)
        return cls._from_config(config) if hasattr(cls, "_from_config") else cls.from_config(config)
    if kind == "builder":
        model = load_function(source["target"])(**source.get("kwargs", {}))
        if not isinstance(model, nn.Module):
            raise UnsupportedModelError(f"model builder {source['target']!r} returned {type(model).__name__}, "
                                        "not an nn.Module")
        return model
    raise UnsupportedModelError(f"the plan's model source is {kind!r}: only the caller holds that model; pass it to "
                                "plan.apply, or plan with a zoo name, a Hugging Face model or a builder "
                                "'pkg.module:function' so that emit and run can build it")
