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
  (same 2 Psi volume);
* stage 2: per micro-batch, all-gather of the parameters and reduce-scatter of the gradients;
* stage 3: per micro-batch, all-gather forward, all-gather again backward, reduce-scatter
  (3 Psi; 1.5x DP at m = 1).

Overlap: gradients are reduced in buckets while the backward runs (PyTorch DDP, Li et al. 2020,
VLDB); only the last bucket, about the largest layer's worth, waits after the last layer. FSDP
prefetches the next layer's parameters while the current one computes, so only the first layer's
gather waits. Whatever exceeds the compute window is exposed too::

    exposed = tail + max(0, comm - tail - window)

The optimizer step (Adam) is memory-bound: about 36 bytes per parameter of its shard (fp32
master, momentum and variance read and written, the gradient read for the update and for the
global norm, the 16-bit copy written, the gradient zeroed). It is reported inside "compute".
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.plan import Mesh
from .collectives import bus_bytes, collective_time
from .hardware import Cluster
from .memory import STATE_BYTES
from .pipeline import RankLayers
from .summary import ModelSummary

OPTIMIZER_BYTES_PER_PARAM = 36


@dataclass(frozen=True, slots=True, kw_only=True)
class RankParams:
    """Parameters one GPU holds before ZeRO sharding."""

    dense: float  # replicated over dp * cp
    expert: float  # replicated over dp * cp / ep
    bucket: float  # the largest unit: a layer, the embedding or the output layer


@dataclass(frozen=True, slots=True, kw_only=True)
class DataParallelCost:
    per_microbatch_s: float  # exposed once per micro-batch (ZeRO-2/3), inside the pipeline
    per_step_s: float  # exposed once per step, after the last backward (DP, ZeRO-1)
    bus_bytes: float  # per GPU per step


def rank_params(summary: ModelSummary, layers: RankLayers, tp: int, ep: int) -> RankParams:
    per_layer = summary.tp_params / tp + summary.norm_params
    experts = summary.expert_params / (tp * ep)
    edges = [per_layer + experts]
    dense = layers.layers * per_layer
    if layers.first:
        dense += summary.embed_params / tp
        edges.append(summary.embed_params / tp)
    if layers.last:
        dense += summary.head_params / tp
        edges.append(summary.head_params / tp)
    return RankParams(dense=dense, expert=layers.layers * experts, bucket=max(edges))


def _overlap(comm_s: float, tail_s: float, window_s: float) -> float:
    tail_s = min(tail_s, comm_s)
    return tail_s + max(0.0, comm_s - tail_s - window_s)


def _group(kind: str, nbytes: float, size: int, stride: int, cluster: Cluster) -> tuple[float, float]:
    return collective_time(kind, nbytes, size, stride, cluster), bus_bytes(kind, nbytes, size)


def data_parallel_cost(params: RankParams, *, cluster: Cluster, mesh: Mesh, zero_stage: int, dtype: str,
                       microbatches: int, fwd_window_s: float, bwd_window_s: float) -> DataParallelCost:
    param_b, grad_b, _ = STATE_BYTES[dtype]
    replicas = mesh.dp * mesh.cp
    groups = [(params.dense, replicas, mesh.tp), (params.expert, replicas // mesh.ep, mesh.tp * mesh.ep)]
    ops = {0: (("all-reduce", grad_b, "bwd"),),
           1: (("reduce-scatter", grad_b, "bwd"), ("all-gather", param_b, "fwd")),
           2: (("all-gather", param_b, "fwd"), ("reduce-scatter", grad_b, "bwd")),
           3: (("all-gather", param_b, "fwd"), ("all-gather", param_b, "bwd"), ("reduce-scatter", grad_b, "bwd"))}
    comm = {"fwd": 0.0, "bwd": 0.0}
    tail = {"fwd": 0.0, "bwd": 0.0}
    moved = 0.0
    for count, size, stride in groups:
        if count <= 0 or size <= 1:
            continue
        share = min(params.bucket / count, 1.0)
        for kind, elem_b, phase in ops[zero_stage]:
            t, b = _group(kind, count * elem_b, size, stride, cluster)
            comm[phase] += t
            tail[phase] += t * share
            moved += b
    exposed = _overlap(comm["fwd"], tail["fwd"], fwd_window_s) + _overlap(comm["bwd"], tail["bwd"], bwd_window_s)
    if zero_stage >= 2:
        return DataParallelCost(per_microbatch_s=exposed, per_step_s=0.0, bus_bytes=moved * microbatches)
    return DataParallelCost(per_microbatch_s=0.0, per_step_s=exposed, bus_bytes=moved)


def optimizer_step_s(params: RankParams, *, cluster: Cluster, mesh: Mesh, zero_stage: int) -> float:
    """Seconds of the Adam step on one GPU's optimizer shard (memory-bound)."""
    replicas = mesh.dp * mesh.cp
    shard = params.dense / (replicas if zero_stage >= 1 else 1)
    shard += params.expert / (max(replicas // mesh.ep, 1) if zero_stage >= 1 else 1)
    accel = cluster.accelerator
    moved_s = OPTIMIZER_BYTES_PER_PARAM * shard / (accel.memory_bw_Bps * accel.memory_efficiency)
    return moved_s + 20 * accel.kernel_overhead_s  # a handful of foreach kernels
