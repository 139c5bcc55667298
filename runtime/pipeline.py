"""Pipeline parallelism in-process: keep this rank's stages of the model and run them with a
``torch.distributed.pipelining`` schedule.

Every rank builds the whole model from the same seed; ``SplitPipeline`` then keeps the stages of
this pp rank (stage ``c`` on rank ``c % pp``), as torchtitan's ``pipeline_module_split`` does. A
``StageModule`` runs ``embed? -> layers[first:last] -> norm? / output?`` and keeps the whole
model's parameter names (``layers.5.attn.wq.weight``), so parameters compare with a single-process
run and checkpoints do not depend on the plan. Later steps (TP, recompute, FSDP/DDP) apply to the
stage that holds the module they name (``run_on_stages``).

One training step (``run_schedule``): the schedule splits this dp rank's batch into
``num_microbatches``, runs them through the stages with the loss on the last stage, sums the
micro-batch losses' gradients and scales them by ``1 / num_microbatches`` (``scale_grads``): the
gradient of the mean loss over the rank's batch, as the plain loop's ``loss / n`` gives.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.nn.parallel import DistributedDataParallel

from ..codegen import Program, SplitPipeline
from ..codegen.pipeline_lower import SCHEDULE_CLASSES
from ..ir import InvalidPlanError

PARTS = ("embed", "layers", "norm", "output")


class StageLayers(nn.ModuleDict):
    """The blocks a stage holds, under their index in the whole model: ``layers[5]`` stays block 5."""

    def __getitem__(self, index: int | str) -> nn.Module:
        return super().__getitem__(str(index))

    def __setitem__(self, index: int | str, module: nn.Module) -> None:
        super().__setitem__(str(index), module)

    def __contains__(self, index: object) -> bool:
        return super().__contains__(str(index))


class StageModule(nn.Module):
    """Layers ``[first, last)`` of a transformer with ``embed``, ``layers``, ``norm`` and ``output``;
    the first stage also embeds, the last also normalizes and projects. ``None`` where another
    stage holds the part. The modules are the model's own (moved, not copied)."""

    def __init__(self, model: nn.Module, first: int, last: int, *, embeds: bool | None = None,
                 projects: bool | None = None) -> None:
        super().__init__()
        whole = len(model.layers)
        # a first or last chunk may hold no layer (the embedding or the head alone; solver/stages.py),
        # so [0, 0) then [0, 1) must not both embed: the split says which chunk is first and last
        embeds = first == 0 if embeds is None else embeds
        projects = last == whole if projects is None else projects
        self.embed = model.embed if embeds else None
        self.layers = StageLayers({str(i): model.layers[i] for i in range(first, last)})
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


class LocalStages(nn.Module):
    """This rank's stages seen as one module under the whole model's names, for the optimizer,
    checkpoints and inspection. Not callable: the schedule runs the stages."""

    def __init__(self, stages: list[nn.Module]) -> None:
        super().__init__()
        self.layers = StageLayers()
        for stage in stages:
            inner = stage.module if isinstance(stage, DistributedDataParallel) else stage
            for name in ("embed", "norm", "output"):
                if getattr(inner, name) is not None:
                    setattr(self, name, getattr(inner, name))
            self.layers.update(inner.layers)

    def forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a pipelined model runs through its schedule: call PlannedModule.step, "
                           "not the module (this rank holds only its stages)")


@dataclass
class Pipeline:
    """This rank's share of the pipeline: its stage indices and modules, the pp group, the schedule."""

    split: SplitPipeline
    stage_ids: tuple[int, ...]
    modules: list[nn.Module]  # one per stage id, as the later steps wrapped it
    group: dist.ProcessGroup
    schedule: Any = None

    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_ids


def split_pipeline(step: SplitPipeline, state: Any) -> None:
    """The ``SplitPipeline`` executor: keep this pp rank's stages of ``state.model``."""
    missing = [name for name in PARTS if not hasattr(state.model, name)]
    if missing:
        raise InvalidPlanError(f"pipeline parallelism splits a model with {PARTS} attributes, but "
                               f"{type(state.model).__name__} lacks {missing}; build it from plan.model")
    pp_rank = state.mesh.get_local_rank(step.mesh_axis)
    ids = tuple(range(pp_rank, len(step.stages), step.pp_size))
    last = len(step.stages) - 1
    modules = [StageModule(state.model, *step.stages[c], embeds=c == 0, projects=c == last) for c in ids]
    state.pipeline = Pipeline(split=step, stage_ids=ids, modules=modules, group=state.mesh[step.mesh_axis].get_group())
    state.model = LocalStages(modules)


def holds(module: nn.Module, path: str) -> bool:
    """Whether ``module`` (a stage) holds the submodule at ``path`` (``""``: itself)."""
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def run_on_stages(step: Any, state: Any, executor: Callable[[Any, Any], None]) -> None:
    """Run a step that names a module of the whole model on each local stage that holds it (the
    root, ``""``, is every stage); a rank that holds none skips it."""
    pipe: Pipeline = state.pipeline
    for i, module in enumerate(pipe.modules):
        if not holds(module, step.module):
            continue
        sub = dataclasses.replace(state, model=module, pipeline=None)
        executor(step, sub)
        pipe.modules[i] = sub.model  # a wrapper (checkpoint, DDP) may have replaced it
        state.ddp = state.ddp or sub.ddp
    state.model = LocalStages(pipe.modules)


def build_schedule(pipe: Pipeline, program: Program, device: torch.device, loss_fn: Callable) -> None:
    """One ``PipelineStage`` per local stage module, and the plan's schedule over them.

    ``loss_fn`` averages over a micro-batch's tokens; the schedule sums micro-batches and, with
    ``scale_grads`` (its default), divides the gradients by their number: the mean over the batch.
    """
    count = len(pipe.split.stages)
    stages = [pipelining.PipelineStage(module, c, count, device, group=pipe.group)
              for c, module in zip(pipe.stage_ids, pipe.modules)]
    name, takes_list = SCHEDULE_CLASSES[pipe.split.schedule]
    schedule_class = getattr(pipelining, name)
    pipe.schedule = schedule_class(stages if takes_list else stages[0], n_microbatches=program.num_microbatches,
                                   loss_fn=loss_fn)


def run_schedule(pipe: Pipeline, inputs: torch.Tensor, targets: torch.Tensor, n: int,
                 device: torch.device) -> torch.Tensor:
    """Forward and backward of this dp rank's batch through the pipeline; returns the mean loss over
    the batch on every rank of the pp group (only the last stage computes it)."""
    losses: list[torch.Tensor] = []
    args = (inputs.to(device),) if pipe.holds_first else ()  # later stages receive activations
    # return_outputs=False: the last stage keeps no logits of past micro-batches for a merged output
    pipe.schedule.step(*args, target=targets.to(device), losses=losses, return_outputs=False)
    loss_sum = torch.zeros((), device=device)
    for loss in losses:
        loss_sum += loss.detach()
    dist.all_reduce(loss_sum, group=pipe.group)  # the last stage's sum; zeros from the others
    return loss_sum / n


def full_parameters(local: nn.Module, pipe: Pipeline) -> dict[str, torch.Tensor]:
    """Every parameter of the whole model as a whole tensor, on every rank: each rank gathers its
    stages' shards (over dp and tp), then the pp ranks exchange their stages. A collective."""
    own = {}
    for name, param in local.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        own[name.replace("_checkpoint_wrapped_module.", "")] = full.detach().cpu()
    parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(pipe.group)
    dist.all_gather_object(parts, own, group=pipe.group)
    return {name: tensor for part in parts for name, tensor in part.items()}
