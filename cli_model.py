"""``--model`` on the command line, the same in ``plan``, ``estimate``: where the model comes from.

    --model llama3-8b                       a zoo name (``meshplan zoo list``)
    --model hf:PATH                         a Hugging Face config: a config.json, or a directory holding one
    --model pkg.module:function             the user's builder, called with --model-kwargs (a JSON object)
    --model-config FILE                     a zoo config (family, layers, hidden, ...)

The model is built on the meta device (nothing allocated) and the plan records where it came from,
so ``emit`` and ``run`` rebuild that very model.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from . import ir

MODEL_HELP = ("a zoo name (see `meshplan zoo list`), hf:PATH (a Hugging Face config.json or a directory holding "
              "one), or pkg.module:function (your builder, called with --model-kwargs)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=MODEL_HELP)
    src.add_argument("--model-config", metavar="FILE", help="a JSON zoo model config (family, layers, hidden, ...)")
    p.add_argument("--model-kwargs", metavar="JSON", help="keyword arguments for a pkg.module:function builder, "
                                                         "as a JSON object, e.g. '{\"n_layer\": 12}'")


def model_arg(args: argparse.Namespace) -> Any:
    """What ``api.plans`` takes for the command's model: a zoo name, a zoo config dict, a builder string,
    or (for hf:PATH) the Hugging Face model built on the meta device."""
    _kwargs(args)  # a malformed --model-kwargs is refused whatever it goes with
    has_kwargs = getattr(args, "model_kwargs", None) is not None
    if args.model is None:
        from .ir.readfile import MAX_CONFIG_BYTES, read_json_file  # a regular file, bounded size, depth and numbers

        if has_kwargs:
            raise ir.PlanError("--model-kwargs goes with --model pkg.module:function, not --model-config")
        return read_json_file(args.model_config, max_bytes=MAX_CONFIG_BYTES, what="model config")
    if args.model.startswith("hf:"):
        if has_kwargs:
            raise ir.PlanError("--model-kwargs goes with --model pkg.module:function, not hf:PATH (edit the config)")
        return hf_model(args.model[3:])
    if ":" in args.model:
        return args.model  # a builder: api.model_and_source checks its form and imports it
    if has_kwargs:
        raise ir.PlanError(f"--model-kwargs goes with --model pkg.module:function, not the zoo name {args.model!r}; "
                           "use --model-config for other sizes")
    return args.model  # '' too: the zoo says it has no such model


def model_kwargs(args: argparse.Namespace) -> dict[str, Any] | None:
    return _kwargs(args) if args.model and ":" in args.model and not args.model.startswith("hf:") else None


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    text = getattr(args, "model_kwargs", None)
    if text is None:
        return {}
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ir.PlanError(f"--model-kwargs is not a JSON object ({exc}); e.g. '{{\"n_layer\": 12}}'") from None
    if not isinstance(value, dict):
        raise ir.PlanError(f"--model-kwargs must be a JSON object of keyword arguments, got {type(value).__name__}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number meshplan takes")


def hf_config_file(path: str) -> Path:
    """The config.json that hf:PATH names (the file, or the one in the directory)."""
    where = Path(path)
    file = where / "config.json" if where.is_dir() else where
    if not file.is_file():
        raise ir.UnsupportedModelError(f"hf:{path}: no Hugging Face config there (looked for {file}); give a "
                                       "config.json or a directory holding one (what save_pretrained writes)")
    return file


def hf_model(path: str) -> Any:
    """The Hugging Face causal LM a config.json describes, built on the meta device."""
    import torch

    from .ir.readfile import MAX_CONFIG_BYTES, read_json_file
    from .runtime import source as sources

    data = read_json_file(str(hf_config_file(path)), max_bytes=MAX_CONFIG_BYTES, what="Hugging Face config")
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ir.UnsupportedModelError(f"hf:{path}: a Hugging Face config.json has a \"model_type\" (e.g. "
                                       "\"llama\"); this one has none")
    archs = data.get("architectures") or []
    cls = archs[0] if archs and isinstance(archs[0], str) and sources.IDENTIFIER.match(archs[0]) else None
    with torch.device("meta"):
        return sources.build({"kind": "hf", "class": cls, "config": data})
