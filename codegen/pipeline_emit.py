"""Printing pipelined Programs: the ``SplitPipeline`` lines, guards for what a stage may not hold,
and the script parts (model setup, training loop) that differ from ``script.py``.

The emitted script builds the model as the plan's source says (on meta for zoo and Hugging Face
models), keeps this pp rank's stages as ``meshplan.runtime.pipeline.Stage``s (the class ``plan.apply``
runs: the user's own model with the other stages' parts taken out, under the whole model's names),
runs ``parallelize`` on each, materializes this rank's shards, wraps the stages in ``PipelineStage``s
and trains through the plan's ``torch.distributed.pipelining`` schedule. Per-block steps loop over
``held(model, blocks)``, the blocks this stage holds; steps on the embedding, final norm or output head
run only on the stage that holds them (``holds``).
"""
from __future__ import annotations

from types import SimpleNamespace

from . import safe, script
from .pipeline_lower import SCHEDULE_CLASSES
from .program import Program, SplitPipeline, Step

INDENT = "    "


def split_pipeline_lines(step: SplitPipeline, target: str) -> tuple[str, list[str]]:
    """Stage modules, ``PipelineStage``s and the schedule: the "pipeline" section of ``main``."""
    cls, takes_list = SCHEDULE_CLASSES[step.schedule]  # a Schedule: SplitPipeline checks it
    cls = safe.name(cls, "the pipeline schedule class")
    stage_arg = "stages" if takes_list else "stages[0]"  # GPipe and 1F1B run one stage per rank
    stages = ", ".join(f"({safe.integer(a, 'a stage bound')}, {safe.integer(b, 'a stage bound')})"
                       for a, b in step.stages)
    axis, pp_size = safe.name(step.mesh_axis, "SplitPipeline.mesh_axis"), safe.integer(step.pp_size, "pp size")
    parts = safe.literal(step.stage_parts(), "the pipeline split's module paths")
    return "pipeline", [
        f"# pipeline parallelism over pp ({safe.shown(step.schedule)}): stage c holds blocks [first, last) of",
        f"# stage_layers[c] and runs on pp rank c % {pp_size}; every rank keeps only its stages' modules",
        f"stage_layers = ({stages})",
        f"stage_parts = {parts}  # where the blocks, embeddings, final norm and head are",
        f'pp_rank, pp_group = mesh.get_local_rank("{axis}"), mesh["{axis}"].get_group()',
        f"stage_ids = range(pp_rank, len(stage_layers), {pp_size})",
        "last_stage = len(stage_layers) - 1  # the first or last stage may hold only the embedding or the head",
        "# a head tied to the embedding: the first and the last stage each hold a copy, whose gradients are summed",
        f'tied = TiedWeights(model, mesh, "{axis}", stage_parts["first_parts"], stage_parts["last_parts"])',
        "stage_modules = [parallelize(Stage(model, *stage_layers[c], embeds=c == 0, projects=c == last_stage,",
        f"{INDENT * 8}**stage_parts), mesh) for c in stage_ids]",
        "model = materialized(LocalStages(stage_modules), mesh)  # this rank's parameters, under the model's names",
        "stages = [PipelineStage(module, c, len(stage_layers), device, group=pp_group)",
        f"{INDENT}{INDENT}  for c, module in zip(stage_ids, stage_modules)]",
        "# the loss runs on the last stage; the schedule scales gradients by 1 / NUM_MICROBATCHES",
        f"schedule = {cls}(",
        f"{INDENT}{stage_arg}, n_microbatches=NUM_MICROBATCHES, loss_fn=token_cross_entropy)",
    ]


def guarded(step: Step, indices: tuple[int, ...] | None, lines: list[str]) -> list[str]:
    """``lines`` of one step group, run only where this stage holds the module they name."""
    module = safe.module_path(getattr(step, "module", ""), "a step's module path")
    if indices is not None:
        indices = tuple(safe.integer(i, "a layer index") for i in indices)
        contiguous = len(indices) > 1 and indices == tuple(range(indices[0], indices[-1] + 1))
        layers = str(indices) if not contiguous else f"range({indices[-1] + 1})" if indices[0] == 0 else (
            f"range({indices[0]}, {indices[-1] + 1})")
        return [f"for i in held(model, {layers}):"] + [INDENT + line for line in lines]
    if module and not isinstance(step, SplitPipeline):
        return [f'if holds(model, "{module}"):  # only the stage that holds it'] + [INDENT + line for line in lines]
    return lines


MAIN_MODEL = '''
    torch.manual_seed(args.seed)  # every rank builds the same initial weights, then keeps its stages
{build}
{pipeline}
'''

LOOP = '''
    dp_rank, dp_group = mesh.get_local_rank("dp"), mesh["dp"].get_group()
    times = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        inputs, targets = get_batch(step, args.seed, dp_rank, data)
        losses = []  # filled on the last stage: one loss per micro-batch
        first_stage_inputs = (inputs.to(device),) if 0 in stage_ids else ()
        # return_outputs=False: the last stage keeps no logits of past micro-batches for a merged output
        schedule.step(*first_stage_inputs, target=targets.to(device), losses=losses, return_outputs=False)
        tied.all_reduce_grads(model)  # the tied head's two copies take one gradient (nothing if none is tied)
        if args.clip_grad is not None:  # the global norm: every stage's gradients add over pp (a tied copy once)
            clip_grad_norm_(model, args.clip_grad, pp_group)
        optimizer.step()
        optimizer.zero_grad()
        loss_sum = torch.zeros((), device=device)
        for loss in losses:
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum, group=pp_group)  # the last stage's losses, to every stage
        loss_sum /= NUM_MICROBATCHES
        dist.all_reduce(loss_sum, group=dp_group)  # the global mean loss: average over the dp ranks
''' + script.LOOP_END


def script_parts(program: Program, pipeline_lines: list[str]) -> SimpleNamespace:
    """``codegen.script``'s templates with the pipelined model setup and training loop."""
    from .model_source import build_lines

    parts = SimpleNamespace(**{name: getattr(script, name) for name in dir(script) if name.isupper()})
    parts.MAIN_MODEL = MAIN_MODEL.format(build="\n".join(INDENT + line for line in build_lines(program)),
                                         pipeline="\n".join(INDENT + line for line in pipeline_lines))
    parts.LOOP = LOOP
    return parts


def schedule_import(program: Program) -> list[str]:
    """The ``torch.distributed.pipelining`` import line a pipelined program needs."""
    split = next((s for s in program.steps if isinstance(s, SplitPipeline)), None)
    if split is None:
        return []
    cls = safe.name(SCHEDULE_CLASSES[split.schedule][0], "the pipeline schedule class")
    return [f"from torch.distributed.pipelining import PipelineStage, {cls}", "",
            "from meshplan.runtime.pipeline import LocalStages, Stage, TiedWeights, held, holds"]
