"""``apply(plan, model) -> PlannedModule``: shard a model in-process as the plan says, and train it.

``PlannedModule.step`` does what the emitted script's loop does, in the same order: each dp rank
takes its slice of the global batch (under context parallelism, each cp rank its tokens of every
sequence: ``runtime.context``), splits it into ``num_microbatches`` micro-batches, backpropagates
``loss / num_microbatches`` for each (gradients accumulate), steps the optimizer, and returns the
global mean loss (a SUM all-reduce over dp (x cp), divided by their number: identical on every rank).

Precision follows ``plan.dtype`` (``codegen.precision``): under bf16 the forward runs in bf16 (FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, and ``torch.autocast`` on the root)
while the parameters, their gradients and the optimizer state stay fp32 (master weights) and gradients
are reduced in fp32; the logits come out in bf16 and the loss is a cross-entropy in fp32 on them
(``token_cross_entropy`` casts first). fp32 plans run in fp32 throughout.

Under tensor parallelism the logits stay sharded over the vocabulary (a ``DTensor``) and the default
loss is vocab-parallel (``runtime.loss``); a ``loss_fn`` of the user's gets them whole.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer

from ..codegen import Program, lower
from ..codegen.model_source import kind as source_kind
from ..ir import InvalidPlanError, Plan
from .checkpoint import load_checkpoint, save_checkpoint
from .context import data_group, sequence_positions, sequence_split
from .distributed import device_for_rank, init_distributed, pg_timeout_s
from .expert import whole_parameters
from .interpret import State, execute
from .loss import on_whole_logits, token_cross_entropy
from .materialize import is_meta
from .pipeline import build_schedule, full_parameters as pipeline_parameters, run_schedule

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def default_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW with lr 1e-3, as the emitted script's default ``--lr``."""
    return torch.optim.AdamW(params, lr=1e-3)


def logits_of(output: object) -> torch.Tensor:
    """The logits of a model's output: a tensor, a Hugging Face ``ModelOutput`` (``.logits``), a dict with
    "logits", or a tuple/list whose first item is the logits."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, dict):
        logits = output.get("logits")
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise InvalidPlanError(f"the model returned {type(output).__name__}, with no logits tensor in it; return the "
                               "logits (a tensor, .logits, or the first item of a tuple), or pass loss_fn= to apply "
                               "that takes this output")
    return logits


def output_cross_entropy(output: object, targets: torch.Tensor) -> torch.Tensor:
    """The default loss: token cross-entropy on the logits of whatever the model returned."""
    return token_cross_entropy(logits_of(output), targets)


class PlannedModule:
    """A model sharded by a plan, with its optimizer and one-call training step.

    ``module`` is the sharded ``nn.Module``, usable in a hand-written loop: take this rank's rows
    (``local_batch``, or slice by ``dp_rank``/``dp_size``), call it, backpropagate, step
    ``optimizer``; gradients are averaged over dp by the wrapper, and ``dp_group`` is there to
    average a loss for printing. ``mesh`` is the DeviceMesh (axes as ``lower(plan).mesh.dims``).
    Under context parallelism a rank also takes only its tokens of each sequence
    (``sequence.take``, which ``local_batch`` applies), gradients are averaged over dp x cp, and a
    loss is averaged over ``loss_group`` (dp x cp; ``dp_group`` otherwise).
    Under pipeline parallelism ``module`` holds this rank's stages under the whole model's names (for
    the optimizer and checkpoints; not callable) and ``pipeline`` its stages and schedule: train with
    ``step``, which runs the micro-batches through the schedule.
    """

    def __init__(self, program: Program, state: State, optimizer: torch.optim.Optimizer, loss_fn: LossFn) -> None:
        self.program = program
        self.module: nn.Module = state.model
        self.mesh = state.mesh
        self.device = state.device
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.dp_size: int = self.mesh[program.dp_axis].size()  # the full data-parallel size (HSDP: dp x dp_shard)
        self.dp_rank: int = self.mesh[program.dp_axis].get_local_rank()
        self.dp_group = self.mesh[program.dp_axis].get_group()
        self.sequence = sequence_split(program, self.mesh)  # this rank's tokens of each sequence (cp)
        self.loss_group, self.loss_ranks = data_group(program, self.mesh)  # the ranks that see other tokens
        self._ddp = state.ddp
        self._source_kind = source_kind(program)  # zoo, hf, builder or module (codegen.model_source)
        self.pipeline = state.pipeline  # runtime.pipeline.Pipeline under pipeline parallelism, else None
        if self.pipeline is not None:
            if self.sequence.cp_size > 1 and self._source_kind != "zoo":  # each stage's forward: global positions
                q = self.sequence
                positions = sequence_positions(program.seq_len, q.cp_size, q.cp_rank, q.load_balance, self.device)
                for stage in self.pipeline.modules:
                    stage.position_ids = positions[None]
            build_schedule(self.pipeline, program, self.device, loss_fn)
        self.steps_done = 0  # optimizer steps taken by step() or restored by load(): the data position

    def local_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of a global batch (the same tensors on every rank): its dp rank's contiguous
        rows and, under context parallelism, its tokens of each sequence (targets cut alike)."""
        batch, parts = inputs.shape[0], self.dp_size * self.program.num_microbatches
        if batch % parts:
            raise InvalidPlanError(
                f"a global batch of {batch} does not split over dp({self.dp_size}) * "
                f"num_microbatches({self.program.num_microbatches}) = {parts}: {batch} % {parts} = "
                f"{batch % parts}; use a multiple of {parts} (the plan's global batch is {self.program.global_batch})")
        local = batch // self.dp_size
        rows = slice(self.dp_rank * local, (self.dp_rank + 1) * local)
        return self.sequence.take(inputs[rows]), self.sequence.take(targets[rows])

    def _check_local(self, inputs: torch.Tensor) -> None:
        batch, n = inputs.shape[0], self.program.num_microbatches
        if batch % n:
            raise InvalidPlanError(f"a local batch of {batch} does not split into num_microbatches({n}): "
                                   f"{batch} % {n} = {batch % n}; use a multiple of {n}")

    def _sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Plain DP reduces gradients only after the last micro-batch; ZeRO-2/3 after every one."""
        p = self.program
        if p.sync_every_microbatch or p.num_microbatches == 1 or p.dp_size == 1:
            return contextlib.nullcontext()
        if self._ddp:
            return contextlib.nullcontext() if last else self.module.no_sync()
        self.module.set_requires_gradient_sync(last)  # FSDP2 (HSDP as DDP) keeps unreduced gradients
        return contextlib.nullcontext()

    def _accumulate(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of each micro-batch; returns this rank's mean loss."""
        n = self.program.num_microbatches
        loss_sum = torch.zeros((), device=self.device)
        for mb, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n))):
            with self._sync(mb == n - 1):
                loss = self.loss_fn(self._forward(x.to(self.device)), y.to(self.device)) / n
                loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    def _forward(self, x: torch.Tensor) -> object:
        """The model's output for ``x`` (what ``loss_fn`` takes): Hugging Face models are called without a
        KV cache (training); under context parallelism a model other than the zoo's gets the global
        ``position_ids`` of this rank's tokens (``runtime.context``)."""
        kwargs: dict = {"use_cache": False} if self._source_kind == "hf" else {}
        if self.sequence.cp_size > 1 and self._source_kind != "zoo":
            kwargs["position_ids"] = self.sequence.positions(x)
        return self.module(x, **kwargs)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, *, local: bool = False) -> float:
        """Forward, backward and optimizer step; returns the global mean loss (the same on every rank).

        ``inputs``/``targets``: token ids ``(batch, seq)``, the global batch on every rank, or this
        rank's share with ``local=True``.
        """
        if local:
            self._check_local(inputs)
        else:
            inputs, targets = self.local_batch(inputs, targets)
        with warnings.catch_warnings():
            # FSDP2 warns that the root returns a view (the logits) because an in-place op on it would
            # skip its hook; the loss here only reads the logits, so the warning does not apply
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            if self.pipeline is not None:  # the schedule runs the micro-batches through the stages
                loss_sum = run_schedule(self.pipeline, inputs, targets, self.program.num_microbatches,
                                        self.device)
                self.pipeline.tied.all_reduce_grads(self.module)  # a tied head's two copies: one gradient
            else:
                loss_sum = self._accumulate(inputs, targets)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps_done += 1
        dist.all_reduce(loss_sum, group=self.loss_group)  # the global mean loss: average over dp (x cp) ranks
        return loss_sum.item() / self.loss_ranks

    def save(self, path: str, *, step: int | None = None) -> None:
        """Write a sharded checkpoint (model, optimizer, ``step`` (default ``steps_done``), RNG) to the
        directory ``path`` with torch.distributed.checkpoint; it loads under any plan of the same
        model. A collective: call it on every rank."""
        save_checkpoint(self, path, step=self.steps_done if step is None else step)

    def load(self, path: str) -> int:
        """Load a checkpoint saved under any plan of the same model, resharding as this plan needs;
        sets and returns ``steps_done``. Raises ``runtime.checkpoint.CheckpointError`` naming the
        parameters that do not match if it is from another model. A collective."""
        self.steps_done = load_checkpoint(self, path)
        return self.steps_done

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter as a whole tensor, under the original model's names (wrapper prefixes
        dropped). A collective: call it on every rank."""
        if self.pipeline is not None:  # each rank holds only its stages: gather them over pp
            return pipeline_parameters(self.module, self.pipeline)
        out = {}
        for name, full in whole_parameters(self.module):  # each ep rank holds E / ep experts: gathered
            clean = name.replace("_checkpoint_wrapped_module.", "")
            out[clean.removeprefix("module.") if self._ddp else clean] = full
        return out

    def load_pretrained(self, path: str) -> None:
        """Fill the parameters from a Hugging Face safetensors checkpoint directory (``save_pretrained``'s),
        each rank reading only what it holds (``runtime.pretrained``). A collective."""
        from .pretrained import load_pretrained

        load_pretrained(self, path)

    def save_pretrained(self, path: str) -> None:
        """Write the parameters to ``path`` as a Hugging Face safetensors checkpoint (``runtime.pretrained``).
        A collective."""
        from .pretrained import save_pretrained

        save_pretrained(self, path)


def apply(plan: Plan, model: nn.Module, *, optimizer: OptimizerFactory | None = None,
          mesh: DeviceMesh | None = None, loss_fn: LossFn | None = None, fuse: bool = False) -> PlannedModule:
    """Shard ``model`` as ``plan`` says, inside an initialized process group (or under torchrun).

    ``optimizer``: params -> Optimizer (default AdamW lr 1e-3); with ZeRO-1 it is wrapped in a
    ``ZeroRedundancyOptimizer``. ``loss_fn(output, targets)`` for ``step`` (default: mean token
    cross-entropy in fp32, as ``meshplan.zoo.loss_fn``, vocab-parallel under tp; a ``loss_fn`` given here
    sees the output with whole logits, ``runtime.loss.whole_logits``). ``mesh``: a DeviceMesh to use instead of building one; it must have
    the plan's axes and sizes (``lower(plan).mesh.dims``). ``fuse``: run the plan's fusions as generated
    Triton kernels (``FuseKernel`` steps; set ``TRITON_INTERPRET=1`` before importing triton to run them on
    CPU).

    Two paths, chosen by the model: one built on meta (``runtime.materialize.build_on_meta(source, seed)``,
    as ``meshplan run`` and emitted scripts build it) is sharded while it holds no memory, then each rank
    allocates and fills only its shards, with the values ``torch.manual_seed(seed)`` and a whole build
    would give (``runtime.materialize``); a model that already has weights (the user's loop may hold one)
    is moved to the device whole, then sharded, and keeps its values.
    """
    program = lower(plan, fuse=fuse)
    # a stopped or hung rank fails the step within minutes, not gloo's/NCCL's 30 (distributed.pg_timeout_s)
    init_distributed(pg_timeout_s(plan.prediction.step_time_s if plan.prediction is not None else 0.0))
    world = dist.get_world_size()
    if plan.world_size != world:
        raise InvalidPlanError(f"the plan's mesh ({plan.mesh}) needs {plan.world_size} processes but the process "
                               f"group has {world}; launch with torchrun --nproc-per-node {plan.world_size}")
    _check_model(plan, program, model)
    device = device_for_rank()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and FSDP use the current device
    # a meta-built model is sharded first and materialized after (only this rank's shards); a model with
    # weights moves to the device whole, then is sharded
    state = execute(program, model if is_meta(model) else model.to(device), device, mesh=mesh)
    factory = optimizer or default_optimizer
    return PlannedModule(program, state, _build_optimizer(state, factory),
                          on_whole_logits(loss_fn) if loss_fn else output_cross_entropy)


def _check_model(plan: Plan, program: Program, model: nn.Module) -> None:
    """The model is the one the plan was made for: its parameters are the ones the plan lays out, and
    every module a step names is there. Raises naming the first difference, before any step runs."""
    if plan.param_layouts:
        have = [name for name, _ in model.named_parameters()]
        want = list(plan.param_layouts)
        for got, expect in zip(have + [None] * len(want), want + [None] * len(have)):
            if got != expect:
                what = (f"the plan's parameter {expect!r}" if got is None else
                        f"the model's parameter {got!r}" if expect is None else
                        f"the model's parameter {got!r} where the plan has {expect!r}")
                raise InvalidPlanError(f"this plan was made for another model: {what} (the model has "
                                       f"{len(have)} parameters, the plan {len(want)}); plan this model, or "
                                       f"build the one the plan names ({_source_words(plan)})")
    modules = dict(model.named_modules())
    for path in program.module_paths():
        if path not in modules:
            raise InvalidPlanError(f"the plan's step on module {path!r} matches no module of the model "
                                   f"({type(model).__name__}); plan this model, or build the one the plan names "
                                   f"({_source_words(plan)})")


def _source_words(plan: Plan) -> str:
    src = plan.source or {"kind": "zoo", "name": plan.model.get("name")}
    kind = src.get("kind")
    if kind == "zoo":
        return f"zoo model {src.get('name')!r}"
    if kind == "builder":
        return f"builder {src.get('target')!r}"
    return "a Hugging Face config" if kind == "hf" else "the model given to autoparallelize"


def _build_optimizer(state: State, factory: OptimizerFactory) -> torch.optim.Optimizer:
    params = list(state.model.parameters())
    if state.zero1_axis is None:
        return factory(params)
    # ZeroRedundancyOptimizer builds its local optimizer as optimizer_class(param_groups, **defaults):
    # the factory is such a callable, so any optimizer the caller chose is sharded the same way.
    return ZeroRedundancyOptimizer(params, optimizer_class=factory,
                                   process_group=state.mesh[state.zero1_axis].get_group())
