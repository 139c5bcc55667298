"""Pipeline parallelism in-process: keep this rank's stages of the model and run them with a
``torch.distributed.pipelining`` schedule.

A stage is the user's own model with the parts other stages hold taken out (``Stage``), and runs the
model's own forward: whatever that forward computes besides its blocks (Hugging Face's rotary tables
and causal mask, a learned position embedding) it computes on every stage, so no model needs to be
rewritten into stages. The split reads only ``SplitPipeline``'s paths (from ``plan.structure``):
the block container, the parts only the first stage holds (token and position embedding) and those
only the last holds (final norm, output head). In a stage holding blocks ``[first, last)``:

    the token embedding, on a later stage   ``EmptyEmbedding``: zeros of the stream's shape, never read;
                                            ``Handoff`` (the activation the previous stage sent) on the
                                            stage that holds block 0 when the first held the embedding alone
    a position embedding, likewise          ``NoPosition``: adds a zero
    blocks before ``first``                 ``Handoff``: hands on the activation the previous stage sent
    block ``last``, on a stage before the last   ``StopBlock``: ends the forward, returning its input
                                            (the final norm, when that stage ends with the final block)
    the final norm and head, likewise       ``Absent`` (never reached)

The stage modules share the user's modules (a block lives in exactly one stage) and copy only the
modules on the way to a replaced part (the root, ``model``, the container), so each stage's
parameters keep the whole model's names (``model.layers.5.self_attn.q_proj.weight``): parameters
compare with a single-process run and checkpoints do not depend on the plan. torchtitan splits
models it wrote to accept missing parts (``pipeline_module_split``); this split takes any model
whose forward passes the residual stream from block to block, and checks that it does.

A head tied to the token embedding (GPT-2, Gemma, Llama 3.2 1B) is one parameter the first and the last
stage both need: each holds it (the first as the embedding, the last as the head, under its own name), as
Megatron-LM holds a tied output layer on its last stage, and ``TiedWeights`` sums the two copies' gradients
after every backward, so that both take the same optimizer step from the same start.

Later steps (TP, recompute, FSDP/DDP) apply to the stage that holds the module they name
(``run_on_stages``). One training step (``run_schedule``): the schedule splits this dp rank's batch
into ``num_microbatches``, runs them through the stages with the loss on the last stage, sums the
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
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from ..codegen import Program, SplitPipeline
from ..codegen.pipeline_lower import SCHEDULE_CLASSES
from ..ir import InvalidPlanError
from .expert import whole_parameters
from .materialize import INIT_ATTR, clean_name


class StageDone(Exception):
    """Raised by ``StopBlock`` to end a stage's forward with the stream as the next stage takes it."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("pipeline stage done")
        self.hidden = hidden


class Absent(nn.Module):
    """Where another pipeline stage holds the part; holds no parameter. Running it is a bug."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"pipeline stage ran {self.path!r}, which another stage holds")


class EmptyEmbedding(Absent):
    """An embedding on a stage after the first: zeros of the shape it would give (``ids.shape + (dim,)``), so
    the model's forward can build what it builds from the embedded sequence (masks, rotary tables); the
    first block this stage holds takes the activation the previous stage sent instead. Its ``weight`` is an empty
    (0, dim) tensor on the stage's device, a buffer outside the state dict, for a forward that reads the table's
    device or dtype (Llama 4's: ``input_ids.to(self.embed_tokens.weight.device)``)."""

    def __init__(self, path: str, embedding: nn.Module) -> None:
        super().__init__(path)
        weight = getattr(embedding, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise InvalidPlanError(f"pipeline parallelism: {path!r} ({type(embedding).__name__}) has no 2-D weight; "
                                   "the split replaces the embeddings on later stages by zeros of their output shape")
        self.dim, self.dtype = int(weight.shape[1]), weight.dtype
        device = "cpu" if weight.is_meta else weight.device
        self.register_buffer("weight", torch.empty(0, self.dim, dtype=weight.dtype, device=device), persistent=False)

    def forward(self, ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.dim, dtype=self.dtype, device=ids.device)


class Handoff(Absent):
    """Hands on the activation the previous stage sent: in place of each block before this stage's first,
    and of the token embedding on a stage that holds block 0 but not the embedding (the first stage held
    the embedding alone, as Megatron's uneven layouts do)."""

    def __init__(self, path: str, stage: "Stage", as_tuple: bool = False) -> None:
        super().__init__(path)
        object.__setattr__(self, "_stage", stage)  # not a submodule: the stage holds this one
        self.as_tuple = as_tuple  # in place of a block that returns (hidden_states, ...) (ModelStructure.block_tuple)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor | tuple[torch.Tensor]:
        return (self._stage.incoming,) if self.as_tuple else self._stage.incoming


class NoPosition(Absent):
    """A position embedding another stage holds: adds nothing (a zero that broadcasts to any stream shape)."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros((), dtype=torch.get_default_dtype())


def _carry_plain_attrs(stand_in: nn.Module, block: nn.Module) -> None:
    """The block's own plain attributes (strings, numbers, booleans, None) on its stand-in: a model's forward may read
    them off every block as it loops (Nemotron-H's ``layer.block_type`` picks each layer's mask)."""
    for key, value in vars(block).items():
        if (not key.startswith("_") and isinstance(value, (str, int, float, bool, type(None)))
                and key not in vars(stand_in) and not hasattr(type(stand_in), key)):
            setattr(stand_in, key, value)


class StopBlock(Absent):
    """The block after this stage's last: ends the stage's forward with the stream it would have taken."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise StageDone(_stream_arg(args, kwargs))


def _stream_arg(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A block's input stream: its first positional argument, or its first tensor keyword argument."""
    return args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)


def _own(node: nn.Module) -> nn.Module:
    """A copy of ``node`` whose module, parameter, buffer and hook tables are its own (their entries shared):
    replacing a child of the copy leaves ``node`` as it was."""
    twin = object.__new__(type(node))
    twin.__dict__.update({k: (v.copy() if isinstance(v, dict) else v) for k, v in node.__dict__.items()})
    return twin


def _put(root: nn.Module, path: str, module: nn.Module, owned: set[int]) -> nn.Module:
    """``root`` (copied on its first change) with the submodule at ``path`` replaced by ``module``; the nodes
    on the way are copied once each (``owned`` holds the copies), every other module is shared."""
    if id(root) not in owned:
        root = _own(root)
        owned.add(id(root))
    node, names = root, path.split(".")
    for part in names[:-1]:
        child = node._modules[part]
        if id(child) not in owned:
            child = _own(child)
            owned.add(id(child))
            node._modules[part] = child
        node = child
    node._modules[names[-1]] = module
    return root


def _get(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _carry_model_attrs(view: nn.Module, model: nn.Module) -> None:
    """Give a module that stands for (part of) ``model`` the model's own init (``INIT_ATTR``) and config (a
    transformers config: ``save_pretrained`` writes its config.json), where the model has them."""
    for attr in (INIT_ATTR, "config"):
        if hasattr(model, attr):
            object.__setattr__(view, attr, getattr(model, attr))


class Stage(nn.Module):
    """Blocks ``[first, last)`` of the model, run through the model's own forward (module docstring).

    Its module tables are those of a copy of the model's root with the other stages' parts replaced, so
    it holds its parameters under the whole model's names. ``forward(x)``: token ids on the first stage,
    the stream from the previous stage on the others; returns the stream for the next stage, or the
    logits on the last."""

    def __init__(self, model: nn.Module, first: int, last: int, *, blocks: str, num_blocks: int,
                 first_parts: tuple[str, ...], last_parts: tuple[str, ...], embeds: bool, projects: bool,
                 seq_factor: int = 1, call_kwargs: dict[str, Any] | None = None, block_tuple: bool = False) -> None:
        super().__init__()
        owned: set[int] = set()
        root = model
        for i in [*range(first), *range(last, num_blocks)]:
            path = f"{blocks}.{i}"
            stand_in = (Handoff(path, self, block_tuple) if i < first else
                        StopBlock(path) if i == last and not projects else Absent(path))
            _carry_plain_attrs(stand_in, model.get_submodule(path))
            root = _put(root, path, stand_in, owned)
        for k, path in enumerate(first_parts if not embeds else ()):  # the token embedding, then positions
            stand_in = (NoPosition(path) if k else Handoff(path, self) if first == 0 else
                        EmptyEmbedding(path, model.get_submodule(path)))
            root = _put(root, path, stand_in, owned)
        for k, path in enumerate(last_parts if not projects else ()):  # the final norm, then the head
            # a stage before the last that ends with the final block stops at the final norm's input
            stand_in = StopBlock(path) if k == 0 and last == num_blocks else Absent(path)
            root = _put(root, path, stand_in, owned)
        object.__setattr__(self, "_root", root)  # the model's forward runs on this copy (not a submodule)
        self._modules, self._parameters, self._buffers = root._modules, root._parameters, root._buffers
        _carry_model_attrs(self, model)  # a meta-built model's init: how to fill what this stage holds
        self.first, self.last, self.embeds, self.projects = first, last, embeds, projects
        # the last stage's copy of a head tied to the embedding, under its own name -> the embedding's name
        self.tied_copies = {} if embeds or not projects else {
            copy: embedding for embedding, copy in tied_across(model, tuple(first_parts), tuple(last_parts))}
        self.parts = (blocks, tuple(first_parts), tuple(last_parts))
        self.seq_factor, self.call_kwargs = seq_factor, dict(call_kwargs or {})
        # under context parallelism, the global positions (1, s / cp) of this rank's tokens, for a model whose
        # forward takes position_ids (runtime.context); None: the model's forward numbers the tokens itself
        self.position_ids: torch.Tensor | None = None
        self.incoming: torch.Tensor | None = None
        if not embeds and first < last:
            block = self.get_submodule(f"{blocks}.{first}")
            block.register_forward_pre_hook(self._check_handoff, with_kwargs=True)

    def _check_handoff(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The first block held takes the activation the previous stage sent, as it is: a model that
        changes what its blocks return on the way to the next block cannot be split between blocks."""
        if self.incoming is None:  # recomputation in backward, after the forward handed off
            return
        got, sent = _stream_arg(args, kwargs), self.incoming
        # FSDP2's pre-forward hands a block its inputs through an autograd function (a view of the same
        # storage), and a learned position embedding another stage holds adds a zero: the same values
        if not isinstance(got, torch.Tensor) or got.shape != sent.shape or (
                got.data_ptr() != sent.data_ptr() and not torch.equal(got, sent)):
            raise InvalidPlanError(
                f"pipeline parallelism: block {self.first} of the model does not take the previous block's output "
                "unchanged (the model's forward transforms it between blocks); plan this model with pp=1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .planned import logits_of

        if self.embeds:
            ids = x
        else:  # the model's forward builds its tables for the whole sequence the stream stands for
            self.incoming = x
            ids = torch.zeros(x.shape[0], x.shape[1] * self.seq_factor, dtype=torch.long, device=x.device)
        kwargs = self.call_kwargs
        if self.position_ids is not None:
            kwargs = {**kwargs, "position_ids": self.position_ids.expand(ids.shape[0], -1)}
        try:
            out = self._root(ids, **kwargs)
        except StageDone as done:
            return done.hidden
        finally:
            self.incoming = None
        if not self.projects:
            raise InvalidPlanError("pipeline parallelism: a stage before the last ran the model's whole forward "
                                   "without reaching the next stage's first block; the model does not run its "
                                   "blocks in order")
        return logits_of(out)


class LocalStages(nn.Module):
    """This rank's stages seen as one module under the whole model's names, for the optimizer,
    checkpoints and inspection. Not callable: the schedule runs the stages."""

    def __init__(self, stages: list[nn.Module]) -> None:
        super().__init__()
        inner = [s.module if isinstance(s, DistributedDataParallel) else s for s in stages]
        owned: set[int] = set()
        root = inner[0]
        for stage in inner[1:]:  # the other stages' parts, into a copy of the first one's tree
            blocks, first_parts, last_parts = stage.parts
            paths = [f"{blocks}.{i}" for i in range(stage.first, stage.last)]
            paths += list(first_parts) * stage.embeds + list(last_parts) * stage.projects
            for path in paths:
                root = _put(root, path, stage.get_submodule(path), owned)
        self._modules, self._parameters, self._buffers = root._modules, root._parameters, root._buffers
        object.__setattr__(self, "_stages", inner)
        _carry_model_attrs(self, inner[0])
        # a tied head's copy this rank holds (``Stage.tied_copies``): counted once by gradient clipping, reported
        # and read from a checkpoint under the embedding's name
        self.tied_copies = {name: first for s in inner for name, first in getattr(s, "tied_copies", {}).items()}

    def _apply(self, fn: Callable, recurse: bool = True) -> "LocalStages":
        """``to_empty``/``to`` go through each stage: a stage FSDP2 shards re-points its sharded
        parameters in its own ``_apply`` (``FSDPModule._apply``), which this view alone would skip."""
        for stage in self._stages:
            stage._apply(fn, recurse)
        return self

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
    tied: TiedWeights  # weights the first and the last stage both hold (a tied head)
    schedule: Any = None

    @property
    def holds_first(self) -> bool:
        return 0 in self.stage_ids


def split_pipeline(step: SplitPipeline, state: Any) -> None:
    """The ``SplitPipeline`` executor: keep this pp rank's stages of ``state.model``."""
    model = state.model
    for path in (step.blocks, *step.first_parts, *step.last_parts):
        if _get(model, path) is None:
            raise InvalidPlanError(f"pipeline parallelism splits the model at {path!r}, but {type(model).__name__} "
                                   "has no such module; plan this model (meshplan reads its structure), or pp=1")
    _check_parts(model, step)
    tied = TiedWeights(model, state.mesh, step.mesh_axis, step.first_parts, step.last_parts)
    pp_rank = state.mesh.get_local_rank(step.mesh_axis)
    ids = tuple(range(pp_rank, len(step.stages), step.pp_size))
    last = len(step.stages) - 1
    modules = [Stage(model, *step.stages[c], **step.stage_parts(), embeds=c == 0, projects=c == last) for c in ids]
    state.pipeline = Pipeline(split=step, stage_ids=ids, modules=modules, group=state.mesh[step.mesh_axis].get_group(),
                              tied=tied)
    state.model = LocalStages(modules)


def held(stage: Stage, layers: Any) -> list[int]:
    """The blocks among ``layers`` that ``stage`` holds (the emitted script's per-block loops)."""
    return [i for i in layers if stage.first <= i < stage.last]


def _check_parts(model: nn.Module, step: SplitPipeline) -> None:
    """Every parameter belongs to a block, an embedding, the final norm or the head, so that exactly one
    stage holds it, or it is a weight the first and the last stage share (``tied_across``); a parameter
    elsewhere (a root-level scale) or shared otherwise (a block's weight reused by the head) is refused by name."""
    parts = [f"{step.blocks}.{i}" for i in range(step.stages[-1][1])]
    stage_of = {p: "first" for p in step.first_parts} | {p: "last" for p in step.last_parts}
    owners: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        part = next((p for p in [*parts, *stage_of] if name.startswith(p + ".")), None)
        if part is None:
            raise InvalidPlanError(f"pipeline parallelism: parameter {name!r} is outside the blocks, embeddings, final "
                                   "norm and head, so no one stage can hold it; plan this model with pp=1")
        other = owners.setdefault(id(param), part)
        if other != part and {stage_of.get(other), stage_of.get(part)} - {"first", "last"}:
            raise InvalidPlanError(f"pipeline parallelism: parameter {name!r} is the same tensor as one in {other!r}, "
                                   "which another stage holds; only the first and the last stage may share a weight "
                                   "(a head tied to the embedding): plan this model with pp=1")


def tied_across(model: nn.Module, first_parts: tuple[str, ...],
                last_parts: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(name on the first stage, name on the last) of each weight both hold: a head tied to the token
    embedding (GPT-2, Gemma, Llama 3.2 1B). Read from the whole model, so every rank finds the same."""
    first: dict[int, str] = {}
    pairs = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if any(name.startswith(p + ".") for p in first_parts):
            first.setdefault(id(param), name)
        elif id(param) in first and any(name.startswith(p + ".") for p in last_parts):
            pairs.append((first[id(param)], name))
    return tuple(pairs)


class TiedWeights:
    """The weights the first and the last pipeline stage both hold (``tied_across``), as Megatron-LM keeps a
    tied output layer: each end stage holds a copy, both start equal (``materialize`` fills the copy from
    the embedding's values), and after every backward the two copies' gradients are summed over the group
    of the two ranks holding them (Megatron's ``_allreduce_word_embedding_grads``), so both take the same
    optimizer step and stay the one weight a single process trains. A rank holding neither end stage, or
    a model with no such weight, does nothing. Built on every rank (the groups are created collectively).
    Which names this rank holds as copies, ``LocalStages.tied_copies`` says."""

    def __init__(self, model: nn.Module, mesh: Any, axis: str, first_parts: tuple[str, ...],
                 last_parts: tuple[str, ...]) -> None:
        self.pairs = tied_across(model, tuple(first_parts), tuple(last_parts))
        self.group: dist.ProcessGroup | None = None
        if self.pairs:
            dim = mesh.mesh_dim_names.index(axis)
            ranks = mesh.mesh.movedim(dim, -1).reshape(-1, mesh.mesh.shape[dim])
            # one group per pp line: the ranks of its first and last stage (stage c runs on pp rank c % pp)
            self.group, _ = dist.new_subgroups_by_enumeration([[int(r[0]), int(r[-1])] for r in ranks])

    def all_reduce_grads(self, local: nn.Module) -> None:
        """Sum each tied weight's gradient over its two copies (a collective of the end-stage ranks)."""
        if self.group is None:
            return
        params = {clean_name(n): p for n, p in local.named_parameters()}
        for first, last in self.pairs:
            param = params.get(first, params.get(last))
            if param is None:  # this rank holds neither end stage
                continue
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad = param.grad
            if isinstance(grad, DTensor) and grad.placements != param.placements:
                # a vocab-parallel embedding's backward can leave its gradient Replicate where the weight is Shard(0):
                # the two copies' local shards must be the same rows to be summed
                grad = param.grad = grad.redistribute(param.device_mesh, param.placements)
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.group)


def holds(module: nn.Module, path: str) -> bool:
    """Whether ``module`` (a stage) holds the submodule at ``path`` (``""``: itself): present, and neither a
    stand-in for another stage's part nor a module with one inside (the zoo's ``embed``, whose token table
    another stage holds)."""
    found = _get(module, path)
    if found is None or isinstance(found, Absent):
        return False
    return path == "" or not any(isinstance(m, Absent) for m in found.modules())


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
    stages' shards (over dp and tp, experts over ep), then the pp ranks exchange their stages. A collective.
    A tied head's copy on the last stage is reported under the embedding's name, as the one-process model
    names the weight (the last pp rank's entry is the one kept)."""
    own = {}
    for name, full in whole_parameters(local):  # a stage's experts gathered over its ep group
        name = clean_name(name)
        own[getattr(local, "tied_copies", {}).get(name, name)] = full
    parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(pipe.group)
    dist.all_gather_object(parts, own, group=pipe.group)
    return {name: tensor for part in parts for name, tensor in part.items()}
