"""``plan --software``: the search costs every candidate as another framework's program runs it and offers
only what that framework runs, so a Megatron user gets Megatron's best plan (issue 13)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from meshplan import ir
from meshplan.api import plans


def _plan(**kw):
    return plans("llama3-8b", "h100-sxm:2x8", global_batch=64, seq_len=4096, top=1, time_limit_s=20, **kw)[0]


def test_a_megatron_plan_is_costed_as_megatron_and_offers_only_what_megatron_runs() -> None:
    plan = _plan(software="megatron-core-2024", dtype="float8")
    assert plan.software == "megatron-core-2024" and plan.dtype == "float8"
    assert plan.zero_stage in (0, 1, 3) and plan.schedule not in (ir.Schedule.GPIPE, ir.Schedule.ZERO_BUBBLE)
    assert not plan.fusions  # meshplan's Triton kernels are not that program's
    m = plan.mesh
    pins = dict(tp=m.tp, pp=m.pp, dp=m.dp, cp=m.cp, zero=plan.zero_stage, sp=plan.sequence_parallel,
                micro_batch=plan.micro_batch_size, recompute=str(plan.recompute[0]), schedule=str(plan.schedule))
    again = _plan(software="megatron-core-2024", dtype="float8", fixed=pins)
    assert again.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)
    # one plan in bf16 costs differently as Megatron's program and as meshplan's runtime
    pins = dict(tp=2, pp=1, dp=8, cp=1, zero=3, sp=True, micro_batch=1, recompute="full")  # one both programs run
    ours, theirs = _plan(fixed=pins), _plan(software="megatron-core-2024", fixed=pins)
    assert theirs.prediction.step_time_s != pytest.approx(ours.prediction.step_time_s, rel=0.01)
    assert "costed as: megatron-core-2024" in plan.report()
    back = ir.Plan.from_json(plan.to_json())
    assert back.software == "megatron-core-2024"


def test_fp8_is_refused_for_meshplans_runtime_with_what_to_do() -> None:
    with pytest.raises(ir.PlanError, match="--software megatron-core-2024"):
        _plan(dtype="float8")


def test_a_plan_file_naming_no_program_is_refused() -> None:
    data = json.loads(_plan().to_json())
    assert data["software"] == "meshplan"
    data["software"] = "__import__('os')"
    with pytest.raises(ir.InvalidPlanError, match="software"):
        ir.Plan.from_dict(data)


def test_a_megatron_fp8_plan_exports_to_megatrons_own_flags() -> None:
    from meshplan.export import export
    from meshplan.export.megatron import parser

    plan = _plan(software="megatron-core-2024", dtype="float8")
    text = export(plan, "megatron")
    args = parser().parse_args(text.split("\n", 1)[1].replace("\\\n", " ").split())
    assert args.bf16 and args.fp8 == "hybrid" and args.tensor_model_parallel_size == plan.mesh.tp


def test_an_nvfp4_plan_is_searched_on_blackwell_as_megatron_runs_it_and_exports_its_fp4_flags() -> None:
    """``--dtype float4`` (NVFP4) with a Transformer Engine program on a Blackwell cluster: searched and priced
    faster than the same plan in FP8, exported with Megatron's ``--fp4-format e2m1`` (and ``--fp4-param-gather``
    under the distributed optimizer, as Megatron-Bridge's NVFP4 recipe sets it); refused for meshplan's runtime
    and on an accelerator without FP4 tensor cores, each saying what to do."""
    from meshplan.export import export
    from meshplan.export.megatron import parse

    def on_gb200(**kw):
        return plans("llama3-8b", "gb200-nvl72:2x4", global_batch=64, seq_len=4096, top=1, time_limit_s=20,
                     software="megatron-core-perf-recipes", **kw)[0]

    fp4 = on_gb200(dtype="float4")
    m = fp4.mesh
    pins = dict(tp=m.tp, pp=m.pp, dp=m.dp, cp=m.cp, zero=fp4.zero_stage, sp=fp4.sequence_parallel,
                micro_batch=fp4.micro_batch_size, recompute=str(fp4.recompute[0]), schedule=str(fp4.schedule))
    fp8 = on_gb200(dtype="float8", fixed=pins)
    assert fp4.dtype == "float4" and fp4.prediction.step_time_s < 0.9 * fp8.prediction.step_time_s
    args = parse(export(fp4, "megatron"))
    assert args.bf16 and args.fp4 == "e2m1" and args.fp8 is None
    zero1 = parse(export(dataclasses.replace(fp4, zero_stage=1), "megatron"))
    assert zero1.fp4_param and zero1.use_distributed_optimizer and not zero1.fp8_param_gather
    with pytest.raises(ir.PlanError, match="--software megatron-core-perf-recipes"):
        _plan(dtype="float4")
    with pytest.raises(ir.InvalidClusterError, match="has no float4 peak"):
        _plan(dtype="float4", software="megatron-core-perf-recipes")


def test_megatron_folds_expert_parallelism_over_the_tp_ranks_and_meshplans_runtime_does_not() -> None:
    """Megatron-Core's MoE parallel folding (expert tensor parallelism 1): the expert-parallel group may take
    tp ranks, as NVIDIA runs Qwen3-235B on H100 (tp 2, dp 16, ep 32). The Megatron search offers it, the
    plan exports with --expert-tensor-parallel-size 1, and meshplan's runtime, which folds ep inside dp only,
    refuses it saying so."""
    from meshplan.export import export, megatron

    pins = dict(tp=2, dp=4, ep=8, pp=2, cp=1)
    plan = plans("mixtral-8x7b", "h100-sxm:2x8", global_batch=32, seq_len=4096, top=1, time_limit_s=20,
                 software="megatron-core-2024", fixed=pins)[0]
    m = plan.mesh
    assert (m.tp, m.dp, m.ep) == (2, 4, 8) and m.ep_over_tp and m.expert_replicas == 1
    assert plan.sequence_parallel  # each tp rank routes its own slice of the sequence
    args = megatron.parse(export(plan, "megatron"))
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (8, 1)
    with pytest.raises(ir.InfeasibleError, match="folds ep over the tp ranks: --software megatron-core-2024"):
        plans("mixtral-8x7b", "h100-sxm:2x8", global_batch=32, seq_len=4096, top=1, time_limit_s=20, fixed=pins)


def test_megatron_may_fold_ep_over_tp_where_ep_fits_in_dp_and_keeps_the_experts_whole(tmp_path) -> None:
    """``Mesh.fold_ep``: Megatron's --expert-tensor-parallel-size 1 where ep divides dp too (NVIDIA's MoE model zoo
    runs Qwen3-235B with tp 2 and ep 8 over one node's tp 2 x dp 4 ranks). Pinned, the Megatron search returns it,
    its experts are whole on each rank (twice the expert weights of ep 8 with the experts split over tp 2), it
    exports with ETP 1, its file keeps the flag, and the runtime's search and emit refuse it saying why."""
    from meshplan.export import export, megatron

    kw = dict(global_batch=32, seq_len=4096, top=1, time_limit_s=20, software="megatron-core-2024")
    base = dict(tp=2, dp=8, ep=8, pp=1, cp=1, zero=1, recompute="full")
    folded = plans("mixtral-8x7b", "h100-sxm:2x8", fixed={**base, "fold_ep": True}, **kw)[0]
    split = plans("mixtral-8x7b", "h100-sxm:2x8", fixed={**base, "fold_ep": False}, **kw)[0]
    assert folded.mesh.fold_ep and folded.mesh.ep_over_tp and folded.sequence_parallel
    assert "expert shards over tp x dp x cp, each expert whole" in folded.report()
    assert "expert shards (inside dp x cp)" in split.report()
    assert not split.mesh.fold_ep and not split.mesh.ep_over_tp
    # one pipeline stage of 16 ranks: ep 8 x 2 replicas; folded, the replicas are at stride 8 over tp x dp
    assert (folded.mesh.expert_replicas, split.mesh.expert_replicas) == (2, 1)
    assert folded.prediction.memory_bytes["params"] > 1.5 * split.prediction.memory_bytes["params"]
    assert (megatron.parse(export(folded, "megatron")).expert_tensor_parallel_size,
            megatron.parse(export(split, "megatron")).expert_tensor_parallel_size) == (1, 2)
    again = ir.Plan.from_json(folded.to_json())
    assert again.mesh == folded.mesh and '"fold_ep": true' in folded.to_json()
    assert "fold_ep" not in split.to_json()  # files of plans that do not fold stay as they were
    with pytest.raises(ir.PlanError, match="fold_ep=True, but this program splits each expert"):
        plans("mixtral-8x7b", "h100-sxm:2x8", fixed={**base, "fold_ep": True}, global_batch=32, seq_len=4096)
    with pytest.raises(ir.InvalidPlanError, match="runtime splits the experts over tp"):
        dataclasses.replace(folded, software="meshplan").emit(tmp_path / "train.py")
    with pytest.raises(ir.InvalidPlanError, match="mesh.fold_ep folds the expert-parallel group over tp ranks"):
        ir.Mesh(tp=1, dp=8, ep=8, fold_ep=True)
    with pytest.raises(ir.PlanError, match=r"fixed: fold_ep='yes'; expected True or False"):
        plans("mixtral-8x7b", "h100-sxm:2x8", fixed={**base, "fold_ep": "yes"}, **kw)
    data = folded.to_dict()
    data["mesh"]["fold_ep"] = "yes"  # a plan file's malformed flag, named
    with pytest.raises(ir.PlanError, match=r"mesh.fold_ep: expected true or false, got 'yes'"):
        ir.Plan.from_dict(data)


def test_the_hybridep_preset_prices_one_network_copy_per_node_and_exports_the_flex_dispatcher() -> None:
    """Megatron's flex dispatcher with the HybridEP backend (the perf recipes' moe_flex_dispatcher_backend) sends a
    token over the network once per remote node hosting one of its experts, not once per expert: with ep 8 at
    stride 2 on h100-sxm:4x8 (4 experts per node, top-2 of Mixtral's 8) a token reaches the other node with
    probability 1 - C(4,2)/C(8,2) = 22/28, against 2 x 1/2 copies for an all-to-all, so the same pinned plan is
    faster; the export asks Megatron for that dispatcher, and only for the preset priced with it."""
    from meshplan.cost_model.software import SOFTWARE
    from meshplan.export import export, megatron

    assert megatron.HYBRIDEP_SOFTWARE == {name for name, s in SOFTWARE.items() if s.ep_dispatch == "hybridep"}
    pins = dict(tp=2, dp=16, ep=8, pp=1, cp=1, fold_ep=False)
    kw = dict(global_batch=64, seq_len=4096, top=1, time_limit_s=20, fixed=pins)
    flex = plans("mixtral-8x7b", "h100-sxm:4x8", software="megatron-core-perf-recipes-hybridep", **kw)[0]
    a2a = plans("mixtral-8x7b", "h100-sxm:4x8", software="megatron-core-perf-recipes", **kw)[0]
    assert (flex.mesh.ep, flex.mesh.tp) == (a2a.mesh.ep, a2a.mesh.tp) == (8, 2) and not flex.mesh.ep_over_tp
    assert flex.prediction.step_time_s < a2a.prediction.step_time_s
    args = megatron.parse(export(flex, "megatron"))
    assert (args.moe_token_dispatcher_type, args.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    plain = megatron.parse(export(a2a, "megatron"))
    assert plain.moe_token_dispatcher_type is None and plain.moe_flex_dispatcher_backend is None
