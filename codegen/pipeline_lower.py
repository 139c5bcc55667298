"""Lowering pipeline parallelism: where ``SplitPipeline`` goes, what changes after it, what is refused.

A pipelined Program is the plain one (``lower.py``) with three differences:

    BuildMesh                     ("pp", pp) outermost, then dp [dp_shard] tp
    SplitPipeline                 first: every later step applies to the stage that holds its module
    TensorParallel(embed|norm|output)   the root's styles, one step per top-level module, because a
                                  stage holds the embedding only if it is first, the head only if last

Why split first (torchtitan, ``train.py``: ``pipeline_llama`` before ``parallelize_llama`` on each
model part): tensor parallelism, recompute and FSDP then act on each stage's modules alone, so a
stage's FSDP unit gathers only the parameters that stage holds, and the stage module that
``PipelineStage`` runs is the FSDP/DDP root whose gradient reduction the schedule drives (it
reduces once, after the last micro-batch, through ``perform_reduce_grad`` or DDP's ``no_sync``).

Schedules are ``torch.distributed.pipelining`` classes (``SCHEDULE_CLASSES``): GPipe (Huang et al.
2019), 1F1B (Narayanan et al. 2019, PipeDream-Flush), interleaved 1F1B (Narayanan et al. 2021,
sec. 2.2) and zero bubble ZB-H1 (Qi et al. 2024, ``ScheduleInterleavedZeroBubble``, which splits
each backward into input and weight halves). Stage ``c`` runs on pp rank ``c % pp`` ("loop"
placement), the layout the plan's stage boundaries assume (ZB-V's "v" placement is not offered).
"""
from __future__ import annotations

from typing import Any

from ..ir import InvalidPlanError, ModelStructure, Plan, Schedule
from .program import DataParallel, FullyShard, SplitPipeline, Step, TensorParallel

# schedule -> (torch.distributed.pipelining class, takes a list of stages)
SCHEDULE_CLASSES: dict[Schedule, tuple[str, bool]] = {
    Schedule.GPIPE: ("ScheduleGPipe", False),
    Schedule.ONE_F_ONE_B: ("Schedule1F1B", False),
    Schedule.INTERLEAVED_1F1B: ("ScheduleInterleaved1F1B", True),
    Schedule.ZERO_BUBBLE: ("ScheduleInterleavedZeroBubble", True),
}


def check_pipeline(plan: Plan, cfg: dict[str, Any]) -> None:
    """Raise for pipelined plans the runtime cannot execute, with the numbers."""
    pp, n, layers = plan.mesh.pp, plan.num_microbatches, cfg["layers"]
    covered = plan.stages[-1][1]
    if covered != layers:
        raise InvalidPlanError(f"plan.stages cover {covered} layers but the model has {layers}; "
                               f"give {pp * plan.vp} stages that end at layer {layers}")
    if plan.stages[0][1] == 0 and plan.sequence_parallel and plan.mesh.tp > 1 and not cfg.get("zoo", True):
        raise InvalidPlanError("the first pipeline stage holds the embedding alone, so the next stage starts at block 0 "
                               "from the sequence-sharded stream, and this model's forward would build its position "
                               "tables from that shorter stream; give the first stage a block, or plan without sp")
    if plan.schedule == Schedule.ONE_F_ONE_B and n < pp:
        raise InvalidPlanError(f"schedule 1f1b needs num_microbatches({n}) >= pp({pp}) (every stage starts a "
                               f"micro-batch before the first backward); use at least {pp} micro-batches or gpipe")
    if SCHEDULE_CLASSES[plan.schedule][1]:
        rounds = max(1, n // pp)
        if n % rounds:
            raise InvalidPlanError(f"schedule {plan.schedule} runs micro-batches in rounds of pp({pp}): "
                                   f"num_microbatches({n}) % {rounds} rounds = {n % rounds}; use a multiple of {pp}")
    if plan.schedule == Schedule.ZERO_BUBBLE and plan.zero_stage == 3 and plan.mesh.dp > 1:
        raise InvalidPlanError("zero_stage 3 with the zero-bubble schedule is not supported: ZB computes weight "
                               "gradients after the input gradients, and FSDP2's resharding after forward "
                               "loses them (seen on gloo: losses off by 1e-3 after one step); use zero_stage 2, "
                               "or ZeRO-3 with gpipe, 1f1b or interleaved-1f1b")
    if plan.zero_stage == 1 and plan.mesh.dp > 1:
        raise InvalidPlanError(f"zero_stage 1 with pp({pp}) > 1 is not supported by the runtime: ZeRO-1 is DDP "
                               "plus ZeroRedundancyOptimizer, and DDP breaks under torch.distributed.pipelining "
                               "(the stages' shape inference runs a backward DDP does not expect: 'rebuilt "
                               "parameter indices size is not same as original model parameters size'); "
                               "use zero_stage 0 (HSDP with a shard group of 1) or 2")


def pipeline_blockers(s: ModelStructure) -> str:
    """Why the pipeline split (``runtime.pipeline``) cannot cut this model's modules ("" when it can): it
    needs the blocks, and an embedding and a head for the first and the last stage (a head tied to the
    embedding is held by both: ``runtime.pipeline.TiedWeights``)."""
    if not s.num_blocks:
        return "no repeated blocks (a ModuleList or ModuleDict of alike layers) were found to split between stages"
    if not s.embed or not s.head:
        return "no token embedding or output head was found for the first and last stages to hold"
    if s.loose:
        verb = "holds" if len(s.loose) == 1 else "hold"
        return (f"{', '.join(map(repr, s.loose))} {verb} parameters outside the blocks, embeddings, final norm and "
                "head, which no one stage is known to hold")
    return ""


def pipelined(plan: Plan, steps: list[Step], s: ModelStructure) -> list[Step]:
    """The plain Program's steps made pipelined: SplitPipeline right after BuildMesh, the root's
    tensor-parallel styles one step per module (a stage holds the embedding only if it is first, the
    head only if last), data parallelism as the schedule needs it."""
    sp = plan.sequence_parallel and plan.mesh.tp > 1
    split = SplitPipeline(stages=plan.stages, schedule=plan.schedule, vp=plan.vp, blocks=s.blocks,
                          first_parts=tuple(p for p in (s.embed, s.pos_embed) if p),
                          last_parts=tuple(p for p in (s.final_norm, s.head) if p),
                          seq_factor=plan.mesh.tp if sp else 1,
                          call_kwargs=(("use_cache", False),) if plan.source.get("kind") == "hf" else (),
                          block_tuple=s.block_tuple)
    out: list[Step] = [steps[0], split]
    for step in steps[1:]:
        if isinstance(step, TensorParallel) and step.module == "":
            out += split_root_styles(step)
        elif isinstance(step, DataParallel):
            # DDP breaks under pipelining (see check_pipeline); FSDP2 in HSDP form with a shard
            # group of 1 is plain DP, its gradient all-reduce driven by the schedule (as lower does
            # for plain DP with TP: blocks, then the root)
            axes = (step.mesh_axis, "dp_shard")  # dp, or dp x cp flattened under context parallelism
            out += [FullyShard(module=s.block_path(i), mesh_axes=axes, reshard_after_forward=False)
                    for i in range(plan.stages[-1][1])]
            out.append(FullyShard(module="", mesh_axes=axes, reshard_after_forward=False))
        else:
            out.append(step)
    return out


def hsdp_for_plain_dp(plan: Plan) -> bool:
    """Plain DP under pipelining is HSDP with a shard group of 1 (see ``pipelined``)."""
    return plan.mesh.pp > 1 and plan.zero_stage == 0


def split_root_styles(step: TensorParallel) -> list[TensorParallel]:
    """``TensorParallel(root, {"embed.tok": a, "embed": b, "norm": c})`` -> one step per module
    (``embed.tok: {"": a}``, ``embed: {"": b}``, ``norm: {"": c}``), in the order the styles came: each
    runs on the stage that holds its module whole (``runtime.pipeline.holds``)."""
    return [TensorParallel(module=path, plan=(("", style),), mesh_axis=step.mesh_axis) for path, style in step.plan]
