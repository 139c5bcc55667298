"""``emit_source(plan) -> str``: print a Program as a readable torchrun script.

The script reads like a torchtitan ``parallelize`` recipe: a ``parallelize(model, mesh)`` function
that applies the plan's steps top to bottom with public PyTorch calls (``parallelize_module``,
``checkpoint_wrapper``, ``fully_shard``, ...), then a plain training loop on synthetic tokens.
Steps that differ only in their layer index print once, as a loop over the layers.

Plan values are data: names (module paths, mesh axes, ops) are checked against a strict pattern
before they print as code, everything else prints as a Python literal, and the finished script is
compiled before it is returned (``codegen.safe``).

Each step kind has one emitter in ``EMITTERS``; it returns the section the lines go to
(``mesh``, ``parallelize`` or ``optimizer``) and the lines. ``runtime.interpret.EXECUTORS`` is the
same table for the in-process back end.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from ..ir import Plan
from . import context, expert, fused, hybrid, model_source, pipeline_emit, safe, script
from .assemble import assemble
from .lower import lower
from .structure import LEGACY_ZOO, structure_of
from .program import (Autocast, BuildMesh, ContextParallel, DataParallel, ExpertMesh, ExpertParallel, FlattenMesh, FullyShard,
                      FuseKernel, Policy, Program, Recompute, ShardOptimizer, SplitPipeline, Step, TensorParallel)
from .tp_plans import torch_call

INDENT = "    "
_LAYER = re.compile(r"^layers\.(\d+)((?:\.[A-Za-z_]\w*)*)$")


def layout_code(layout: str) -> str:
    """``"S(1)"`` -> ``"Shard(1)"``, ``"R"`` -> ``"Replicate()"``."""
    safe.layout(layout, "a tensor-parallel style's layout")
    return "Replicate()" if layout == "R" else layout.replace("S(", "Shard(")


def tuple_code(items: list[str]) -> str:
    """A tuple literal: ``(a, b)``, or ``(a,)`` for one item."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def module_expr(path: str, root: str = "model") -> str:
    """``"layers.{i}.attn"`` -> ``"model.layers[i].attn"``: numeric parts (and ``{i}``) index."""
    expr = root
    for part in filter(None, safe.module_path(path, "a step's module path").split(".")):
        if part.isdigit() or part == "{i}":
            expr += f"[{part.strip('{}')}]"
        else:
            expr += f".{part}"
    return expr


def _tp_lines(step: TensorParallel, target: str) -> tuple[str, list[str]]:
    lines = [f'parallelize_module({target}, mesh["{safe.name(step.mesh_axis, "TensorParallel.mesh_axis")}"], {{']
    for path, style in step.plan:
        cls, kwargs = torch_call(style)
        args = []
        for key, value in kwargs:
            if isinstance(value, bool):
                code = repr(safe.boolean(value, f"{cls}.{key}"))
            elif isinstance(value, int):  # SequenceParallel's sequence_dim
                code = repr(safe.integer(value, f"{cls}.{key}"))
            elif isinstance(value, dict):  # keyword argument -> layout
                code = "{" + ", ".join(f"{safe.string_literal(safe.name(k, f'{cls}.{key} keyword'))}: "
                                       f"{layout_code(v)}" for k, v in value.items()) + "}"
            else:
                code = tuple_code([layout_code(v) for v in value]) if isinstance(value, tuple) else layout_code(value)
            args.append(f"{key}={code}")
        path = safe.module_path(path, "a submodule of a TensorParallel plan")
        lines.append(f'{INDENT}{safe.string_literal(path)}: {safe.name(cls, "a tensor-parallel style")}({", ".join(args)}),')
    lines.append("})")
    if step.module == "":  # the root holds the embedding and the head: a tied weight stays one, split alike
        lines = [f"with kept_ties({target}):  # a head tied to the embedding stays one weight (runtime/styles.py)"] + [
            INDENT + line for line in lines]
    return "parallelize", lines


def _recompute_lines(step: Recompute, target: str) -> tuple[str, list[str]]:
    if step.policy == Policy.OFFLOAD:
        return "parallelize", [f"offload_activations({target})"]
    extra = ", context_fn=selective_context" if step.policy == Policy.SELECTIVE else ""
    return "parallelize", [f"{target} = checkpoint_wrapper(",
                           f"{INDENT}{target}, checkpoint_impl=CheckpointImpl.NO_REENTRANT{extra})"]


def _fully_shard_lines(step: FullyShard, target: str) -> tuple[str, list[str]]:
    mesh = ", ".join(f'"{safe.name(a, "FullyShard.mesh_axes entry")}"' for a in step.mesh_axes)
    var = "expert_mesh" if expert.on_expert_mesh(step.mesh_axes) else "mesh"
    reshard = safe.boolean(step.reshard_after_forward, "FullyShard.reshard_after_forward")
    policy = ""
    if step.param_dtype is not None:  # mixed precision: bf16 gathered parameters and compute, fp32 reduction
        param = safe.name(step.param_dtype, "FullyShard.param_dtype")
        reduce = safe.name(step.reduce_dtype or "float32", "FullyShard.reduce_dtype")
        policy = f", mp_policy=MixedPrecisionPolicy(param_dtype=torch.{param}, reduce_dtype=torch.{reduce})"
    return "parallelize", [f"fully_shard({target}, mesh={var}[{mesh}], reshard_after_forward={reshard}{policy})"]


def _autocast_lines(step: Autocast, target: str) -> tuple[str, list[str]]:
    dtype = safe.name(step.dtype, "Autocast.dtype")
    return "parallelize", [f"{target}.forward = torch.autocast(mesh.device_type, dtype=torch.{dtype})({target}.forward)"]


def _ddp_lines(step: DataParallel, target: str) -> tuple[str, list[str]]:
    axis = safe.name(step.mesh_axis, "DataParallel.mesh_axis")
    return "parallelize", [f"{target} = materialized({target}, mesh)  # DDP broadcasts weights: they must be real",
                           f'{target} = DistributedDataParallel({target}, process_group=mesh["{axis}"]'
                           ".get_group(), gradient_as_bucket_view=True)  # gradients live in the buckets"]


def _shard_optimizer_lines(step: ShardOptimizer, target: str) -> tuple[str, list[str]]:
    return "optimizer", [
        "# ZeRO-1: each dp rank keeps the AdamW state of its share of the parameters",
        "optimizer = ZeroRedundancyOptimizer(",
        f'{INDENT}model.parameters(), optimizer_class=torch.optim.AdamW, '
        f'process_group=mesh["{safe.name(step.mesh_axis, "ShardOptimizer.mesh_axis")}"].get_group(), lr=args.lr)']


def _mesh_lines(step: BuildMesh, target: str) -> tuple[str, list[str]]:
    sizes = tuple_code([str(safe.integer(n, f"BuildMesh size of {a!r}")) for a, n in step.dims])
    names = tuple_code([f'"{safe.name(a, "BuildMesh axis")}"' for a, _ in step.dims])
    return "mesh", [f"mesh = init_device_mesh(device.type, {sizes}, mesh_dim_names={names})"]


EMITTERS: dict[type, Callable[..., tuple[str, list[str]]]] = {
    BuildMesh: _mesh_lines, TensorParallel: _tp_lines, Recompute: _recompute_lines,
    FullyShard: _fully_shard_lines, DataParallel: _ddp_lines, ShardOptimizer: _shard_optimizer_lines,
    ExpertMesh: expert.expert_mesh_lines, ExpertParallel: expert.expert_parallel_lines,
    SplitPipeline: pipeline_emit.split_pipeline_lines,
    FlattenMesh: context.flatten_mesh_lines, ContextParallel: context.context_parallel_lines,
    FuseKernel: fused.fuse_kernel_lines, Autocast: _autocast_lines,
}


def _comment(step: Step) -> str:
    """Why the group of steps is there, as the comment above it."""
    expert_comment = expert.comment(step) or context.comment(step) or fused.comment(step)
    if expert_comment is not None:
        return expert_comment
    if isinstance(step, TensorParallel):
        where = {"": "the embedding, final norm and output head", "embed": "the embedding", "norm": "the final norm",
                 "output": "the output head"}.get(step.module, "each block")
        sp = any(str(s.kind) == "sequence_parallel" for _, s in step.plan)
        return f"# tensor parallelism{' with sequence parallelism' if sp else ''} over tp: {where}"
    if isinstance(step, Recompute):
        if step.policy == Policy.FULL:
            return "# activation checkpointing: recompute the whole block in backward, keep only its input"
        if step.policy == Policy.OFFLOAD:
            return "# activation offloading: what the block saves for its backward waits in pinned host memory"
        return "# selective activation checkpointing: recompute the attention core, keep the projections"
    if isinstance(step, FullyShard):
        if step.module == "":
            return ("# the root last: it takes the embedding, final norm and output head, and keeps them gathered "
                    "(backward needs them first)")
        if len(step.mesh_axes) == 2:
            return (f"# FSDP2 on a 2-D mesh {step.mesh_axes} (HSDP): replicate over the first axis, shard over the "
                    "second;\n# with a shard group of 1 this is plain data parallelism (all-reduced gradients)")
        if step.reshard_after_forward:
            return ("# ZeRO-3 (FSDP): shard parameters, gradients and optimizer state over dp; gather each block's "
                    "parameters for its forward and again for its backward")
        return ("# ZeRO-2: shard gradients and optimizer state over dp; keep each block's gathered parameters from "
                "forward to backward")
    if isinstance(step, DataParallel):
        return "# plain data parallelism over dp: replicated parameters, gradients all-reduced"
    if isinstance(step, Autocast):
        return (f"# mixed precision: compute in {safe.shown(step.dtype)} on fp32 parameters (the master weights); "
                "gradients stay fp32")
    return ""


def _layer_template(step: Step) -> tuple[Step, int] | None:
    """The step with its layer index replaced by ``{i}``, and the index; None if not per layer."""
    match = _LAYER.match(getattr(step, "module", None) or "")
    if match is None:
        return None
    return dataclasses.replace(step, module="layers.{i}" + match.group(2)), int(match.group(1))


def group_steps(steps: tuple[Step, ...]) -> list[tuple[Step, tuple[int, ...] | None]]:
    """Runs of consecutive steps that differ only in the layer index become one (template, indices)."""
    groups: list[tuple[Step, tuple[int, ...] | None]] = []
    for step in steps:
        templ = _layer_template(step)
        if templ and groups and groups[-1][1] is not None and groups[-1][0] == templ[0]:
            groups[-1] = (templ[0], groups[-1][1] + (templ[1],))
        elif templ:
            groups.append((templ[0], (templ[1],)))
        else:
            groups.append((step, None))
    return groups


def _loop_header(indices: tuple[int, ...]) -> str:
    contiguous = indices == tuple(range(indices[0], indices[-1] + 1))
    if contiguous:
        return f"for i in range({indices[0]}, {indices[-1] + 1}):" if indices[0] else f"for i in range({len(indices)}):"
    return f"for i in {tuple(safe.integer(i, 'a layer index') for i in indices)}:"


def render_sections(program: Program) -> dict[str, list[str]]:
    """The lines of each section, loops over layers included, with a comment per group."""
    sections: dict[str, list[str]] = {"mesh": [], "parallelize": [], "optimizer": [], "pipeline": []}
    pipelined = any(isinstance(s, SplitPipeline) for s in program.steps)
    for step, indices in group_steps(program.steps):
        target = module_expr(getattr(step, "module", ""))
        section, lines = EMITTERS[type(step)](step, target)
        comment = _comment(step)
        out = sections[section]
        if comment:
            out += comment.split("\n")
        if pipelined:  # parallelize() runs on each stage module: only on what the stage holds
            out += pipeline_emit.guarded(step, indices, lines)
        elif indices is not None and len(indices) > 1:
            out.append(_loop_header(indices))
            out += [INDENT + line for line in lines]
        else:
            out += [line.replace("[i]", f"[{indices[0]}]") for line in lines] if indices else lines
    return sections


def _blocks(plan: Plan | Program, program: Program) -> str:
    """The module path of the model's block container, which --compile compiles: the plan's structure;
    a Program alone names it only when pipelined, and a zoo model's is known ("" otherwise: the script
    then refuses --compile)."""
    if isinstance(plan, Plan):
        return structure_of(plan).blocks
    split = next((s for s in program.steps if isinstance(s, SplitPipeline)), None)
    if split is not None:
        return split.blocks
    return LEGACY_ZOO["gpt"]["blocks"] if model_source.kind(program) == "zoo" else ""


def emit_source(plan: Plan | Program, *, name: str | None = None, fuse: bool = False,
                kernels_module: str = "fused_kernels") -> str:
    """A torchrun training script for ``plan`` (or an already lowered Program). With ``fuse`` (or a
    Program with FuseKernel steps) the script imports ``kernels_module`` from its own folder: write
    ``fused.kernels_source(program)`` there as ``<kernels_module>.py`` (``Plan.emit`` does)."""
    program = plan if isinstance(plan, Program) else lower(plan, fuse=fuse)
    blocks = _blocks(plan, program)
    if name is None:
        config = program.config
        name = safe.shown(config["name"]) if config.get("name") else f"a {safe.shown(config.get('family'))} model"
    sections = render_sections(program)
    parts = pipeline_emit.script_parts(program, sections["pipeline"]) if sections["pipeline"] else script
    parts = context.script_parts(program, parts)  # this rank's tokens, under context parallelism
    parts = hybrid.script_parts(program, parts)  # the data rank over dp x dp_shard, under HSDP
    source = assemble(program, sections, name, parts, blocks=blocks, kernels_module=kernels_module)
    return safe.checked_source(source, "<emitted training script>", "the emitted training script")
