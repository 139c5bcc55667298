"""Printing pipelined Programs: the ``SplitPipeline`` lines, guards for what a stage may not hold,
and the script parts (stage module, model setup, training loop) that differ from ``script.py``.

The emitted script builds the whole model on every rank, keeps this pp rank's stages as
``StageModule``s (the same class as ``meshplan.runtime.pipeline.StageModule``), runs
``parallelize`` on each of them, wraps them in ``PipelineStage``s and trains through the plan's
``torch.distributed.pipelining`` schedule. Per-layer steps loop over ``held(model, layers)``, the
layers this stage holds; steps on the embedding, final norm or output head run only on the stage
that has them.
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
    return "pipeline", [
        f"# pipeline parallelism over pp ({safe.shown(step.schedule)}): stage c holds layers [first, last) of",
        f"# stage_layers[c] and runs on pp rank c % {pp_size}; every rank keeps only its stages' modules",
        f"stage_layers = ({stages})",
        f'pp_rank, pp_group = mesh.get_local_rank("{axis}"), mesh["{axis}"].get_group()',
        f"stage_ids = range(pp_rank, len(stage_layers), {pp_size})",
        "last_stage = len(stage_layers) - 1  # the first or last stage may hold only the embedding or the head",
        "stage_modules = [parallelize(StageModule(model, *stage_layers[c], embeds=c == 0, projects=c == last_stage),",
        f"{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}{INDENT}     mesh) for c in stage_ids]",
        "stages = [PipelineStage(module, c, len(stage_layers), device, group=pp_group)",
        f"{INDENT}{INDENT}  for c, module in zip(stage_ids, stage_modules)]",
        "# the loss runs on the last stage; the schedule scales gradients by 1 / NUM_MICROBATCHES",
        f"schedule = {cls}(",
        f"{INDENT}{stage_arg}, n_microbatches=NUM_MICROBATCHES, loss_fn=meshplan.zoo.loss_fn)",
        "model = torch.nn.ModuleList(stage_modules)  # this rank's parameters, for the optimizer",
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
    top = module.partition(".")[0]
    if top and not isinstance(step, SplitPipeline):
        safe.name(top, "the top-level module of a step under pipeline parallelism")
        return [f"if model.{top} is not None:  # only the {_WHERE.get(top, 'stage that holds it')}"] + [
            INDENT + line for line in lines]
    return lines


_WHERE = {"embed": "first stage embeds", "norm": "last stage normalizes", "output": "last stage projects"}

STAGE_MODULE = '''

class StageLayers(torch.nn.ModuleDict):
    """The blocks a pipeline stage holds, under their index in the whole model: layers[5] stays block 5."""

    def __getitem__(self, index):
        return super().__getitem__(str(index))

    def __setitem__(self, index, module):
        super().__setitem__(str(index), module)

    def __contains__(self, index):
        return super().__contains__(str(index))


class StageModule(torch.nn.Module):
    """Layers [first, last) of the model; the first stage also embeds, the last also normalizes and
    projects (a first or last stage may hold no layer: the embedding or the head alone, so say which
    stage it is with embeds/projects). Parameters keep the whole model's names ("layers.5.attn.wq.weight")."""

    def __init__(self, model: torch.nn.Module, first: int, last: int, *, embeds: bool | None = None,
                 projects: bool | None = None) -> None:
        super().__init__()
        whole = len(model.layers)
        embeds = first == 0 if embeds is None else embeds
        projects = last == whole if projects is None else projects
        self.embed = model.embed if embeds else None
        self.layers = StageLayers({{str(i): model.layers[i] for i in range(first, last)}})
        self.norm = model.norm if projects else None
        self.output = model.output if projects else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)  # (b, s) tokens -> (b, s, h)
        for layer in self.layers.values():
            x = layer(x)
        if self.output is not None:
            x = self.output(self.norm(x))  # (b, s, h) -> (b, s, vocab)
        return x


def held(model: StageModule, layers) -> list[int]:
    """The layers among ``layers`` that this pipeline stage holds."""
    return [i for i in layers if i in model.layers]
'''

MAIN_MODEL = '''
    torch.manual_seed(args.seed)  # every rank builds the same initial weights, then keeps its stages
    model = meshplan.zoo.build_from_config(MODEL_CONFIG).to(device)
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
    parts = SimpleNamespace(**{name: getattr(script, name) for name in dir(script) if name.isupper()})
    parts.DATA = STAGE_MODULE.format() + script.DATA
    parts.MAIN_MODEL = MAIN_MODEL.format(pipeline="\n".join(INDENT + line for line in pipeline_lines))
    parts.LOOP = LOOP
    return parts


def schedule_import(program: Program) -> list[str]:
    """The ``torch.distributed.pipelining`` import line a pipelined program needs."""
    split = next((s for s in program.steps if isinstance(s, SplitPipeline)), None)
    if split is None:
        return []
    cls = safe.name(SCHEDULE_CLASSES[split.schedule][0], "the pipeline schedule class")
    return [f"from torch.distributed.pipelining import PipelineStage, {cls}"]
