"""The framework's cost per op: how many aten ops meshplan's runtime dispatches eagerly per layer,
per model edge and per optimizer step, and how many of them run on DTensors.

On a CPU an eager op costs its kernel plus a fixed framework share (Python, the dispatcher,
autograd's node), and an op on DTensors costs several times more (sharding propagation, unwrapping
and wrapping the local tensors). Seconds = dispatches x ``Accelerator.dispatch_s`` (plain) or
``dtensor_dispatch_s``; both are measured by ``meshplan calibrate`` (a chain of tiny autograd ops,
its time over the dispatches it makes, ``profile.py``) and 0 on GPU presets, where launches run
ahead of the kernels. The counts come from the program's structure: the zoo's modules
(``zoo/models.py``), the tensor-parallel styles (``codegen/tp_plans.py``) and PyTorch's own
decompositions, and a gloo run that counts every dispatch with a ``TorchDispatchMode`` checks them
(``tests/cost_model/test_dispatch_counts.py``). Collectives and their buffers are not counted here
(``collectives.py`` times them).

GPT, per layer (Llama/MoE: the same rules over their modules, not checked by a run):

* ``nn.Linear`` on a 3-D input, ``LINEAR``: forward t(W), view to 2-D, addmm (mm without bias),
  view back = 4; backward (Addmm/MmBackward, TBackward, 2 ViewBackward) 2 mm, 3 t, 3 views and one
  detach per parameter for AccumulateGrad = 9, with a bias one more t and its gradient's sum (+3).
  Under TP the weight is a DTensor (ColwiseParallel/RowwiseParallel), so all of them are DTensor
  ops, and the local tensors crossing into and out of the parallel region add 2 plain views forward
  and 1 backward per Linear (``from_local``, ``to_local``); under SP the column-parallel ones get
  DTensor input from ``PrepareModuleInput`` (no view) and each norm takes one (``COLUMN_PARALLEL``).
* ``nn.LayerNorm``: 1 forward; 1 backward plus a detach per parameter (2; RMSNorm 1). DTensor
  ops under SP (``SequenceParallel`` makes their parameters replicated DTensors), where the two
  residual gradients of the sequence-sharded stream also sum as DTensor adds (2 backward).
* the rest of a GPT block on plain tensors, ``GPT_REST``: forward 3 views and 4 transposes of
  q/k/v and the output, SDPA and the detach of its saved output, the output reshape, GELU, 2
  residual adds = 13; backward the same views and transposes (8), SDPA's and GELU's backward (2),
  4 gradient sums and a detach = 15 (2 of the sums are DTensor ops under SP).
* edges: the token embedding (RowwiseParallel under TP) 1 forward, 2 backward
  (embedding_dense_backward, detach); GPT's position embedding, its arange and add on plain
  tensors; the final norm; the output head, a Linear without bias; the loss (log-softmax, NLL and
  their views) on plain tensors.
* optimizer: ``torch.optim.AdamW`` on CPU tensors defaults to the single-tensor loop
  (``foreach`` only for CUDA tensors): per parameter tensor 8 ops on its own tensors (decay mul_,
  lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_) and 2 on its plain step counter (add_, item).
  Parameters are DTensors under TP (sharded weights, and the norms' under SP) and under ZeRO-2/3
  (FSDP2 keeps every parameter sharded as a DTensor); ZeRO-1 (``ZeroRedundancyOptimizer``) steps
  plain tensors, 1/dp of them per rank. Under SP the norms' gradients stay Partial and every AdamW
  op that reads one all-reduces it (``partial_grad_allreduces``; ``estimate.py`` times them).
  Each of those ops is a pass of its own over the parameter's fp32 elements (``ADAMW_ELEMENT_PASSES``:
  20 elements read or written per parameter, 80 bytes, where a fused Adam moves the 36 bytes of
  ``data_parallel.OPTIMIZER_BYTES_PER_PARAM``); ``single_tensor_adamw_excess_s`` adds the difference on
  CPU ranks. Measured: a DDP step of the bench's GPT (5.3M parameters) spends 13.2 ms of CPU in the
  AdamW ops (sqrt 2.5, mul_ 2.1, lerp_ 1.5, addcdiv_ 1.5, div 1.3, add_ 1.1, addcmul_ 1.0, and DDP's
  gradient division 2.2), 5.3M x 80 B at the 37 GB/s a copy runs in CPU time: 11.5 ms.

Each module given a DTensor parallel style (a TP Linear, the vocab-parallel embedding, a norm under
SP) also pays the style's own cost beyond its ops and collectives: ``from_local`` and ``to_local``,
redistributing its input or output, wrapping the functional collectives' results for autograd
(``Accelerator.tp_style_fwd_s``/``tp_style_bwd_s``; ``meshplan calibrate`` times a tiny
ColwiseParallel + RowwiseParallel MLP against the same matmuls with the same all-reduces by hand,
each less its ops' dispatch). With 4 ranks on the 2 cores here it was 0.4-0.9 ms forward and
0.6-1.0 ms backward per module (contended), several times the module's ops' dispatch.

Collectives the program's structure adds under TP, also counted here: without SP each
column-parallel Linear all-reduces its own input gradient (``SEPARATE_INPUT_GRADS``;
``layer_cost._comm``), and the loss runs on logits gathered to every rank
(``runs_dtensor_styles``; ``layer_cost.edge_cost``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import ModelDims
from .hardware import Cluster
from .software import Software

# column-parallel Linears of a layer (q, k, v; GPT fc1, Llama w1 and w3; the MoE stays replicated).
# Without SP the backward all-reduces each one's input gradient, not one per sublayer as Megatron's
# f operator does: COLUMN_PARALLEL - 2 more all-reduces per layer
COLUMN_PARALLEL = {"gpt": 4, "llama": 5, "moe": 3}
SEPARATE_INPUT_GRADS = {"gpt": 2, "llama": 3}
LINEAR = (4, 9)  # (forward, backward) dispatches of an nn.Linear without bias
LINEAR_BIAS_BWD = 3  # a bias adds t, the sum of its gradient and a detach
TP_BOUNDARY = (2, 1)  # plain views of from_local / to_local per DTensor Linear
GPT_REST = (13, 15)
ADAMW_PER_PARAM = 8  # on the parameter's own tensors
ADAMW_STEP_COUNTER = 2  # plain: the step's add_ and .item()
ADAMW_GRAD_READS = 3  # gradient operands of its ops: lerp_(grad), addcmul_(grad, grad)
# fp32 elements each single-tensor AdamW op reads and writes per parameter (torch/optim/adamw.py,
# _single_tensor_adamw): param.mul_(1 - lr * wd) 2, exp_avg.lerp_(grad) 3, exp_avg_sq.mul_(beta2) 2,
# .addcmul_(grad, grad) 3, exp_avg_sq.sqrt() 2, / bias_correction2_sqrt 2, .add_(eps) 2,
# param.addcdiv_(exp_avg, denom) 4
ADAMW_ELEMENT_PASSES = 20


def runs_dtensor_styles(software: Software) -> bool:
    """Whether the program applies tensor parallelism with DTensor's parallel styles on each Linear
    (``Software.dtensor_tp_styles``: meshplan's runtime, ``codegen/tp_plans.py``) rather than
    Megatron's fused regions: each column-parallel Linear then takes its input through its own
    ``from_local``, hence an input-gradient all-reduce per Linear. Whether the loss is
    vocab-parallel is a separate trait (``Software.vocab_parallel_loss``)."""
    return software.dtensor_tp_styles


def runs_loss_parallel(software: Software) -> bool:
    """Whether the program's vocab-parallel loss is torch's ``loss_parallel`` on DTensor logits (meshplan's
    runtime, ``runtime.loss``): three per-token all-reduces, and its backward's logits-sized temporaries
    (``memory.logits_bytes``). Megatron's fused ``vocab_parallel_cross_entropy`` is neither."""
    return runs_dtensor_styles(software) and software.vocab_parallel_loss


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatches:
    """Eager op dispatches of one forward and one backward: plain and DTensor."""

    plain_fwd: int = 0
    plain_bwd: int = 0
    dtensor_fwd: int = 0
    dtensor_bwd: int = 0
    styled: int = 0  # modules run through a DTensor parallel style (each pays its own cost, fwd and bwd)

    def __add__(self, other: "Dispatches") -> "Dispatches":
        return Dispatches(plain_fwd=self.plain_fwd + other.plain_fwd, plain_bwd=self.plain_bwd + other.plain_bwd,
                          dtensor_fwd=self.dtensor_fwd + other.dtensor_fwd,
                          dtensor_bwd=self.dtensor_bwd + other.dtensor_bwd, styled=self.styled + other.styled)


def _linears(count: int, bias: bool, on_dtensors: bool) -> Dispatches:
    fwd, bwd = LINEAR[0] * count, (LINEAR[1] + (LINEAR_BIAS_BWD if bias else 0)) * count
    if not on_dtensors:
        return Dispatches(plain_fwd=fwd, plain_bwd=bwd)
    return Dispatches(plain_fwd=TP_BOUNDARY[0] * count, plain_bwd=TP_BOUNDARY[1] * count,
                      dtensor_fwd=fwd, dtensor_bwd=bwd, styled=count)


def _norms(count: int, params_each: int, on_dtensors: bool) -> Dispatches:
    fwd, bwd = count, count * (1 + params_each)
    if on_dtensors:  # SequenceParallel: a style of their own
        return Dispatches(dtensor_fwd=fwd, dtensor_bwd=bwd, styled=count)
    return Dispatches(plain_fwd=fwd, plain_bwd=bwd)


def norm_params(dims: ModelDims) -> int:
    """Parameter tensors of one norm: LayerNorm's weight and bias, RMSNorm's weight."""
    return 2 if dims.family == "gpt" else 1


def layer_dispatches(dims: ModelDims, tp: int, sp: bool) -> Dispatches:
    """Dispatches of one transformer layer's forward and backward (see the module docstring)."""
    gpt = dims.family == "gpt"
    linears = 6 if gpt else 7  # q, k, v, o; fc1, fc2 (GPT) or w1, w3, w2
    out = _linears(linears, bias=gpt, on_dtensors=tp > 1) + _norms(2, norm_params(dims), on_dtensors=sp and tp > 1)
    if gpt:
        rest = GPT_REST
    else:  # RMSNorm is in _norms; rotary (~6 per q and k), SwiGLU's silu and product, repeat of k, v
        rest = (GPT_REST[0] - 1 + 12 + 2 + 2, GPT_REST[1] - 1 + 24 + 4 + 2)
    sums_on_dtensors = 2 if sp and tp > 1 else 0
    # under SP the column-parallel Linears get DTensor input (PrepareModuleInput): no from_local view;
    # each norm (SequenceParallel) takes its input through one
    views = 2 - COLUMN_PARALLEL[dims.family] if sp and tp > 1 else 0
    return out + Dispatches(plain_fwd=rest[0] + views, plain_bwd=rest[1] - sums_on_dtensors,
                            dtensor_bwd=sums_on_dtensors)


def edge_dispatches(dims: ModelDims, tp: int, sp: bool, *, first: bool, last: bool) -> Dispatches:
    """Dispatches of the embedding (first pipeline rank) and of the final norm, output head and loss
    (last rank), forward and backward."""
    out = Dispatches()
    on_dtensors = tp > 1
    if first:
        tok = (Dispatches(dtensor_fwd=1, dtensor_bwd=2, styled=1) if on_dtensors  # RowwiseParallel
               else Dispatches(plain_fwd=1, plain_bwd=2))
        # GPT: the position embedding (arange, embedding; its backward and detach) and the add
        out = out + tok + (Dispatches(plain_fwd=3, plain_bwd=2) if dims.family == "gpt" else Dispatches())
    if last:
        out = out + _norms(1, norm_params(dims), on_dtensors=sp and on_dtensors)
        out = out + _linears(1, bias=False, on_dtensors=on_dtensors)
        if on_dtensors:  # vocab-parallel (runtime.loss): the view and upcast, log-softmax, NLL on the shards
            out = out + Dispatches(dtensor_fwd=3, plain_fwd=2, dtensor_bwd=3)
        else:
            out = out + Dispatches(plain_fwd=6, plain_bwd=4)  # views, log-softmax, NLL; their backward
    return out


def param_tensors(dims: ModelDims, *, layers: int, first: bool, last: bool, tp: int,
                  sp: bool) -> tuple[int, int]:
    """(plain, DTensor) parameter tensors of a pipeline rank that holds ``layers`` layers and the
    edges, as the runtime's parallel styles leave them (before ZeRO)."""
    gpt = dims.family == "gpt"
    linear_params = 12 if gpt else 7
    norm_params_ = 2 * norm_params(dims)
    sharded = tp > 1
    dtensor = layers * ((linear_params if sharded else 0) + (norm_params_ if sharded and sp else 0))
    plain = layers * ((0 if sharded else linear_params) + (0 if sharded and sp else norm_params_))
    if first:  # token embedding (vocab-parallel under TP), GPT's position embedding (replicated)
        dtensor, plain = dtensor + (1 if sharded else 0), plain + (0 if sharded else 1) + (1 if gpt else 0)
    if last:  # final norm, output head
        final = norm_params(dims)
        dtensor += (final if sharded and sp else 0) + (1 if sharded else 0)
        plain += (0 if sharded and sp else final) + (0 if sharded else 1)
    return plain, dtensor


def optimizer_dispatches(plain_params: int, dtensor_params: int, *, zero_stage: int, dp: int) -> tuple[int, int]:
    """(plain, DTensor) dispatches of one single-tensor AdamW step over a rank's parameters."""
    if zero_stage >= 2:  # FSDP2: every parameter a DTensor shard
        plain_params, dtensor_params = 0, plain_params + dtensor_params
    elif zero_stage == 1:  # ZeroRedundancyOptimizer: this rank's 1/dp of the (plain) tensors
        plain_params, dtensor_params = (plain_params + dtensor_params) / dp, 0
    total = plain_params + dtensor_params
    return round(ADAMW_PER_PARAM * plain_params + ADAMW_STEP_COUNTER * total), ADAMW_PER_PARAM * dtensor_params


def single_tensor_adamw_excess_s(cluster: Cluster, shard_params: float, fused_bytes_per_param: float) -> float:
    """Seconds the single-tensor AdamW's passes (``ADAMW_ELEMENT_PASSES`` fp32 elements per parameter)
    move beyond a fused Adam's ``fused_bytes_per_param``, over a rank's ``shard_params``, on CPU ranks
    (shared-memory tier: the runtime's AdamW on CPU tensors); 0 on GPU clusters (foreach/fused there)."""
    if not cluster.cpu_ranks:
        return 0.0
    accel = cluster.accelerator
    extra = max(0.0, ADAMW_ELEMENT_PASSES * 4 - fused_bytes_per_param) * shard_params
    return extra / (accel.memory_bw_Bps * accel.memory_efficiency)


def dispatch_s(counts: Dispatches, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) framework seconds of ``counts``."""
    accel = cluster.accelerator
    return (counts.plain_fwd * accel.dispatch_s + counts.dtensor_fwd * accel.dtensor_dispatch_s
            + counts.styled * accel.tp_style_fwd_s,
            counts.plain_bwd * accel.dispatch_s + counts.dtensor_bwd * accel.dtensor_dispatch_s
            + counts.styled * accel.tp_style_bwd_s)


def partial_grad_allreduces(dims: ModelDims, *, layers: int, last: bool, tp: int, sp: bool) -> int:
    """All-reduces one optimizer step runs on gradients left Partial: under SP the norms' replicated
    DTensor parameters see a sequence shard per rank, so autograd leaves their gradients Partial,
    and each AdamW op that reads one redistributes it to Replicate: lerp_(grad) once and
    addcmul_(grad, grad) twice, ``ADAMW_GRAD_READS`` per parameter tensor."""
    if tp <= 1 or not sp:
        return 0
    norms = 2 * layers + (1 if last else 0)
    return ADAMW_GRAD_READS * norms * norm_params(dims)


def optimizer_dispatch_s(dims: ModelDims, cluster: Cluster, *, layers: int, first: bool, last: bool, tp: int,
                         sp: bool, zero_stage: int, dp: int) -> float:
    """Framework seconds of one optimizer step on a pipeline rank (its kernels' memory traffic is
    ``data_parallel.optimizer_step_s``)."""
    plain, dtensor = param_tensors(dims, layers=layers, first=first, last=last, tp=tp, sp=sp)
    plain_ops, dtensor_ops = optimizer_dispatches(plain, dtensor, zero_stage=zero_stage, dp=dp)
    return plain_ops * cluster.accelerator.dispatch_s + dtensor_ops * cluster.accelerator.dtensor_dispatch_s
