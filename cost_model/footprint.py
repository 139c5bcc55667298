"""Peak memory of each GPU of a plan, and the largest of them.

For pipeline rank r (every dp/cp/tp rank of a pipeline rank holds the same amount)::

    params + grads + optimizer   ZeRO over the dp*cp replicas (memory.state_bytes), dense and expert;
                                 gradients in fp32 where the program reduces them in fp32
                                 (software.fp32_grad_reduce: Megatron's main_grad buffers);
                                 fp32 ones under bf16 where the program keeps fp32 parameters as the
                                 master weights (software.fp32_params: meshplan's runtime); ZeRO-2
                                 under FSDP2 (reshard_after_forward=False) shards the parameters at
                                 rest too, and holds every unit's gathered copy from forward to
                                 backward (a buffer, in the compute dtype); the gradients only as far
                                 as they are held when the activations peak (_grads_at_peak)
    activations                  sum over its layers of the per-layer bytes x micro-batches in flight
                                 (pipeline.inflight_microbatches; meshplan's eager program:
                                 memory.eager_layer_bytes, else Korthikanti's count), plus one layer
                                 rematerialized during the backward when it recomputes, plus on the
                                 last rank the logits and loss of one micro-batch (all of them under
                                 GPipe): whole on every TP rank unless the program's loss is
                                 vocab-parallel; under torch pipelining each stage's output too
    buffers                      communication buffers (TP gather outputs, pipeline send/recv,
                                 expert all-to-all, ring-attention K/V, FSDP unsharded layers, the
                                 unsharded copy of FSDP2 standing in for DDP, FSDP2's unsharded
                                 gradients under torch pipelining), the
                                 optimizer step's temporaries where they exceed the freed
                                 activations, and an allowance for the caching allocator

Never under-estimate: where unsure, round up. The allocator allowance is ALLOCATOR_FRACTION of what
is allocated and freed as the step runs (activations, gradients, buffers): PyTorch's caching allocator
rounds blocks up (to 2 MiB segments for large tensors) and fragments as activations of different
sizes come and go; a 10% gap between reserved and allocated memory is common in
torch.cuda.memory_summary() of LLM training (engineering allowance; GMLake, arXiv:2401.08156,
measured 9.2 GB on average of 80 GB reclaimed by undoing that fragmentation over eight LLMs, the
same order, and names its cause: the "frequent and irregular memory (de)allocation requests" of
recomputation, offloading and distributed training). The parameters and optimizer states take none:
each is allocated once, before the first step's activations (Megatron's contiguous parameter buffers,
its distributed optimizer's shards, torch's optimizer state at the first step), and updated in place
for the whole run, so no freed gap forms among them. Gradients keep it: FSDP2 and torch's
``zero_grad(set_to_none=True)`` free and reallocate them every step. None under expandable segments
(``Software.expandable_segments``), which unmap the pages of free blocks. The optimizer step's
temporaries (``optimizer_temp_bytes``: foreach AdamW's ``torch._foreach_sqrt(exp_avg_sq)``, the size
of its fp32 state shard; none for a fused one; one parameter's for a per-parameter loop) are counted
once, while the activations are freed.
"""
from __future__ import annotations

from ..ir.plan import Plan, Schedule
from .data_parallel import rank_params, runs_ddp, runs_fsdp
from .dispatch import runs_loss_parallel
from .flops import kv_width
from .memory import (ACTIVATION_BYTES, GEMM_OPERAND_BYTES, STATE_BYTES, eager_layer_bytes, head_input_bytes, layer_activation_bytes,
                     logits_bytes, state_bytes, stream_bytes)
from .pipeline import RankLayers, inflight_microbatches
from .software import DEFAULT, Software
from .sublayers import replicated_params, replicated_sublayers
from .summary import ModelSummary

ALLOCATOR_FRACTION = 0.10
KEYS = ("params", "grads", "optimizer", "activations", "buffers")


def _eager(plan: Plan, software: Software) -> tuple[bool, bool]:
    """Whether the program runs eager modules (meshplan's runtime), and whether their residual stream is fp32."""
    eager = software.eager_modules and software.attention == "flash" and not software.dropout
    return eager, eager and plan.dtype != "float32" and not runs_fsdp(plan.mesh, plan.zero_stage, software)


def _per_layer(summary: ModelSummary, plan: Plan, software: Software) -> dict[str, float]:
    """One layer's activation bytes for one micro-batch, by recompute kind ("none", "selective", "full")."""
    d, mesh = summary.dims, plan.mesh
    split = 1 if replicated_sublayers(plan) else mesh.tp  # a sublayer kept whole: count the layer whole
    eager, stream_fp32 = _eager(plan, software)
    common = dict(seq_len=plan.seq_len, micro_batch=plan.micro_batch_size, tp=split, sp=plan.sequence_parallel,
                  cp=mesh.cp, dtype=plan.dtype)
    if eager:
        layer_bytes, common = eager_layer_bytes, dict(common, ep=mesh.ep, stream_fp32=stream_fp32,
                                                      alternate_matmuls=software.selective_alternate_matmuls,
                                                      fused_norm=software.fused_norm, compiled=software.compiled)
    else:
        layer_bytes, common = layer_activation_bytes, dict(common, flash=software.attention == "flash",
                                                           dropout=software.drops_out(d.family),
                                                           selective_saves_matmuls=software.selective_saves_matmuls,
                                                           recompute_modules=software.recompute_modules,
                                                           fused_mlp=software.fused_grouped_mlp,
                                                           alternate_matmuls=software.selective_alternate_matmuls)
    return {kind: layer_bytes(d, recompute=kind, **common) for kind in ("none", "selective", "full")}


def offloaded_layer_bytes(summary: ModelSummary, plan: Plan, software: Software) -> float:
    """Bytes one offloaded layer sends to host memory per micro-batch, and takes back: what it would keep."""
    return _per_layer(summary, plan, software)["none"]


def _activations(summary: ModelSummary, plan: Plan, layers: RankLayers, software: Software,
                 per: dict[str, float]) -> float:
    """The rank's activation bytes; ``per``: ``_per_layer``'s bytes of one layer."""
    d, mesh = summary.dims, plan.mesh
    eager, stream_fp32 = _eager(plan, software)
    inflight = inflight_microbatches(plan.schedule, mesh.pp, plan.vp, plan.num_microbatches, layers.rank)
    total = inflight * (layers.none * per["none"] + layers.selective * per["selective"] + layers.full * per["full"])
    if layers.offload:  # an offloaded layer keeps nothing on the GPU but the layer whose copy is under way
        total += per["none"]  # (out in the forward, back ahead of its backward: one at a time, double-buffered)
    elif layers.full:
        total += per["none"] - per["full"]  # the layer being rematerialized in the backward
    elif layers.selective:
        total += per["none"] - per["selective"]
    if layers.last:
        whole = mesh.tp > 1 and not software.vocab_parallel_loss  # every TP rank gathers all the logits
        kept, transient = logits_bytes(d, seq_len=plan.seq_len, micro_batch=plan.micro_batch_size,
                                       tp=1 if whole else mesh.tp, cp=mesh.cp,
                                       loss_parallel=mesh.tp > 1 and runs_loss_parallel(software),
                                       kind=software.cross_entropy, dtype=plan.dtype)
        # the logits themselves, in the compute dtype, stay alive: torch pipelining keeps the stage's output
        # until its backward, and the gathered 16-bit logits outlive their upcast (seen in a profile of the
        # CPU runtime; not in fp32); a fused loss keeps them as its own saved input or keeps their fp32 gradient
        # instead (counted in ``kept``)
        if software.cross_entropy == "upcast" and (mesh.pp > 1 or (whole and plan.dtype != "float32")):
            kept += kept / 4.0 * ACTIVATION_BYTES[plan.dtype]  # kept is the fp32 log-softmax: 4 bytes a logit
        if eager:
            kept += head_input_bytes(d, seq_len=plan.seq_len, micro_batch=plan.micro_batch_size, cp=mesh.cp,
                                     dtype=plan.dtype, stream_fp32=stream_fp32, tp=mesh.tp, sp=plan.sequence_parallel)
        held = plan.num_microbatches if plan.schedule == Schedule.GPIPE and mesh.pp > 1 else 1
        total += held * kept + transient
    elif mesh.pp > 1:  # the stage's output (the residual stream) is kept by the schedule until its backward
        stream_b = stream_bytes(plan.dtype, stream_fp32)[1]
        slice_div = mesh.tp if plan.sequence_parallel else 1
        total += inflight * plan.vp * plan.seq_len / mesh.cp * plan.micro_batch_size * d.hidden * stream_b / slice_div
    return total


def _comm_buffers(summary: ModelSummary, plan: Plan, bucket_params: float, dense_params: float,
                  software: Software, layer_activations: float = 0.0) -> float:
    """``layer_activations``: one layer's activation bytes for one micro-batch. FSDP2 makes a unit's
    unsharded gradients during that unit's backward, as it frees the unit's activations (the head's while
    the loss's buffers go, which are larger), and reduce-scatters them when it ends; so they add to the
    peak only by what they exceed those activations by (bench/cpu_memory.py: the CPU runtime's ZeRO-3
    step peaks 4.3 MB above DDP's, whose activations are the same (64.2 vs 59.9 MB in step), where
    adding the whole unit's fp32 gradients beside FSDP2's gathered parameters would make it far more)."""
    d, mesh, ab = summary.dims, plan.mesh, ACTIVATION_BYTES[plan.dtype]
    act = plan.micro_batch_size * plan.seq_len / mesh.cp * d.hidden * ab
    total = 0.0
    if mesh.tp > 1:
        total += 2 * act  # gathered / all-reduced activations in flight
    if mesh.pp > 1:
        total += 2 * plan.vp * act / (mesh.tp if plan.sequence_parallel else 1)  # send + receive
    if d.family == "moe" and mesh.ep > 1:  # dispatch + combine (each tp rank its own tokens when ep takes tp ranks)
        total += 2 * act * d.top_k / (mesh.tp if mesh.ep_over_tp else 1)
    if mesh.cp > 1:
        total += 2 * 2 * plan.micro_batch_size * plan.seq_len * kv_width(d) / mesh.tp * ab  # K,V and their grads
    param_b, grad_b = STATE_BYTES[plan.dtype][0], _unsharded_grad_bytes(plan.dtype, software, plan.zero_stage)
    if mesh.pp > 1 and software.fsdp_under_pipeline and plan.zero_stage >= 2 and mesh.dp * mesh.cp > 1:
        # torch pipelining keeps FSDP2's gradients unsharded over the micro-batches, and ZeRO-3's
        # parameters gathered after the first backward, until its reduce after the schedule
        total += dense_params * grad_b + (dense_params * param_b if plan.zero_stage == 3 else 0.0)
    if plan.zero_stage == 3:
        # current + prefetched layer, and the unsharded gradients of one
        total += 2 * bucket_params * param_b + max(0.0, bucket_params * grad_b - layer_activations)
    elif plan.zero_stage == 2 and runs_fsdp(mesh, 2, software):
        # FSDP2 with reshard_after_forward=False: parameters sharded at rest (rank_memory), each unit's
        # gathered copy in the compute dtype held from its forward to its backward: all of them at the
        # start of backward
        total += dense_params * param_b + max(0.0, bucket_params * grad_b - layer_activations)
    elif plan.zero_stage == 2:
        total += bucket_params * grad_b
    elif plan.zero_stage == 0 and runs_fsdp(mesh, 0, software):
        # FSDP2's unsharded copy, held fwd -> bwd
        total += dense_params * param_b + max(0.0, bucket_params * grad_b - layer_activations)
    elif software.ddp_accumulation_copy and plan.num_microbatches > 1 and runs_ddp(mesh, plan.zero_stage):
        # DDP's buckets beside the gradients accumulated under no_sync (the parameters' dtype: DDP reduces
        # what autocast's backward leaves in param.grad)
        total += dense_params * STATE_BYTES[_state_dtype(plan.dtype, software)][1]
    return total


def optimizer_temp_bytes(plan: Plan, bucket_params: float, state_params: float, shard_group: int,
                         software: Software) -> float:
    """Bytes the optimizer step allocates beside its state (``Software.optimizer``): foreach AdamW one fp32
    tensor of every parameter it updates (``state_params``: the parameters whose state the rank holds); a
    fused one nothing; a per-parameter loop two fp32 tensors of the largest parameter's local part, at most
    the largest unit (``bucket_params``), or under ZeRO its shard (FSDP's flat chunk)."""
    if software.optimizer == "fused":
        return 0.0
    if software.optimizer == "per_param":
        return 2 * 4.0 * bucket_params / (shard_group if plan.zero_stage >= 1 else 1)
    return 4.0 * state_params


def _state_dtype(dtype: str, software: Software) -> str:
    """The dtype whose bytes per parameter the model states take (``software.fp32_params``)."""
    return "float32" if software.fp32_params else dtype


def _unsharded_grad_bytes(dtype: str, software: Software, zero_stage: int) -> float:
    """Bytes per parameter of a gathered unit's gradients before the reduce: under ``fp32_params`` (or a 16-bit
    program's fp32 gradient reduce, ``Software.reduces_grads_in_fp32``) with a 16-bit compute dtype, the gradient in
    that dtype and FSDP2's fp32 copy for the reduce-scatter."""
    grad_b = STATE_BYTES[dtype][1]
    fp32 = software.fp32_params or software.reduces_grads_in_fp32(zero_stage)
    return grad_b + 4.0 if fp32 and dtype != "float32" else grad_b


def _grads_at_peak(plan: Plan, grads: float, activations: float) -> float:
    """The gradient bytes live when activations peak. PyTorch DDP keeps them (views into its buckets,
    which outlive ``zero_grad``); every other program frees them between steps (``zero_grad``'s
    ``set_to_none``), and they come back layer by layer in the backward as the activations go. So the
    first backward of a step, where activations peak, starts without them: with one micro-batch the
    peak is the larger of the two moments, activations then and gradients at the end; under GPipe the
    second micro-batch's backward holds the first one's gradients and one micro-batch less of
    activations. Other schedules, and accumulation over micro-batches, reach the first backward's
    activations again with every gradient held (a profile of the CPU runtime: at the peak of the
    ZeRO-3 and GPipe plans only the parameters and the AdamW state were held from before)."""
    m, mesh = plan.num_microbatches, plan.mesh
    if runs_ddp(mesh, plan.zero_stage) or (m > 1 and not (plan.schedule == Schedule.GPIPE and mesh.pp > 1)):
        return grads
    return max(0.0, grads - activations / m)


def rank_memory(summary: ModelSummary, plan: Plan, layers: RankLayers,
                software: Software = DEFAULT, activations: float | None = None) -> dict[str, float]:
    """Peak bytes of one GPU of pipeline rank ``layers.rank``, by kind (see the module docstring).
    ``activations``: the rank's activation bytes when the caller has them (a model without blocks,
    ``graph_cost.graph_memory``), else priced per layer here."""
    mesh = plan.mesh
    params = rank_params(summary, layers, mesh.tp, mesh.ep, replicated_params(plan, summary.dims),
                         expert_tp=software.splits_experts_over_tp(mesh.ep_over_tp))
    replicas = mesh.dp * mesh.cp
    shard_group = plan.zero_group * mesh.cp if plan.zero_group else replicas  # HSDP: ZeRO inside the group
    state_dtype = _state_dtype(plan.dtype, software)
    dense = state_bytes(params.dense, dp=shard_group, zero_stage=plan.zero_stage, dtype=state_dtype)
    if plan.zero_stage == 2 and runs_fsdp(mesh, 2, software):  # FSDP2 shards the parameters at rest too
        dense["params"] = state_bytes(params.dense, dp=shard_group, zero_stage=3, dtype=state_dtype)["params"]
    expert = state_bytes(params.expert, dp=max(mesh.expert_replicas, 1), zero_stage=plan.zero_stage, dtype=state_dtype)
    states = {k: dense[k] + expert[k] for k in dense}
    state_params = states["optimizer"] / STATE_BYTES[state_dtype][2]  # the parameters whose state the rank holds
    if not software.master_weights and state_dtype != "float32":  # Adam's two moments in the parameters' dtype
        states["optimizer"] = 2.0 * STATE_BYTES[state_dtype][0] * state_params
    if (software.reduces_grads_in_fp32(plan.zero_stage) and state_dtype != "float32"
            and not runs_fsdp(mesh, plan.zero_stage, software)):
        # Megatron's gradient buffers take the reduce dtype: fp32 main_grad for a 16-bit model
        # (megatron/core/distributed/distributed_data_parallel.py groups parameters by (param_dtype, grad_dtype));
        # FSDP2 casts its reduced shard back to the parameter's dtype (Software.master_weights)
        states["grads"] *= 4.0 / STATE_BYTES[state_dtype][1]
    layer = 0.0
    if activations is None:
        per = _per_layer(summary, plan, software)
        activations = _activations(summary, plan, layers, software, per)
        if layers.layers:
            layer = per["none"]
    states["grads"] = _grads_at_peak(plan, states["grads"], activations)
    buffers = _comm_buffers(summary, plan, params.bucket, params.dense, software, layer)
    if software.keeps_fp8_weights(plan.dtype, plan.zero_stage):
        # FP8 weights (Software.fp8_param_gather; NVFP4 ones under float4): GEMM_OPERAND_BYTES a parameter where
        # the 16-bit copy would be, plus the transposed / columnwise copy the backward takes (as much, cached for
        # the step)
        operand = GEMM_OPERAND_BYTES[plan.dtype]
        states["params"] *= operand / STATE_BYTES[state_dtype][0]
        buffers += operand * (params.dense + params.expert)
    elif plan.dtype in GEMM_OPERAND_BYTES and plan.zero_stage < 3:
        # Transformer Engine caches each weight's FP8 (NVFP4) copy (rowwise and, on Hopper, transposed: 2 bytes a
        # parameter in FP8) across the micro-batches of a step (module/base.py quantize_weight, _fp8_workspaces)
        buffers += 2.0 * GEMM_OPERAND_BYTES[plan.dtype] * (params.dense + params.expert)
    optimizer_temp = optimizer_temp_bytes(plan, params.bucket, state_params, shard_group, software)
    buffers += max(0.0, optimizer_temp - activations - buffers)
    if not software.expandable_segments:  # the splitting allocator's fragmentation (Software.expandable_segments)
        buffers += ALLOCATOR_FRACTION * (states["grads"] + activations + buffers)  # what churns: not the
        # parameters and optimizer states, allocated once and updated in place
    return {**states, "activations": activations, "buffers": buffers}


def peak_memory(summary: ModelSummary, plan: Plan, ranks: tuple[RankLayers, ...],
                software: Software = DEFAULT) -> dict[str, float]:
    """The memory of the most loaded GPU. Ranks with the same layers differ only in micro-batches in
    flight, which never grow with the rank, so the first rank of each kind is the one to check."""
    firsts: dict[tuple, RankLayers] = {}
    for r in ranks:
        firsts.setdefault(r.kind, r)
    return max((rank_memory(summary, plan, r, software) for r in firsts.values()), key=lambda m: sum(m.values()))
