"""Activation memory per layer against Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4 / table 2."""
from __future__ import annotations

import pytest

from meshplan import ir
from meshplan.cost_model import layer_activation_bytes, logits_bytes
from meshplan.cost_model.memory import activation_units

# (hidden, heads, layers, seq, micro-batch, tp): their 22B and 175B configurations (table 3)
CONFIGS = [(6144, 64, 48, 2048, 4, 8), (12288, 96, 96, 2048, 1, 8)]


def _gpt(h: int, a: int, layers: int) -> ir.ModelDims:
    return ir.ModelDims(family="gpt", layers=layers, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=51200)


@pytest.mark.parametrize("h, a, layers, s, b, t", CONFIGS)
def test_korthikanti_table_with_dropout_and_unfused_attention(h, a, layers, s, b, t) -> None:
    dims, sbh = _gpt(h, a, layers), s * b * h
    act = lambda **kw: layer_activation_bytes(dims, seq_len=s, micro_batch=b, flash=False, dropout=True, **kw)
    assert act() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(tp=t, sp=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(tp=t, sp=True, recompute="selective") == pytest.approx(34 * sbh / t)
    assert act(recompute="full") == pytest.approx(2 * sbh)
    assert act(tp=t, sp=True, recompute="full") == pytest.approx(2 * sbh / t)


@pytest.mark.parametrize("h, a, layers, s, b, t", CONFIGS)
def test_fused_attention_drops_the_5as2b_term(h, a, layers, s, b, t) -> None:
    dims, sbh = _gpt(h, a, layers), s * b * h
    flash = layer_activation_bytes(dims, seq_len=s, micro_batch=b, tp=t, sp=True, dropout=True)
    # the kernel keeps its fp32 log-sum-exp (4abs) instead of 5as^2b; its output is the projection's
    # input, already among the 34
    assert flash == pytest.approx(sbh / t * (34 + 4 * a / h))
    assert flash < layer_activation_bytes(dims, seq_len=s, micro_batch=b, tp=t, sp=True, dropout=True, flash=False)


def test_generalized_ffn_gqa_and_dtype() -> None:
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=128256)
    mha = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=14336,
                       vocab=128256)
    kw = dict(seq_len=4096, micro_batch=1)
    assert layer_activation_bytes(llama, **kw) < layer_activation_bytes(mha, **kw)  # smaller K and V
    sbh = 4096 * 4096
    # Megatron-Core's fused modules: R = 8 (norms, inputs), S = 4 (q, proj input = kernel output)
    # + 4*kv/h (k, v at their grouped width) + 6f/h (fused SwiGLU's input and the down projection's)
    # + 4a/h (log-sum-exp); the fused RoPE keeps nothing; no dropout
    expect = sbh * (8 + 4 + 4 * 1024 / 4096 + 6 * 14336 / 4096 + 4 * 32 / 4096)
    assert layer_activation_bytes(llama, **kw) == pytest.approx(expect)
    assert layer_activation_bytes(llama, dtype="float32", **kw) == pytest.approx(2 * expect)
    assert layer_activation_bytes(llama, cp=2, **kw) == pytest.approx(expect / 2)


def test_logits_are_fp32_and_vocab_parallel() -> None:
    dims = _gpt(4096, 32, 32)
    kept, grad = logits_bytes(dims, seq_len=2048, micro_batch=2, tp=4, cp=1)
    elems = 2048 * 2 * 51200 / 4
    # kept: the fp32 log-softmax only (the logits and their upcast are freed); in the backward the
    # gradients of the log-probabilities and of the logits (fp32) exist at once
    assert kept == pytest.approx(elems * 4) and grad == pytest.approx(elems * 8)
    # torch's loss_parallel backward (meshplan's runtime under TP) holds a zeroed tensor, exp(log-probs)
    # and their sum at once: three fp32 tensors of the rank's logits
    kept, grad = logits_bytes(dims, seq_len=2048, micro_batch=2, tp=4, cp=1, loss_parallel=True)
    assert kept == pytest.approx(elems * 4) and grad == pytest.approx(elems * 12)


def test_selective_recompute_as_meshplan_runs_it_keeps_the_matmul_outputs() -> None:
    """meshplan's runtime saves the matmul and TP-collective outputs and recomputes the rest
    (codegen.program.SELECTIVE_SAVE_OPS); per token of a Llama layer without TP: the input h, Q h, K and
    V kv each, gate and up 2f, and the two output projections 2h, at 2 bytes each."""
    from meshplan.cost_model.memory import matmul_save_units

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=128256)
    s, b, h, f, kv = 4096, 1, 4096, 14336, 1024
    ours = layer_activation_bytes(llama, seq_len=s, micro_batch=b, recompute="selective", selective_saves_matmuls=True)
    assert ours == pytest.approx(s * b * 2 * (h + h + 2 * kv + 2 * f + 2 * h))
    korthikanti = layer_activation_bytes(llama, seq_len=s, micro_batch=b, recompute="selective")
    # Megatron's fused layer under Korthikanti's policy keeps the norms' inputs and outputs (4h), Q and the
    # projection input (2h), K and V (2kv), the fused SwiGLU's input and the down projection's (3f); the
    # runtime keeps the input (h), Q (h), K and V (2kv), gate and up (2f) and the two projections' outputs (2h)
    assert ours / korthikanti == pytest.approx((4 * h + 2 * kv + 2 * f) / (6 * h + 2 * kv + 3 * f))
    for dims in (llama, _gpt(6144, 64, 48),
                 ir.ModelDims(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                              vocab=32000, experts=8, top_k=2)):
        for tp, sp in ((1, False), (8, False), (8, True)):
            none = layer_activation_bytes(dims, seq_len=s, micro_batch=b, tp=tp, sp=sp)
            selective = layer_activation_bytes(dims, seq_len=s, micro_batch=b, tp=tp, sp=sp, recompute="selective",
                                               selective_saves_matmuls=True)
            full = layer_activation_bytes(dims, seq_len=s, micro_batch=b, tp=tp, sp=sp, recompute="full")
            assert full < selective <= none, (dims.family, tp, sp)
            assert matmul_save_units(dims, tp=tp, sp=sp) > 0


def test_torchtitans_selective_recompute_keeps_every_other_matmul_and_the_attention_output() -> None:
    """torchtitan's op-level policy (``Software.selective_alternate_matmuls``): of a Llama block's wq, wk, wv, wo,
    w1, w3, w2 it keeps wq, wv, w1 and w2's outputs (every second one is recomputed), the attention kernel's output
    with its fp32 log-sum-exp per head, and the block's input; meshplan's keeps every matmul output and no
    attention output."""
    import importlib

    from meshplan.cost_model.memory import matmul_save_units

    lc = importlib.import_module("meshplan.cost_model.layer_cost")  # the module (the package exports the function)
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=128256)
    s, b, h, f, kv, heads = 8192, 2, 4096, 14336, 1024, 32
    kw = dict(seq_len=s, micro_batch=b, recompute="selective", selective_saves_matmuls=True)
    titan = layer_activation_bytes(llama, alternate_matmuls=True, **kw)
    assert titan == pytest.approx(s * b * 2 * (h + h + kv + f + h + h + 2 * heads))
    assert titan < layer_activation_bytes(llama, **kw)  # wk, wo and w3 (f) dropped, the attention output (h) kept
    assert matmul_save_units(llama, alternate=True) == pytest.approx(titan / (s * b * h))
    # a MoE block keeps meshplan's rule (the policy is priced for dense blocks)
    moe = ir.ModelDims(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                       experts=8, top_k=2)
    assert matmul_save_units(moe, alternate=True) == matmul_save_units(moe)

    # the backward repeats the memory-bound ops and wk, wo and w3, not the attention core
    from meshplan.cost_model import Cluster, software_named
    from meshplan.cost_model.kernels import matmul_fwd_bwd_s

    cluster = Cluster.preset("a100-80gb")
    shape = lc.LayerShape(dims=llama, micro_batch=1, seq_len=s, software=software_named("meshplan"))
    ours, theirs = (lc.layer_cost(shape, cluster),
                    lc.layer_cost(lc.LayerShape(dims=llama, micro_batch=1, seq_len=s,
                                                software=software_named("torchtitan")), cluster))
    acc, m = cluster.accelerator, s
    wk, wo, w3 = (matmul_fwd_bwd_s(acc, "bfloat16", m, n, k, 2)[0] for n, k in ((kv, h), (h, h), (f, h)))
    assert theirs.fwd_compute_s == ours.fwd_compute_s and theirs.bwd_compute_s == ours.bwd_compute_s
    assert theirs.selective_fwd_s == pytest.approx(ours.selective_fwd_s - ours.core_fwd_s + wk + wo + w3)


def test_a_fused_norm_keeps_its_input_only_and_moves_a_read_and_a_write() -> None:
    """``Software.fused_norm`` (torchtitan's fused Triton RMSNorm): each of a Llama block's two norms keeps its
    bf16 input (and a per-row rstd), not nn.RMSNorm's two fp32 tensors: 2 x (8 - 2) bytes per token and h less;
    its forward reads and writes the (m, h) tensor once, where the eager chain (upcast, square, mean, rsqrt product,
    cast back, weight product) moves 36 bytes an element in 8 kernels: 18 passes of the 16-bit tensor."""
    import importlib

    from meshplan.cost_model import software_named
    from meshplan.cost_model.memory import eager_layer_bytes

    lc = importlib.import_module("meshplan.cost_model.layer_cost")
    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=128256)
    s, b, h = 8192, 1, 4096
    eager, fused = (eager_layer_bytes(llama, seq_len=s, micro_batch=b, fused_norm=f) for f in (False, True))
    assert eager - fused == pytest.approx(s * b * h * 2 * (8 - 2))
    plain, titan = (lc.elementwise_fwd(lc.LayerShape(dims=llama, micro_batch=b, seq_len=s, software=software_named(n)))
                    for n in ("torchtitan", "torchtitan+fused-norm"))
    assert plain[0] - titan[0] == pytest.approx(2 * (18 - 2) * s * b * h * 2) and plain[1] - titan[1] == 14


def test_megatron_moe_keeps_each_routed_copys_input_but_not_its_output() -> None:
    """Megatron-Core's MoE layer (Korthikanti's count): per routed copy the gathered expert input (2 bytes an
    element, R) and the SwiGLU's and fc2's inputs (6f/h, S); the probabilities are multiplied into the
    activation, so no expert output is kept for the combine. Under FP8 each GEMM input is kept as TE's FP8
    copy: the QKV norm output and the k expert inputs halve, the router's input (the MLP norm output) does not."""
    k, e, h, f = 8, 128, 2048, 768
    qwen3_30b = ir.ModelDims(family="moe", layers=48, hidden=h, heads=32, kv_heads=4, ffn_hidden=f, vocab=151936,
                             experts=e, top_k=k, head_dim=128)
    whole, sharded, _ = activation_units(qwen3_30b, seq_len=4096)
    assert whole == pytest.approx(8 + 2 * k + 4 * e / h)
    assert sharded == pytest.approx((4 * 4096 + 4 * 512) / h + k * 6 * f / h)
    whole8, sharded8, _ = activation_units(qwen3_30b, seq_len=4096, fp8=True)
    assert whole - whole8 == pytest.approx(1 + k)
    assert sharded - sharded8 == pytest.approx((k * f - 4096) / h)  # fc2's inputs halve; the projection's copy


def test_recomputed_modules_free_what_megatron_discards_until_the_backward() -> None:
    """Megatron's output-discarding ``--recompute-modules``: ``layernorm`` frees the MoE layer's pre-MLP norm output
    (s*b*h at 2 bytes: 2 units; the attention's norm runs inside TE's LayerNormLinear), ``moe_act`` the experts'
    activation output (k*f per token, 1 byte under FP8), none of it where a fused grouped MLP makes that inside its
    GEMM; a dense layer frees nothing. A GPT-OSS-shaped MoE: h 2880, 128 experts of 2880, top 4."""
    moe = ir.ModelDims(family="moe", layers=36, hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088,
                       experts=128, top_k=4, head_dim=64)
    s, b, tp = 4096, 1, 2
    sbh = s * b * moe.hidden
    act = lambda **kw: layer_activation_bytes(moe, seq_len=s, micro_batch=b, tp=tp, sp=True, **kw)
    kept = act()
    assert kept - act(recompute_modules=("layernorm",)) == pytest.approx(2 * sbh / tp)
    assert kept - act(recompute_modules=("moe_act",)) == pytest.approx(2 * moe.top_k * sbh / tp)
    assert act(dtype="float8") - act(dtype="float8", recompute_modules=("moe_act",)) == pytest.approx(
        moe.top_k * sbh / tp)
    assert act(recompute_modules=("moe_act",), fused_mlp=True) == act(fused_mlp=True)
    assert act(recompute="full", recompute_modules=("layernorm", "moe_act")) == act(recompute="full")
    dense = _gpt(4096, 32, 32)
    assert layer_activation_bytes(dense, seq_len=s, micro_batch=b, recompute_modules=("layernorm",)) == (
        layer_activation_bytes(dense, seq_len=s, micro_batch=b))


def test_torchtitans_op_policy_keeps_the_reduce_scatters_outputs_and_gathers_the_norm_outputs_again() -> None:
    """torchtitan's op-level SAC saves aten.mm (every other), the SDPA kernels and the reduce-scatters' outputs, not
    the all-gathers' (its ``_save_list`` @9dec370): under TP with SP a selective Llama layer keeps its input slice
    (h/tp), w2's partial sums (h), wq's, wv's and w1's outputs and the attention output with its log-sum-exp (/tp)
    and the two reduce-scatter outputs (h/tp each), not the two gathered norm outputs, which its backward gathers
    again: two all-gathers more in the recomputation's time. meshplan's runtime's policy keeps both."""
    import dataclasses

    from meshplan.cost_model import Cluster, LayerShape, layer_cost, software_named
    from meshplan.cost_model.collectives import collective_time
    from meshplan.cost_model.layer_cost import matmul_s, recomputed_matmuls_fwd_s
    from meshplan.cost_model.memory import matmul_save_units

    llama = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                         vocab=128256)
    h, t = 4096, 8
    sharded = 4096 + 1024 + 14336 + 4096 + 2 * 32  # wq, wv, w1, the attention output, its fp32 lse
    kept = h / t + h + sharded / t + 2 * h / t
    assert matmul_save_units(llama, tp=t, sp=True, alternate=True) == pytest.approx(2 * kept / h)
    runtime = h / t + 2 * h + (4096 + 2 * 1024 + 2 * 14336) / t + 2 * h + 2 * h / t  # + the two gathered tensors
    assert matmul_save_units(llama, tp=t, sp=True) == pytest.approx(2 * runtime / h)
    h100 = Cluster.preset("h100-sxm", nodes=1, gpus_per_node=8)
    titan = software_named("torchtitan")
    shape = LayerShape(dims=llama, micro_batch=2, seq_len=8192, tp=t, sp=True, software=titan)
    regather = 2 * (collective_time("all-gather", 2 * 8192 * h * 2, t, 1, h100) + h100.accelerator.sync_overhead_s)

    def without_gathers(sh):  # the rest of the recomputation: the unsaved pointwise work, the unsaved matmuls
        cost = layer_cost(sh, h100)
        return cost.fwd_compute_s - matmul_s(sh, h100)[0] - cost.core_fwd_s + recomputed_matmuls_fwd_s(sh, h100)

    assert layer_cost(shape, h100).selective_fwd_s == pytest.approx(without_gathers(shape) + regather)
    alone = dataclasses.replace(shape, tp=1, sp=False)
    assert layer_cost(alone, h100).selective_fwd_s == pytest.approx(without_gathers(alone))
