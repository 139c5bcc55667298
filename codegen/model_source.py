"""How an emitted script builds its model and reads the logits, from the plan's source (``plan.source``).

    zoo       model = build_on_meta({"kind": "zoo", "config": MODEL_CONFIG}, seed)  logits = model(x)
    hf        model = build_on_meta({"kind": "hf", "class": ..., "config": HF_CONFIG}, seed)
                                                                             logits = model(x, use_cache=False).logits
              (under context parallelism HF and builder models also get position_ids=cp_positions)
    builder   from pkg.module import function as build_user_model
              model = build_user_model(**BUILDER_KWARGS)                       logits = logits_of(model(x))
    module    refused: only the caller holds that model (plan.apply runs it; emit needs a source to build it)

Zoo and Hugging Face models are built with their parameters on meta and materialized after
``parallelize`` (``meshplan.runtime.materialize``): each rank allocates only its shards, filled with the
weights of ``torch.manual_seed(seed)`` and a whole build, as ``plan.apply`` and ``meshplan run`` do.

Everything from the plan enters as data: the class, module and function names are checked as
identifiers (``safe.name``), the config and keyword arguments are Python literals (``safe.literal``).
"""
from __future__ import annotations

from ..ir import InvalidPlanError
from . import safe
from .context import context_step
from .program import DataParallel, Program, SplitPipeline

INDENT = "    "


def kind(program: Program) -> str:
    return program.source.get("kind", "zoo") if program.source else "zoo"


def check_emittable(program: Program) -> None:
    if kind(program) not in ("zoo", "hf", "builder"):
        raise InvalidPlanError("the plan's model source is 'module': only the caller holds that model, so a script "
                               "cannot build it; plan it from a builder (autoparallelize('pkg.module:function', ...) "
                               "or meshplan plan --model pkg.module:function), or use plan.apply(model) in your loop")


def on_meta(program: Program) -> bool:
    """The script builds the model on meta and materializes this rank's shards after ``parallelize``
    (``meshplan.runtime.materialize``): zoo and Hugging Face models, whose initialization it replays;
    a user's builder builds the whole model first."""
    return kind(program) in ("zoo", "hf")


def imports(program: Program) -> list[str]:
    k = kind(program)
    pipelined = any(isinstance(s, SplitPipeline) for s in program.steps)
    names = ["build_on_meta", "materialized"] if on_meta(program) else (
        ["materialized"] if pipelined or any(isinstance(s, DataParallel) for s in program.steps) else [])
    lines = [f"from meshplan.runtime.materialize import {', '.join(names)}"] if names else []
    if k in ("zoo", "hf"):  # the runtime's loss: vocab-parallel on tp-sharded logits (runtime.loss)
        return ["", *lines, "from meshplan.runtime.planned import token_cross_entropy"]
    module, function = _target(program)
    return ["", f"from {module} import {function} as build_user_model",
            "", *lines, "from meshplan.runtime.planned import logits_of, token_cross_entropy"]


def _target(program: Program) -> tuple[str, str]:
    target = program.source.get("target")
    if not isinstance(target, str) or target.count(":") != 1:
        raise InvalidPlanError(f"plan.source.target is {target!r}; a builder is 'pkg.module:function'")
    module, function = target.split(":")
    for part in module.split("."):
        safe.name(part, "plan.source.target's module")
    return module, safe.name(function, "plan.source.target's function")


def constants(program: Program) -> list[str]:
    """Module-level constants the model's construction reads."""
    k = kind(program)
    if k == "hf":
        config = program.source.get("config")
        if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
            raise InvalidPlanError("plan.source.config must be a Hugging Face config with a model_type")
        items = [f"{INDENT}{safe.literal(key, 'plan.source.config key')}: {safe.literal(value, 'plan.source.config')},"
                 for key, value in config.items()]
        return ["", "HF_CONFIG = {  # the model's transformers config, as the plan recorded it", *items, "}"]
    if k == "builder":
        kwargs = program.source.get("kwargs", {})
        return ["", f"BUILDER_KWARGS = {safe.literal(kwargs, 'plan.source.kwargs')}  # the builder's arguments"]
    return []


# after the model is built, before parallelize: as runtime.train.prepare_model (torchtitan's order)
COMPILE = ["if args.compile:  # torch.compile each block in place: names and parameters stay the same",
           f"{INDENT}compile_blocks(model, BLOCKS)"]


def build_lines(program: Program) -> list[str]:
    """The lines in ``main`` that build the model on ``device`` (after the seed is set), then compile
    its blocks under --compile."""
    if kind(program) == "zoo":
        return ['model = build_on_meta({"kind": "zoo", "config": MODEL_CONFIG}, args.seed)', *COMPILE]
    if kind(program) == "hf":  # parameters on meta; the values of a seeded whole build are filled in after parallelize
        cls = safe.name(program.source.get("class") or "AutoModelForCausalLM", "plan.source.class")
        return [f'model = build_on_meta({{"kind": "hf", "class": {safe.string_literal(cls)}, "config": HF_CONFIG}}, '
                "args.seed)", *COMPILE]
    return ["model = build_user_model(**BUILDER_KWARGS).to(device)", *COMPILE]


def loss_line(program: Program) -> str:
    """The micro-batch's loss from the output of a Hugging Face or builder model on ``x`` (a zoo model's
    is the template's ``FORWARD_BACKWARD``)."""
    # under context parallelism the tokens' global positions (codegen.context: cp_positions, per rank)
    positions = ", position_ids=cp_positions.expand(x.shape[0], -1)" if context_step(program) else ""
    if kind(program) == "hf":
        return (f"loss = token_cross_entropy(model(x.to(device){positions}, use_cache=False).logits, y.to(device)) "
                "/ NUM_MICROBATCHES")
    return (f"loss = token_cross_entropy(logits_of(model(x.to(device){positions})), y.to(device)) "
            "/ NUM_MICROBATCHES")
