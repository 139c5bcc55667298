"""``estimate(graph, cluster, plan, software=DEFAULT)``: the step time and the memory per GPU of a plan
run by a program (``software.py``: its attention kernel and what it overlaps; meshplan's runtime
by default).

Step time, with m micro-batches, p pipeline ranks, t_r the time of one micro-batch (forward,
backward and recomputation, with the TP/EP/CP communication inside it, the per-micro-batch
ZeRO-2/3 traffic that compute does not hide, and the exposed host copies of offloaded layers'
activations, ``_offload_s``, all in "exposed_comm") on pipeline rank r::

    step = m * max_r t_r                      compute + in-layer exposed communication
         + bubble(schedule, v, t_r)           pipeline.py: the ranks but the slowest, sum t_r / v
         + m * v * 2 * send_recv(b*s*h)       pipeline activations forward and gradients backward,
                                              exposed per micro-batch (Narayanan 2021 sec. 4.1)
         + exposed DP / ZeRO-1 reduction      data_parallel.py, after the last backward
         + the loss all-reduce                over dp x cp (and pp), for the step's mean loss
         + optimizer step                     data_parallel.optimizer_step_s, reported in "compute",
                                              plus its eager ops' dispatch (dispatch.py) and its
                                              square roots at their measured rate (0 on GPUs), and
                                              the m - 1 passes that add micro-batches' gradients

``time_s = {"compute", "exposed_comm", "bubble"}`` sums to ``step_time_s``, and on an accelerator calibrated
against published runs (``Accelerator.calibration`` c < 1, ``calibrated``) a fourth part, ``unpriced``,
adds (1/c - 1) of the priced compute outside the attention core (``Prediction.attention_s``): what those runs
spent beyond what the model prices. When CPU ranks
oversubscribe the cores (``Accelerator.shared_by`` > 1), a pipeline rank that waits lends its core
to the others: the step is the mean rank's work, or the critical path (the slowest rank's work and
bubble) at up to ``shared_by`` times the speed if that is longer. FLOPs per GPU are the
step's FLOPs (flops.py) over the world; MFU divides the model FLOP/s per GPU by the dense peak of
the plan's dtype (PaLM's definition, no recomputation counted), the hardware FLOP/s counts it.
Memory is the most loaded GPU (footprint.py).

Speed: everything that depends only on the graph is summarized once per graph (summary.py), layer
and collective costs are cached by shape, and pipeline ranks with the same layers are timed once,
so that a call costs tens of microseconds after the first.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.errors import InvalidPlanError
from ..ir.graph import Graph, ModelDims
from ..ir.plan import Plan, Prediction, Recompute
from .collectives import bus_bytes, collective_time
from .data_parallel import (OPTIMIZER_BYTES_PER_PARAM, DataParallelCost, RankParams, data_parallel_cost,
                            fsdp_under_pipeline, optimizer_step_s, rank_params)
from .dispatch import (optimizer_dispatch_s, partial_grad_allreduces, runs_dtensor_styles,
                       single_tensor_adamw_excess_s)
from .flops import attention_core_flops, layer_forward_flops, model_flops_per_step
from .footprint import offloaded_layer_bytes, peak_memory
from .hardware import Cluster
from .kernels import transcendental_excess_s
from .layer_cost import LayerCost, LayerShape, edge_cost, layer_cost
from .memory import ACTIVATION_BYTES, STATE_BYTES
from .pipeline import RankLayers, bubble_s, inflight_microbatches, rank_layers
from .software import DEFAULT, Software
from .sublayers import norm_reductions, replicated_params, replicated_sublayers, sublayer_shares
from .summary import ModelSummary, summary_of

FAMILIES = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTime:
    compute_s: float  # per micro-batch
    comm_s: float  # exposed, per micro-batch
    optimizer_s: float
    dp: DataParallelCost
    tp_cp_ep_bytes: dict[str, float]  # per micro-batch
    attention_s: float = 0.0  # of compute_s: the attention core's, forward, backward and recomputed

    @property
    def microbatch_s(self) -> float:
        return self.compute_s + self.comm_s


def check_plan(dims: ModelDims, cluster: Cluster, plan: Plan) -> None:
    """Raise if the plan does not fit the cluster or the model (with the arithmetic)."""
    m = plan.mesh
    if plan.world_size != cluster.world_size:
        raise InvalidPlanError(f"pp({m.pp}) * dp({m.dp}) * cp({m.cp}) * tp({m.tp}) = {plan.world_size} != "
                               f"{cluster.world_size} GPUs of {cluster.spec}")
    if plan.dtype not in STATE_BYTES:
        raise InvalidPlanError(f"dtype {plan.dtype!r} is not one of {sorted(STATE_BYTES)}")
    cluster.accelerator.peak(plan.dtype)
    if plan.recompute and len(plan.recompute) != dims.layers:
        raise InvalidPlanError(f"recompute has {len(plan.recompute)} entries but the model has {dims.layers} layers")
    if plan.stages and plan.stages[-1][1] != dims.layers:
        raise InvalidPlanError(f"stages cover {plan.stages[-1][1]} layers but the model has {dims.layers}")
    if dims.heads % m.tp:
        raise InvalidPlanError(f"tp({m.tp}) must divide heads({dims.heads}): "
                               f"{dims.heads} % {m.tp} = {dims.heads % m.tp}")
    if m.ep > 1 and dims.family != "moe":
        raise InvalidPlanError(f"ep({m.ep}) > 1 needs a mixture-of-experts model; this one is {dims.family!r}")
    if m.ep > 1 and dims.experts % m.ep:
        raise InvalidPlanError(f"ep({m.ep}) must divide experts({dims.experts}): {dims.experts} % {m.ep} = "
                               f"{dims.experts % m.ep}")
    if m.ep_over_tp and not plan.sequence_parallel:
        why = "mesh.fold_ep" if m.fold_ep else f"it does not divide dp * cp = {m.dp * m.cp}"
        raise InvalidPlanError(f"ep({m.ep}) takes tp ranks ({why}): each tp "
                               "rank then routes its own slice of the sequence, which needs sequence_parallel "
                               "(Megatron-Core requires it for MoE under TP)")


def _with_replicated(layer: LayerCost, whole: LayerCost, shares: dict[str, tuple[float, float]],
                     replicated: frozenset[str], saves_matmuls: bool) -> LayerCost:
    """The layer with the ``replicated`` sublayers' compute at tp = 1 (their FLOP share of the whole
    layer's time). Their TP communication is kept (conservative: without SP a replicated sublayer
    communicates nothing; with SP it gathers and slices the same volume)."""
    share = sum(shares[sub][0] for sub in replicated)
    core, core_bwd = (whole.core_fwd_s, whole.core_bwd_s) if "attn" in replicated else (layer.core_fwd_s,
                                                                                          layer.core_bwd_s)
    if saves_matmuls:  # selective recompute repeats every op but the matmuls: scaled as the layer's compute
        selective = layer.selective_fwd_s + share * (whole.selective_fwd_s - layer.selective_fwd_s)
    else:  # the attention core only
        selective = core
    return replace(layer, fwd_compute_s=layer.fwd_compute_s + share * (whole.fwd_compute_s - layer.fwd_compute_s),
                   bwd_compute_s=layer.bwd_compute_s + share * (whole.bwd_compute_s - layer.bwd_compute_s),
                   core_fwd_s=core, core_bwd_s=core_bwd, selective_fwd_s=selective)


def _rank_time(layers: RankLayers, layer: LayerCost, edge: LayerCost | None, summary: ModelSummary,
               cluster: Cluster, plan: Plan, software: Software) -> RankTime:
    n = layers.layers
    fwd = n * layer.fwd_compute_s
    bwd = n * layer.bwd_compute_s + layers.full * layer.fwd_compute_s + layers.selective * layer.selective_fwd_s
    comm = n * (layer.fwd_comm_s + layer.bwd_comm_s) + layers.full * layer.fwd_comm_s
    moved = {k: n * (layer.comm_bytes_fwd[k] + layer.comm_bytes_bwd[k]) + layers.full * layer.comm_bytes_fwd[k]
             for k in ("tp", "cp", "ep")}
    comm += _offload_s(layers, layer, summary, cluster, plan, software)
    if edge is not None:
        fwd, bwd, comm = fwd + edge.fwd_compute_s, bwd + edge.bwd_compute_s, comm + edge.fwd_comm_s + edge.bwd_comm_s
        moved["tp"] += edge.comm_bytes_fwd["tp"]
    params = rank_params(summary, layers, plan.mesh.tp, plan.mesh.ep, replicated_params(plan, summary.dims),
                         expert_tp=software.splits_experts_over_tp(plan.mesh.ep_over_tp))
    dp = data_parallel_cost(params, cluster=cluster, mesh=plan.mesh, zero_stage=plan.zero_stage, dtype=plan.dtype,
                            microbatches=plan.num_microbatches, fwd_window_s=fwd, bwd_window_s=bwd, software=software,
                            recomputed_share=layers.full / max(n, 1), zero_group=plan.zero_group)
    opt = optimizer_step_s(params, cluster=cluster, mesh=plan.mesh, zero_stage=plan.zero_stage,
                           zero_group=plan.zero_group)
    opt += optimizer_dispatch_s(summary.dims, cluster, layers=n, first=layers.first, last=layers.last,
                                tp=plan.mesh.tp, sp=plan.sequence_parallel, zero_stage=plan.zero_stage,
                                dp=plan.mesh.dp * plan.mesh.cp)  # the single-tensor AdamW's ops (dispatch.py)
    # AdamW's square root of the second moment, at its measured rate where that bounds it (CPUs)
    shard = _optimizer_shard_params(params, plan)
    opt += transcendental_excess_s(cluster.accelerator, "sqrt", shard, 2 * 4 * shard)  # fp32 r + w
    opt += single_tensor_adamw_excess_s(cluster, shard, OPTIMIZER_BYTES_PER_PARAM)  # one pass per op (CPUs)
    opt += _accumulation_s(params, cluster, plan, software)
    partial = partial_grad_allreduces(summary.dims, layers=n, last=layers.last, tp=plan.mesh.tp,
                                      sp=plan.sequence_parallel) if runs_dtensor_styles(software) else 0
    if partial:  # SP norms' Partial gradients, all-reduced by each AdamW op that reads them (dispatch.py)
        norm_bytes = summary.dims.hidden * ACTIVATION_BYTES[plan.dtype]
        opt += partial * (collective_time("all-reduce", norm_bytes, plan.mesh.tp, 1, cluster)
                          + cluster.accelerator.sync_overhead_s)
    # selective recomputation repeats the attention core (and, where the program saves only matmul outputs, more)
    attention = n * (layer.core_fwd_s + layer.core_bwd_s) + (layers.full + layers.selective) * layer.core_fwd_s
    return RankTime(compute_s=fwd + bwd + dp.compute_per_microbatch_s, comm_s=comm + dp.per_microbatch_s,
                    optimizer_s=opt + dp.compute_per_step_s, dp=dp,
                    tp_cp_ep_bytes=moved, attention_s=attention)


def _offload_s(layers: RankLayers, layer: LayerCost, summary: ModelSummary, cluster: Cluster, plan: Plan,
               software: Software) -> float:
    """Exposed seconds per micro-batch of copying the offloaded layers' activations to host memory in the
    forward and back in the backward over the GPU's host link (``Accelerator.host_link_Bps``): hidden
    under each layer's compute where the program copies on streams of its own
    (``Software.offload_overlap``), else the copies' whole time."""
    if not layers.offload:
        return 0.0
    copy_s = offloaded_layer_bytes(summary, plan, software) / cluster.accelerator.host_link_Bps
    if software.offload_overlap:
        return layers.offload * (max(0.0, copy_s - layer.fwd_compute_s) + max(0.0, copy_s - layer.bwd_compute_s))
    return layers.offload * 2.0 * copy_s


def _accumulation_s(params: RankParams, cluster: Cluster, plan: Plan, software: Software) -> float:
    """Seconds of adding each micro-batch's weight gradients after the first to the accumulated ones
    (``Software.grad_accumulation_add``): read both, write one. FSDP2 adds reduce-scattered shards,
    except under torch pipelining, where the gradients stay unsharded until after the schedule."""
    if not software.grad_accumulation_add or plan.num_microbatches <= 1:
        return 0.0
    sharded = plan.zero_stage >= 2 and not fsdp_under_pipeline(plan.mesh, plan.zero_stage, software)
    count = _optimizer_shard_params(params, plan) if sharded else params.dense + params.expert
    grad_b = STATE_BYTES[plan.dtype][1]
    accel = cluster.accelerator
    return (plan.num_microbatches - 1) * 3 * grad_b * count / (accel.memory_bw_Bps * accel.memory_efficiency)


def _optimizer_shard_params(params: RankParams, plan: Plan) -> float:
    """Parameters of one rank's optimizer shard, as ``data_parallel.optimizer_step_s`` shards them."""
    mesh, replicas = plan.mesh, plan.mesh.dp * plan.mesh.cp
    if plan.zero_stage < 1:
        return params.dense + params.expert
    dense_group = plan.zero_group * mesh.cp if plan.zero_group else replicas
    return params.dense / dense_group + params.expert / max(mesh.expert_replicas, 1)


def _rank_times(summary: ModelSummary, cluster: Cluster, plan: Plan, shape: LayerShape,
                ranks: tuple[RankLayers, ...], software: Software) -> list[RankTime]:
    """One entry per pipeline rank (ranks with the same layers are timed once)."""
    layer = layer_cost(shape, cluster)
    replicated = replicated_sublayers(plan)
    if replicated:
        whole = layer_cost(replace(shape, tp=1, sp=False), cluster)
        layer = _with_replicated(layer, whole, sublayer_shares(shape.dims, plan.seq_len), replicated,
                                 shape.software.selective_saves_matmuls)
    if reductions := norm_reductions(plan, replicated):  # a norm's statistics over features tp split (OLMo 2's q_norm)
        stats = 4.0 * shape.tokens  # one fp32 number a token
        one = collective_time("all-reduce", stats, shape.tp, 1, cluster) + cluster.accelerator.sync_overhead_s
        moved = reductions * bus_bytes("all-reduce", stats, shape.tp)
        layer = replace(layer, fwd_comm_s=layer.fwd_comm_s + reductions * one,
                        bwd_comm_s=layer.bwd_comm_s + reductions * one,
                        comm_bytes_fwd={**layer.comm_bytes_fwd, "tp": layer.comm_bytes_fwd["tp"] + moved},
                        comm_bytes_bwd={**layer.comm_bytes_bwd, "tp": layer.comm_bytes_bwd["tp"] + moved})
    seen: dict[tuple, RankTime] = {}
    out = []
    for r in ranks:
        key = r.kind
        if key not in seen:
            edge = edge_cost(shape, cluster, first=r.first, last=r.last) if (r.first or r.last) else None
            seen[key] = _rank_time(r, layer, edge, summary, cluster, plan, software)
        out.append(seen[key])
    return out


def _step_parts(times: list[RankTime], cluster: Cluster, plan: Plan, p2p_s: float) -> dict[str, float]:
    """compute, exposed communication and bubble of a step (see the module docstring)."""
    m, mesh = plan.num_microbatches, plan.mesh
    slowest = max(times, key=lambda t: t.microbatch_s)
    # one entry per pipeline rank (``_rank_times``); the pp ranks beside each other run the same stages
    bubble = bubble_s(plan.schedule, plan.vp, [t.microbatch_s for t in times])
    per_step = max(t.dp.per_step_s for t in times)
    parts = {"compute": m * slowest.compute_s + max(t.optimizer_s for t in times),
             "exposed_comm": m * slowest.comm_s + p2p_s + per_step, "bubble": bubble}
    shared = cluster.accelerator.shared_by
    if shared <= 1 or mesh.pp <= 1:
        return parts
    # oversubscribed cores: a rank idle in the bubble or ahead of the slowest stage lends its core, so the
    # step is the mean rank's work, unless the critical path at up to ``shared`` times the speed is longer
    mean = {k: sum(getattr(t, k) for t in times) / len(times) for k in ("compute_s", "comm_s", "optimizer_s")}
    parts = {"compute": m * mean["compute_s"] + mean["optimizer_s"],
             "exposed_comm": m * mean["comm_s"] + p2p_s + per_step, "bubble": 0.0}
    critical = (m * slowest.microbatch_s + bubble + slowest.optimizer_s) / shared + p2p_s + per_step
    parts["bubble"] = max(0.0, critical - sum(parts.values()))
    return parts


def _pipeline_p2p(cluster: Cluster, plan: Plan, summary: ModelSummary) -> tuple[float, float]:
    """(exposed seconds, bytes sent per GPU) of pipeline send/recv per step."""
    m = plan.mesh
    if m.pp <= 1:
        return 0.0, 0.0
    act = (plan.micro_batch_size * plan.seq_len / m.cp * summary.dims.hidden * ACTIVATION_BYTES[plan.dtype]
           / (m.tp if plan.sequence_parallel else 1))
    transfers = plan.num_microbatches * plan.vp * 2  # activation forward, its gradient backward
    each = collective_time("send-recv", act, 2, m.dp * m.cp * m.tp, cluster) + _sync_wait(cluster)
    return transfers * each, transfers * act


def _tied_head_s(cluster: Cluster, plan: Plan, summary: ModelSummary) -> float:
    """A head tied to the embedding under pipeline parallelism: the first and the last stage each hold the table,
    and after the backward the two copies' gradients are all-reduced between them (Megatron-LM
    ``_allreduce_word_embedding_grads``; ``runtime.pipeline.TiedWeights``), each rank's shard of them under
    ZeRO-2/3."""
    m = plan.mesh
    if m.pp <= 1 or not summary.tied_params:
        return 0.0
    shard = (plan.zero_group or m.dp) if plan.zero_stage >= 2 else 1  # HSDP: the shard group's
    nbytes = summary.tied_params / m.tp / shard * STATE_BYTES[plan.dtype][1]
    return collective_time("all-reduce", nbytes, 2, (m.pp - 1) * m.dp * m.cp * m.tp, cluster) + _sync_wait(cluster)


def _sync_wait(cluster: Cluster) -> float:
    """What a blocking call waits for the rank that computes last: calibrated on CPU ranks, 0 on GPUs."""
    return cluster.accelerator.sync_overhead_s if cluster.cpu_ranks else 0.0


def _loss_reduce_s(cluster: Cluster, plan: Plan) -> float:
    """The step's mean loss, all-reduced over the ranks that see other tokens (and the pipeline)."""
    m = plan.mesh
    t = collective_time("all-reduce", 4.0, m.dp * m.cp, m.tp, cluster) + _sync_wait(cluster)
    return t + (collective_time("all-reduce", 4.0, m.pp, m.dp * m.cp * m.tp, cluster) if m.pp > 1 else 0.0)


def _ep_overlap(plan: Plan, software: Software) -> bool:
    """Whether the EP all-to-alls run under another micro-batch's compute: ``Software.ep_comm_overlap`` where
    Megatron allows it (expert parallelism, no full recomputation, virtual stages under pipelining)."""
    m = plan.mesh
    return (software.ep_comm_overlap and m.ep > 1 and (m.pp == 1 or plan.vp > 1)
            and Recompute.FULL not in plan.recompute)


@dataclass(frozen=True, slots=True)
class _Timed:
    """What the step's time needs and the prediction reuses (``_timed``)."""

    summary: ModelSummary
    ranks: tuple[RankLayers, ...]
    times: list[RankTime]
    time_s: dict[str, float]
    attention_s: float
    p2p_bytes: float


def _timed(graph: Graph, cluster: Cluster, plan: Plan, software: Software) -> _Timed:
    summary = summary_of(graph)
    dims = summary.dims
    check_plan(dims, cluster, plan)
    mesh, m = plan.mesh, plan.num_microbatches
    shape = LayerShape(dims=dims, micro_batch=plan.micro_batch_size, seq_len=plan.seq_len, tp=mesh.tp, cp=mesh.cp,
                       ep=mesh.ep, ep_over_tp=mesh.ep_over_tp, ep_overlap=_ep_overlap(plan, software),
                       sp=plan.sequence_parallel, dtype=plan.dtype,
                       software=software, fusions=plan.fusions)  # the fused kernels' traffic replaces their eager ops' (fusion.py)
    ranks = _ranks(plan, summary, cluster, software)
    times = _rank_times(summary, cluster, plan, shape, ranks, software)
    p2p_s, p2p_bytes = _pipeline_p2p(cluster, plan, summary)
    attention_s = m * max(times, key=lambda t: t.microbatch_s).attention_s  # the slowest rank's, as compute's
    per_step = p2p_s + _loss_reduce_s(cluster, plan) + _tied_head_s(cluster, plan, summary)
    time_s = calibrated(_step_parts(times, cluster, plan, per_step), cluster, attention_s)
    return _Timed(summary=summary, ranks=ranks, times=times, time_s=time_s, attention_s=attention_s,
                  p2p_bytes=p2p_bytes)


def estimate(graph: Graph, cluster: Cluster, plan: Plan, *, software: Software = DEFAULT) -> Prediction:
    """Predicted step time and per-GPU memory of ``plan`` for ``graph`` on ``cluster``, run by
    ``software``. ``plan.prediction`` is ignored."""
    t = _timed(graph, cluster, plan, software)
    memory = peak_memory(t.summary, plan, t.ranks, software)
    return _prediction(t.summary.dims, cluster, plan, t.ranks, sum(t.time_s.values()), t.time_s, memory,
                       _comm_bytes(t.times, plan.num_microbatches, t.p2p_bytes), t.attention_s)


def step_time(graph: Graph, cluster: Cluster, plan: Plan, *, software: Software = DEFAULT) -> float:
    """``estimate(...).step_time_s`` without the memory and the rest of the prediction: what the search
    orders its candidates by (``solver.search``), a third less work a candidate."""
    return sum(_timed(graph, cluster, plan, software).time_s.values())


def calibrated(time_s: dict[str, float], cluster: Cluster, attention_s: float = 0.0) -> dict[str, float]:
    """``time_s`` with the ``unpriced`` part of a calibrated accelerator (``Accelerator.calibration`` c < 1):
    (1/c - 1) of the priced compute outside the fused attention core (``attention_s`` of ``time_s["compute"]``).
    Fitted on published runs (``bench/reference_runs.py``), it stands for what the model leaves out of the GPU's
    work (a launch that waits on the host, a kernel's ramp and tail, clocks under a training load): the
    attention core is priced at the rate NVIDIA's and FlashAttention's benchmarks of that very kernel measured at
    the plan's sequence length, the exposed communication and the bubble from the links and the schedule; and the
    published runs whose step the attention core fills most (NeMo's long-sequence table, 9 rows) are priced at
    -0.2% on average without any, where a share of the whole step made them 11.4% slow. Leaving each source out,
    a share of the compute outside attention predicted better than a share of the whole step when it came in (MAPE
    9.2% against 9.9% over 573 runs, ``bench/reference_runs.py``). A plan with more compute for the same step pays
    more."""
    c = cluster.accelerator.calibration
    if c >= 1.0:
        return time_s
    return {**time_s, "unpriced": max(0.0, time_s["compute"] - attention_s) * (1.0 / c - 1.0)}


def _comm_bytes(times: list[RankTime], microbatches: int, p2p_bytes: float) -> dict[str, float]:
    out = {k: microbatches * max(t.tp_cp_ep_bytes[k] for t in times) for k in ("tp", "cp", "ep")}
    out["pp"] = p2p_bytes
    out["dp"] = max(t.dp.bus_bytes for t in times)
    return {k: out[k] for k in FAMILIES}


def _prediction(dims: ModelDims, cluster: Cluster, plan: Plan, ranks: tuple[RankLayers, ...], step_s: float,
                time_s: dict[str, float], memory: dict[str, float], comm_bytes: dict[str, float],
                attention_s: float) -> Prediction:
    world = plan.world_size
    model_flops = model_flops_per_step(dims, plan.global_batch, plan.seq_len)
    full = sum(r.full for r in ranks)
    selective = sum(r.selective for r in ranks)
    recompute_flops = (full * layer_forward_flops(dims, plan.global_batch, plan.seq_len)
                       + selective * attention_core_flops(dims, plan.global_batch, plan.seq_len))
    hw_flops = model_flops + recompute_flops
    model_per_gpu = model_flops / world / step_s
    return Prediction(step_time_s=step_s, tokens_per_s=plan.global_batch * plan.seq_len / step_s,
                      model_tflops_per_gpu=model_per_gpu / 1e12,
                      hardware_tflops_per_gpu=hw_flops / world / step_s / 1e12,
                      mfu=model_per_gpu / cluster.accelerator.peak(plan.dtype),
                      peak_memory_bytes=sum(memory.values()), memory_bytes=memory, time_s=time_s,
                      memory_limit_bytes=cluster.accelerator.usable_memory_bytes, comm_bytes=comm_bytes,
                      attention_s=attention_s)


def memory_breakdown(graph: Graph, cluster: Cluster, plan: Plan, *,
                     software: Software = DEFAULT) -> dict[str, float]:
    """Bytes of the most loaded GPU by kind: params, grads, optimizer, activations, buffers."""
    summary = summary_of(graph)
    check_plan(summary.dims, cluster, plan)
    return peak_memory(summary, plan, _ranks(plan, summary, cluster, software), software)


def _ranks(plan: Plan, summary: ModelSummary, cluster: Cluster, software: Software) -> tuple[RankLayers, ...]:
    """``rank_layers``; without a host link (a CPU rank, whose activations are in host memory already)
    offloading moves nothing and frees nothing, so an offloaded layer keeps what it would keep. Host memory
    holds only ``host_offload_layers`` offloaded layers of a rank: the rest keep their activations on the GPU
    (and copy nothing), so a plan that offloads more than the host holds shows it in its GPU memory."""
    ranks = rank_layers(plan, summary.dims.layers)
    if cluster.accelerator.host_link_Bps <= 0:
        return tuple(replace(r, none=r.none + r.offload, offload=0) for r in ranks)
    if cluster.accelerator.host_memory_bytes <= 0 or not any(r.offload for r in ranks):
        return ranks  # nothing to check (every estimate of a plan that offloads nothing passes here)
    out = []
    for r in ranks:
        kept = max(0, r.offload - host_offload_layers(summary, cluster, plan, r.rank, software)) if r.offload else 0
        out.append(replace(r, none=r.none + kept, offload=r.offload - kept) if kept else r)
    return tuple(out)


def host_offload_layers(summary: ModelSummary, cluster: Cluster, plan: Plan, rank: int = 0,
                        software: Software = DEFAULT) -> int | None:
    """How many offloaded layers pipeline rank ``rank``'s share of host memory holds
    (``Accelerator.host_memory_bytes``): each keeps its activations there for every micro-batch the rank has in
    flight (``pipeline.inflight_microbatches``); None where the host memory is not known (0)."""
    host = cluster.accelerator.host_memory_bytes
    if host <= 0:
        return None
    per = offloaded_layer_bytes(summary, plan, software) * inflight_microbatches(
        plan.schedule, plan.mesh.pp, plan.vp, plan.num_microbatches, rank)
    return int(host // per) if per > 0 else summary.dims.layers
