"""A plan lowered to a ``Program``: ordered parallelization steps, as plain values.

Each step names a module by its path in the zoo model (``""`` is the root, ``"layers.3"`` a block)
and says what to do to it with which PyTorch primitive. Two back ends read the same steps:
``codegen.emit`` prints them as a torchrun script and ``runtime`` executes them in-process, so
the emitted program and ``plan.apply`` cannot drift apart (``STEP_KINDS`` lists every kind, and a
test checks that both back ends handle each one).

Module paths are resolved when a step runs, on the model as the earlier steps left it: after
``Recompute(module="layers.0")`` wraps block 0, ``FullyShard(module="layers.0")`` shards the
wrapper, exactly as torchtitan's ``apply_ac`` then ``apply_fsdp`` do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..ir import InvalidPlanError, Schedule, parse_placement


MIXED_DTYPES = ("bfloat16", "float16", "float32")  # torch dtype names a Program may name


class StyleKind(StrEnum):
    """The tensor-parallel styles of ``torch.distributed.tensor.parallel``."""

    COLWISE = "colwise"  # ColwiseParallel: weight S(0) (out features), output S(-1)
    ROWWISE = "rowwise"  # RowwiseParallel: weight S(1) (in features), output reduced
    SEQUENCE_PARALLEL = "sequence_parallel"  # SequenceParallel: norm on S(1) activations
    FEATURE_NORM = "feature_norm"  # meshplan's FeatureShardedNorm: a norm over features tp splits (OLMo 2's q_norm)
    # meshplan's HeadShardedParams: attention's own per-head parameters split with its heads (GPT-OSS's sinks), and
    # its input prepared as prepare_input's where src is set (under sp)
    HEAD_PARAMS = "head_params"
    PREPARE_INPUT = "prepare_input"  # PrepareModuleInput: redistribute the first input
    PREPARE_OUTPUT = "prepare_output"  # PrepareModuleOutput: redistribute the output
    PREPARE_INPUT_OUTPUT = "prepare_input_output"  # both, for a module kept replicated


@dataclass(frozen=True, slots=True, kw_only=True)
class TPStyle:
    """One tensor-parallel style with its redistributions, layouts as short strings (``S(1)``, ``R``).

    ``src -> dst`` is the input redistribution (colwise, rowwise, prepare_input) or the output one
    (prepare_output); ``None`` keeps the style's default. For colwise/rowwise, ``out`` is the
    output layout. ``prepare_input_output`` uses ``src -> dst`` on the input and ``out_src -> out``
    on the output.
    """

    kind: StyleKind
    src: str | None = None
    dst: str | None = None
    out_src: str | None = None
    out: str | None = None
    kwarg: str | None = None  # prepare_input(_output): the input is this keyword argument, not the first positional
    local: bool = False  # prepare_input, sequence_parallel: hand the module (or its caller) a plain local tensor
    dtensor_out: bool = False  # colwise: return the output as a DTensor (use_local_output=False), as the
    # vocabulary-sharded logits that the vocab-parallel loss takes (runtime.loss)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StyleKind(self.kind))
        if self.kwarg is not None and not (isinstance(self.kwarg, str) and self.kwarg.isidentifier()):
            raise InvalidPlanError(f"TPStyle.kwarg: {self.kwarg!r} is not a keyword argument name")
        for name in ("src", "dst", "out_src", "out"):
            layout = getattr(self, name)
            if layout is None:
                continue
            try:
                placement = parse_placement(layout)
            except ValueError as exc:
                raise InvalidPlanError(f"TPStyle.{name}: {exc}") from None
            if str(placement) == "P":
                raise InvalidPlanError(f"TPStyle.{name}: a module boundary cannot be Partial (P)")
            if self.kind == StyleKind.SEQUENCE_PARALLEL and not str(placement).startswith("S("):
                raise InvalidPlanError(f"TPStyle.{name}: a sequence-parallel norm's input is sharded on a dim, S(d); "
                                       f"got {layout!r}")

    def __str__(self) -> str:
        kind = self.kind
        if kind == StyleKind.SEQUENCE_PARALLEL:
            return f"sequence_parallel({self.src})" if self.src else "sequence_parallel"
        if kind == StyleKind.FEATURE_NORM:
            return "feature_norm"
        if kind == StyleKind.HEAD_PARAMS:
            return f"head_params({self.src} -> {self.dst})" if self.src else "head_params"
        if kind == StyleKind.PREPARE_INPUT_OUTPUT:
            return f"{kind}({self.src} -> {self.dst}; {self.out_src} -> {self.out})"
        if kind in (StyleKind.PREPARE_INPUT, StyleKind.PREPARE_OUTPUT):
            return f"{kind}({self.src} -> {self.dst})"
        default_src, default_out = ("R", "S(-1)") if kind == StyleKind.COLWISE else ("S(-1)", "R")
        dtensor = ", DTensor" if self.dtensor_out else ""
        return f"{kind}({self.src or default_src} -> {self.out or default_out}{dtensor})"


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildMesh:
    """``init_device_mesh`` with named axes, outermost first (tp innermost: its ranks are neighbours)."""

    dims: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.dims]
        if len(set(names)) != len(names) or any(size < 1 for _, size in self.dims):
            raise InvalidPlanError(f"BuildMesh: axis names must be distinct and sizes positive, got {self.dims}")

    @property
    def world_size(self) -> int:
        size = 1
        for _, n in self.dims:
            size *= n
        return size


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallel:
    """``parallelize_module(module, mesh[axis], {submodule: style})``."""

    module: str
    plan: tuple[tuple[str, TPStyle], ...]
    mesh_axis: str = "tp"


class Policy(StrEnum):
    FULL = "full"  # recompute the whole module in backward, keep only its input
    SELECTIVE = "selective"  # keep the matmul outputs, recompute the rest (the attention core)
    OFFLOAD = "offload"  # recompute nothing: keep what the module saves in host memory (runtime/offload.py)


# Ops whose outputs selective recompute keeps: the projections (cheap to store, costly to redo) and
# the tensor-parallel collectives (redoing them would add communication to the backward pass).
# Everything else in the wrapped module (rotary, the softmax(QK^T)V core) is recomputed, as in
# Korthikanti et al. 2022, sec. 5 ("selective activation recomputation").
SELECTIVE_SAVE_OPS = (
    "aten.mm.default",
    "aten.addmm.default",
    "_c10d_functional.all_gather_into_tensor.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_reduce.default",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recompute:
    """Activation checkpointing of one module (non-reentrant ``checkpoint_wrapper``), or with ``Policy.OFFLOAD``
    its saved activations kept in host memory (``runtime.offload.offload_activations``, no wrapper)."""

    module: str
    policy: Policy
    save_ops: tuple[str, ...] = ()  # selective only: ops whose outputs are kept

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", Policy(self.policy))
        if self.policy == Policy.SELECTIVE and not self.save_ops:
            object.__setattr__(self, "save_ops", SELECTIVE_SAVE_OPS)


@dataclass(frozen=True, slots=True, kw_only=True)
class FullyShard:
    """FSDP2 ``fully_shard(module, mesh=mesh[axes])``: one axis shards (ZeRO-2/3); two axes are HSDP
    (replicate over the first, shard over the second)."""

    module: str
    mesh_axes: tuple[str, ...]
    reshard_after_forward: bool
    # mixed precision (FSDP2's MixedPrecisionPolicy): gathered parameters and compute in param_dtype, gradients
    # reduced in reduce_dtype; the sharded parameters (the optimizer's master weights) stay fp32. None: fp32
    param_dtype: str | None = None
    reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        if len(self.mesh_axes) not in (1, 2):
            raise InvalidPlanError(f"FullyShard: one or two mesh axes, got {self.mesh_axes}")
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in MIXED_DTYPES:
                raise InvalidPlanError(f"FullyShard.{name} is {value!r}; one of {MIXED_DTYPES} or None")


@dataclass(frozen=True, slots=True, kw_only=True)
class Autocast:
    """``module.forward = torch.autocast(device_type, dtype)(module.forward)``: compute in ``dtype`` where
    no FSDP2 policy casts the parameters (DDP, tensor parallelism alone, pipeline stages without dp). The
    parameters, their gradients and the optimizer state stay fp32 (the master weights); DDP all-reduces
    fp32 gradients."""

    module: str
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in MIXED_DTYPES:
            raise InvalidPlanError(f"Autocast.dtype is {self.dtype!r}; one of {MIXED_DTYPES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallel:
    """``DistributedDataParallel`` over ``mesh[axis]``: replicated parameters, all-reduced gradients."""

    module: str = ""
    mesh_axis: str = "dp"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOptimizer:
    """ZeRO-1: ``ZeroRedundancyOptimizer`` over ``mesh[axis]`` shards the optimizer state only."""

    mesh_axis: str = "dp"


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitPipeline:
    """Pipeline parallelism (``torch.distributed.pipelining``): keep only this rank's stages of the model.

    Stage ``c`` holds layers ``[first, last)`` of ``stages[c]`` (the first stage also the embedding,
    the last the final norm and output head) and runs on pp rank ``c % pp``, ``vp`` stages per rank.
    Later steps name modules of the whole model and apply to the stage that holds them.
    """

    stages: tuple[tuple[int, int], ...]
    schedule: Schedule
    vp: int = 1
    mesh_axis: str = "pp"
    # where the parts are in the model (``ir.ModelStructure`` paths): the block container, what only the
    # first stage holds (token and position embedding), what only the last holds (final norm, head)
    blocks: str = "layers"
    first_parts: tuple[str, ...] = ("embed",)
    last_parts: tuple[str, ...] = ("norm", "output")
    # a later stage's input is the residual stream, sequence-sharded under sequence parallelism: the
    # model's own forward (rotary tables, masks) sees ``seq_factor`` times its local length
    seq_factor: int = 1
    call_kwargs: tuple[tuple[str, bool], ...] = ()  # keywords the model is called with (HF: use_cache=False)
    block_tuple: bool = False  # a block returns a tuple whose [0] the model takes on (ModelStructure.block_tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", Schedule(self.schedule))
        object.__setattr__(self, "stages", tuple((int(a), int(b)) for a, b in self.stages))
        object.__setattr__(self, "first_parts", tuple(self.first_parts))
        object.__setattr__(self, "last_parts", tuple(self.last_parts))
        object.__setattr__(self, "call_kwargs", tuple((str(k), bool(v)) for k, v in self.call_kwargs))
        if self.vp < 1 or len(self.stages) < 2 or len(self.stages) % self.vp:
            raise InvalidPlanError(f"SplitPipeline: {len(self.stages)} stages do not split into pp ranks of "
                                   f"vp({self.vp}) stages each (at least 2 stages)")
        expect = 0
        for c, (first, last) in enumerate(self.stages):  # only the first/last stage may be the embedding/head alone
            if first != expect or last < first or (last == first and c not in (0, len(self.stages) - 1)):
                raise InvalidPlanError(f"SplitPipeline: stages must cover the layers in order, got {self.stages}")
            expect = last

    @property
    def pp_size(self) -> int:
        return len(self.stages) // self.vp

    def stage_parts(self) -> dict[str, Any]:
        """``runtime.pipeline.Stage``'s keyword arguments that every stage shares (emitted scripts print them)."""
        return {"blocks": self.blocks, "num_blocks": self.stages[-1][1], "first_parts": self.first_parts,
                "last_parts": self.last_parts, "seq_factor": self.seq_factor, "call_kwargs": dict(self.call_kwargs),
                "block_tuple": self.block_tuple}


EXPERT_AXES = ("edp", "ep")  # axes only the expert mesh has; a FullyShard over them shards on that mesh


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertMesh:
    """The experts' view of BuildMesh's ranks (``DeviceMesh`` over the same rank tensor, reshaped):
    ``split_axis`` (dp) split into ``("edp", dp/ep), ("ep", ep)``, ep innermost as in Megatron-Core;
    the other axes as BuildMesh has them. ``dims`` lists every axis of the expert mesh in order."""

    dims: tuple[tuple[str, int], ...]
    split_axis: str = "dp"

    def __post_init__(self) -> None:
        names = [name for name, _ in self.dims]
        if not set(EXPERT_AXES) <= set(names) or len(set(names)) != len(names):
            raise InvalidPlanError(f"ExpertMesh: axes must be distinct and include {EXPERT_AXES}, got {self.dims}")

    @property
    def world_size(self) -> int:
        return BuildMesh(dims=self.dims).world_size


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertParallel:
    """Expert parallelism of one stacked-experts module (dim 0 is the expert) over ``expert_mesh[axis]``:
    each rank keeps ``num_experts / ep_size`` experts; token slots reach them by ``all_to_all_single``
    (``meshplan.runtime.expert.shard_experts``: PyTorch has no ready-made MoE dispatch)."""

    module: str
    num_experts: int
    ep_size: int
    mesh_axis: str = "ep"

    def __post_init__(self) -> None:
        if self.ep_size < 2 or self.num_experts % self.ep_size:
            raise InvalidPlanError(f"ExpertParallel({self.module}): ep_size({self.ep_size}) must be at least 2 "
                                   f"and divide num_experts({self.num_experts})")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlattenMesh:
    """``mesh[axes]._flatten(name)``: one more axis over the ranks of ``axes`` together (torchtitan's
    ``dp_shard_cp``). Under context parallelism the dp x cp ranks all see different tokens, so data
    parallelism (DDP, FSDP) runs over the flattened axis."""

    axes: tuple[str, ...]
    name: str

    def __post_init__(self) -> None:
        if len(self.axes) < 2 or self.name in self.axes:
            raise InvalidPlanError(f"FlattenMesh: flatten two or more axes into a new name, got {self.axes} -> "
                                   f"{self.name!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextParallel:
    """Context parallelism of one module over ``mesh[axis]`` (Llama 3's all-gather CP, Dubey et al. 2024,
    sec. 3.3.2): each cp rank holds ``seq_len / cp_size`` tokens of every sequence, chunks ``r`` and
    ``2 cp - 1 - r`` of ``2 cp`` with ``load_balance`` (equal causal work per rank), else chunk ``r`` of
    ``cp``. An attention module all-gathers K and V over cp and masks by the tokens' global positions,
    where its rotary rows come from too; an embedding takes its learned positions there
    (``meshplan.runtime.context.context_parallel``)."""

    module: str
    cp_size: int
    load_balance: bool = True
    mesh_axis: str = "cp"

    def __post_init__(self) -> None:
        if self.cp_size < 2:
            raise InvalidPlanError(f"ContextParallel({self.module}): cp_size({self.cp_size}) must be at least 2")


@dataclass(frozen=True, slots=True, kw_only=True)
class FuseKernel:
    """Run ``module``'s forward through a generated fused kernel (``codegen.kernels``): its class is
    swapped for a subclass whose forward calls ``kernels.<kernel>`` on the same parameters, so the
    state dict, tensor parallelism and FSDP see the module unchanged. ``kernel`` is a pattern name of
    ``codegen.kernels.PATTERNS`` that ``codegen.fused.FUSED_MODULES`` knows how to apply to a zoo module,
    or, with ``submodules``, ``codegen.fused.USER_MODULES`` to a user's module: the children the fused
    method calls, by their paths inside ``module`` in the order of the spec's roles (swiglu: gate, up, down)."""

    module: str
    kernel: str
    submodules: tuple[str, ...] = ()


Step = (BuildMesh | SplitPipeline | TensorParallel | ExpertMesh | ExpertParallel | Recompute | FullyShard
        | DataParallel | ShardOptimizer | FlattenMesh | ContextParallel | FuseKernel | Autocast)
STEP_KINDS: tuple[type, ...] = (BuildMesh, SplitPipeline, TensorParallel, ExpertMesh, ExpertParallel, Recompute,
                                FullyShard, DataParallel, ShardOptimizer, FlattenMesh, ContextParallel, FuseKernel,
                                Autocast)


@dataclass(frozen=True, slots=True, kw_only=True)
class Program:
    """Everything a back end needs: the steps, the model config, and the training-loop shape.

    ``sync_every_microbatch``: reduce gradients after every micro-batch (ZeRO-2/3, whose point is
    never to hold a full gradient) or only after the last one (plain DP: one all-reduce per step).
    Training computes in ``compute_dtype`` (``plan.dtype``): under bf16, FullyShard steps carry FSDP2's
    mixed-precision policy (bf16 parameters and compute, fp32 gradient reduction) and a program without
    FSDP has an ``Autocast`` step; parameters and optimizer state stay fp32 (master weights). Logits come
    out in the compute dtype and the loss is a cross-entropy in fp32 on them (``.float()`` first).
    """

    plan_summary: str
    header: tuple[str, ...]  # lines for the emitted script's docstring (prediction, cluster)
    model_config: tuple[tuple[str, Any], ...]
    global_batch: int
    seq_len: int
    micro_batch_size: int
    num_microbatches: int
    dp_size: int
    dp_axis: str = "dp"
    sync_every_microbatch: bool = True
    compute_dtype: str = "float32"
    steps: tuple[Step, ...]
    source: dict[str, Any] = field(default_factory=dict)  # where the model comes from (plan.source)

    def __post_init__(self) -> None:
        if not self.steps or not isinstance(self.steps[0], BuildMesh):
            raise InvalidPlanError("a Program starts with BuildMesh")
        for step in self.steps:
            if not isinstance(step, STEP_KINDS):
                raise InvalidPlanError(f"unknown step {step!r}; known kinds: {[k.__name__ for k in STEP_KINDS]}")
        if self.micro_batch_size * self.num_microbatches * self.dp_size != self.global_batch:
            raise InvalidPlanError(
                f"micro_batch_size({self.micro_batch_size}) * num_microbatches({self.num_microbatches}) * "
                f"dp({self.dp_size}) != global_batch({self.global_batch})")

    @property
    def mesh(self) -> BuildMesh:
        return self.steps[0]  # type: ignore[return-value]

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.model_config)

    def kinds(self) -> tuple[str, ...]:
        """Step kind names in order, for structural checks."""
        return tuple(type(s).__name__ for s in self.steps)

    def module_paths(self) -> tuple[str, ...]:
        """Every module path a step names (tensor-parallel styles' submodules under their step's module),
        in order, once each; the root ("") is left out."""
        paths: dict[str, None] = {}
        for step in self.steps:
            if isinstance(step, SplitPipeline):
                paths.update(dict.fromkeys((step.blocks, *step.first_parts, *step.last_parts)))
            base = getattr(step, "module", None)
            if base is None:
                continue
            if base:
                paths[base] = None
            for sub, _ in getattr(step, "plan", ()) if isinstance(step, TensorParallel) else ():
                if sub:
                    paths[f"{base}.{sub}" if base else sub] = None
        return tuple(paths)

    def describe(self) -> str:
        """One line per step, for reports and error messages."""
        lines = []
        for step in self.steps:
            if isinstance(step, TensorParallel):
                styles = ", ".join(f"{path or '<root>'}: {style}" for path, style in step.plan)
                lines.append(f"TensorParallel({step.module or '<root>'}) {{{styles}}}")
            else:
                lines.append(repr(step))
        return "\n".join(lines)
