"""Data parallelism and ZeRO: gradient and parameter traffic, how much of it hides, the optimizer step.

Parameters are replicated over the dp * cp ranks that share a pipeline rank and a tp rank
(context-parallel ranks hold the same weights, so their gradients are reduced together, as in
Megatron-Core); the group is dp * cp ranks at stride tp. Expert weights are sharded over ep inside
that group, so their replicas are dp * cp / ep ranks at stride tp * ep.

Traffic per step, Psi the parameters of one GPU's replica, m micro-batches (ZeRO paper sec. 7;
nccl-tests factors in ``collectives.py``); stages 2 and 3 follow PyTorch FSDP2, which reshards
after every micro-batch:

* stage 0 (DDP): all-reduce of the gradients once per step (2 Psi (n-1)/n per rank);
* stage 1: reduce-scatter of the gradients and all-gather of the updated parameters, once per step
  (same 2 Psi volume); meshplan's runtime does ZeRO-1 as PyTorch does (DDP's all-reduce, then
  ``ZeroRedundancyOptimizer`` broadcasts each updated parameter from its owner, one call per
  parameter tensor issued together: 3 Psi, ``Software.zero1_allreduce``);
* stage 2: per micro-batch, all-gather of the parameters and reduce-scatter of the gradients;
* stage 3: per micro-batch, all-gather forward, all-gather again backward, reduce-scatter
  (3 Psi; 1.5x DP at m = 1).

Overlap: gradients are reduced in buckets while the backward runs (PyTorch DDP, Li et al. 2020,
VLDB); only the last bucket, about the largest layer's worth, waits after the last layer. FSDP
prefetches the next layer's parameters while the current one computes, so only the first layer's
gather waits. Whatever exceeds the compute window is exposed too::

    exposed = tail + max(0, comm - tail - window)

Each collective is cut into calls, and every call pays the latency: DDP buckets of 25 MiB (Megatron-Core's
of max(40M, 1M x dp) parameters, ``Software.megatron_buckets``), one call per FSDP unit (a layer, and the
root), one broadcast per owner of a ZeRO-1 optimizer shard. An all-gather or reduce-scatter's latency grows
with its group (a ring: ``collectives.ring_steps``), which is why Megatron grows its buckets with dp.

What overlaps depends on the program (``software.py``): without ``overlap_grad_reduce`` the
gradient reduction waits in full after the backward (Megatron-LM 2021), without
``overlap_param_gather`` so does ZeRO-1's gather of the updated parameters; a ZeRO-3 that prefetches
only ``zero3_prefetch_params`` of a layer's ``bucket`` parameters (DeepSpeed) hides that share of
each gather and waits for the rest. With ``zero3_regather_recompute`` the layers under full
recomputation gather their parameters a third time, for the recomputed forward; with
``zero3_flat`` the collectives are costed per GPU on its own link (``collectives.py``).

What hides is not free: compute runs ``Software.overlap_slowdown`` slower while a collective
runs beside it (Lee et al. 2025), so each hidden second adds that share of a second to the step,
reported as compute::

    contention = overlap_slowdown * min(comm - tail, window)   per phase

A ZeRO-2/3 program that copies parameters out of its all-gather buffer and gradients into its
reduce-scatter buffer (``Software.zero_copy_buffers``, PyTorch FSDP2) reads and writes each byte
once more per collective: ``2 * bytes`` at HBM bandwidth per gather and per reduce-scatter, per
micro-batch, also reported as compute. FSDP2's own framework cost (its hooks and buffer bookkeeping,
``Accelerator.fsdp_unit_s``, calibrated on CPUs, where it is milliseconds per unit; 0 on GPU
presets, where it runs ahead of the kernels) is charged per unit, micro-batch and pass (``runs_fsdp``).

On a shared-memory tier (CPU processes over gloo) a collective is copied and reduced by the same
cores that compute, so overlapping it with compute saves nothing: all of it is exposed, and each call
also waits for the rank that computes last (``Accelerator.sync_overhead_s``, calibrated; zero on GPU
presets).

The optimizer step (Adam) is memory-bound: about 36 bytes per parameter of its shard (fp32
master, momentum and variance read and written, the gradient read for the update and for the
global norm, the 16-bit copy written, the gradient zeroed). It is reported inside "compute".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.plan import Mesh
from .collectives import bus_bytes, collective_time, flat_collective_time, group_phases
from .dispatch import param_tensors
from .hardware import Cluster, TierKind
from .kernels import memory_time_s
from .memory import GEMM_OPERAND_BYTES, STATE_BYTES
from .pipeline import RankLayers
from .software import DEFAULT, Software
from .summary import ModelSummary

OPTIMIZER_BYTES_PER_PARAM = 36
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel(bucket_cap_mb=25)
# Megatron-Core's default bucket: max(40M, 1M * dp) parameters (Software.megatron_buckets)
MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK = 40_000_000, 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RankParams:
    """Parameters one GPU holds before ZeRO sharding."""

    dense: float  # replicated over dp * cp
    expert: float  # replicated over dp * cp / ep
    bucket: float  # the largest unit: a layer, the embedding or the output layer
    units: int = 1  # FSDP units: one per layer, one for the root (embedding, final norm, output layer)
    tensors: int = 1  # parameter tensors (torch's ZeroRedundancyOptimizer broadcasts each on its own)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelCost:
    per_microbatch_s: float  # exposed once per micro-batch (ZeRO-2/3), inside the pipeline
    per_step_s: float  # exposed once per step, after the last backward (DP, ZeRO-1)
    bus_bytes: float  # per GPU per step
    compute_per_microbatch_s: float = 0.0  # compute slowed by hidden collectives, buffer copies (ZeRO-2/3)
    compute_per_step_s: float = 0.0  # the same, once per step (DP, ZeRO-1)


def rank_params(summary: ModelSummary, layers: RankLayers, tp: int, ep: int, replicated: float = 0.0, *,
                expert_tp: bool) -> RankParams:
    """``replicated``: parameters per layer a plan keeps whole over tp (``estimate.replicated_sublayers``);
    ``expert_tp``: the experts are split over tp as well as ep (``Software.expert_tp``), else whole on every
    tp rank."""
    per_layer = (summary.tp_params - replicated) / tp + replicated + summary.norm_params
    experts = summary.expert_params / ((tp if expert_tp else 1) * ep)
    edges = [per_layer + experts]
    dense = layers.layers * per_layer
    if layers.first:
        dense += summary.embed_params / tp
        edges.append(summary.embed_params / tp)
    if layers.last:  # a tied head: the last stage's copy of the embedding's table when another stage holds it
        head = summary.head_params or (0 if layers.first else summary.tied_params)
        dense += head / tp
        edges.append(head / tp)
    units = layers.layers + (1 if layers.first or layers.last else 0)
    plain, dtensor = param_tensors(summary.dims, layers=layers.layers, first=layers.first, last=layers.last, tp=tp,
                                   sp=False)
    return RankParams(dense=dense, expert=layers.layers * experts, bucket=max(edges), units=max(units, 1),
                      tensors=max(plain + dtensor, 1))


def _overlap(comm_s: float, tail_s: float, window_s: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of ``comm_s`` issued under ``window_s`` of compute, whose last
    ``tail_s`` can only start after the compute."""
    tail_s = min(tail_s, comm_s)
    exposed = tail_s + max(0.0, comm_s - tail_s - window_s)
    return exposed, comm_s - exposed


def _ops(zero_stage: int, param_b: int, grad_b: int, regather: float,
         software: Software) -> tuple[tuple[str, int, str, float, str], ...]:
    """(collective, bytes per parameter, phase, share of the parameters, how it is cut into calls)
    per step (stages 0, 1) or micro-batch (2, 3). Calls: DDP ``buckets`` of ``DDP_BUCKET_BYTES``, one
    per FSDP ``unit``, or one broadcast per parameter tensor (``tensors``: torch's
    ``ZeroRedundancyOptimizer._broadcast_params_from_rank`` without ``parameters_as_bucket_view``)."""
    if zero_stage == 0:
        return (("all-reduce", grad_b, "reduce", 1.0, "buckets"),)
    if zero_stage == 1 and software.zero1_allreduce:  # the updated parameters themselves: fp32 under fp32_params
        owned_b = 4 if software.fp32_params else param_b
        return (("all-reduce", grad_b, "reduce", 1.0, "buckets"), ("broadcast", owned_b, "update", 1.0, "tensors"))
    if zero_stage == 1:
        return (("reduce-scatter", grad_b, "reduce", 1.0, "buckets"), ("all-gather", param_b, "update", 1.0, "buckets"))
    if zero_stage == 2:
        return (("all-gather", param_b, "fwd", 1.0, "units"), ("reduce-scatter", grad_b, "reduce", 1.0, "units"))
    ops = (("all-gather", param_b, "fwd", 1.0, "units"), ("all-gather", param_b, "bwd", 1.0, "units"),
           ("reduce-scatter", grad_b, "reduce", 1.0, "units"))
    return ops + ((("all-gather", param_b, "bwd", regather, "units"),) if regather > 0 else ())


def _calls(how: str, nbytes: float, count: float, params: RankParams, group_size: int, software: Software) -> int:
    """Calls one collective of ``count`` parameters (``nbytes``) is cut into (``_ops``'s ``how``)."""
    if how == "units":
        return params.units
    if how == "tensors":
        return params.tensors
    if software.megatron_buckets:  # buckets of max(40M, 1M * dp) parameters (Software.megatron_buckets)
        return max(1, math.ceil(count / max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * group_size)))
    return max(1, math.ceil(nbytes / DDP_BUCKET_BYTES))


def _pipelined_ops(zero_stage: int, ops: tuple) -> tuple[tuple, tuple]:
    """(per micro-batch, per step) ops of FSDP2 under ``torch.distributed.pipelining``: the stage
    turns gradient sync and resharding after backward off for every micro-batch and reduces once after
    the schedule, unhidden (``PipelineStage.backward_maybe_with_nosync``, ``perform_reduce_grad``),
    so parameters gathered in a backward stay gathered: ZeRO-2 gathers once per step, ZeRO-3 gathers
    every forward and once in the backward; gradients are reduced once, at the end."""
    per_mb = tuple(op for op in ops if zero_stage == 3 and op[2] == "fwd")
    per_step = tuple((kind, b, "end" if phase == "reduce" else phase, part, how)
                     for kind, b, phase, part, how in ops if not (zero_stage == 3 and phase == "fwd"))
    return per_mb, per_step


def data_parallel_cost(params: RankParams, *, cluster: Cluster, mesh: Mesh, zero_stage: int, dtype: str,
                       microbatches: int, fwd_window_s: float, bwd_window_s: float, software: Software = DEFAULT,
                       recomputed_share: float = 0.0, zero_group: int = 0) -> DataParallelCost:
    """Exposed seconds and bus bytes of the DP/ZeRO traffic of one GPU. ``recomputed_share`` is the
    share of its parameters in fully recomputed layers (gathered again under
    ``software.zero3_regather_recompute``). ``zero_group`` (HSDP, ZeRO-2/3): the dense parameters'
    gathers and reduce-scatters run inside groups of ``zero_group * cp`` ranks at stride tp, and each
    rank's gradient shard is then all-reduced over the ``dp // zero_group`` replicas at stride
    ``tp * cp * zero_group``; the experts stay sharded over all their replicas. Under pipeline
    parallelism a program with ``software.fsdp_under_pipeline`` runs FSDP2 as ``_pipelined_ops`` says."""
    param_b, grad_b, _ = STATE_BYTES[dtype]
    grad_b = 4 if software.reduces_grads_in_fp32(zero_stage) else grad_b
    if software.keeps_fp8_weights(dtype, zero_stage):
        # FP8 (or NVFP4) weights, all-gathered at that width after the step (Software.fp8_param_gather)
        param_b = GEMM_OPERAND_BYTES[dtype]
    replicas = mesh.dp * mesh.cp
    # each expert shard's replicas: dp * cp / ep of them at stride tp * ep, or, folded over tp
    # (Mesh.ep_over_tp), tp * dp * cp / ep at stride ep
    expert_stride = mesh.ep if mesh.ep_over_tp else mesh.tp * mesh.ep
    groups = [(params.dense, replicas, mesh.tp), (params.expert, mesh.expert_replicas, expert_stride)]
    if zero_group and zero_stage >= 2:
        shard = zero_group * mesh.cp
        groups[0] = (params.dense, shard, mesh.tp)
        replica_ar = (("all-reduce", grad_b, "reduce", 1.0, "units"),)
        groups.append((params.dense / shard, replicas // shard, mesh.tp * shard, replica_ar))
    regather = recomputed_share if zero_stage == 3 and software.zero3_regather_recompute else 0.0
    pipelined = fsdp_under_pipeline(mesh, zero_stage, software)
    time_of = flat_collective_time if zero_stage == 3 and software.zero3_flat else collective_time
    # gathers FSDP issues ahead of the layer: all of it, or DeepSpeed's prefetch bucket's share
    ahead = 1.0 if software.zero3_prefetch_params is None else min(1.0, software.zero3_prefetch_params / params.bucket)
    hidden = {"fwd": ahead, "bwd": ahead, "reduce": 1.0 if software.overlap_grad_reduce else 0.0,
              "update": 1.0 if software.overlap_param_gather else 0.0, "end": 0.0}
    under = {"fwd": "fwd", "bwd": "bwd", "reduce": "bwd", "update": "fwd", "end": "bwd"}  # what can hide it
    accel = cluster.accelerator

    def traffic(ops_of) -> tuple[float, float, float]:
        """(exposed s, compute slowed s, bus bytes) of the ops ``ops_of(group_ops)`` keeps, run once."""
        waits = copies = moved = 0.0
        comm = dict.fromkeys(("fwd", "bwd"), 0.0)
        tail = dict.fromkeys(("fwd", "bwd"), 0.0)
        for count, size, stride, *own_ops in groups:
            if count <= 0 or size <= 1:
                continue
            share = min(params.bucket / count, 1.0)
            on_cores = all(t.kind == TierKind.SHARED_MEMORY for t, _ in group_phases(size, stride, cluster))
            for kind, elem_b, phase, part, how in ops_of(own_ops[0] if own_ops else
                                                        _ops(zero_stage, param_b, grad_b, regather, software)):
                # one collective's bandwidth time, plus the latency of every further call it is cut into
                calls = _calls(how, part * count * elem_b, part * count, params, size, software)
                t = part * time_of(kind, count * elem_b, size, stride, cluster)
                t += (calls - 1) * part * time_of(kind, 1.0, size, stride, cluster)
                if on_cores:  # CPU ranks: each call also waits for the rank computing last (calibrated);
                    # calls issued together and waited on at once (ZeRO-1's broadcasts) wait once
                    t += (1 if how == "tensors" else calls) * part * accel.sync_overhead_s
                moved += part * bus_bytes(kind, count * elem_b, size)
                if software.zero_copy_buffers and zero_stage >= 2 and kind in ("all-gather", "reduce-scatter"):
                    copies += part * 2 * count * elem_b
                hides = 0.0 if on_cores else hidden[phase]
                waits += (1.0 - hides) * t
                comm[under[phase]] += hides * t
                tail[under[phase]] += hides * t * share
        (fwd_exposed, fwd_hidden), (bwd_exposed, bwd_hidden) = (_overlap(comm["fwd"], tail["fwd"], fwd_window_s),
                                                                _overlap(comm["bwd"], tail["bwd"], bwd_window_s))
        slowed = software.overlap_slowdown * (fwd_hidden + bwd_hidden)
        if copies:
            slowed += memory_time_s(accel, copies, 0)
        return waits + fwd_exposed + bwd_exposed, slowed, moved

    # FSDP2's framework cost per unit and pass (calibrated on CPU profiles, 0 on GPU presets): forward and
    # backward of every micro-batch, and the recomputed forward of fully recomputed layers
    hooks = (params.units * (2 + recomputed_share) * accel.fsdp_unit_s
             if runs_fsdp(mesh, zero_stage, software) else 0.0)
    if pipelined:
        (mb_s, mb_slowed, mb_moved), (step_s, step_slowed, step_moved) = (
            traffic(lambda ops, i=i: _pipelined_ops(zero_stage, ops)[i]) for i in (0, 1))  # per micro-batch, per step
        return DataParallelCost(per_microbatch_s=mb_s, per_step_s=step_s, bus_bytes=mb_moved * microbatches + step_moved,
                                compute_per_microbatch_s=mb_slowed + hooks, compute_per_step_s=step_slowed)
    exposed, slowed, moved = traffic(lambda ops: ops)
    if zero_stage >= 2:
        return DataParallelCost(per_microbatch_s=exposed, per_step_s=0.0, bus_bytes=moved * microbatches,
                                compute_per_microbatch_s=slowed + hooks)
    return DataParallelCost(per_microbatch_s=0.0, per_step_s=exposed, bus_bytes=moved, compute_per_step_s=slowed,
                            compute_per_microbatch_s=hooks)


def runs_fsdp(mesh: Mesh, zero_stage: int, software: Software) -> bool:
    """Whether the program runs the data parallelism with FSDP2: ZeRO-2/3 where it copies through flat
    buffers (``Software.zero_copy_buffers``), and with ``fsdp_plain_dp`` plain DP beside TP, PP or EP
    (HSDP with a shard group of one); otherwise DDP (``runs_ddp``) or another program's ZeRO."""
    if mesh.dp * mesh.cp <= 1:
        return False
    if zero_stage >= 2:
        return software.zero_copy_buffers
    return software.fsdp_plain_dp and max(mesh.tp, mesh.pp, mesh.ep) > 1


def runs_ddp(mesh: Mesh, zero_stage: int) -> bool:
    """Whether plain DP (or ZeRO-1 on top of it) is PyTorch DDP: no TP, PP or EP beside it."""
    return zero_stage <= 1 and mesh.dp * mesh.cp > 1 and mesh.tp == mesh.pp == mesh.ep == 1


def fsdp_under_pipeline(mesh: Mesh, zero_stage: int, software: Software) -> bool:
    """Whether FSDP2 runs inside ``torch.distributed.pipelining`` stages (``_pipelined_ops``)."""
    return mesh.pp > 1 and software.fsdp_under_pipeline and runs_fsdp(mesh, zero_stage, software)


def optimizer_step_s(params: RankParams, *, cluster: Cluster, mesh: Mesh, zero_stage: int,
                     zero_group: int = 0) -> float:
    """Seconds of the Adam step on one GPU's optimizer shard (memory-bound)."""
    replicas = mesh.dp * mesh.cp
    shard = params.dense / ((zero_group * mesh.cp if zero_group else replicas) if zero_stage >= 1 else 1)
    shard += params.expert / (max(mesh.expert_replicas, 1) if zero_stage >= 1 else 1)
    accel = cluster.accelerator
    moved_s = OPTIMIZER_BYTES_PER_PARAM * shard / (accel.memory_bw_Bps * accel.memory_efficiency)
    return moved_s + 20 * accel.kernel_overhead_s  # a handful of foreach kernels
