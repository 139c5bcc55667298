"""``lower(plan) -> Program``: choose the parallelization steps a plan asks for, in torchtitan's order.

    BuildMesh                     [("pp", pp)] ("dp", dp) [("dp_shard", 1)] [("cp", cp)] ("tp", tp)
    FlattenMesh                   dp x cp as one axis "dp_cp", when cp > 1 (codegen.context)
    FuseKernel(layers.i[.mlp])    generated fused kernels, with lower(plan, fuse=True) (codegen.fused);
                                  the header names the recorded fusions the plan's parallelism rules out
    SplitPipeline                 pipeline stages first, when pp > 1 (codegen.pipeline_lower)
    TensorParallel(root)          embedding, final norm, output head
    TensorParallel(layers.i)      attention and MLP of each block: split, or replicated where the plan's
                                  param_layouts keep a sublayer's linear weights R over tp (codegen.tp_plans)
    ExpertMesh, ExpertParallel    MoE experts sharded over ep, a sub-group of dp (codegen.expert)
    ContextParallel(layers.i.attn), (embed)   the sequence split over cp (codegen.context)
    Recompute(layers.i[.attn])    activation checkpointing, per layer as plan.recompute says
    FullyShard(layers.i), (root)  ZeRO-2/3, or HSDP with a shard axis of 1 for plain DP with TP
    DataParallel(root)            plain DP without TP (DDP)
    ShardOptimizer                ZeRO-1 (with DDP)
    (data parallelism runs over "dp_cp" instead of "dp" under context parallelism)

Why this order (torchtitan, ``models/llama3/parallelize.py``): tensor parallelism first, because
it replaces parameters with DTensors on the tp mesh that FSDP then shards further over dp (2-D
parallelism); activation checkpointing next, because it wraps each block and FSDP must wrap the
checkpointed block so that its all-gather and reduce-scatter stay outside the recomputed region;
FSDP last, bottom-up (blocks, then the root), since ``fully_shard`` groups the parameters not yet
claimed by a sub-module.
"""
from __future__ import annotations

from typing import Any

from ..ir import AXES, InvalidPlanError, Plan
from ..ir import Recompute as RecomputeChoice
from . import context, expert, fused, hybrid, pipeline_lower, tp_plans
from .precision import with_precision
from .structure import structure_of, zoo_family
from .program import (BuildMesh, DataParallel, FullyShard, Policy, Program, Recompute, ShardOptimizer, Step,
                      TensorParallel)

def lower(plan: Plan, *, fuse: bool = False) -> Program:
    """The ordered steps for ``plan``; raises ``InvalidPlanError`` for what the runtime cannot do yet.

    ``fuse``: also run the fusions ``plan.fusions`` records as generated kernels (``FuseKernel``
    steps, first: they swap a module's forward, which later steps wrap or shard unchanged)."""
    cfg = _model_dims(plan)
    check_supported(plan, cfg)
    dp, tp = plan.mesh.dp, plan.mesh.tp
    steps: list[Step] = [BuildMesh(dims=_mesh_dims(plan)), *context.flatten_mesh(plan), *hybrid.flatten_steps(plan)]
    if fuse:
        steps += fused.fuse_steps(plan, cfg["structure"])
    if tp > 1:
        steps += _tensor_parallel(plan, cfg)
    if plan.mesh.cp > 1:
        steps += context.context_parallel(plan, cfg)
    if plan.mesh.ep > 1:
        steps += expert.expert_parallel(plan, steps[0].dims, cfg["structure"])
    steps += _recompute(plan, cfg)
    steps += _data_parallel(plan, cfg)
    if plan.mesh.pp > 1:
        steps = pipeline_lower.pipelined(plan, steps, cfg["structure"])  # SplitPipeline first; see pipeline_lower
    steps = with_precision(plan.dtype, steps)  # bf16: FSDP2's mixed-precision policy, or autocast
    return Program(
        plan_summary=plan.summary(), header=_header(plan) + (fused.skipped(plan) if fuse else ()), model_config=tuple(plan.model.items()),
        global_batch=plan.global_batch, seq_len=plan.seq_len, micro_batch_size=plan.micro_batch_size,
        num_microbatches=plan.num_microbatches, dp_size=dp, dp_axis=hybrid.data_axis(plan, "dp"),
        # ZeRO-2/3 reduce-scatter after every micro-batch so that no full gradient is ever held;
        # plain DP accumulates locally and all-reduces once per step.
        sync_every_microbatch=plan.zero_stage >= 2, steps=tuple(steps), source=dict(plan.source),
        compute_dtype=plan.dtype)


def _model_dims(plan: Plan) -> dict[str, Any]:
    """The sizes lowering needs: the blocks and module paths from ``plan.structure``, the widths tensor
    parallelism splits from ``plan.model`` (0 defaults as zoo.ModelConfig has them)."""
    model, s = plan.model, structure_of(plan)
    heads = _size(model, "heads", 1)
    family = zoo_family(s)
    return {"structure": s, "family": family or "custom", "layers": s.num_blocks, "heads": heads,
            "kv_heads": _size(model, "kv_heads", 0) or heads,
            "ffn_hidden": _size(model, "ffn_hidden", 0) or 4 * _size(model, "hidden", 0),
            "vocab": _size(model, "vocab", 0), "zoo": family is not None}


def _size(model: dict[str, Any], key: str, default: int) -> int:
    """``model[key]``, a non-negative int (a plan built in Python skips the file schema's check)."""
    value = model.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidPlanError(f"plan.model[{key!r}] must be a non-negative integer, got {value!r:.60}; "
                               "give the model's size (meshplan.zoo.ModelConfig's fields)")
    return value


def check_supported(plan: Plan, cfg: dict[str, Any]) -> None:
    """Raise for the parts of a plan the runtime does not execute yet, saying which and why."""
    m, s = plan.mesh, cfg["structure"]
    hybrid.check_hybrid(plan)
    _check_model_modules(plan, cfg)
    if m.ep > 1:
        expert.check_expert_parallel(plan, cfg)
    if plan.zero_stage == 1 and m.tp > 1:
        raise InvalidPlanError(f"zero_stage 1 with tp({m.tp}) > 1 is not supported by the runtime yet "
                               "(ZeroRedundancyOptimizer needs plain tensors, TP makes DTensors); "
                               "use zero_stage 0 or 2")
    if m.pp > 1:
        pipeline_lower.check_pipeline(plan, cfg)
    if plan.recompute and len(plan.recompute) != cfg["layers"]:
        raise InvalidPlanError(f"plan.recompute has {len(plan.recompute)} entries but the model has "
                               f"{cfg['layers']} layers; give one per layer")
    if m.tp > 1:
        for layer in range(cfg["layers"]):
            replicated_sublayers(plan, cfg, layer)  # raises for a layout the styles cannot execute
        linears = s.tp_linears()
        split = (("heads", "kv_heads") if linears["attn"] else ()) + (("ffn_hidden",) if linears["mlp"] else ()) \
            + (("vocab",) if s.head else ())
        for name in split:
            if cfg[name] % m.tp:
                raise InvalidPlanError(f"tensor parallelism splits {name} over tp ranks, but "
                                       f"{name}({cfg[name]}) does not divide by tp({m.tp}); "
                                       f"use a tp that divides {cfg[name]}")


def _check_model_modules(plan: Plan, cfg: dict[str, Any]) -> None:
    """What the plan asks of the model's modules, against what the frontend found in them."""
    m, s = plan.mesh, cfg["structure"]
    if (m.tp > 1 or m.pp > 1 or any(r != RecomputeChoice.NONE for r in plan.recompute)) and not s.num_blocks:
        raise InvalidPlanError("the plan splits or recomputes the model's blocks, but no repeated blocks were found "
                               "in it (a ModuleList or ModuleDict of alike layers); plan it with data parallelism "
                               "and ZeRO only (tp=1, pp=1, recompute none)")
    if plan.sequence_parallel and (why := tp_plans.sp_blockers(s)):
        raise InvalidPlanError(f"sequence parallelism needs norms and module boundaries it can shard on: {'; '.join(why)}; "
                               "plan without sp (--no-sp)")
    if not cfg["zoo"] and m.cp > 1 and (why := context.cp_blockers(s)):
        raise InvalidPlanError(f"cp({m.cp}) > 1: the runtime cannot run context parallelism on this model: "
                               f"{'; '.join(why)}; plan with cp=1")
    if m.pp > 1 and (why := pipeline_lower.pipeline_blockers(s)):
        raise InvalidPlanError(f"pp({m.pp}) > 1: {why}; plan with pp=1")
    if any(r == RecomputeChoice.SELECTIVE for r in plan.recompute) and not s.attn:
        raise InvalidPlanError("selective recompute wraps each block's attention module, but none was found in the "
                               "blocks; use recompute full or none")


def _mesh_dims(plan: Plan) -> tuple[tuple[str, int], ...]:
    """pp outermost, then dp, cp, tp innermost (tp ranks are neighbours, on one node when there are several).

    Plain DP with TP gets a size-1 "dp_shard" axis: FSDP2 in HSDP form with a shard group of one
    replicates the parameters and all-reduces the gradients (DDP semantics), which DDP itself
    cannot do over DTensor parameters.
    """
    dims = ([("pp", plan.mesh.pp)] if plan.mesh.pp > 1 else []) + [("dp", plan.mesh.dp)]
    dims = hybrid.split_dp(plan, dims)  # HSDP: ("dp", dp // zero_group), ("dp_shard", zero_group)
    hsdp = pipeline_lower.hsdp_for_plain_dp(plan) or expert.hsdp_for_plain_dp(plan)
    if plan.mesh.cp > 1:
        dims.append(("cp", plan.mesh.cp))
    # after cp: the replicate axis of that HSDP is dp x cp flattened (``FlattenMesh``), which needs dp, cp adjacent
    m = plan.mesh
    if m.dp * m.cp > 1 and ((hsdp and m.tp == 1) or (m.tp > 1 and plan.zero_stage == 0)):
        dims.append(("dp_shard", 1))
    if plan.mesh.tp > 1:
        dims.append(("tp", plan.mesh.tp))
    return tuple(dims)


def _tensor_parallel(plan: Plan, cfg: dict[str, Any]) -> list[Step]:
    s, sp = cfg["structure"], plan.sequence_parallel
    root = tp_plans.root_plan(s, sp)
    steps: list[Step] = [TensorParallel(module="", plan=root)] if root else []
    for i in range(cfg["layers"]):
        block = tp_plans.block_plan(s, sp, replicated_sublayers(plan, cfg, i))
        if block:  # a block replicated whole, without sp, has nothing to parallelize
            steps.append(TensorParallel(module=s.block_path(i), plan=block))
    return steps


def replicated_sublayers(plan: Plan, cfg: dict[str, Any], layer: int) -> frozenset[str]:
    """The sublayers of block ``layer`` whose linear weights ``plan.param_layouts`` keeps R over tp (the
    intra-op program's answer); none for a plan without layouts (old plan files, ``meshplan estimate``),
    which gets the fixed Megatron split."""
    s = cfg["structure"]
    split = s.tp_linears()
    # attention of another kind (ModelStructure.whole_attn_blocks): whole, whatever the roles' linears' layouts say
    other = frozenset({"attn"}) if layer in s.whole_attn_blocks and split["attn"] else frozenset()
    if not plan.param_layouts:
        return other
    tp_axis, prefix = AXES.index("tp"), s.block_path(layer)
    weight_tp = {name: layout[tp_axis]
                 for sub, linears in split.items() if linears and sub not in other
                 for name in (*linears[0], linears[1])
                 if (layout := plan.param_layouts.get(f"{prefix}.{name}.weight")) is not None}
    return tp_plans.replicated_sublayers(s, prefix, weight_tp) | other


def _recompute(plan: Plan, cfg: dict[str, Any]) -> list[Step]:
    """"full" wraps the block; "selective" wraps its attention module with a policy that keeps the
    projection outputs and recomputes the attention core (see program.SELECTIVE_SAVE_OPS); "offload" keeps
    what the block saves in host memory."""
    s = cfg["structure"]
    steps: list[Step] = []
    for i, choice in enumerate(plan.recompute[:cfg["layers"]]):
        if choice == RecomputeChoice.FULL:
            steps.append(Recompute(module=s.block_path(i), policy=Policy.FULL))
        elif choice == RecomputeChoice.SELECTIVE:
            steps.append(Recompute(module=f"{s.block_path(i)}.{s.attn}", policy=Policy.SELECTIVE))
        elif choice == RecomputeChoice.OFFLOAD:
            steps.append(Recompute(module=s.block_path(i), policy=Policy.OFFLOAD))
    return steps


def _data_parallel(plan: Plan, cfg: dict[str, Any]) -> list[Step]:
    dp, zero = plan.mesh.dp * plan.mesh.cp, plan.zero_stage  # cp ranks see other tokens: data-parallel too
    axis = context.data_axis(plan)  # "dp", or "dp_cp" (dp x cp flattened) under context parallelism
    if dp == 1:
        return []  # nothing to replicate or shard over
    if plan.mesh.tp == 1 and plan.mesh.ep == 1 and zero <= 1:
        return [DataParallel(module="", mesh_axis=axis)] + ([ShardOptimizer(mesh_axis=axis)] if zero == 1 else [])
    axes = (axis, "dp_shard") if zero == 0 or plan.zero_group else (axis,)  # HSDP: replicate x shard
    # ZeRO-3 frees each block's gathered parameters after its forward and gathers them again in
    # backward; ZeRO-2 (and HSDP-as-DDP) keeps them. The root keeps its own either way: what is left in
    # it (the final norm) is needed again as soon as backward starts.
    s = cfg["structure"]
    steps: list[Step] = expert.expert_data_parallel(plan, s) if plan.mesh.ep > 1 else []
    steps += [FullyShard(module=s.block_path(i), mesh_axes=axes, reshard_after_forward=zero == 3)
              for i in range(cfg["layers"])]
    steps += _edge_units(plan, s, axes)
    steps.append(FullyShard(module="", mesh_axes=axes, reshard_after_forward=False))
    return steps


def _edge_units(plan: Plan, s: Any, axes: tuple[str, ...]) -> list[Step]:
    """Under ZeRO-2/3 the embedding and the output head are FSDP units of their own, as torchtitan
    shards them (``models/llama3/infra/parallelize.py``, ``apply_fsdp``), and as the cost model prices
    them (``data_parallel.rank_params``: each is a unit beside the blocks). In the root they would stay
    gathered from the forward to the end of the backward, with their unsharded gradients: for a 32k
    vocabulary at hidden 1024 in fp32, 0.5 GB whole on every rank. Apart, the head's gradient is
    reduce-scattered as soon as its backward ends, and under ZeRO-3 the embedding is freed after the
    forward. The head keeps its parameters gathered into the backward (it is the first unit there).
    A tied head shares the embedding's table, so both stay in one unit (the root); pipeline stages hold
    one of them or neither, and keep the root's."""
    if plan.zero_stage < 2 or plan.mesh.pp > 1 or s.tied_head or not (s.embed and s.head):
        return []
    return [FullyShard(module=s.embed, mesh_axes=axes, reshard_after_forward=plan.zero_stage == 3),
            FullyShard(module=s.head, mesh_axes=axes, reshard_after_forward=False)]


def _precision_words(plan: Plan) -> str:
    if plan.dtype == "float32":
        return "fp32 parameters, compute and optimizer state"
    return (f"{plan.dtype} compute, fp32 master weights, optimizer state and gradient reduction, "
            "fp32 cross-entropy on the logits")


def _header(plan: Plan) -> tuple[str, ...]:
    """Lines for the script's docstring; plan strings shown quoted unless plain tokens (``safe.shown``),
    and escaped again where they are printed (``safe.doc_text``)."""
    from .safe import shown

    lines = [f"model: {shown(plan.model.get('name') or plan.model.get('family'))}, cluster: {shown(plan.cluster)}, "
             f"global batch {plan.global_batch} x seq {plan.seq_len}, dtype {shown(plan.dtype)} "
             f"({_precision_words(plan)})"]
    p = plan.prediction
    if p is not None:
        lines.append(f"predicted: step time {p.step_time_s:.4g} s, memory per GPU "
                     f"{p.peak_memory_bytes / 2**30:.2f} GiB, MFU {p.mfu:.1%}")
    return tuple(lines)
