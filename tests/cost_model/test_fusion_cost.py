"""The cost model counts the fused kernels a plan records: the memory-bound time of a layer falls by
exactly the bytes (and kernel launches) the fused kernels save, the cost model's table agrees with
the kernels codegen generates, and a fusion the program cannot run saves nothing."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from meshplan import autoparallelize, ir, zoo
from meshplan.codegen.kernels import pattern
from meshplan.codegen.kernels.elementwise import backward_of, backward_traffic
from meshplan.cost_model import estimate, fusion_saving, parse_cluster, worthwhile
from meshplan.cost_model.fusion import FUSED_TRAFFIC
from meshplan.cost_model.layer_cost import LayerShape, layer_cost
from meshplan.frontend import trace

H100 = parse_cluster("h100-sxm:1x8")


def _dims(model: str):
    with torch.device("meta"):
        return trace(zoo.build(model), batch=1, seq_len=64).dims


@pytest.fixture(scope="module")
def llama():
    return _dims("llama3-8b")


def test_fused_layer_saves_exactly_the_counted_bytes_over_bandwidth(llama) -> None:
    shape = LayerShape(dims=llama, micro_batch=2, seq_len=4096, tp=2)
    fused = replace(shape, fusions=("add_rmsnorm", "swiglu"))
    accel = H100.accelerator
    m, ab = 2 * 4096, 2
    whole, ffn = m * llama.hidden * ab, m * llama.ffn_hidden * ab / 2  # the stream is whole without SP
    saving = fusion_saving(fused, fused.fusions)
    # add + RMSNorm: eager 3 + 4 passes, fused 4; SwiGLU: eager 2 + 3, fused 3 (backward: 2x eager, fused 4 and 5)
    assert saving.fwd_bytes == 3 * whole + 2 * ffn
    assert saving.bwd_bytes == (14 - 4) * whole + (10 - 5) * ffn
    assert (saving.fwd_kernels, saving.bwd_kernels) == (4 + 1, 8 + 3)
    bandwidth = accel.memory_bw_Bps * accel.memory_efficiency
    plain, fast = layer_cost(shape, H100), layer_cost(fused, H100)
    assert plain.fwd_compute_s - fast.fwd_compute_s == pytest.approx(
        saving.fwd_bytes / bandwidth + saving.fwd_kernels * accel.kernel_overhead_s, rel=1e-12)
    assert plain.bwd_compute_s - fast.bwd_compute_s == pytest.approx(
        saving.bwd_bytes / bandwidth + saving.bwd_kernels * accel.kernel_overhead_s, rel=1e-12)


def test_a_fused_plan_predicts_less_step_time(llama) -> None:
    cfg = zoo.config("llama3-8b").to_dict()
    with torch.device("meta"):
        graph = trace(zoo.build("llama3-8b"), batch=1, seq_len=64)
    plan = ir.Plan(model=cfg, cluster="h100-sxm:1x8", global_batch=8, seq_len=4096, mesh=ir.Mesh(dp=8),
                   zero_stage=3, micro_batch_size=1, num_microbatches=1)
    plain, fused = estimate(graph, H100, plan), estimate(graph, H100, replace(plan, fusions=("add_rmsnorm", "swiglu")))
    assert fused.step_time_s < plain.step_time_s
    # sequence parallelism rules out the add + norm: only SwiGLU's saving is left
    sp = replace(plan, mesh=ir.Mesh(dp=4, tp=2), sequence_parallel=True, micro_batch_size=2)
    only = estimate(graph, H100, replace(sp, fusions=("swiglu",)))
    assert estimate(graph, H100, replace(sp, fusions=("add_rmsnorm", "swiglu"))).step_time_s == only.step_time_s
    assert only.step_time_s < estimate(graph, H100, sp).step_time_s


def test_the_table_agrees_with_the_generated_kernels() -> None:
    for name, t in FUSED_TRAFFIC.items():
        p = pattern(name)
        assert t.fused_fwd == p.forward_traffic().fused, name
        if p.kind == "elementwise":
            assert t.fused_bwd == backward_traffic(p, backward_of(p)).fused, name
        else:  # codegen.kernels.norms: the backward reads dout, dresidual and s and writes ds
            assert t.fused_bwd == 4, name


def test_the_cost_model_keeps_the_fusions_that_save_time() -> None:
    found = ("add_layernorm", "bias_gelu")
    # PyTorch's Linear adds the bias in its GEMM: a fused bias + GeLU moves what the eager GeLU moves
    assert worthwhile(found, "gpt", tp=1, sp=False) == ("add_layernorm",)
    assert worthwhile(found, "gpt", tp=2, sp=True) == ()
    assert worthwhile(("add_rmsnorm", "swiglu"), "llama", tp=2, sp=False) == ("add_rmsnorm", "swiglu")
    assert worthwhile(("add_rmsnorm", "swiglu"), "moe", tp=1, sp=False) == ("add_rmsnorm",)
    assert worthwhile(("softmax",), "llama", tp=1, sp=False) == ()


def test_autoparallelize_records_fusions_and_reports_their_saving() -> None:
    plan = autoparallelize("llama3-8b", "h100-sxm:1x8", global_batch=64, seq_len=4096, time_limit_s=10,
                           fixed={"tp": 1, "pp": 1, "cp": 1})
    assert plan.fusions == ("add_rmsnorm", "swiglu")
    unfused = plan.solver.alternatives[0]
    assert unfused["fuse"] is False and unfused["step_time_s"] > plan.prediction.step_time_s
    saved_ms = (unfused["step_time_s"] - plan.prediction.step_time_s) * 1e3
    assert f"add_rmsnorm, swiglu: save {saved_ms:.1f} ms/step (emit and apply fuse by default" in plan.report()
    assert "with --no-fuse (eager ops): the fused kernels add_rmsnorm, swiglu save" in plan.explain()
    assert ir.Plan.from_json(plan.to_json()).fusions == plan.fusions


def test_a_hugging_face_llama_with_swiglu_alone_saves_what_the_zoo_saves_with_it() -> None:
    """A Hugging Face Llama's block is priced as the zoo's llama: its plan records swiglu (the kernel runs on
    its own LlamaMLP, codegen.fused), which saves the same bytes and launches as in the zoo's layer."""
    import transformers

    cfg = zoo.config("llama-tiny")
    hf_cfg = transformers.LlamaConfig(hidden_size=cfg.hidden, intermediate_size=cfg.ffn_hidden,
                                      num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                                      num_key_value_heads=cfg.kv_heads, vocab_size=cfg.vocab)
    with torch.device("meta"):
        hf = trace(transformers.LlamaForCausalLM(hf_cfg), batch=1, seq_len=64).dims
    zoo_dims = _dims("llama-tiny")
    assert hf.family == "llama" and worthwhile(("swiglu",), hf.family, tp=2, sp=True) == ("swiglu",)
    shapes = [LayerShape(dims=d, micro_batch=2, seq_len=128, tp=2, fusions=("swiglu",)) for d in (hf, zoo_dims)]
    savings = [fusion_saving(s, s.fusions) for s in shapes]
    assert savings[0] == savings[1] and savings[0].fwd_bytes > 0
