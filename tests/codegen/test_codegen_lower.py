"""lower(plan): which steps, in which order, how many; and what it refuses, with the reason."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meshplan import ir
from meshplan.codegen import (STEP_KINDS, BuildMesh, DataParallel, FullyShard, Policy, Program, Recompute,
                              ShardOptimizer, StyleKind, TensorParallel, TPStyle, emit_source, lower)

CONFIGS = {
    "gpt": dict(family="gpt", layers=4, hidden=64, heads=4, vocab=512, max_seq_len=128, name="gpt-tiny"),
    "llama": dict(family="llama", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=160, vocab=512,
                  max_seq_len=128, name="llama-tiny"),
    "moe": dict(family="moe", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, vocab=512, max_seq_len=128,
                experts=4, top_k=2, name="moe-tiny"),
}


def plan(family: str = "gpt", *, dp: int = 1, tp: int = 1, zero: int = 0, sp: bool = False, nmb: int = 1,
         recompute: tuple[str, ...] = (), layers: int = 4, **mesh: int) -> ir.Plan:
    return ir.Plan(model={**CONFIGS[family], "layers": layers}, cluster="cpu:1x8", global_batch=8 * dp,
                   seq_len=16, mesh=ir.Mesh(dp=dp, tp=tp, **mesh), zero_stage=zero, sequence_parallel=sp,
                   micro_batch_size=8 // nmb, num_microbatches=nmb, recompute=recompute,
                   dtype="float32")  # fp32 programs (bf16 adds precision steps: tests/runtime/test_runtime_precision)


def test_one_process_builds_only_the_mesh() -> None:
    program = lower(plan())
    assert program.kinds() == ("BuildMesh",)
    assert program.mesh.dims == (("dp", 1),)


def test_plain_dp_is_ddp_on_the_root() -> None:
    program = lower(plan(dp=4, nmb=2))
    assert program.kinds() == ("BuildMesh", "DataParallel")
    assert program.steps[1] == DataParallel(module="", mesh_axis="dp")
    assert not program.sync_every_microbatch  # accumulate locally, all-reduce once per step


def test_zero1_adds_a_sharded_optimizer() -> None:
    assert lower(plan(dp=4, zero=1)).kinds() == ("BuildMesh", "DataParallel", "ShardOptimizer")


@pytest.mark.parametrize("zero, reshard", [(2, False), (3, True)])
def test_zero_2_and_3_shard_blocks_then_root(zero: int, reshard: bool) -> None:
    program = lower(plan("llama", dp=8, zero=zero))
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    # the embedding and the head are units of their own (torchtitan's apply_fsdp), then the root
    assert [s.module for s in shards] == ["layers.0", "layers.1", "layers.2", "layers.3", "embed.tok", "output", ""]
    assert all(s.reshard_after_forward == reshard for s in shards[:-2])
    assert not shards[-2].reshard_after_forward and not shards[-1].reshard_after_forward  # first in backward
    assert all(s.mesh_axes == ("dp",) for s in shards)
    assert program.sync_every_microbatch


def test_dp_x_tp_with_sp() -> None:
    program = lower(plan("gpt", dp=2, tp=4, zero=3, sp=True))
    assert program.mesh.dims == (("dp", 2), ("tp", 4))
    assert program.kinds() == ("BuildMesh",) + ("TensorParallel",) * 5 + ("FullyShard",) * 7
    root, block = program.steps[1], program.steps[2]
    assert root.module == "" and block.module == "layers.0"
    root_styles = dict(root.plan)
    assert root_styles["embed"] == TPStyle(kind=StyleKind.PREPARE_OUTPUT, src="R", dst="S(1)")
    assert root_styles["norm"].kind == StyleKind.SEQUENCE_PARALLEL
    assert str(root_styles["output"]) == "colwise(S(1) -> S(-1), DTensor)"  # vocab-parallel loss
    styles = dict(block.plan)
    assert sorted(styles) == ["attn", "attn.wk", "attn.wo", "attn.wq", "attn.wv", "attn_norm", "mlp", "mlp.fc1",
                              "mlp.fc2", "mlp_norm"]
    assert str(styles["attn"]) == "prepare_input(S(1) -> R)"
    assert str(styles["attn.wo"]) == "rowwise(S(-1) -> S(1))"


def test_tp_without_sp_keeps_the_stream_replicated() -> None:
    block = dict(lower(plan("llama", tp=2)).steps[2].plan)
    assert sorted(block) == ["attn.wk", "attn.wo", "attn.wq", "attn.wv", "mlp.w1", "mlp.w2", "mlp.w3"]
    assert str(block["mlp.w2"]) == "rowwise(S(-1) -> R)"


def test_per_head_norms_split_with_their_heads() -> None:
    """Qwen3's q_norm / k_norm (a (head_dim,) weight on (b, s, heads, head_dim)): sequence-parallel on the heads'
    dim, handing attention its local heads back, printed as the torch call the emitted script makes."""
    from meshplan.codegen import torch_call
    from meshplan.codegen.tp_plans import block_plan

    s = ir.ModelStructure(blocks="layers", num_blocks=2, attn="attn", q="attn.q", k="attn.k", v="attn.v", o="attn.o",
                          head_norms=("attn.q_norm", "attn.k_norm"), head_norm_dim=2)
    styles = dict(block_plan(s, sp=False))
    assert str(styles["attn.q_norm"]) == "sequence_parallel(S(2))" and styles["attn.k_norm"] == styles["attn.q_norm"]
    assert torch_call(styles["attn.q_norm"]) == ("SequenceParallel", (("sequence_dim", 2), ("use_local_output", True)))
    step = TensorParallel(module="layers.0", plan=tuple(block_plan(s, sp=False)))
    source = emit_source(dataclasses.replace(lower(plan("llama", tp=2)), steps=(lower(plan("llama", tp=2)).steps[0],
                                                                                 step)))
    assert '"attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True)' in source
    assert block_plan(dataclasses.replace(s, q="", k="", v=""), sp=False) == ()  # attention whole: no styles
    with pytest.raises(ir.InvalidPlanError, match="go together"):
        dataclasses.replace(s, head_norm_dim=0)
    with pytest.raises(ir.InvalidPlanError, match="sharded on a dim"):
        TPStyle(kind=StyleKind.SEQUENCE_PARALLEL, src="R")


def test_attention_s_own_per_head_parameters_and_norms_over_all_heads_are_meshplan_styles() -> None:
    """GPT-OSS's sinks (``head_params``): the attention module's own style, which also gathers its input under sp;
    OLMo 2's q/k norms over all heads (``feature_norms``): ``FeatureShardedNorm``. Both are imported from
    ``meshplan.runtime.styles`` by the emitted script, not from torch."""
    from meshplan.codegen import torch_call
    from meshplan.codegen.tp_plans import block_plan

    s = ir.ModelStructure(blocks="layers", num_blocks=2, attn="attn", q="attn.q", k="attn.k", v="attn.v", o="attn.o",
                          attn_norm="norm1", mlp="mlp", mlp_norm="norm2", attn_kwarg="hidden_states",
                          head_params=("attn.sinks",), feature_norms=("attn.q_norm",))
    plain, sp = dict(block_plan(s, sp=False)), dict(block_plan(s, sp=True))
    assert str(plain["attn"]) == "head_params" and torch_call(plain["attn"]) == ("HeadShardedParams", ())
    assert str(sp["attn"]) == "head_params(S(1) -> R)"
    assert torch_call(sp["attn"])[1] == (("input_kwarg_layouts", {"hidden_states": "S(1)"}),
                                         ("desired_input_kwarg_layouts", {"hidden_states": "R"}))
    assert torch_call(plain["attn.q_norm"]) == ("FeatureShardedNorm", ())
    program = lower(plan("llama", tp=2))
    source = emit_source(dataclasses.replace(program, steps=(program.steps[0], TensorParallel(
        module="layers.0", plan=tuple(block_plan(s, sp=True))))))
    assert "from meshplan.runtime.styles import FeatureShardedNorm, HeadShardedParams" in source
    assert '"attn": HeadShardedParams(input_kwarg_layouts={"hidden_states": Shard(1)}' in source, source


def test_moe_under_tp_splits_attention_and_keeps_experts_whole() -> None:
    block = dict(lower(plan("moe", tp=2, sp=True)).steps[2].plan)
    assert not any(path.startswith("mlp.") for path in block)
    assert block["mlp"].kind == StyleKind.PREPARE_INPUT_OUTPUT


def test_plain_dp_with_tp_is_hsdp_with_a_shard_group_of_one() -> None:
    program = lower(plan("gpt", dp=2, tp=2, zero=0, nmb=2))
    assert program.mesh.dims == (("dp", 2), ("dp_shard", 1), ("tp", 2))
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    assert len(shards) == 5 and all(s.mesh_axes == ("dp", "dp_shard") for s in shards)
    assert not any(s.reshard_after_forward for s in shards)
    assert not program.sync_every_microbatch


def test_recompute_per_layer_between_tp_and_fsdp() -> None:
    program = lower(plan("gpt", dp=2, tp=2, zero=3, recompute=("full", "none", "selective", "full")))
    recomputes = [s for s in program.steps if isinstance(s, Recompute)]
    assert [(s.module, s.policy) for s in recomputes] == [
        ("layers.0", Policy.FULL), ("layers.2.attn", Policy.SELECTIVE), ("layers.3", Policy.FULL)]
    assert "aten.mm.default" in recomputes[1].save_ops and recomputes[0].save_ops == ()
    kinds = program.kinds()
    last_tp = max(i for i, k in enumerate(kinds) if k == "TensorParallel")
    first_fsdp = kinds.index("FullyShard")
    assert all(last_tp < i < first_fsdp for i, k in enumerate(kinds) if k == "Recompute")


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp=2, ep=2), "expert parallelism (ep=2) needs a MoE model, but plan.model is family 'gpt'"),
    (dict(dp=2, tp=2, zero=1), "zero_stage 1 with tp(2) > 1 is not supported by the runtime yet"),
    (dict(family="llama", tp=4), "kv_heads(2) does not divide by tp(4)"),
    (dict(recompute=("full",) * 3), "plan.recompute has 3 entries but the model has 4 layers"),
])
def test_unsupported_plans_say_why(kwargs, message) -> None:
    family = kwargs.pop("family", "gpt")
    with pytest.raises(ir.InvalidPlanError) as err:
        lower(plan(family, **kwargs))
    assert message in str(err.value)


def test_pipeline_splits_stages_first() -> None:  # more in test_codegen_pipeline.py
    p = dataclasses.replace(plan(), mesh=ir.Mesh(pp=2), stages=((0, 2), (2, 4)), schedule="gpipe")
    assert lower(p).kinds()[:2] == ("BuildMesh", "SplitPipeline")


def test_unknown_family_is_refused() -> None:
    p = dataclasses.replace(plan(), model={**CONFIGS["gpt"], "family": "rwkv"})
    with pytest.raises(ir.InvalidPlanError, match="model family 'rwkv' is not a zoo family"):
        lower(p)


def test_values_check_themselves() -> None:
    with pytest.raises(ir.InvalidPlanError, match="S\\(dim\\), R, P"):
        TPStyle(kind=StyleKind.COLWISE, src="Shard(1)")
    with pytest.raises(ir.InvalidPlanError, match="starts with BuildMesh"):
        dataclasses.replace(lower(plan()), steps=(FullyShard(module="", mesh_axes=("dp",),
                                                             reshard_after_forward=True),))
    with pytest.raises(ir.InvalidPlanError, match="distinct"):
        BuildMesh(dims=(("dp", 2), ("dp", 2)))
    step = TensorParallel(module="layers.0", plan=(("attn.wq", TPStyle(kind="colwise")),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.module = "layers.1"  # type: ignore[misc]


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(["gpt", "llama", "moe"]), dp=st.sampled_from([1, 2, 4]), tp=st.sampled_from([1, 2]),
       zero=st.sampled_from([0, 1, 2, 3]), sp=st.booleans(), nmb=st.sampled_from([1, 2, 4]),
       recompute=st.lists(st.sampled_from(["none", "full", "selective"]), min_size=4, max_size=4))
def test_any_supported_plan_lowers_in_order_and_emits(family, dp, tp, zero, sp, nmb, recompute) -> None:
    assume(not (zero == 1 and tp > 1) and not (sp and tp == 1))  # refused, or not a valid plan
    p = plan(family, dp=dp, tp=tp, zero=zero, sp=sp, nmb=nmb, recompute=tuple(recompute))
    program = lower(p)
    assert isinstance(program, Program) and all(isinstance(s, STEP_KINDS) for s in program.steps)
    assert program.mesh.world_size == p.world_size
    order = {BuildMesh: 0, TensorParallel: 1, Recompute: 2, FullyShard: 3, DataParallel: 3, ShardOptimizer: 4}
    ranks = [order[type(s)] for s in program.steps]
    assert ranks == sorted(ranks)
    assert sum(isinstance(s, TensorParallel) for s in program.steps) == (5 if tp > 1 else 0)
    assert sum(isinstance(s, Recompute) for s in program.steps) == sum(r != "none" for r in recompute)
    fsdp = sum(isinstance(s, FullyShard) for s in program.steps)
    assert fsdp == (0 if dp == 1 else 7 if zero >= 2 else 5 if tp > 1 else 0)  # ZeRO-2/3: embedding, head apart
    compile(emit_source(p), "emitted.py", "exec")


def test_offloaded_blocks_keep_their_names_and_the_script_imports_the_runtimes_hooks() -> None:
    """Offloading wraps nothing (the block keeps its name and state-dict keys): the program registers
    runtime.offload's hooks on the block, and the script imports them, not checkpoint_wrapper."""
    from meshplan.codegen import emit_source

    p = plan("gpt", dp=2, zero=3, recompute=("offload", "offload", "none", "none"))
    recomputes = [s for s in lower(p).steps if isinstance(s, Recompute)]
    assert [(s.module, s.policy) for s in recomputes] == [("layers.0", Policy.OFFLOAD), ("layers.1", Policy.OFFLOAD)]
    src = emit_source(p)
    compile(src, "offload_script.py", "exec")
    assert "from meshplan.runtime.offload import offload_activations" in src
    assert "    for i in range(2):\n        offload_activations(model.layers[i])" in src  # blocks 0 and 1
    assert "checkpoint_wrapper" not in src
