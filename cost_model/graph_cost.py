"""The per-node cost path: a model without repeated blocks (an ``nn.Sequential`` MLP, a one-off
network), priced from its traced graph, node by node, under data parallelism and ZeRO.

The transformer path (``estimate.py``) prices a model per block from closed-form formulas over
``ModelDims``; a model with no blocks has no such dims, so its work comes from the graph itself:

* **FLOPs.** Each node's forward FLOPs are the frontend's own count (``frontend/op_rules.py``: a
  multiply-add counts 2, as ``torch.utils.flop_counter.FlopCounterMode`` counts aten matmuls; a test
  checks the two agree). The backward of a matmul, an attention core and a routed-expert leaf is
  twice the forward (input and weight gradients; Kaplan et al. 2020, arXiv:2001.08361, sec. 2.1;
  Narayanan et al. 2021, arXiv:2104.04473, eq. 3), except a matmul that reads the model's input
  directly: autograd computes no gradient for the input, so its backward is the weight gradient
  alone (1x). Every other op's backward is counted as one forward (they are memory-bound: their
  FLOPs do not set their time).
* **Time of one micro-batch.** A matmul ``(m, k) @ (k, n)`` (m the output's rows, n its last dim, k
  the input's last dim) is timed by ``kernels.matmul_fwd_bwd_s``; an attention core by
  ``kernels.attention_fwd_bwd_s`` counted as full (not causal: the mask is not known here, so round
  up); any other op is memory-bound at the node's traced bytes (``kernels.memory_time_s``), its
  backward reading and writing twice as much (the output's gradient and the saved input read, the
  input's gradient written), plus GELU's measured excess on CPU profiles. Every node is one eager
  dispatch forward and two backward, each parameter one more (AccumulateGrad): an approximation of
  ``dispatch.py``'s per-module counts, which only CPU profiles price (``dispatch_s`` is 0 on GPUs).
* **Activations saved for backward.** Every tensor that an op other than a view reads (views share
  their producer's storage: a chain of views counts its producer once), and the model's outputs
  (the loss keeps them for its backward), at the plan's activation dtype. This is what PyTorch's
  autograd saves for linears (their input), GELU/ReLU/norms/softmax (their input or output, the same
  size), and an upper bound for ops that save nothing (an add): rounded up, never down. During the
  backward the largest activation's gradient and its input's gradient are alive beside them (2x
  the largest activation, added).
* **Model states and buffers** are ``footprint.rank_memory``'s, for one rank holding every
  parameter (no layer, no pipeline): ZeRO as ``memory.state_bytes`` shards them, DDP's and FSDP2's
  buffers. The runtime (``codegen/lower.py``) makes the model's root one FSDP unit (and the token
  embedding and output head units of their own, when the frontend found them) that stays gathered
  from the forward to the end of the backward at ZeRO-2 and ZeRO-3 alike, so both stages run the
  same program: their traffic is priced as ZeRO-2's (one gather and one reduce-scatter per
  micro-batch; ``data_parallel.data_parallel_cost``) and their memory as ZeRO-3's (parameters
  sharded at rest, the gathered unit beside them, counted whole: rounding up). The optimizer step's
  temporary is counted as if no activation were freed by then (rounding up).

Step time, with m micro-batches (no pipeline, so no bubble)::

    step = m * (fwd + bwd + DP/ZeRO per micro-batch) + DP/ZeRO per step + optimizer + loss all-reduce

Approximate, and stated so in the plan's report: the per-op dispatch counts, the saved-activation
rule above, and ops other than matmul, attention and memory-bound elementwise (priced at their
traced bytes only).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.graph import BATCH, DTYPE_BYTES, SEQ, Graph, ModelDims, Node, OpKind
from ..ir.plan import Plan, Prediction
from .data_parallel import OPTIMIZER_BYTES_PER_PARAM, RankParams, data_parallel_cost, optimizer_step_s
from .dispatch import optimizer_dispatches, single_tensor_adamw_excess_s
from .estimate import _accumulation_s, _loss_reduce_s, _optimizer_shard_params, calibrated
from .footprint import rank_memory
from .hardware import Cluster
from .kernels import (attention_fwd_bwd_s, matmul_fwd_bwd_s, matmul_time_s, memory_time_s,
                      transcendental_excess_s)
from .memory import ACTIVATION_BYTES
from .pipeline import RankLayers
from .software import DEFAULT, Software
from .summary import ModelSummary

TWICE_FORWARD = frozenset({OpKind.MATMUL, OpKind.ATTENTION, OpKind.MOE})  # backward FLOPs = 2x forward
# a stand-in for the footprint's transformer dims: no layer, no vocabulary, no tp/pp/cp/ep buffers
_NO_LAYERS = ModelDims(family="custom", layers=0, hidden=1, heads=0, kv_heads=0, ffn_hidden=0, vocab=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphWork:
    """One micro-batch of ``micro_batch`` samples on one GPU, summed over the graph's nodes."""

    fwd_flops: float
    bwd_flops: float
    fwd_s: float
    bwd_s: float
    activation_bytes: float  # saved for the backward, plus the gradients alive beside them


def graph_work(graph: Graph, cluster: Cluster, *, micro_batch: int, seq_len: int, dtype: str) -> GraphWork:
    """The FLOPs, seconds and activation bytes of one micro-batch (see the module docstring)."""
    at = {BATCH: micro_batch, SEQ: seq_len}
    accel, elem_b = cluster.accelerator, ACTIVATION_BYTES[dtype]
    scale = elem_b / DTYPE_BYTES[graph.dtype]  # traced bytes are at the graph's dtype
    fwd_flops = bwd_flops = fwd_s = bwd_s = 0.0
    ops = 0
    inputs = {n.name for n in graph.nodes if not n.inputs}  # the placeholders: the model's inputs
    for node in graph.nodes:
        if not node.inputs:
            continue  # a placeholder
        flops = float(node.flops.subs(at))
        input_grad = node.inputs[0] not in inputs
        fwd_flops += flops
        bwd_flops += 2 * flops if node.op in TWICE_FORWARD and input_grad else flops
        f, b = _node_time_s(node, accel, dtype, flops, float(node.bytes.subs(at)) * scale, at, elem_b, input_grad)
        fwd_s, bwd_s, ops = fwd_s + f, bwd_s + b, ops + 1
    fwd_s += ops * accel.dispatch_s
    bwd_s += (2 * ops + len(graph.params)) * accel.dispatch_s
    return GraphWork(fwd_flops=fwd_flops, bwd_flops=bwd_flops, fwd_s=fwd_s, bwd_s=bwd_s,
                     activation_bytes=_activation_bytes(graph, at, elem_b))


def _node_time_s(node: Node, accel, dtype: str, flops: float, moved_bytes: float, at: dict, elem_b: int,
                 input_grad: bool) -> tuple[float, float]:
    """(forward, backward) seconds of one node; without ``input_grad`` a matmul's backward is its weight
    gradient alone."""
    if node.op == OpKind.VIEW:
        return 0.0, 0.0
    out = node.outputs[0] if node.outputs else None
    if node.op == OpKind.MATMUL and out is not None and out.shape and node.input_metas:
        n = float(out.shape[-1].subs(at))
        m = float(out.numel.subs(at)) / n  # (..., m, n): the leading dims are rows of the output
        k = float(node.input_metas[0].shape[-1].subs(at))
        if not input_grad:  # dW = X^T (k, m) @ dY (m, n) only
            return (matmul_time_s(accel, dtype, m, n, k, elem_b),
                    matmul_time_s(accel, dtype, k, n, m, elem_b) / accel.matmul_bwd_efficiency)
        return matmul_fwd_bwd_s(accel, dtype, m, n, k, elem_b)
    if node.op == OpKind.ATTENTION:
        return attention_fwd_bwd_s(accel, dtype, flops, causal=False)
    if node.op in TWICE_FORWARD:  # a matmul of unknown shape, a routed-expert leaf: a roofline
        fwd = max(flops / accel.achievable_flops(dtype), memory_time_s(accel, moved_bytes, 0)) + accel.kernel_overhead_s
        return fwd, (2 if input_grad else 1) * fwd
    fwd, bwd = memory_time_s(accel, moved_bytes, 1), memory_time_s(accel, 2 * moved_bytes, 1)
    if "gelu" in node.target and out is not None:
        elems = float(out.numel.subs(at))
        fwd += transcendental_excess_s(accel, "gelu", elems, moved_bytes)
        bwd += transcendental_excess_s(accel, "gelu_backward", elems, 2 * moved_bytes)
    return fwd, bwd


def _activation_bytes(graph: Graph, at: dict, elem_b: int) -> float:
    """Bytes saved for the backward (each tensor a non-view op reads, through views to its producer,
    and the outputs), plus twice the largest of them for the gradients alive during the backward."""
    root = {}  # a view's output -> the node whose storage it shares
    consumed = set()
    saved = set()
    for node in graph.nodes:
        if node.op == OpKind.VIEW and len(node.inputs) == 1:
            root[node.name] = root.get(node.inputs[0], node.inputs[0])
            consumed.add(node.inputs[0])
            continue
        for name in node.inputs:
            consumed.add(name)
            saved.add(root.get(name, name))
    saved |= {root.get(n.name, n.name) for n in graph.nodes if n.name not in consumed and n.inputs}
    sizes = [_output_bytes(graph.node(name), at, elem_b) for name in saved]
    return sum(sizes) + 2 * max(sizes, default=0.0)


def _output_bytes(node: Node, at: dict, elem_b: int) -> float:
    """A node's outputs at the plan's activation dtype (integer tensors at their own size)."""
    return sum(float(out.numel.subs(at)) * (elem_b if "float" in out.dtype else DTYPE_BYTES[out.dtype])
               for out in node.outputs)


def rank_params(graph: Graph) -> RankParams:
    """Every parameter on every rank (no tp, pp or ep). FSDP units as ``codegen/lower.py`` makes them
    under ZeRO-2/3: the root, and the embedding and output head on their own when found (untied)."""
    s = graph.structure
    units = 1 + (2 if s is not None and s.embed and s.head and not s.tied_head else 0)
    return RankParams(dense=graph.param_count, expert=0.0, bucket=graph.param_count, units=units,
                      tensors=max(len(graph.params), 1))


def graph_memory(graph: Graph, plan: Plan, work: GraphWork, software: Software = DEFAULT) -> dict[str, float]:
    """Bytes of one GPU by kind: ``footprint.rank_memory`` of a rank holding every parameter as one
    unit (ZeRO-2 priced as ZeRO-3: the same program here), plus the graph's activations."""
    total = graph.param_count
    summary = ModelSummary(dims=_NO_LAYERS, total_params=total, tp_params=0, norm_params=0, expert_params=0,
                           embed_params=total, head_params=0)
    as_run = replace(plan, zero_stage=3) if plan.zero_stage == 2 else plan
    return rank_memory(summary, as_run, RankLayers(rank=0, first=True, last=True), software,
                       activations=work.activation_bytes)


def graph_estimate(graph: Graph, cluster: Cluster, plan: Plan, *, work: GraphWork | None = None,
                   software: Software = DEFAULT) -> Prediction:
    """Predicted step time and per-GPU memory of a data-parallel ``plan`` (dp = world, ZeRO 0..3) for a
    model without blocks. ``work``: ``graph_work`` at the plan's micro-batch, when already computed."""
    mesh, m = plan.mesh, plan.num_microbatches
    if max(mesh.tp, mesh.pp, mesh.cp, mesh.ep) > 1 or plan.world_size != cluster.world_size:
        raise ValueError(f"graph_estimate prices data parallelism over the whole cluster only: mesh {mesh} "
                         f"on {cluster.world_size} GPUs; a model with blocks goes through estimate()")
    work = work or graph_work(graph, cluster, micro_batch=plan.micro_batch_size, seq_len=plan.seq_len,
                              dtype=plan.dtype)
    params = rank_params(graph)
    traffic_stage = min(plan.zero_stage, 2)  # one unit that stays gathered: ZeRO-3 moves ZeRO-2's bytes
    dp = data_parallel_cost(params, cluster=cluster, mesh=mesh, zero_stage=traffic_stage, dtype=plan.dtype,
                            microbatches=m, fwd_window_s=work.fwd_s, bwd_window_s=work.bwd_s, software=software)
    opt = _optimizer_s(params, cluster, plan, software)
    time_s = {"compute": m * (work.fwd_s + work.bwd_s + dp.compute_per_microbatch_s) + opt + dp.compute_per_step_s,
              "exposed_comm": m * dp.per_microbatch_s + dp.per_step_s + _loss_reduce_s(cluster, plan),
              "bubble": 0.0}
    time_s = calibrated(time_s, cluster)
    step_s = sum(time_s.values())
    memory = graph_memory(graph, plan, work, software)
    flops_per_gpu = m * (work.fwd_flops + work.bwd_flops)  # every sample once a step, no recomputation
    return Prediction(step_time_s=step_s, tokens_per_s=plan.global_batch * plan.seq_len / step_s,
                      model_tflops_per_gpu=flops_per_gpu / step_s / 1e12,
                      hardware_tflops_per_gpu=flops_per_gpu / step_s / 1e12,
                      mfu=flops_per_gpu / step_s / cluster.accelerator.peak(plan.dtype),
                      peak_memory_bytes=sum(memory.values()), memory_bytes=memory, time_s=time_s,
                      memory_limit_bytes=cluster.accelerator.usable_memory_bytes,
                      comm_bytes={"tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0, "dp": dp.bus_bytes})


def _optimizer_s(params: RankParams, cluster: Cluster, plan: Plan, software: Software) -> float:
    """The AdamW step on this rank's shard, as ``estimate._rank_time`` prices it: its memory traffic,
    its eager ops (single-tensor AdamW on CPU tensors), its square roots, and the micro-batches'
    gradient additions."""
    mesh, accel = plan.mesh, cluster.accelerator
    opt = optimizer_step_s(params, cluster=cluster, mesh=mesh, zero_stage=plan.zero_stage)
    plain_ops, dtensor_ops = optimizer_dispatches(params.tensors, 0, zero_stage=plan.zero_stage, dp=mesh.dp)
    opt += plain_ops * accel.dispatch_s + dtensor_ops * accel.dtensor_dispatch_s
    shard = _optimizer_shard_params(params, plan)
    opt += transcendental_excess_s(accel, "sqrt", shard, 2 * 4 * shard)  # fp32 read + write
    opt += single_tensor_adamw_excess_s(cluster, shard, OPTIMIZER_BYTES_PER_PARAM)
    return opt + _accumulation_s(params, cluster, plan, software)

