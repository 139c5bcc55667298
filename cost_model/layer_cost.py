"""Seconds of one transformer layer for one micro-batch on one GPU, forward and backward.

Per GPU a layer sees m = b * s / cp tokens and 1/tp of every matmul (Megatron-LM's column- then
row-parallel split, Shoeybi et al. 2019): the matmuls of ``layer_matmuls`` are timed with the
roofline of ``kernels.py``; the attention core with the fused-attention rate; the rest (norms,
residual adds, activations, rotary, copies) is memory-bound, except GELU on a CPU profile that
measured its rate (``kernels.transcendental_excess_s``). The framework's cost of each eager op the
runtime dispatches is ``dispatch.py``'s (0 on GPU presets). Under TP without sequence parallelism
those memory-bound ops run on the full (m, h) activation on every rank; with SP on 1/tp of it.
The backward of a memory-bound op reads the saved input and the output gradient and writes the
input gradient: 2x the forward's bytes.

Exposed communication inside a layer (nothing hides it, as in Megatron without
``--tp-comm-overlap``):

* TP: 2 all-reduces of m*h per forward and 2 per backward (Narayanan 2021 sec. 3.2); with SP each
  becomes an all-gather plus a reduce-scatter of the same volume (Korthikanti 2022 sec. 4.2.2).
  Group: tp ranks, stride 1. A program with DTensor's per-Linear styles (meshplan's runtime,
  ``dispatch.runs_dtensor_styles``) all-reduces the input gradient of each column-parallel Linear
  without SP: q, k, v and fc1, 4 per GPT backward instead of 2. Megatron keeps only the
  sequence-sharded input of the two column-parallel GEMMs (that is SP's memory saving) and all-gathers it again in the backward for their weight
  gradients (``Software.sp_regather``; Megatron-LM's ``LinearWithGradAccumulationAndAsync...``): 2
  more all-gathers per backward. Korthikanti Table 4 shows it: SP saves 0.5 ms of the 22B layer's
  forward but only 0.1 ms of its backward.
* EP: an all-to-all to dispatch the k routed copies of each token and one to combine them, per
  forward and again per backward (Lepikhin et al. 2020, GShard). Group: ep ranks, stride tp. A flex
  dispatcher (``Software.ep_dispatch``) sends a token over the network once per remote node instead of
  once per expert (``collectives.deduplicated_all_to_all_time``); Megatron's 1F1B A2A overlap
  (``Software.ep_comm_overlap``) hides the forward's under the paired backward's compute and vice versa.
* CP: ring attention (Liu et al. 2023) all-gathers K and V of the whole sequence per forward and
  all-gathers them again plus reduce-scatters their gradients per backward; the transfers overlap
  the attention core, so only what exceeds it is exposed (not beside the 1F1B A2A overlap on an accelerator with
  ``ordered_comm_overlap``, below). Group: cp ranks, stride tp.

With ``Software.tp_comm_overlap`` (Megatron-Core ``--tp-comm-overlap``, not under NVFP4: Transformer Engine splits
each sequence-parallel all-gather and reduce-scatter into chunks that flow while the adjacent GEMM
computes on the chunks already there), TP communication is hidden up to the layer's matmul time; not beside
Megatron's 1F1B A2A overlap on an accelerator whose comm-GEMM overlap needs the launch order kept
(``Accelerator.ordered_comm_overlap``, NVIDIA before Blackwell): NVIDIA's scripts then give up
CUDA_DEVICE_MAX_CONNECTIONS=1 for the A2A overlap, and "communication kernel will be pushed to the end of the GEMM
kernel, failing to overlap the kernels" (Megatron-Bridge scripts/performance/perf_plugins.py @v0.4.0).
What hides (TP under the matmuls, CP's K/V all-gather under the attention core) slows the compute
it runs beside by ``Software.overlap_slowdown`` of its time (``data_parallel.py``); that share is
counted with the layer's communication. CPU ranks overlap nothing, so there it is zero.
``Software.attention == "plain"`` times the attention core unfused (``kernels.py``), and
``Software.dropout`` adds the 1-byte masks the two bias-dropout-adds write (read again backward).

FP8 (``dtype="float8"``, Transformer Engine's tensor-wise recipes on Hopper) runs every GEMM on 1-byte
operands quantized on the fly (``fp8_cast_bytes``): each GEMM input is read in bf16 and written as a
rowwise and a transposed FP8 copy (the wgrad GEMM needs the transpose on Hopper) in the forward, and
each output gradient the same way in the backward: 2 bytes read and 2 written per element (TE's fused
``cast_transpose``, transformer_engine/common/transpose/cast_transpose.cu; quantizer.cpp allocates the
transpose where ``nvte_is_non_tn_fp8_gemm_supported`` is false, i.e. before Blackwell). Megatron-Core
feeds TE four GEMMs per layer, QKV and fc1 fused (``linear_qkv``, ``linear_fc1``), so four inputs and
four output gradients are cast. Weights are cast once per step and cached across micro-batches
(TE ``is_first_microbatch``), not counted here. Current scaling (``Software.fp8_recipe == "tensorwise"``) reads
each tensor once more, and in a kernel of its own, to take its amax before the cast: 6 bytes per element.

NVFP4 (``dtype="float4"``, Transformer Engine's ``NVFP4BlockScaling``, Megatron's ``--fp4-format e2m1``)
runs the same GEMMs (forward, dgrad and wgrad) on 4-bit E2M1 operands with an E4M3 scale per 16 elements
and a per-tensor FP32 scale (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149 sec. 2
and 4: all three GEMMs of the linear layers in NVFP4, a 16x16 random Hadamard transform on the wgrad
inputs, stochastic rounding on the gradients). The per-tensor scale is the tensor's amax, so each cast
reads its bf16 input twice as current scaling does (an amax pass, then the cast, which applies the
Hadamard transform and the rounding in registers) and writes a rowwise and a columnwise copy of
0.5 + 1/16 bytes an element (``memory.GEMM_OPERAND_BYTES``): 4 + 1.125 bytes.

Under both, Megatron-Core's output layer is a plain ``tensor_parallel.ColumnParallelLinear``, outside
Transformer Engine's autocast (megatron/core/models/gpt/gpt_model.py @d98e8a6: ``TELMHeadColumnParallelLinear``
only with ``fp8_output_proj`` under MXFP8, off by default): its GEMM runs in bf16.

A recomputed forward (full recompute) repeats the forward's compute and its communication.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..ir.graph import ModelDims
from .collectives import bus_bytes, collective_time, deduplicated_all_to_all_time
from .flops import attention_core_flops, kv_width, q_width, window_pair_share, window_share, windowed_part
from .hardware import Cluster
from .dispatch import (SEPARATE_INPUT_GRADS, dispatch_s as dispatches_s, edge_dispatches, layer_dispatches,
                       runs_dtensor_styles, runs_loss_parallel)
from .kernels import (attention_fwd_bwd_s, fresh_pages_s, matmul_fwd_bwd_s, memory_time_s,
                      plain_attention_fwd_bwd_s, transcendental_excess_s, unquantized_dtype)
from .fusion import fusion_saving
from .memory import ACTIVATION_BYTES, GEMM_OPERAND_BYTES
from .software import DEFAULT, Software


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerShape:
    """Everything a layer's time depends on besides the cluster."""

    dims: ModelDims
    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    ep_over_tp: bool = False  # the ep group takes tp ranks: experts whole, each tp rank's tokens (Mesh.ep_over_tp)
    # the EP all-to-alls run under another micro-batch's compute (Software.ep_comm_overlap, where the plan allows it:
    # estimate._ep_overlap)
    ep_overlap: bool = False
    sp: bool = False
    dtype: str = "bfloat16"
    software: Software = DEFAULT
    fusions: tuple[str, ...] = ()  # plan.fusions: fused kernels replace some memory-bound ops (fusion.py)

    @property
    def tokens(self) -> float:
        return self.micro_batch * self.seq_len / self.cp


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    fwd_compute_s: float
    bwd_compute_s: float
    core_fwd_s: float  # the attention core's forward
    core_bwd_s: float = 0.0  # and its backward
    # what selective recompute repeats in the backward: the attention core (Korthikanti et al. 2022's
    # policy), or, where the runtime saves only the matmul and collective outputs
    # (``Software.selective_saves_matmuls``, codegen.program.SELECTIVE_SAVE_OPS), every other op of the
    # forward: the attention core, the memory-bound ops and their dispatch; torchtitan's policy
    # (``Software.selective_alternate_matmuls``): the memory-bound ops and every second matmul
    selective_fwd_s: float
    fwd_comm_s: float  # exposed TP + EP + CP communication of one forward
    bwd_comm_s: float
    comm_bytes_fwd: dict[str, float]  # per family, bytes per GPU of one forward
    comm_bytes_bwd: dict[str, float]


# the router's place in a MoE layer's ``layer_matmuls`` (after wq; wk, wv; wo)
ROUTER = 3


def layer_matmuls(shape: LayerShape) -> tuple[tuple[float, float, float, int], ...]:
    """(m, n, k, count) of every matmul ``(m, k) @ (k, n)`` of one layer on one GPU."""
    d, m, t = shape.dims, shape.tokens, shape.tp
    h, f, hd = d.hidden, d.ffn_hidden, d.head_dim
    q = q_width(d) / t  # heads * head_dim, which is not always h (Qwen3: 32 heads of 128 on 2048)
    kv = max(kv_width(d) / t, hd)  # kv heads are replicated when tp > kv_heads
    mm = [(m, q, h, 1), (m, kv, h, 2), (m, h, q, 1)]  # wq; wk, wv; wo
    if d.family == "gpt":
        mm += [(m, f / t, h, 1), (m, h, f / t, 1)]  # fc1, fc2
    elif d.family == "llama":
        mm += [(m, f / t, h, 2), (m, h, f / t, 1)]  # w1, w3; w2
    else:
        local_experts = max(d.experts // shape.ep, 1)
        per_expert = expert_tokens(shape) * d.top_k / local_experts  # balanced routing
        fe = f / expert_split(shape)
        mm += [(m, d.experts, h, 1),  # router
               (per_expert, fe, h, 2 * local_experts), (per_expert, h, fe, local_experts)]
    return tuple(mm)


def recomputed_matmuls_fwd_s(shape: LayerShape, cluster: Cluster) -> float:
    """Forward seconds of the matmuls torchtitan's op-level selective recompute repeats in the backward
    (``Software.selective_alternate_matmuls``): every second one of the block in forward order, ``layer_matmuls``'
    entries taken one by one (wq, wk, wv, wo, then w1, w3, w2 or fc1, fc2): wk, wo and w3 (GPT: wk, wo, fc2)."""
    accel, ab = cluster.accelerator, ACTIVATION_BYTES[shape.dtype]
    order = [(m, n, k) for m, n, k, count in layer_matmuls(shape) for _ in range(count)]
    recomputed = sum(matmul_fwd_bwd_s(accel, shape.dtype, m, n, k, ab)[0] for m, n, k in order[1::2])
    return recomputed * shape.dims.matmul_scale


def expert_split(shape: LayerShape) -> int:
    """How many ways each expert's FFN is split over the tp ranks: tp where the program shards experts like
    the dense MLP (``Software.expert_tp``, Megatron-Core), else 1 (meshplan's runtime keeps them whole on
    every tp rank, which runs the whole MoE; and an ep group that takes tp ranks, ``ep_over_tp``)."""
    return shape.tp if shape.software.splits_experts_over_tp(shape.ep_over_tp) else 1


def expert_tokens(shape: LayerShape) -> float:
    """Tokens of one micro-batch whose routed copies leave this rank: the whole (m, h) activation, or with
    the ep group over tp ranks (``ep_over_tp``, under SP) this tp rank's slice of the sequence."""
    return shape.tokens / (shape.tp if shape.ep_over_tp else 1)


def elementwise_fwd(shape: LayerShape) -> tuple[float, int]:
    """(bytes moved, kernels) of the memory-bound ops of one layer's forward on one GPU."""
    d, m, t, ab = shape.dims, shape.tokens, shape.tp, ACTIVATION_BYTES[shape.dtype]
    whole = m * d.hidden * ab / (t if shape.sp else 1)  # an (m, h) tensor, sharded by SP only
    attn = m * q_width(d) * ab / t  # q or the attention output, inside the TP region
    kv = m * kv_width(d) * ab / t
    ffn = (m * d.ffn_hidden * ab / t if d.family != "moe"
           else expert_tokens(shape) * d.ffn_hidden * ab / expert_split(shape))
    masks = whole / 2 if shape.software.drops_out(d.family) else 0.0  # two 1-byte dropout masks
    if shape.software.compiled:  # torch.compile: one kernel per pointwise chain between GEMMs (Software.compiled)
        return _compiled_fwd(shape, whole, attn, kv, ffn, masks)
    if d.family == "gpt":
        # 2 LayerNorms (r+w), 2 residual adds (2r+w), GELU (r+w), attention-output copy (r+w)
        return 4 * whole + 6 * whole + 2 * ffn + 2 * attn + 2 * masks, 6
    # 2 RMSNorms, 2 residual adds, rotary on q and k (~6 passes), repeat_interleave of k and v, attention-output copy.
    # A fused norm (Software.fused_norm) reads its input once and writes its output once. An eager one runs the chain
    # of Hugging Face's LlamaRMSNorm and torchtitan's RMSNorm (torchtitan/models/norms.py @ba24697): the input cast to
    # fp32 (2 bytes read, 4 written), squared (4, 4), its mean (4 read), the product with the rsqrt (4, 4), the cast
    # back (4, 2), the product with the weight (2, 2): 36 bytes an element, 18 passes of a 16-bit tensor, in 8
    # kernels; on an fp32 tensor the casts do nothing: 7 passes in 6 kernels
    if shape.software.fused_norm:
        norms, norm_kernels = 2 * 2 * whole, 2
    else:
        norms, norm_kernels = (2 * 7 * whole, 12) if ab == 4 else (2 * 18 * whole, 16)
    moved = norms + 6 * whole + 6 * (attn + kv) + (2 * (attn + kv) if kv < attn else 0) + 2 * attn + 2 * masks
    kernels = norm_kernels + 2 + 12 + 2 + 1
    if d.family == "llama":
        return moved + 5 * ffn, kernels + 2  # silu (r+w), product (2r+w)
    routed = d.top_k * expert_tokens(shape) * d.hidden * ab  # the k copies of each token
    act = 0.0 if shape.software.fused_grouped_mlp else 5 * d.top_k * ffn  # experts' silu*up, else in the GEMM
    moved += act + 5 * routed + m * d.experts * 10  # gather, combine; router
    return moved, kernels + 12 + 4 * max(d.experts // shape.ep, 1)


def _compiled_fwd(shape: LayerShape, whole: float, attn: float, kv: float, ffn: float,
                  masks: float) -> tuple[float, int]:
    """``elementwise_fwd`` of a block under ``Software.compiled``: each pointwise chain between two GEMMs (or the
    fused attention) reads its inputs and writes its outputs once. The attention norm (r+w); rotary on q and k with
    the grouped-query repeat of k and v in the same kernel (q r+w; k and v read at their width, written at q's), none
    for GPT; the attention output's copy (r+w); the residual add fused with the MLP norm (2r+2w); the activation
    (SwiGLU 2r+w, GELU r+w); the last residual add (2r+w); dropout's masks written by the kernels that apply them.
    Under MoE the routed tokens' gather and combine stay as ``elementwise_fwd`` counts them (index kernels), the
    experts' SwiGLU one kernel (2r+w) unless their grouped GEMM runs it (``Software.fused_grouped_mlp``)."""
    d, ab = shape.dims, ACTIVATION_BYTES[shape.dtype]
    moved, kernels = 9 * whole + 2 * attn + 2 * masks, 4
    if d.family == "gpt":
        return moved + 2 * ffn, kernels + 1
    moved += 2 * attn + (2 * kv + 2 * attn if kv < attn else 2 * kv)  # rotary and the grouped-query repeat
    kernels += 1
    if d.family == "llama":
        return moved + 3 * ffn, kernels + 1
    routed = d.top_k * expert_tokens(shape) * d.hidden * ab
    act = 0.0 if shape.software.fused_grouped_mlp else 3 * d.top_k * ffn
    moved += act + 5 * routed + shape.tokens * d.experts * 10
    return moved, kernels + 1 + 12 + 4 * max(d.experts // shape.ep, 1)


def unpad_bytes(shape: LayerShape) -> tuple[float, int, float, int]:
    """(forward bytes, kernels, backward bytes, kernels) of ``Software.attention_unpad``'s gathers and scatters around
    the attention kernel; 0 without it. Forward: q, k and v each read and written once more by the gather
    (``index_first_axis``), the output written as zeros, then read and scattered into them (``pad_input``): 5 q-sized
    and 4 kv-sized passes in 5 kernels (and 4 small ones on the mask's indices). Backward: each of dq, dk and dv
    scattered into a zero-filled padded tensor (the gather's transpose: 3 passes each), the output's gradient gathered
    (2 passes): 5 q-sized and 6 kv-sized passes in 7 kernels."""
    if not shape.software.attention_unpad:
        return 0.0, 0, 0.0, 0
    ab, d = ACTIVATION_BYTES[shape.dtype], shape.dims
    q = shape.tokens * q_width(d) * ab / shape.tp
    kv = shape.tokens * kv_width(d) * ab / shape.tp
    return 5 * q + 4 * kv, 9, 5 * q + 6 * kv, 7


def recompute_modules_bytes(shape: LayerShape) -> tuple[float, int]:
    """(bytes moved, kernels) of the forward the backward runs again for ``Software.recompute_modules``: the two
    norms (read the input, write the output: Transformer Engine's fused RMSNorm/LayerNorm) for ``"layernorm"``,
    the experts' activation as ``elementwise_fwd`` counts it (none where ``Software.fused_grouped_mlp`` runs it
    in the GEMM) for ``"moe_act"``."""
    d, ab, modules = shape.dims, ACTIVATION_BYTES[shape.dtype], shape.software.recompute_modules
    moved, kernels = 0.0, 0
    if "layernorm" in modules:
        moved += 2 * 2 * shape.tokens * d.hidden * ab / (shape.tp if shape.sp else 1)
        kernels += 2
    if "moe_act" in modules and d.family == "moe" and not shape.software.fused_grouped_mlp:
        moved += 5 * d.top_k * expert_tokens(shape) * d.ffn_hidden * ab / expert_split(shape)
        kernels += 1
        if clamped := clamped_units(shape):  # the clamp runs inside the recomputed function (``expert_extra_bytes``)
            moved, kernels = moved + 8 * clamped, kernels + 3
    return moved, kernels


def _eager_experts(shape: LayerShape) -> bool:
    """Whether the experts' activation and fc2 bias run as Megatron-Core's eager ops (``expert_extra_bytes``): a MoE
    layer neither torch.compile (``Software.compiled``) nor a fused grouped MLP (``Software.fused_grouped_mlp``)
    fuses."""
    return shape.dims.family == "moe" and not shape.software.compiled and not shape.software.fused_grouped_mlp


def clamped_units(shape: LayerShape) -> float:
    """Bytes of the experts' (routed tokens, ffn) activation where Megatron-Core clamps it eagerly
    (``expert_extra_bytes``), else 0."""
    d = shape.dims
    if not d.glu_limit or not _eager_experts(shape):
        return 0.0
    return d.top_k * expert_tokens(shape) * d.ffn_hidden * ACTIVATION_BYTES[shape.dtype] / expert_split(shape)


def expert_extra_bytes(shape: LayerShape) -> tuple[float, int, float, int]:
    """(forward bytes, kernels, backward bytes, kernels) the experts move beyond a plain SwiGLU where the model has
    a clamped GLU (``ModelDims.glu_limit``) or biased expert linears (``ModelDims.expert_bias``), as Megatron-Core's
    ``TEGroupedMLP`` runs them (core_v0.16.0; GPT-OSS through Megatron-Bridge's ``gpt_oss_bridge.py``: quick-GEGLU,
    clamp 7.0, ``add_bias_linear``). U below is the (routed tokens, ffn) activation, R the (routed tokens, h) output.

    * The clamp (megatron/core/fusions/fused_bias_geglu.py ``weighted_bias_quick_geglu_impl``) runs eagerly before the
      fused activation: each half of fc1's output clamped (r+w), then the two concatenated again (2 r+w): 8 U in 3
      kernels. Backward: each clamp's gradient reads the gradient and its input and writes one (3 U, twice), and the
      halves' gradients are concatenated (4 U): 10 U in 3 kernels.
    * fc1's bias is added in its grouped GEMM (``skip_bias_add=False``); fc2's is not (``skip_bias_add=True``) and is
      added scaled by the routing probability, per local expert, in fp32 (experts.py ``_apply_bias``:
      ``torch.cat([t + b * p ...]).to(dtype)``): b * p writes 4 bytes an element, t + it reads 2 + 4 and writes 4,
      the concatenation reads and writes 4, the cast reads 4 and writes 2: 28 bytes per element of R. Backward: the
      cast's gradient (2 r, 4 w), its cast to t's bf16 (4 r, 2 w), and the gradients of b and p, each a product
      (4 r, 4 w) and a sum (4 r): 36 bytes.

    None under torch.compile (``Software.compiled``: one kernel per pointwise chain) nor where the experts' grouped
    GEMM runs the activation and scaled bias (``Software.fused_grouped_mlp``: Transformer Engine's fused grouped MLP,
    ``ScaledClampedQGeGLU`` and GroupedLinear's ``scale_bias``)."""
    d = shape.dims
    if not _eager_experts(shape):
        return 0.0, 0, 0.0, 0
    u = clamped_units(shape)
    fwd, fk, bwd, bk = (8 * u, 3, 10 * u, 3) if u else (0.0, 0, 0.0, 0)
    if d.expert_bias:
        local = max(d.experts // shape.ep, 1)
        r = d.top_k * expert_tokens(shape) * d.hidden
        fwd, fk, bwd, bk = fwd + 28 * r, fk + 2 * local + 2, bwd + 36 * r, bk + 4 * local + 2
    return fwd, fk, bwd, bk


def fp8_cast_bytes(shape: LayerShape) -> tuple[float, int, float, int]:
    """(forward bytes, kernels, backward bytes, kernels) the FP8 quantization of one layer's GEMM operands
    moves (module docstring): the inputs of Megatron-Core's four GEMMs (QKV, projection, fc1, fc2) in the
    forward, their output gradients in the backward, 2 bytes read and 2 written per element; 0 unless
    ``shape.dtype`` is float8. Under SP the QKV and fc1 inputs are cast on the sequence slice (TE
    quantizes before its FP8 all-gather). Current scaling adds an amax pass: 2 bytes more read per element,
    one kernel more per cast. float4 (NVFP4): the amax pass and the cast read 4 bytes an element and write
    two copies of ``GEMM_OPERAND_BYTES["float4"]`` (module docstring)."""
    if shape.dtype not in GEMM_OPERAND_BYTES:
        return 0.0, 0, 0.0, 0
    d, m, t = shape.dims, shape.tokens, shape.tp
    whole = m * d.hidden / (t if shape.sp else 1)
    q, kv = m * q_width(d) / t, m * kv_width(d) / t
    f = (expert_tokens(shape) * d.ffn_hidden * d.top_k / expert_split(shape) if d.family == "moe"
         else m * d.ffn_hidden / t)
    up = f * (1 if d.family == "gpt" else 2)  # fc1's output: gate and up for SwiGLU
    if d.family == "moe" and shape.software.fused_grouped_mlp:
        f = up = 0.0  # written quantized by the experts' fused GEMM + SwiGLU (Software.fused_grouped_mlp)
    inputs = 2 * whole + q + f  # QKV, fc1 (norm outputs); projection; fc2
    grads = (q + 2 * kv) + m * d.hidden / t * 2 + up  # QKV, projection, fc1, fc2 outputs (row-parallel: whole h)
    if shape.dtype == "float4":
        per_elem, kernels = 4.0 + 2 * GEMM_OPERAND_BYTES["float4"], 8
    elif shape.software.fp8_recipe == "tensorwise":
        per_elem, kernels = 6.0, 8
    else:
        per_elem, kernels = 4.0, 4
    return per_elem * inputs, kernels, per_elem * grads, kernels


def dispatch_s(shape: LayerShape, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) framework seconds (dispatch, autograd) of one layer: its eager ops counted
    from the runtime's structure, plain and on DTensors (``dispatch.py``), at the per-dispatch cost a
    CPU profile measured; 0 on GPU presets (launches run ahead of the kernels there)."""
    return dispatches_s(layer_dispatches(shape.dims, shape.tp, shape.sp), cluster)


def matmul_s(shape: LayerShape, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) seconds of the layer's weight matmuls on one GPU."""
    accel, ab = cluster.accelerator, ACTIVATION_BYTES[shape.dtype]
    # Megatron-Core's router is no Transformer Engine module either (``router_gating_linear``,
    # megatron/core/transformer/moe/moe_utils.py @d98e8a6: a bf16 GEMM with an fp32 output, its backward in the
    # router dtype, fp32 where a model sets moe_router_dtype, priced here at bf16's rate): never FP8 or NVFP4
    router = ROUTER if shape.dims.family == "moe" else -1
    fwd = bwd = 0.0
    for i, (m, n, k, count) in enumerate(layer_matmuls(shape)):
        dtype = unquantized_dtype(accel, shape.dtype) if i == router else shape.dtype
        f, b = matmul_fwd_bwd_s(accel, dtype, m, n, k, ab)
        fwd, bwd = fwd + count * f, bwd + count * b
    scale = shape.dims.matmul_scale  # the traced block's matmul FLOPs where the family's shapes miss them
    return fwd * scale, bwd * scale


def core_s(shape: LayerShape, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core on one GPU, fused or plain."""
    d, accel = shape.dims, cluster.accelerator
    if shape.software.attention == "plain":
        f, b = plain_attention_fwd_bwd_s(accel, shape.dtype, batch_heads=shape.micro_batch * d.heads / shape.tp,
                                         q_len=shape.seq_len / shape.cp, kv_len=shape.seq_len, head_dim=d.head_dim,
                                         elem_bytes=ACTIVATION_BYTES[shape.dtype], dropout=shape.software.drops_out(d.family))
        return f * d.core_scale, b * d.core_scale  # core_scale: the traced block's attention where the shapes miss it
    # a window-aware kernel skips the blocks outside a sliding window (Software.window_kernel, flops.window_share)
    full = attention_core_flops(d, shape.micro_batch, shape.seq_len) / shape.cp / shape.tp
    part = windowed_part(d, shape.seq_len) if shape.software.window_kernel else 0.0
    measured = accel.window_attention_at(d.attention_window, d.head_dim) if part else None
    # the full kernel's share: the non-windowed layers where cuDNN's window kernel was measured; else every layer,
    # a windowed one at the full kernel's rate on its share of the pairs
    dense = full * (1.0 - part) if measured else full * (window_share(d, shape.seq_len) if part else 1.0)
    fwd, bwd = attention_fwd_bwd_s(accel, shape.dtype, dense, head_dim=d.head_dim,
                                   speed=shape.software.attention_speed, seq_len=shape.seq_len / shape.cp,
                                   kernel=shape.software.attention_kernel, pair_dim=d.head_dim * d.core_scale)
    if measured is None:
        return fwd, bwd
    # cuDNN's window kernel at its measured rate (Accelerator.cudnn_window_attention) for the windowed layers' share:
    # its executed pairs, s w - w^2 / 2 of a causal layer's s^2 / 2, at the efficiency it reached over them
    eff, ratio = measured
    executed = 0.5 * full * part * window_pair_share(d.attention_window, shape.seq_len)
    window_fwd = executed / (accel.peak(unquantized_dtype(accel, shape.dtype)) * eff) + accel.kernel_overhead_s
    return fwd + window_fwd, bwd + ratio * window_fwd


def _compute_s(shape: LayerShape, cluster: Cluster) -> tuple[float, float, float, float, float, float]:
    """(forward, backward, attention-core forward, attention-core backward, matmul forward, matmul backward)
    seconds."""
    accel = cluster.accelerator
    mm_f, mm_b = matmul_s(shape, cluster)
    core_f, core_b = core_s(shape, cluster)
    moved, kernels = elementwise_fwd(shape)
    fused = fusion_saving(shape, shape.fusions)  # what the plan's fused kernels do not move
    cast_f, cast_fk, cast_b, cast_bk = fp8_cast_bytes(shape)
    pad_f, pad_fk, pad_b, pad_bk = unpad_bytes(shape)  # Software.attention_unpad: varlen gathers and scatters
    ex_f, ex_fk, ex_b, ex_bk = expert_extra_bytes(shape)  # a clamped GLU, biased experts
    mem_f = memory_time_s(accel, moved - fused.fwd_bytes + cast_f + pad_f + ex_f,
                          kernels - fused.fwd_kernels + cast_fk + pad_fk + ex_fk)
    again, again_k = recompute_modules_bytes(shape)  # Software.recompute_modules: their forward, in the backward
    mem_b = memory_time_s(accel, 2 * moved - fused.bwd_bytes + cast_b + again + pad_b + ex_b,
                          2 * kernels - fused.bwd_kernels + cast_bk + again_k + pad_bk + ex_bk)
    ops_f, ops_b = dispatch_s(shape, cluster)
    if shape.dims.family == "gpt":  # GELU (tanh) at its measured rate where tanh, not memory, bounds it (CPUs)
        ffn = shape.tokens * shape.dims.ffn_hidden / shape.tp
        mem_f += transcendental_excess_s(accel, "gelu", ffn, 2 * ffn * ACTIVATION_BYTES[shape.dtype])
        mem_b += transcendental_excess_s(accel, "gelu_backward", ffn, 4 * ffn * ACTIVATION_BYTES[shape.dtype])
    return mm_f + core_f + mem_f + ops_f, mm_b + core_b + mem_b + ops_b, core_f, core_b, mm_f, mm_b


def regather_s(shape: LayerShape, cluster: Cluster) -> float:
    """Seconds of the two sequence-parallel all-gathers that gather a block's attention and MLP inputs again (their
    sequence-sharded copies kept, the full ones not), each with its wait for ranks out of step."""
    act = shape.tokens * shape.dims.hidden * ACTIVATION_BYTES[shape.dtype]
    return 2 * (collective_time("all-gather", act, shape.tp, 1, cluster) + cluster.accelerator.sync_overhead_s)


def _comm(shape: LayerShape, cluster: Cluster, core_fwd_s: float, matmul_s_: tuple[float, float],
          compute_s: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, dict, dict]:
    d, ab, tp, cp, ep = shape.dims, ACTIVATION_BYTES[shape.dtype], shape.tp, shape.cp, shape.ep
    act = shape.tokens * d.hidden * ab
    if shape.sp:
        tp_s = 2 * (collective_time("all-gather", act, tp, 1, cluster)
                    + collective_time("reduce-scatter", act, tp, 1, cluster))
        tp_b = 2 * (bus_bytes("all-gather", act, tp) + bus_bytes("reduce-scatter", act, tp))
    else:
        tp_s, tp_b = 2 * collective_time("all-reduce", act, tp, 1, cluster), 2 * bus_bytes("all-reduce", act, tp)
    if tp > 1:  # each call waits for ranks that computed out of step (measured on CPU profiles, else 0)
        tp_s += (4 if shape.sp else 2) * cluster.accelerator.sync_overhead_s
    tp_fwd_s = tp_bwd_s = tp_s
    tp_bwd_b = tp_b
    if tp > 1 and not shape.sp and runs_dtensor_styles(shape.software) and d.family in SEPARATE_INPUT_GRADS:
        # each ColwiseParallel Linear takes its input through its own from_local: the backward
        # all-reduces every one's input gradient (q, k, v, fc1), not one per sublayer as Megatron's f
        more = SEPARATE_INPUT_GRADS[d.family]
        tp_bwd_s += more * (collective_time("all-reduce", act, tp, 1, cluster) + cluster.accelerator.sync_overhead_s)
        tp_bwd_b += more * bus_bytes("all-reduce", act, tp)
    if shape.sp and shape.software.sp_regather:  # the attention and MLP inputs, gathered again
        tp_bwd_s += regather_s(shape, cluster)
        tp_bwd_b += 2 * bus_bytes("all-gather", act, tp)
    hidden = 0.0  # communication run under compute, which it slows (Software.overlap_slowdown)
    # before Blackwell the TP comm-GEMM overlap needs one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1), which the
    # 1F1B A2A overlap gives up for more (Accelerator.ordered_comm_overlap): then the TP collectives wait
    ordered = shape.ep_overlap and cluster.accelerator.ordered_comm_overlap
    if shape.software.overlaps_tp_comm(shape.dtype) and shape.sp and not ordered:
        hidden = min(tp_fwd_s, matmul_s_[0]) + min(tp_bwd_s, matmul_s_[1])
        tp_fwd_s, tp_bwd_s = max(0.0, tp_fwd_s - matmul_s_[0]), max(0.0, tp_bwd_s - matmul_s_[1])
    ep_s = ep_b = 0.0
    if d.family == "moe" and ep > 1:  # ep ranks at stride tp, or consecutive when the group takes tp ranks
        tokens = expert_tokens(shape) * d.hidden * ab  # bytes of the tokens this rank routes
        routed = tokens * d.top_k
        stride = 1 if shape.ep_over_tp else tp
        if shape.software.ep_dispatch == "hybridep":  # one copy per remote node, not per expert (Software.ep_dispatch)
            one = deduplicated_all_to_all_time(tokens, d.top_k, d.experts, ep, stride, cluster,
                                               routing=shape.software.ep_routing)
        else:
            one = collective_time("all-to-all", routed, ep, stride, cluster)
        ep_s, ep_b = 2 * one, 2 * bus_bytes("all-to-all", routed, ep)
        if shape.ep_overlap:  # Megatron's 1F1B A2A overlap: "EP A2A in forward step is hidden by the attention/mlp
            # computation in the backward step, and vice versa" (megatron/core/pipeline_parallel/combined_1f1b.py)
            exposed = max(0.0, ep_s - compute_s[1]) + max(0.0, ep_s - compute_s[0])
            hidden += 2 * ep_s - exposed
            ep_s = exposed / 2
    kv_all = 2 * shape.micro_batch * shape.seq_len * max(kv_width(d) / tp, d.head_dim) * ab
    cp_ag = collective_time("all-gather", kv_all, cp, tp, cluster)
    cp_rs = collective_time("reduce-scatter", kv_all, cp, tp, cluster)
    # the K/V exchange hides under the attention core, but not beside the A2A overlap where that needs the launch
    # order (``ordered``: NVIDIA's scripts keep one hardware queue for tp > 1 or cp > 1 only without it)
    cover_fwd, cover_bwd = (0.0, 0.0) if ordered else (core_fwd_s, 2.5 * core_fwd_s)  # the core it hides under
    cp_fwd = max(0.0, cp_ag - cover_fwd)
    cp_bwd = max(0.0, cp_ag + cp_rs - cover_bwd)
    hidden += (cp_ag - cp_fwd) + (cp_ag + cp_rs - cp_bwd)
    slowed = 0.0 if cluster.cpu_ranks else shape.software.overlap_slowdown * hidden / 2  # half forward, half backward
    cp_b = bus_bytes("all-gather", kv_all, cp)
    fwd_bytes = {"tp": tp_b, "ep": ep_b, "cp": cp_b}
    bwd_bytes = {"tp": tp_bwd_b, "ep": ep_b, "cp": cp_b + bus_bytes("reduce-scatter", kv_all, cp)}
    return tp_fwd_s + ep_s + cp_fwd + slowed, tp_bwd_s + ep_s + cp_bwd + slowed, fwd_bytes, bwd_bytes


@lru_cache(maxsize=8192)
def layer_cost(shape: LayerShape, cluster: Cluster) -> LayerCost:
    """Forward and backward seconds of one layer for one micro-batch on one GPU."""
    fwd_s, bwd_s, core_fwd, core_bwd, mm_f, mm_b = _compute_s(shape, cluster)
    fwd_comm, bwd_comm, fwd_bytes, bwd_bytes = _comm(shape, cluster, core_fwd, (mm_f, mm_b), (fwd_s, bwd_s))
    selective = fwd_s - mm_f if shape.software.selective_saves_matmuls else core_fwd
    if shape.software.selective_alternate_matmuls and shape.dims.family != "moe":  # torchtitan's policy: the
        selective += recomputed_matmuls_fwd_s(shape, cluster) - core_fwd  # attention output kept, half the matmuls not
        if shape.tp > 1 and shape.sp:  # and the two norm outputs gathered again (memory.matmul_save_units)
            selective += regather_s(shape, cluster)
    return LayerCost(fwd_compute_s=fwd_s, bwd_compute_s=bwd_s, core_fwd_s=core_fwd, core_bwd_s=core_bwd,
                     selective_fwd_s=selective, fwd_comm_s=fwd_comm, bwd_comm_s=bwd_comm, comm_bytes_fwd=fwd_bytes,
                     comm_bytes_bwd=bwd_bytes)


@lru_cache(maxsize=1024)
def edge_cost(shape: LayerShape, cluster: Cluster, *, first: bool, last: bool) -> LayerCost:
    """The embedding (first pipeline rank) and the output layer with the loss (last rank).

    Embedding: a gather of m rows (plus the position add for GPT), vocab-parallel under TP, so its
    output is all-reduced (reduce-scattered with SP; meshplan's runtime all-reduces GPT's and cuts
    it after the position add). Output: the final norm, the logits matmul ``(m, h) @ (h, V/tp)``,
    and a cross-entropy in fp32 that reads and writes about 18 bytes per logit forward (bf16 read,
    fp32 upcast, log-softmax) and as many backward, or at the measured log-softmax rate where that
    is slower (CPUs), or one fused kernel over the 16-bit logits (``Software.cross_entropy``: FlashAttention's, 4
    bytes a logit each way); under TP the hidden state is all-gathered (SP) or its gradient all-reduced.
    The cross-entropy is vocab-parallel (V/tp logits per rank: Megatron's, and meshplan's runtime's
    ``loss_parallel``, whose three per-token all-reduces are timed here); a software without it
    (``Software.vocab_parallel_loss=False``) gathers the logits: an all-gather of the m*V logits and
    the concatenation of the gathered shards forward, and the full-vocabulary loss on every rank;
    with SP the hidden state's all-gather forward and reduce-scatter backward.
    On a CPU the loss path's logits-sized tensors are new memory when they reach 32 MiB
    (``kernels.fresh_pages_s``).
    """
    accel, d, ab, tp = cluster.accelerator, shape.dims, ACTIVATION_BYTES[shape.dtype], shape.tp
    m, act = shape.tokens, shape.tokens * shape.dims.hidden * ab
    whole = act / (tp if shape.sp else 1)
    runtime = tp > 1 and runs_dtensor_styles(shape.software)
    gathered = tp > 1 and not shape.software.vocab_parallel_loss  # the loss sees all V logits on each rank
    kind = "reduce-scatter" if shape.sp and not (runtime and d.family == "gpt") else "all-reduce"
    sync = accel.sync_overhead_s if tp > 1 else 0.0
    fwd = bwd = comm_f = comm_b = 0.0
    tp_bytes = 0.0
    if first:
        moved = (3 if d.family == "gpt" else 2) * act
        fwd += memory_time_s(accel, moved, 2)
        bwd += memory_time_s(accel, 2 * moved, 2)
        comm_f += collective_time(kind, act, tp, 1, cluster) + sync
        tp_bytes += bus_bytes(kind, act, tp)
    if last:
        f, b = matmul_fwd_bwd_s(accel, unquantized_dtype(accel, shape.dtype), m, d.vocab / tp, d.hidden, ab)
        logits = m * d.vocab / (1 if gathered else tp)  # the loss's
        norm = (4 if d.family == "gpt" else 8) * whole
        # bytes a logit the loss moves (Software.cross_entropy): FlashAttention's xentropy kernel reads the
        # 16-bit logits twice forward (the row's max, then its sum of exponentials) and once backward, writing
        # their gradient: 4 bytes a logit each way at bf16; Transformer Engine's reads them twice forward and
        # writes their fp32 gradient, which its backward scales in place (read, write) and autograd casts to
        # the logits' dtype (read, write): 8 forward, 14 backward at bf16
        loss_f, loss_b = {"flash": (2 * ab, 2 * ab), "te": (2 * ab + 4, 4 + 4 + 4 + ab)}.get(
            shape.software.cross_entropy, (18, 18))
        fwd += f + memory_time_s(accel, loss_f * logits + norm, 6)
        bwd += b + memory_time_s(accel, loss_b * logits + 2 * norm, 8)
        fwd += transcendental_excess_s(accel, "log_softmax", logits, 2 * 4 * logits)  # fp32 r + w
        bwd += transcendental_excess_s(accel, "log_softmax_backward", logits, 3 * 4 * logits)
        # new tensors of the loss path, faulted in where they are large (CPUs, kernels.fresh_pages_s): the
        # head's logits and the fp32 log-probabilities; backward the NLL's zeroed gradient and log-softmax's
        fwd += fresh_pages_s(accel, m * d.vocab / tp * ab) + fresh_pages_s(accel, 4 * logits)
        bwd += fresh_pages_s(accel, 4 * logits, 2)
        gather = "all-gather" if shape.sp else "all-reduce"
        comm_b += collective_time(gather, act, tp, 1, cluster) + sync
        tp_bytes += bus_bytes(gather, act, tp)
        if tp > 1 and runs_loss_parallel(shape.software):  # one fp32 value per token: max, sum, target
            comm_f += 3 * (collective_time("all-reduce", 4 * m, tp, 1, cluster) + sync)
            tp_bytes += 3 * bus_bytes("all-reduce", 4 * m, tp)
        if gathered:  # the logits gathered (S(-1) -> R: gathered on dim 0, then concatenated on the last)
            comm_f += collective_time("all-gather", logits * ab, tp, 1, cluster) + sync
            fwd += memory_time_s(accel, 2 * logits * ab, 1) + fresh_pages_s(accel, logits * ab, 2)
            tp_bytes += bus_bytes("all-gather", logits * ab, tp)
        if runtime and shape.sp:  # the hidden state S(1) -> R forward; its gradient reduce-scattered
            comm_f += collective_time("all-gather", act, tp, 1, cluster) + sync
            tp_bytes += bus_bytes("all-gather", act, tp)
    ops_f, ops_b = dispatches_s(edge_dispatches(d, tp, shape.sp, first=first, last=last), cluster)
    fwd, bwd = fwd + ops_f, bwd + ops_b
    return LayerCost(fwd_compute_s=fwd, bwd_compute_s=bwd, core_fwd_s=0.0, selective_fwd_s=0.0,
                     fwd_comm_s=comm_f, bwd_comm_s=comm_b,
                     comm_bytes_fwd={"tp": tp_bytes}, comm_bytes_bwd={})
