"""Memory per GPU: model states under ZeRO, activations per layer, and what rides on top.

Model states (Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054, sec. 3 and Fig. 1), bytes per
parameter as (params, grads, optimizer):

* ``bfloat16`` / ``float16`` / ``float8`` mixed precision: (2, 2, K=12): 16-bit weights and grads,
  fp32 master weights, Adam momentum and variance. 16 bytes per parameter in all.
* ``float32``: (4, 4, 8): fp32 weights and grads, Adam momentum and variance. Also 16 bytes per
  parameter; the difference is that activations are fp32 (4 bytes), twice the 16-bit ones.

ZeRO-1 divides the optimizer states by N_d, ZeRO-2 also the gradients, ZeRO-3 also the
parameters: for Psi = 7.5B and N_d = 64 that is 120, 31.4, 16.6 and 1.9 GB (the paper's Fig. 1).

Activations of one layer (Korthikanti et al. 2022, arXiv:2205.05198, sec. 4), in units of s*b*h
bytes at 2 bytes per element, split into what tensor parallelism leaves whole (R) and what it
shards (S), so that per layer ``bytes = s*b*h * (R / (t if sp else 1) + S / t)``:

* R: two norm inputs 4, attention input 2, MLP input 2 (under MoE the router's), two dropout masks 2
  (only with dropout; the zoo has none); MoE adds per routed token copy (k of them) the gathered expert
  input 2, and the fp32 router probabilities 4E/h. Not the experts' output: Megatron-Core multiplies the
  routing probabilities into the experts' activation (``permuted_probs``, "Scaled activation", in
  ``megatron/core/transformer/moe/experts.py``), so the combine (``unpermute`` in token_dispatcher.py, called
  without probs) needs nothing saved and fc2 keeps only its input, counted in S. (meshplan's eager
  program weighs the expert outputs in the combine and keeps them: ``eager_layer_bytes``.)
* S: Q 2, K and V 2kv/h each (the fused attention takes grouped-query K and V as they are:
  Transformer Engine's ``DotProductAttention`` with ``num_gqa_groups``), projection input 2; rotary
  embeddings keep nothing (Megatron-Core's ``apply_rope_fusion``, on in Megatron-Bridge's Llama
  configs: Transformer Engine's fused RoPE saves only the frequencies, its backward rotates the
  gradient back); the MLP keeps 4f/h (GELU: its input and output) or 6f/h (SwiGLU fused by
  ``bias_activation_fusion``: ``SwiGLUFunction`` in ``megatron/core/fusions/fused_bias_swiglu.py``
  saves its input, gate and up, 4f/h, and the down projection keeps its input, 2f/h), k*6f/h for MoE.
  (meshplan's own eager program repeats K and V, keeps pre-rotary Q and K and four SwiGLU tensors:
  ``eager_layer_bytes``.)
* The attention core: without a fused kernel it stores softmax 2as/h, and with dropout also the
  mask as/h and the dropped-out probabilities 2as/h, i.e. Korthikanti's 5as/h. With
  SDPA/FlashAttention (our default) that term is absent; the kernel keeps its output and the fp32
  log-sum-exp 4a/h instead, and its output is the projection's input already counted in S: flash
  kernels write it in (b, s, heads, head_dim) order, so the transpose back and the reshape to
  (b, s, h) are views of it (a profile of the CPU runtime: one tensor per layer, not two).

For GPT with dropout, f = 4h and no fused attention this is Korthikanti's table exactly:
sbh(34 + 5as/h) unsharded, sbh(10 + 24/t + 5as/ht) with TP, sbh/t(34 + 5as/h) with TP+SP.
Selective recompute drops what the attention core saved (Korthikanti's policy, Megatron's programs);
in meshplan's runtime it keeps the matmul outputs and recomputes the rest (``matmul_save_units``:
about half of the eager SwiGLU layer's bytes); full recompute keeps only the layer input 2sbh
(2sbh/t with SP). Context parallelism divides s by cp in s*b*h.
"""
from __future__ import annotations

from ..ir.graph import ModelDims
from .flops import attention_params, dense_mlp_params, expert_params, kv_width, layer_matmul_params, q_width

STATE_BYTES = {"bfloat16": (2, 2, 12), "float16": (2, 2, 12), "float8": (2, 2, 12), "float4": (2, 2, 12),
               "float32": (4, 4, 8)}
ACTIVATION_BYTES = {"bfloat16": 2, "float16": 2, "float8": 2, "float4": 2, "float32": 4}
# bytes per element of a GEMM operand quantized to a plan's low-precision dtype, its scales included: FP8 1
# (one fp32 scale per tensor, or per 32 elements under MXFP8: 1/32 byte, not counted); NVFP4 a 4-bit E2M1 value
# and one E4M3 scale per 16 elements, 0.5 + 1/16 (NVIDIA, "Pretraining Large Language Models with NVFP4",
# arXiv:2509.25149 sec. 2: 16-element blocks with an FP8 E4M3 scale, and a per-tensor FP32 scale)
GEMM_OPERAND_BYTES = {"float8": 1.0, "float4": 0.5 + 1.0 / 16}


def state_bytes(param_count: float, *, dp: int, zero_stage: int, dtype: str = "bfloat16") -> dict[str, float]:
    """Bytes of params, grads and optimizer states on one GPU holding ``param_count`` parameters
    replicated over ``dp`` ranks, sharded by ZeRO stage ``zero_stage``."""
    param_b, grad_b, opt_b = STATE_BYTES[dtype]
    return {"params": param_b * param_count / (dp if zero_stage >= 3 else 1),
            "grads": grad_b * param_count / (dp if zero_stage >= 2 else 1),
            "optimizer": opt_b * param_count / (dp if zero_stage >= 1 else 1)}


def activation_units(dims: ModelDims, *, seq_len: int, flash: bool = True, dropout: bool = False,
                     fp8: bool = False) -> tuple[float, float, float]:
    """(R, S, core) per layer in units of s*b*h bytes at 2-byte elements (see the module docstring):
    R is left whole by TP, S is sharded by TP, core is what the attention core alone saves.

    ``fp8``: a plan in float8 or float4 (``GEMM_OPERAND_BYTES``); NVFP4's copies are counted at FP8's 1 byte,
    rounding up. Transformer Engine keeps a GEMM's quantized input (1 byte, the columnwise copy) instead of
    the bf16 one (te.Linear / te.LayerNormLinear / te.GroupedLinear, ``linear.py``, ``layernorm_linear.py``,
    ``grouped_linear.py``): the two norm outputs and fc2's input halve; the projection's input is kept in
    bf16 by the attention core and, under TE's default delayed-scaling recipe, once more as an FP8 copy
    (``save_original_input`` is refused there), 1 byte more. Under MoE the MLP's norm output feeds the
    router, a plain GEMM that keeps it in bf16; the k gathered expert inputs halve instead."""
    h, f, a = dims.hidden, dims.ffn_hidden, dims.heads
    whole = 8.0 + (2.0 if dropout else 0.0)
    sharded = (4.0 * q_width(dims) + 4.0 * kv_width(dims)) / h  # Q, projection input; K, V at their own width
    if dims.family == "gpt":
        sharded += 4.0 * f / h
    elif dims.family == "moe":
        whole += 2.0 * dims.top_k + 4.0 * dims.experts / h
        sharded += dims.top_k * 6.0 * f / h
    else:
        sharded += 6.0 * f / h
    core = 4.0 * a / h if flash else (2.0 + (3.0 if dropout else 0.0)) * a * seq_len / h
    if fp8:  # the QKV and fc1 inputs (norm outputs) at 1 byte each; under MoE the router's stays, the
        whole -= 2.0 if dims.family != "moe" else 1.0 + dims.top_k  # k expert inputs halve
        sharded += (q_width(dims) - (dims.top_k if dims.family == "moe" else 1) * f) / h  # proj copy; fc2 input
    return whole, sharded, core


def matmul_save_units(dims: ModelDims, *, tp: int = 1, sp: bool = False, alternate: bool = False) -> float:
    """What selective recompute keeps per layer when it saves the outputs of the matmuls and of the
    tensor-parallel collectives and recomputes everything else (norms, rotary, the attention core,
    activations, residual adds): meshplan's runtime (``codegen.program.SELECTIVE_SAVE_OPS``, PyTorch's
    selective activation checkpointing), in units of s*b*h bytes at 2 bytes per element (TP applied).

    Per token: the layer's input (sequence-sharded under SP); the column-parallel outputs, sharded by
    TP (GPT: the fused QKV 3h and the MLP up-projection f; Llama: Q h, K and V kv each (before the
    zoo repeats them), gate and up 2f; MoE: per routed copy gate and up 2f); the row-parallel outputs,
    partial sums of width h on every TP rank (attention and MLP output projections, k of them for
    MoE, with the router's E logits); with TP the collectives' outputs too: under SP the two gathered
    norm outputs (whole) and the two reduce-scatter outputs (/t), else the two all-reduce outputs.

    ``alternate`` (torchtitan's op-level policy, ``Software.selective_alternate_matmuls``; dense blocks): only
    every other matmul's output in forward order (GPT: q, v, fc1; Llama: q, v, w1, w2), and the attention kernel's
    output with its fp32 log-sum-exp per head, sharded by TP; of the collectives' outputs only the reduce-scatters'
    (its ``_save_list``: aten.mm, the SDPA kernels, ``_c10d_functional.reduce_scatter_tensor``, abs and max;
    torchtitan/parallelisms/parallelize_llama.py @9dec370): the gathered norm outputs are gathered again in the
    backward (``layer_cost.layer_cost``'s selective time), an all-reduce's output recomputed too."""
    h, f, q = dims.hidden, dims.ffn_hidden, q_width(dims)
    if alternate and dims.family != "moe":
        kv = kv_width(dims)  # forward order as layer_cost.layer_matmuls lists them: (width, sharded by TP)
        order = [(q, True), (kv, True), (kv, True), (h, False)] + (
            [(f, True), (h, False)] if dims.family == "gpt" else [(f, True), (f, True), (h, False)])
        kept = order[0::2]
        sharded = sum(w for w, by_tp in kept if by_tp) + q + 2.0 * dims.heads  # + attention output, fp32 lse
        row = sum(w for w, by_tp in kept if not by_tp)
    elif dims.family == "gpt":
        sharded, row = q + 2.0 * kv_width(dims) + f, 2.0 * h  # the fused QKV: 3h where heads * head_dim = h
    elif dims.family == "moe":
        sharded, row = q + 2.0 * kv_width(dims) + dims.top_k * 2.0 * f, h + dims.top_k * h + dims.experts
    else:
        sharded, row = q + 2.0 * kv_width(dims) + 2.0 * f, 2.0 * h
    elems = h / (tp if sp else 1) + row + sharded / tp
    if tp > 1 and alternate and dims.family != "moe":
        elems += 2.0 * h / tp if sp else 0.0  # torchtitan's list keeps the reduce-scatters' outputs only
    elif tp > 1:
        elems += 2.0 * h + 2.0 * h / tp if sp else 2.0 * h
    return 2.0 * elems / h


def eager_layer_bytes(dims: ModelDims, *, seq_len: int, micro_batch: int, tp: int = 1, sp: bool = False,
                      cp: int = 1, ep: int = 1, recompute: str = "none", dtype: str = "bfloat16",
                      stream_fp32: bool = False, alternate_matmuls: bool = False, fused_norm: bool = False,
                      compiled: bool = False) -> float:
    """Bytes one layer keeps for its backward, per micro-batch, on one GPU, as autograd saves them for
    the zoo's eager modules under meshplan's runtime (``Software.eager_modules``): in ``dtype``
    (c bytes per element) under ``torch.autocast`` when it is 16-bit. ``stream_fp32``: the layer's
    parameters are fp32 when it computes (autocast without FSDP2: DDP, TP or PP alone), so the residual
    stream is fp32 and autocast casts every matmul's fp32 operands to c bytes, each cast kept for the
    backward; under FSDP2 the gathered parameters, and the stream, are already in ``dtype``.

    Per token, each of width h unless said (SDPA with a flash kernel; no dropout in the zoo):

    * norms (on the sequence slice under SP): LayerNorm keeps its input, in the stream's dtype (r: 4
      with an fp32 stream, else c); ``nn.RMSNorm`` keeps its input and the normalized tensor, both fp32
      (it upcasts), 2 x 4 bytes; a fused norm kernel (``fused_norm``, ``Software.fused_norm``) its input (r);
    * the sublayers' inputs (whole on every TP rank: DTensor's SP keeps the gathered tensor): one per
      sublayer, or with an fp32 stream one cast per projection reading it (q, k, v; GPT's fc1; Llama's
      w1 and w3; the MoE router);
    * attention (sharded by TP): Q, K and V at q width (K and V repeated to every head before SDPA,
      which saves the repeated ones; the rotary embedding saves only its tables), the kernel's output
      (the output projection's input: flash kernels write it in (b, s, heads, head_dim) order, so the
      transpose and reshape back are views) and its fp32 log-sum-exp (4 bytes per head);
    * MLP (sharded by TP): GELU keeps fc1's output and its own, 2 of width f; SwiGLU w1's and w3's
      outputs, silu and the product, 4 of width f; MoE (replicated over TP in the zoo) per routed copy
      the expert input (two casts with an fp32 stream), the four SwiGLU tensors, the expert's output
      and its product with the routing weight (in the stream's dtype: the weights are cast to it),
      and the fp32 router probabilities (4 bytes per expert);
    * with an fp32 stream, the c-byte copy of every matmul weight autocast made for this forward
      (the layer's share under TP and EP; autocast casts views such as an expert's slice each call).

    Under ``torch.compile`` (``compiled``, ``Software.compiled``) the partitioner keeps a norm's input (as a fused
    norm does) and recomputes SwiGLU's silu in the backward from w1's output: 3 of width f (w1's and w3's outputs,
    the product w2 reads), not 4.

    Full recompute keeps the layer's input (r bytes); selective recompute (``matmul_save_units``) the
    matmul outputs (every other one and the attention output with ``alternate_matmuls``) and the input at r
    bytes. Measured against ``torch.autograd.graph.saved_tensors_hooks`` on the zoo's blocks
    (tests/cost_model/test_saved_activations.py)."""
    c, r = stream_bytes(dtype, stream_fp32)
    stream_fp32 = r > c
    tokens = seq_len / cp * micro_batch
    h, f, q = dims.hidden, dims.ffn_hidden, q_width(dims)
    slice_div = tp if sp else 1
    if recompute == "full":
        return tokens * h * r / slice_div
    moe = dims.family == "moe"
    norms = 2.0 * (r if fused_norm or compiled else _norm_saved_bytes(dims, r)) * h  # a fused norm: its input only
    swiglu = 3.0 if compiled else 4.0  # SwiGLU's saved tensors of width f (silu recomputed under compile)
    attn_in = (3.0 if stream_fp32 else 1.0) * c * h
    if dims.family == "gpt":
        mlp_in, mlp = c * h, 2.0 * f * c
    elif moe:
        k = dims.top_k
        mlp_in = c * h  # the router's input (its cast with an fp32 stream, else the norm's output)
        mlp = k * ((2.0 if stream_fp32 else 1.0) * c * h + swiglu * f * c + c * h + r * h) + 4.0 * dims.experts
    else:
        mlp_in, mlp = (2.0 if stream_fp32 else 1.0) * c * h, swiglu * f * c
    attn = 4.0 * q * c + 4.0 * dims.heads
    per_token = norms / slice_div + attn_in + mlp_in + attn / tp + (mlp if moe else mlp / tp)
    weights = 0.0  # the matmul weights autocast copies, this rank's share (router whole, experts over ep)
    if stream_fp32:
        weights = (attention_params(dims) / tp + dense_mlp_params(dims) + expert_params(dims) / ep if moe
                   else layer_matmul_params(dims) / tp)
    none = tokens * per_token + c * weights
    if recompute == "selective":  # matmul_save_units: 2-byte units of s*b*h, the layer's input among them
        units = matmul_save_units(dims, tp=tp, sp=sp, alternate=alternate_matmuls)
        return min(tokens * h * (units * c / 2.0 + (r - c) / slice_div), none)
    return none


def discarded_units(dims: ModelDims, modules: tuple[str, ...], *, fp8: bool = False,
                    fused_mlp: bool = False) -> tuple[float, float]:
    """(R, S) units of ``activation_units`` that Megatron's output-discarding recomputation of ``modules``
    (``Software.recompute_modules``) frees until the backward recomputes them. ``"layernorm"``: the MoE layer's
    pre-MLP norm output, a norm module of its own whose output feeds the router and the dispatch (2 units); the
    attention's norm, and a dense MLP's, run inside Transformer Engine's LayerNormLinear, which no recomputation
    of norms reaches (Megatron's Transformer Engine layer spec: ``linear_qkv=column_parallel_layer_norm_linear()``,
    ``pre_mlp_layernorm=layer_norm() if num_experts else IdentityOp``, megatron/core/models/gpt/gpt_layer_specs.py
    @d98e8a64dd; MLA's separate input norm is not counted, which errs high). ``"moe_act"``:
    the experts' activation output, the second grouped GEMM's input (2 bytes, 1 where Transformer Engine keeps it
    quantized under FP8), not where a fused grouped MLP makes it inside the GEMM (``fused_mlp``)."""
    if dims.family != "moe":
        return 0.0, 0.0
    whole = 2.0 if "layernorm" in modules else 0.0
    sharded = ((1.0 if fp8 else 2.0) * dims.top_k * dims.ffn_hidden / dims.hidden
               if "moe_act" in modules and not fused_mlp else 0.0)
    return whole, sharded


def layer_activation_bytes(dims: ModelDims, *, seq_len: int, micro_batch: int, tp: int = 1, sp: bool = False,
                           cp: int = 1, recompute: str = "none", flash: bool = True, dropout: bool = False,
                           dtype: str = "bfloat16", selective_saves_matmuls: bool = False,
                           recompute_modules: tuple[str, ...] = (), fused_mlp: bool = False,
                           alternate_matmuls: bool = False) -> float:
    """Bytes one layer keeps for its backward, per micro-batch, on one GPU, as Korthikanti et al. count
    them (Megatron's fused modules; meshplan's own program: ``eager_layer_bytes``).
    ``selective_saves_matmuls``: selective recompute keeps the matmul outputs and recomputes the rest
    (``matmul_save_units``, never more than no recompute), not Korthikanti's attention core alone;
    ``alternate_matmuls``: every other one of them (torchtitan's policy, ``matmul_save_units``).
    ``recompute_modules``: what Megatron also discards and recomputes (``discarded_units``)."""
    sbh = seq_len / cp * micro_batch * dims.hidden * ACTIVATION_BYTES[dtype] / 2.0
    whole_div = tp if sp else 1
    if recompute == "full":
        return sbh * 2.0 / whole_div
    fp8 = dtype in GEMM_OPERAND_BYTES
    whole, sharded, core = activation_units(dims, seq_len=seq_len, flash=flash, dropout=dropout, fp8=fp8)
    freed_whole, freed_sharded = discarded_units(dims, recompute_modules, fp8=fp8, fused_mlp=fused_mlp)
    whole, sharded = whole - freed_whole, sharded - freed_sharded
    none = whole / whole_div + (sharded + core) / tp
    if recompute == "selective" and selective_saves_matmuls:
        return sbh * min(matmul_save_units(dims, tp=tp, sp=sp, alternate=alternate_matmuls), none)
    if recompute != "selective":
        return sbh * none
    return sbh * (whole / whole_div + sharded / tp)


def logits_bytes(dims: ModelDims, *, seq_len: int, micro_batch: int, tp: int, cp: int,
                 loss_parallel: bool = False, kind: str = "upcast", dtype: str = "bfloat16") -> tuple[float, float]:
    """(kept, transient) bytes of the output layer and loss for one micro-batch (``zoo.loss_fn``:
    cross-entropy of the logits upcast to fp32, i.e. log-softmax then NLL), whatever the compute dtype.
    Kept for the backward: the fp32 log-softmax output only; the logits (V/tp, vocab-parallel) are
    freed once upcast (nothing saves them: the output layer saves its input, the upcast nothing), in
    fp32 once the log-softmax has read them. Transient, at the start of the backward, the largest
    moment: the two fp32 gradients the loss's backward holds at once (the NLL backward writes a dense
    gradient of the log-probabilities, and the log-softmax backward writes the logits' gradient while
    that one is still alive). A profile of the CPU runtime saw both: three logits-sized fp32 tensors at
    the peak, in fp32 and in bf16. The forward's moment (logits, their upcast, the log-softmax: at most
    10 bytes per element) is smaller.

    ``loss_parallel``: torch's vocab-parallel backward (meshplan's runtime under TP, ``runtime.loss``)
    computes the logits' gradient as ``(grad_input + exp(logp)) * grad_output`` with ``grad_input`` a
    zeroed tensor it keeps to the end (``_nll_loss_and_log_softmax_backward`` in
    ``torch/distributed/tensor/parallel/loss.py``): three fp32 logits-sized tensors beside the kept
    log-probabilities at its add, 12 bytes per element transient (a profile of TP4 on 4 gloo ranks saw
    four 8.4 MB tensors at the peak, inside ``nll_loss_backward``'s add).

    ``kind``: ``Software.cross_entropy``. FlashAttention's fused kernel (``"flash"``) keeps the logits in the
    compute dtype (``dtype``) and writes one gradient of them in that dtype: no fp32 copy either way.
    Transformer Engine's (``"te"``) keeps the fp32 gradient its forward wrote, not the logits, and its
    backward's result is cast to ``dtype``: 4 bytes kept, one cast transient."""
    elems = seq_len / cp * micro_batch * dims.vocab / tp
    if kind == "flash":
        return elems * ACTIVATION_BYTES[dtype], elems * ACTIVATION_BYTES[dtype]
    if kind == "te":
        return elems * 4.0, elems * ACTIVATION_BYTES[dtype]
    return elems * 4.0, elems * (12.0 if loss_parallel else 8.0)


def head_input_bytes(dims: ModelDims, *, seq_len: int, micro_batch: int, cp: int, dtype: str = "bfloat16",
                     stream_fp32: bool = False, tp: int = 1, sp: bool = False) -> float:
    """Bytes the final norm and the output layer keep for the backward, per micro-batch, in meshplan's
    eager program (``eager_layer_bytes``): the norm's saved tensors (on the sequence slice under SP), the
    output layer's input (whole), and with an fp32 stream autocast's copy of the output weight (V/tp)."""
    c, r = stream_bytes(dtype, stream_fp32)
    tokens = seq_len / cp * micro_batch
    weight = c * dims.vocab * dims.hidden / tp if r > c else 0.0
    return tokens * dims.hidden * (_norm_saved_bytes(dims, r) / (tp if sp else 1) + c) + weight


def stream_bytes(dtype: str, stream_fp32: bool = False) -> tuple[float, float]:
    """(c, r): bytes per element of what a layer computes in ``dtype``, and of the residual stream, fp32
    when the parameters are fp32 at compute under autocast (``stream_fp32``, 16-bit dtypes only)."""
    c = float(ACTIVATION_BYTES[dtype])
    return c, 4.0 if stream_fp32 else c


def _norm_saved_bytes(dims: ModelDims, r: float) -> float:
    """Bytes per element of width h one norm keeps: LayerNorm its input in the stream's dtype,
    ``nn.RMSNorm`` its input and the normalized tensor, both fp32."""
    return r if dims.family == "gpt" else 8.0
