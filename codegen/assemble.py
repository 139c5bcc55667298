"""Put an emitted script together: header, only the imports its steps use, constants, functions, loop."""
from __future__ import annotations

from types import ModuleType

from .program import (DataParallel, ExpertMesh, ExpertParallel, FullyShard, Policy, Program, Recompute,
                      ShardOptimizer, SplitPipeline, TensorParallel)
from . import fused, model_source, options, safe
from .context import imports as context_imports
from .pipeline_emit import schedule_import as pipeline_schedule_import
from .tp_plans import MESHPLAN_STYLES, torch_call

INDENT = "    "


def imports(program: Program, kernels_module: str = "fused_kernels") -> list[str]:
    """The import lines the program's steps need, stdlib first, then torch, then meshplan."""
    kinds = {type(s) for s in program.steps}
    stdlib = ["argparse", "os", "statistics", "time"]
    if DataParallel in kinds and _accumulates_locally(program):
        stdlib.append("contextlib")
    if fused.kernels_used(program):
        stdlib.append("sys")
    lines = [f"import {m}" for m in sorted(stdlib)] + ["", "import torch", "import torch.distributed as dist"]
    if any(isinstance(s, Recompute) and s.policy != Policy.OFFLOAD for s in program.steps):
        lines.append("from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, "
                     "checkpoint_wrapper")
    mesh_names = "DeviceMesh, init_device_mesh" if ExpertMesh in kinds else "init_device_mesh"
    lines.append(f"from torch.distributed.device_mesh import {mesh_names}")
    if FullyShard in kinds:
        mixed = any(isinstance(s, FullyShard) and s.param_dtype is not None for s in program.steps)
        lines.append(f"from torch.distributed.fsdp import {'MixedPrecisionPolicy, ' if mixed else ''}fully_shard")
    if ShardOptimizer in kinds:
        lines.append("from torch.distributed.optim import ZeroRedundancyOptimizer")
    lines += pipeline_schedule_import(program)
    lines += _tp_imports(program)
    if DataParallel in kinds:
        lines.append("from torch.nn.parallel import DistributedDataParallel")
    if any(isinstance(s, Recompute) and s.policy == Policy.SELECTIVE for s in program.steps):
        lines.append("from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts")
    lines += model_source.imports(program)  # what builds the model: the zoo, transformers or the user's builder
    lines += options.imports(program)  # --clip-grad, --compile, --init-from: the runtime's own functions
    if any(isinstance(s, Recompute) and s.policy == Policy.OFFLOAD for s in program.steps):
        lines.append("from meshplan.runtime.offload import offload_activations")  # torch's save_on_cpu, less params
    if ExpertParallel in kinds:  # PyTorch has no ready-made MoE dispatch (all_to_all_single of token slots)
        lines.append("from meshplan.runtime.expert import shard_experts")
    lines += context_imports(program)  # all-gather attention: torch's context_parallel has no CPU kernel rule
    lines += fused.imports(program, kernels_module)  # generated kernels (FuseKernel steps)
    return lines


def _tp_imports(program: Program) -> list[str]:
    classes, placements = set(), set()
    for step in program.steps:
        if not isinstance(step, TensorParallel):
            continue
        for _, style in step.plan:
            cls, kwargs = torch_call(style)
            classes.add(cls)
            for _, value in kwargs:
                if isinstance(value, (bool, int)):
                    continue
                layouts = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else (value,)
                for layout in layouts:
                    placements.add("Replicate" if layout == "R" else "Shard")
    if not classes:
        return []
    names = sorted(classes - set(MESHPLAN_STYLES)) + ["parallelize_module"]
    root = any(isinstance(step, TensorParallel) and step.module == "" for step in program.steps)
    own = sorted(classes & set(MESHPLAN_STYLES)) + (["kept_ties"] if root else [])
    return ([f"from torch.distributed.tensor import {', '.join(sorted(placements))}"] if placements else []) + [
            "from torch.distributed.tensor.parallel import (",
            *_wrap(names, INDENT), ")"] + ([f"from meshplan.runtime.styles import {', '.join(own)}"] if own else [])


def _wrap(items: list[str], pad: str, width: int = 100) -> list[str]:
    """``items`` joined by commas over as many lines as ``width`` needs."""
    lines, line = [], pad
    for item in items:
        if len(line) + len(item) + 2 > width and line.strip():
            lines.append(line.rstrip())
            line = pad
        line += f"{item}, "
    return lines + [line.rstrip()]


def config_code(config: dict) -> str:
    """The model config as a dict literal, wrapped at 100 columns: keys and values are plan data, so
    each prints as a Python literal (``safe.literal``), never inside hand-written quotes."""
    items = [f"{safe.literal(k, 'a key of plan.model')}: {safe.literal(v, f'plan.model[{k!r}]')}"
             for k, v in config.items()]
    return "{\n" + "\n".join(_wrap(items, INDENT)) + "\n}"


def _accumulates_locally(program: Program) -> bool:
    """Gradients are reduced only after the last micro-batch (plain DP with several micro-batches)."""
    return program.num_microbatches > 1 and not program.sync_every_microbatch and program.dp_size > 1


def micro_step(program: Program, fwd_bwd: list[str]) -> list[str]:
    """The body of the micro-batch loop, with the gradient-sync control plain DP needs."""
    pad = INDENT * 3
    if not _accumulates_locally(program):
        return [pad + line for line in fwd_bwd]
    if any(isinstance(s, DataParallel) for s in program.steps):
        return [pad + "# accumulate gradients locally; all-reduce once, after the last micro-batch",
                pad + "sync = contextlib.nullcontext() if mb == NUM_MICROBATCHES - 1 else model.no_sync()",
                pad + "with sync:"] + [pad + INDENT + line for line in fwd_bwd]
    return [pad + "# accumulate gradients locally; all-reduce once, after the last micro-batch",
            pad + "model.set_requires_gradient_sync(mb == NUM_MICROBATCHES - 1)"] + [pad + line for line in fwd_bwd]


def _parallelize_function(lines: list[str]) -> str:
    body = [INDENT + line if line else "" for line in lines] or [INDENT + "pass  # one process: nothing to split"]
    return ("\n\ndef parallelize(model: torch.nn.Module, mesh) -> torch.nn.Module:\n"
            f'{INDENT}"""The plan\'s steps in order: tensor parallelism, activation checkpointing, then data '
            'parallelism."""\n' + "\n".join(body) + f"\n{INDENT}return model\n")


def _model_block(program: Program, parts: ModuleType) -> str:
    """Build the model from the plan's source (``model_source``), then parallelize it."""
    if model_source.kind(program) == "zoo" or any(isinstance(s, SplitPipeline) for s in program.steps):
        return parts.MAIN_MODEL.rstrip("\n").lstrip("\n")  # the pipeline's builds the stages too
    lines = ["torch.manual_seed(args.seed)  # every rank builds the same initial weights",
             *model_source.build_lines(program), "model = materialized(parallelize(model, mesh), mesh)"
             if model_source.on_meta(program) else "model = parallelize(model, mesh)"]
    return "\n".join(INDENT + line for line in lines)


def assemble(program: Program, sections: dict[str, list[str]], name: str, parts: ModuleType, *, blocks: str,
             kernels_module: str = "fused_kernels") -> str:
    """The whole script; ``parts`` is the ``codegen.script`` module of text templates, ``blocks`` the
    module path of the model's block container (what --compile compiles; "" if it has none)."""
    # the docstring carries plan text: escaped so that no quote, backslash or newline in it ends the docstring
    header = parts.HEADER.format(name=safe.doc_text(name), summary=safe.doc_text(program.plan_summary),
                                 world_size=safe.integer(program.mesh.world_size, "the mesh's world size"),
                                 header="\n".join(safe.doc_text(line) for line in program.header))
    config = config_code(program.config)
    numbers = {key: safe.integer(getattr(program, key), f"Program.{key}") for key in (
        "global_batch", "seq_len", "dp_size", "num_microbatches", "micro_batch_size")}
    model_source.check_emittable(program)
    text = [header, "\n".join(imports(program, kernels_module)), parts.CONSTANTS.format(config=config, **numbers)]
    text += model_source.constants(program) + options.constants(blocks)
    save_ops = {safe.op_name(op, "Recompute.save_ops entry") for s in program.steps if isinstance(s, Recompute)
                for op in s.save_ops}
    if save_ops:
        text.append(parts.SELECTIVE.format(ops="\n".join(f"{INDENT}torch.ops.{op}," for op in sorted(save_ops))))
    text += fused.definitions(program)  # the fused subclasses FuseKernel steps swap in
    option_args = "\n".join(INDENT + line for line in options.ARGS)
    option_checks = "\n".join(INDENT + line for line in options.check_lines(program, blocks))
    text += [_parallelize_function(sections["parallelize"]), parts.DATA,
             parts.MAIN_START.format(option_args=option_args, option_checks=option_checks)]
    main = [INDENT + line for line in sections["mesh"]] + [_model_block(program, parts)]
    if options.takes_init_from(program):
        main += [INDENT + line for line in options.INIT_FROM]
    optimizer = sections["optimizer"] or ["optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)"]
    main += [INDENT + line for line in optimizer]
    text.append("\n".join(main))
    forward = parts.FORWARD_BACKWARD if model_source.kind(program) == "zoo" else [
        model_source.loss_line(program), "loss.backward()"]
    text.append(parts.LOOP.format(micro_step="\n".join(micro_step(program, forward))).rstrip("\n"))
    return "".join(t if t.endswith("\n") else t + "\n" for t in text)
