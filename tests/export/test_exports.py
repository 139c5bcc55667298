"""Each export read back as its framework reads it: torchtitan 0.2.2's ConfigManager, DeepSpeed
0.19.8's DeepSpeedConfig (each skipped, saying why, when not installed: `pip install
'.[report-check]'`), and Megatron-LM's argument definitions (``export.megatron.FLAGS``, read from its
parser at d98e8a6); plans a framework cannot run are refused naming the feature."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
from plans import plan  # noqa: E402  (planned once per session)

from meshplan import ir  # noqa: E402
from meshplan.export import export, megatron  # noqa: E402


def _no_recompute(p):
    return dataclasses.replace(p, recompute=(ir.Recompute.NONE,) * p.layers)


def _torchtitan(tmp_path, p):
    pytest.importorskip("torchtitan", reason="torchtitan 0.2.2 not installed (pip install '.[report-check]')")
    from torchtitan.config import ConfigManager

    path = tmp_path / "job.toml"
    path.write_text(export(p, "torchtitan"))
    return ConfigManager().parse_args(["--job.config_file", str(path)])


@pytest.mark.parametrize("kind", ["dense", "pipeline-ddp", "zero3"])
def test_torchtitan_reads_the_plan(tmp_path, kind):
    p = plan(kind)
    p = _no_recompute(p) if kind == "zero3" else p
    cfg = _torchtitan(tmp_path, p)
    par, tr, m = cfg.parallelism, cfg.training, p.mesh
    assert par.data_parallel_replicate_degree * max(par.data_parallel_shard_degree, 1) == m.dp
    assert (par.data_parallel_shard_degree > 1) == (p.zero_stage >= 2)
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (m.tp, m.pp, m.cp, m.ep)
    assert tr.global_batch_size == p.global_batch and tr.seq_len == p.seq_len
    accumulation = tr.global_batch_size // (tr.local_batch_size * m.dp)  # torchtitan's Trainer.__init__
    if m.pp > 1:
        assert tr.local_batch_size // par.pipeline_parallel_microbatch_size == p.num_microbatches
        assert par.pipeline_parallel_microbatch_size == p.micro_batch_size and accumulation == 1
        assert par.pipeline_parallel_schedule == {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}[p.schedule]
        layers = [[int(f.split(".")[1]) for f in part if f.startswith("layers.")]
                  for part in par.module_fqns_per_model_part]
        assert [(ls[0], ls[-1] + 1) for ls in layers] == [tuple(s) for s in p.stages]
    else:
        assert tr.local_batch_size == p.micro_batch_size and accumulation == p.num_microbatches
    assert cfg.activation_checkpoint.mode == ("none" if set(p.recompute) == {"none"} else "full")


def test_torchtitan_every_nth_full_layer(tmp_path):
    p = plan("zero3")
    p = dataclasses.replace(p, recompute=tuple("full" if i % 4 == 3 else "none" for i in range(p.layers)))
    cfg = _torchtitan(tmp_path, p)
    assert (cfg.activation_checkpoint.mode, cfg.activation_checkpoint.selective_ac_option) == ("selective", "4")


@pytest.mark.parametrize("kind", ["pipeline-ddp", "zero3"])
def test_deepspeed_reads_the_plan(monkeypatch, kind):
    pytest.importorskip("deepspeed", reason="DeepSpeed 0.19.8 not installed (pip install '.[report-check]')")
    from deepspeed.runtime import config as ds_config

    p = plan(kind)
    p = _no_recompute(p) if kind == "zero3" else p
    data = json.loads(export(p, "deepspeed"))

    class Mpu:  # DeepSpeed reads the data-parallel size from the model-parallel unit
        def get_data_parallel_world_size(self):
            return p.mesh.dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)
    cfg = ds_config.DeepSpeedConfig(data, mpu=Mpu())
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        p.global_batch, p.micro_batch_size, p.num_microbatches)
    assert cfg.zero_optimization_stage == p.zero_stage and cfg.bfloat16_config.enabled == (p.dtype == "bfloat16")
    assert data["meshplan"]["pipeline_stages"] == p.mesh.pp


@pytest.mark.parametrize("kind", ["dense", "moe", "pipeline-ddp"])
def test_megatron_reads_the_plan(kind):
    p = plan(kind)
    a, m = megatron.parse(export(p, "megatron")), p.mesh
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size or 1, a.context_parallel_size,
            a.expert_model_parallel_size) == (m.tp, m.pp, m.cp, m.ep)
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (p.micro_batch_size, p.global_batch, p.seq_len)
    assert a.global_batch_size // (a.micro_batch_size * m.dp) == p.num_microbatches  # Megatron's accumulation
    assert a.sequence_parallel == p.sequence_parallel
    assert a.use_distributed_optimizer == (p.zero_stage in (1, 2)) and a.bf16 == (p.dtype == "bfloat16")
    assert a.num_layers == p.layers and a.num_experts == (p.model.get("experts") or None)
    if m.ep > 1:  # the experts' tp split the Megatron-Core presets price (Software.expert_tp)
        assert a.expert_tensor_parallel_size == m.tp
    counts = [b - f for f, b in p.stages] if p.stages else [p.layers]
    if a.pipeline_model_parallel_layout:  # chunk i = "E"? "t*n" "L"?, i % pp the rank (Megatron's layout)
        chunks = a.pipeline_model_parallel_layout.split("|")
        assert [int(c.strip("EL").split("*")[1]) for c in chunks] == counts
    elif a.decoder_first_pipeline_num_layers is not None:
        assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (counts[0], counts[-1])
    else:
        assert len(set(counts)) == 1 and (a.num_virtual_stages_per_pipeline_rank or 1) == p.vp
    full = sum(r == "full" for r in p.recompute)
    if full:  # MoE plan: the first n layers of the one chunk, Megatron's 'block' method
        assert (a.recompute_granularity, a.recompute_method) == ("full", "block" if full < p.layers else "uniform")
        assert a.recompute_method == "uniform" or list(p.recompute[:a.recompute_num_layers]) == ["full"] * full


def test_megatron_runs_zero3_as_megatron_fsdp_with_expert_parallelism_too():
    """ZeRO-3 is Megatron-FSDP, as the Megatron-Core presets price it (the search's "Megatron-FSDP as ZeRO-3"):
    --use-megatron-fsdp with every state sharded and the fsdp_dtensor checkpoints Megatron requires of it; beside
    expert parallelism as well (NVIDIA's MoE model zoo runs Qwen3-235B so), not under pipeline parallelism."""
    moe = plan("moe")
    assert moe.mesh.ep > 1 and moe.mesh.pp == 1
    a = megatron.parse(export(dataclasses.replace(moe, zero_stage=3), "megatron"))
    assert a.use_megatron_fsdp and not a.use_torch_fsdp2 and not a.use_distributed_optimizer
    assert (a.data_parallel_sharding_strategy, a.ckpt_format) == ("optim_grads_params", "fsdp_dtensor")
    assert not megatron.parse(export(dataclasses.replace(moe, zero_stage=1), "megatron")).use_megatron_fsdp


def test_megatron_flags_are_megatrons():
    """Every flag written is one Megatron's parser defines (FLAGS), with a value of its kind."""
    for p in (plan("dense"), plan("moe"), plan("pipeline-ddp"), dataclasses.replace(plan("moe"), zero_stage=3)):
        text = export(p, "megatron")
        written = [w for w in text.split() if w.startswith("--")]
        assert written and set(written) <= set(megatron.FLAGS)


def test_refusals_name_the_feature():
    dense = plan("dense")
    zb = dataclasses.replace(dense, schedule="zero-bubble", vp=1, stages=((0, 16), (16, 32)))
    with pytest.raises(ir.InvalidPlanError, match="zero-bubble pipeline schedule"):
        export(zb, "deepspeed")
    with pytest.raises(ir.InvalidPlanError, match="zero-bubble"):
        export(zb, "megatron")
    with pytest.raises(ir.InvalidPlanError, match="ZeRO-3 under pipeline parallelism"):
        export(dataclasses.replace(dense, zero_stage=3), "megatron")
    with pytest.raises(ir.InvalidPlanError, match="expert parallelism ep=8"):
        export(plan("moe"), "deepspeed")
    with pytest.raises(ir.InvalidPlanError, match="selective and full recomputation"):
        export(plan("zero3"), "megatron") if len(set(plan("zero3").recompute)) == 3 else export(
            dataclasses.replace(plan("zero3"), recompute=("full", "selective") * 16), "megatron")
    with pytest.raises(ir.InvalidPlanError, match="ZeRO-1"):
        export(dataclasses.replace(plan("zero3"), zero_stage=1), "torchtitan")


def test_cli_export_refusal_is_one_line(tmp_path):
    path = dataclasses.replace(plan("dense"), zero_stage=3).save(tmp_path / "p.json")
    out = subprocess.run([sys.executable, "-m", "meshplan.cli", "export", str(path), "--to", "megatron"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "ZeRO-3 under pipeline parallelism" in out.stderr and "Traceback" not in out.stderr
    ok = subprocess.run([sys.executable, "-m", "meshplan.cli", "export", str(path.with_name("q.json")), "--to",
                         "deepspeed"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 2 and "q.json" in ok.stderr


def test_offloading_exports_to_megatron_only_as_its_config_allows():
    """--cpu-offloading-num-layers n for the first n layers without pipelining or recomputation (TransformerConfig's
    rules); torchtitan and DeepSpeed have no whole-layer activation offload and say so."""
    base = plan("zero3")
    assert base.mesh.pp == 1
    layers = base.layers
    off = dataclasses.replace(base, recompute=("offload",) * 8 + ("none",) * (layers - 8))
    assert megatron.parse(export(off, "megatron")).cpu_offloading_num_layers == 8
    for bad, why in ((dataclasses.replace(base, recompute=("offload",) * layers), "first n layers"),
                     (dataclasses.replace(off, recompute=("offload", "full") + ("none",) * (layers - 2)),
                      "beside recomputation"),
                     (dataclasses.replace(off, software="megatron-core-perf-recipes+recompute-layernorm"),
                      "offloading beside recomputation"),
                     (dataclasses.replace(plan("dense"), recompute=("offload",) * 4 + ("none",) * (plan("dense").layers - 4)),
                      "under pipeline parallelism")):
        with pytest.raises(ir.InvalidPlanError, match=why):
            export(bad, "megatron")
    with pytest.raises(ir.InvalidPlanError, match="activation offloading"):
        export(off, "torchtitan")
    with pytest.raises(ir.InvalidPlanError, match="activation offloading"):
        export(off, "deepspeed")


def test_an_fp8_plan_with_the_distributed_optimizer_keeps_fp8_weights_in_megatron():
    """--fp8-param-gather with --fp8-format for a ZeRO-1 plan (the distributed optimizer: Megatron asserts it),
    the FP8 weights the Megatron-Core presets price (Software.fp8_param_gather); not for bf16 or ZeRO-3."""
    dense = plan("dense")
    fp8 = dataclasses.replace(dense, dtype="float8", zero_stage=1)
    args = megatron.parse(export(fp8, "megatron"))
    assert args.fp8 == "hybrid" and args.fp8_param_gather and args.use_distributed_optimizer
    assert not megatron.parse(export(dataclasses.replace(fp8, dtype="bfloat16"), "megatron")).fp8_param_gather
    zero3 = dataclasses.replace(_no_recompute(plan("zero3")), dtype="float8")
    assert not megatron.parse(export(zero3, "megatron")).fp8_param_gather
    # the recipe the plan was priced with (Software.fp8_recipe): Megatron's default, delayed scaling, unless the
    # plan's program is the perf recipes', whose FP8 is current scaling ("tensorwise")
    assert args.fp8_recipe is None
    recipes = dataclasses.replace(fp8, software="megatron-core-perf-recipes")
    assert megatron.parse(export(recipes, "megatron")).fp8_recipe == "tensorwise"
    from meshplan.cost_model.software import SOFTWARE  # the export's names are the presets priced that way
    assert megatron.TENSORWISE_FP8_SOFTWARE == {n for n, s in SOFTWARE.items()
                                                if s.fp8_recipe == "tensorwise" and s.search_space == "megatron"}
    # +fp8-delayed: the same program with FP8 from an amax history (MLPerf v5.0's Llama 3.1 405B), Megatron's default
    delayed = dataclasses.replace(fp8, software="megatron-core-perf-recipes+fp8-delayed")
    assert megatron.parse(export(delayed, "megatron")).fp8_recipe is None
    # the gradients' wire dtype: bf16 where the preset priced it (the perf recipes), Megatron-LM's fp32 otherwise and
    # under +fp32-grads (NVIDIA's MoE model zoo's scripts)
    from meshplan.cost_model.software import software_named
    assert megatron.BF16_GRADS_SOFTWARE == {n for n, s in SOFTWARE.items()  # Megatron-Core's (its buckets)
                                            if not s.fp32_grad_reduce and s.megatron_buckets}
    for name, bf16_grads in (("megatron-core-perf-recipes", True), ("megatron-core-perf-recipes+fp32-grads", False),
                             ("megatron-core-2024", False)):
        assert software_named(name).fp32_grad_reduce is not bf16_grads
        args = megatron.parse(export(dataclasses.replace(fp8, software=name), "megatron"))
        assert args.grad_reduce_in_bf16 is bf16_grads


def test_megatron_runs_dropout_only_where_the_plan_was_priced_with_it():
    """Megatron's --hidden-dropout and --attention-dropout default to 0.1; a plan priced without dropout (a non-GPT
    model, a program without it, or +no-dropout: Software.drops_out) sets both to 0, one priced with it keeps them."""
    from meshplan.cost_model.software import SOFTWARE, software_named
    assert megatron.DROPOUT_SOFTWARE == {n for n, s in SOFTWARE.items() if s.dropout}
    dense = plan("dense")
    for name in ("megatron-core-perf-recipes", "megatron-core-perf-recipes+no-dropout", "meshplan"):
        priced = software_named(name).drops_out(dense.model["family"])
        args = megatron.parse(export(dataclasses.replace(dense, software=name), "megatron"))
        assert (args.hidden_dropout, args.attention_dropout) == ((None, None) if priced else (0.0, 0.0)), name
    llama = dataclasses.replace(_no_recompute(plan("moe")), software="megatron-core-perf-recipes")
    assert llama.model["family"] != "gpt" and megatron.parse(export(llama, "megatron")).hidden_dropout == 0.0


def test_a_software_name_s_modifiers_reach_megatron_as_flags_or_named_environment():
    """A plan priced as ``megatron-core-perf-recipes+mxfp8+ep-overlap+expandable+fused-mlp`` exports MXFP8's recipe
    and the 1F1B A2A overlap as Megatron's flags, names the environment NVIDIA's scripts set for the others, and
    writes recomputed modules as Megatron takes them, refusing the combinations its TransformerConfig refuses."""
    from meshplan.cost_model.software import MODIFIERS

    full_moe = dataclasses.replace(plan("moe"), dtype="float8", zero_stage=1)
    moe = _no_recompute(full_moe)
    assert moe.mesh.ep > 1 and moe.mesh.pp == 1 and set(full_moe.recompute) == {ir.Recompute.FULL}
    name = "megatron-core-perf-recipes+mxfp8+ep-overlap+expandable+fused-mlp"
    text = export(dataclasses.replace(moe, software=name), "megatron")
    args = megatron.parse(text)
    assert args.fp8_recipe == "mxfp8" and args.overlap_moe_expert_parallel_comm
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text and "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1" in text
    # Megatron refuses the overlap beside full recomputation, and the cost model did not price it there
    assert not megatron.parse(export(dataclasses.replace(full_moe, software=name), "megatron")
                              ).overlap_moe_expert_parallel_comm
    plain = megatron.parse(export(dataclasses.replace(moe, software="megatron-core-perf-recipes"), "megatron"))
    assert plain.fp8_recipe == "tensorwise" and not plain.overlap_moe_expert_parallel_comm
    assert set(megatron.ENVIRONMENT) <= set(MODIFIERS)
    # recomputed modules (Software.recompute_modules): Megatron's selective granularity with those modules, the
    # attention core too where the plan recomputes it, and the grouped GEMM moe_act needs
    both = megatron.parse(export(dataclasses.replace(moe, software="megatron-core-perf-recipes+recompute-layernorm-moe_act"),
                                 "megatron"))
    assert (both.recompute_granularity, both.recompute_modules, both.moe_grouped_gemm) == (
        "selective", ["layernorm", "moe_act"], True)
    selective = dataclasses.replace(moe, software="megatron-core-perf-recipes+recompute-layernorm",
                                    recompute=(ir.Recompute.SELECTIVE,) * moe.layers)
    args = megatron.parse(export(selective, "megatron"))
    assert args.recompute_modules == ["core_attn", "layernorm"] and not args.moe_grouped_gemm
    full = dataclasses.replace(selective, recompute=(ir.Recompute.FULL,) * moe.layers)
    with pytest.raises(ir.InvalidPlanError, match="beside full recomputation"):
        export(full, "megatron")
    delayed = dataclasses.replace(moe, software="megatron-core-2024+recompute-moe_act")
    with pytest.raises(ir.InvalidPlanError, match="delayed scaling"):
        export(delayed, "megatron")


def test_torchtitan_export_turns_on_the_compile_and_float8_the_plan_was_costed_with(tmp_path):
    """A plan costed as ``torchtitan+compile+float8`` (torchtitan's per-block torch.compile, torchao's Float8Linear)
    is exported with ``[compile]`` on and the float8 converter on the blocks' linears (the output layer left in
    bf16, as the cost model prices it); a bf16 plan of plain ``torchtitan`` with neither; NVFP4 is refused."""
    import tomllib

    p = _no_recompute(plan("zero3"))
    fp8 = dataclasses.replace(p, software="torchtitan+compile+float8", dtype="float8")
    cfg = tomllib.loads(export(fp8, "torchtitan"))
    assert cfg["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert cfg["model"]["converters"] == ["quantize.linear.float8"]
    assert cfg["quantize"]["linear"]["float8"] == {"recipe_name": "tensorwise", "filter_fqns": ["output"]}
    assert cfg["training"]["mixed_precision_param"] == "bfloat16"
    plain = tomllib.loads(export(dataclasses.replace(p, software="torchtitan"), "torchtitan"))
    assert "compile" not in plain and "converters" not in plain["model"] and "quantize" not in plain
    with pytest.raises(ir.PlanError, match="NVFP4"):
        export(dataclasses.replace(p, dtype="float4"), "torchtitan")
