"""Cases where an expert knows the right plan."""
from __future__ import annotations

import dataclasses
import re

import pytest

import meshplan as mp
from meshplan import ir


def test_small_model_on_many_gpus_gets_data_parallelism() -> None:
    plan = mp.autoparallelize("gpt2-small", "h100-sxm:2x8", global_batch=256, seq_len=1024)
    assert plan.mesh.tp == 1 and plan.mesh.dp == 16
    assert plan.prediction.peak_memory_bytes <= plan.prediction.memory_limit_bytes


def test_70b_on_8_gpus_is_sharded_never_plain_dp() -> None:
    # 70B x 16 bytes of mixed-precision Adam state is 1.1 TB: 16 H200s (141 GB) hold it only when sharded
    found = mp.plans("llama3-70b", "h200:2x8", global_batch=64, seq_len=4096, top=5)
    for plan in found:
        assert plan.mesh.tp > 1 or plan.zero_stage == 3, plan.summary()
        assert plan.prediction.peak_memory_bytes <= plan.prediction.memory_limit_bytes


def test_memory_tight_case_turns_recompute_on() -> None:
    # cp pinned off: splitting the 8192-token sequences (cp=4) would fit without recompute
    plan = mp.autoparallelize("llama3-8b", "h100-sxm:1x8", global_batch=16, seq_len=8192,
                              fixed={"tp": 1, "cp": 1, "micro_batch": 2})
    loose = mp.autoparallelize("gpt2-small", "h100-sxm:1x8", global_batch=8, seq_len=1024)
    assert any(r != ir.Recompute.NONE for r in plan.recompute), plan.report()
    assert all(r == ir.Recompute.NONE for r in loose.recompute), loose.report()


def test_too_big_model_says_what_would_fit() -> None:
    with pytest.raises(ir.InfeasibleError) as err:
        mp.autoparallelize("llama3-405b", "h100-sxm:1x8", global_batch=8, seq_len=8192)
    msg = str(err.value)
    assert "needs" in msg and "GB per GPU at best" in msg and "use at least" in msg and "GPUs" in msg


def test_a_pinned_recompute_that_cannot_fit_names_what_it_needs() -> None:
    """With recompute pinned, the memory quoted is that policy's, not full recompute's (which fits here:
    the same job with recompute free picks it, test above), and the advice is to free the pin."""
    with pytest.raises(ir.InfeasibleError) as err:
        mp.autoparallelize("llama3-8b", "h100-sxm:1x8", global_batch=16, seq_len=8192,
                           fixed={"tp": 1, "cp": 1, "micro_batch": 2, "recompute": "none"})
    msg = str(err.value)
    need, usable = (float(x) for x in re.search(r"needs ([\d.]+) GB per GPU at best .* has ([\d.]+) GB usable", msg).groups())
    assert need > usable, msg
    assert "recompute 'none' as pinned" in msg and "leave recompute free" in msg and "full recompute" not in msg


def test_everything_pinned_evaluates_that_plan() -> None:
    fixed = {"tp": 2, "dp": 4, "zero": 3, "sp": True, "micro_batch": 2, "recompute": "full"}
    plan = mp.autoparallelize("llama3-8b", "h100-sxm:1x8", global_batch=16, seq_len=4096, fixed=fixed)
    assert (plan.mesh.tp, plan.mesh.dp, plan.zero_stage, plan.sequence_parallel, plan.micro_batch_size) == \
        (2, 4, 3, True, 2)
    assert set(plan.recompute) == {ir.Recompute.FULL} and plan.solver.status == "EVALUATED"


def test_bad_pins_are_explained() -> None:
    with pytest.raises(ir.PlanError, match=r"unknown choice\(s\) \['tpp'\]"):
        mp.autoparallelize("gpt-tiny", "cpu:1x4", global_batch=8, seq_len=16, fixed={"tpp": 2})
    with pytest.raises(ir.InfeasibleError, match="global batch 6 must divide by dp"):
        mp.autoparallelize("gpt-tiny", "cpu:1x4", global_batch=6, seq_len=16, fixed={"tp": 1, "pp": 1})


def test_same_input_same_plan() -> None:
    a = mp.autoparallelize("llama3-8b", "h100-sxm:2x8", global_batch=64, seq_len=4096)
    b = mp.autoparallelize("llama3-8b", "h100-sxm:2x8", global_batch=64, seq_len=4096)
    assert a.to_dict() | {"solver": None} == b.to_dict() | {"solver": None}


def test_report_and_explain_are_strings_with_the_numbers() -> None:
    # cp pinned off: dp x cp meshes of the same size tie on predicted time, and "slower" needs a loser
    found = mp.plans("llama3-8b", "h100-sxm:1x8", global_batch=32, seq_len=4096, top=3, fixed={"cp": 1})
    text = found[0].report()
    assert "memory per GPU" in text and "binding constraint" in text and "MFU" in text
    assert len(found) >= 2
    assert "#2:" in found[0].explain() and "slower" in found[0].explain()


def test_moe_model_gets_expert_parallelism() -> None:
    plan = mp.autoparallelize("mixtral-8x7b", "h100-sxm:2x8", global_batch=64, seq_len=4096)
    assert plan.mesh.ep > 1, plan.report()
    assert 8 % plan.mesh.ep == 0 and (plan.mesh.dp * plan.mesh.cp) % plan.mesh.ep == 0


def test_long_sequence_gets_context_parallelism() -> None:
    # 8 sequences of 128k tokens on 64 GPUs: dp can use at most 8 of them, and one 128k sequence of
    # activations does not fit a GPU without splitting it
    plan = mp.autoparallelize("llama3-8b", "h100-sxm:8x8", global_batch=8, seq_len=131072)
    assert plan.mesh.cp > 1, plan.report()
    assert plan.prediction.peak_memory_bytes <= plan.prediction.memory_limit_bytes



@pytest.mark.xfail(strict=False, reason=(
    "since the cost model prices meshplan's own program (fp32 master parameters under bf16, commit a7a2373), "
    "pipelined and unpipelined plans are within the model's error of each other: with the attention rate by "
    "sequence length (FA2 paper Fig. 4) pp16 x dp16 x tp4 wins at 17.07 s against dp512 x cp2 ZeRO-3's 17.11 s "
    "(0.5%), so this passes, but by a margin no test should rest on; open in issue 12 (item 6)"))
def test_gpt3_175b_on_1024_a100_keeps_tp_in_a_node_and_uses_pipeline_stages() -> None:
    """Narayanan et al. 2021 ran it with tp 8 inside the DGX node and pipeline stages across nodes.
    ZeRO-3 over 256+ ranks would move 3 x 175 GB / tp per micro-batch over 25 GB/s links; with the
    compute it slows and the buffer copies it costs, pipelining wins."""
    plan = mp.autoparallelize("gpt3-175b", "a100-80gb:128x8", global_batch=1536, seq_len=2048)
    assert plan.mesh.pp > 1, plan.report()
    assert 1 < plan.mesh.tp <= 8 and 8 % plan.mesh.tp == 0, plan.report()
    assert plan.prediction.peak_memory_bytes <= plan.prediction.memory_limit_bytes


def test_out_of_time_returns_the_best_plan_found_with_its_gap() -> None:
    args = dict(global_batch=512, seq_len=4096)
    rushed = mp.autoparallelize("llama3-70b", "h100-sxm:8x8", time_limit_s=1e-6, **args)
    proper = mp.autoparallelize("llama3-70b", "h100-sxm:8x8", **args)
    assert rushed.solver.status == "FEASIBLE" and 0 < rushed.solver.gap < 1
    assert proper.solver.status == "OPTIMAL" and proper.solver.gap == 0
    assert rushed.prediction.step_time_s >= proper.prediction.step_time_s
    assert rushed.prediction.peak_memory_bytes <= rushed.prediction.memory_limit_bytes
    assert f"gap {100 * rushed.solver.gap:.2f}%" in rushed.report()


def test_out_of_time_before_the_program_finds_any_plan_still_returns_one(monkeypatch) -> None:
    """On a loaded machine the half second the integer program gets once time is up can pass with no
    solution at all (seen in bench/expert_plans: Qwen3-235B on 256 GB300s was refused as if nothing fit).
    Then the first candidate in bound order whose own program solves is returned, FEASIBLE, with the
    bound of the whole race as its gap's floor, and never an infeasibility error."""
    from meshplan.solver import ilp

    real = ilp.solve

    def stalled(problem, **kw):  # a window of several candidates finds nothing in its time
        sol = real(problem, **kw)
        return dataclasses.replace(sol, status="UNKNOWN", candidate=-1) if len(problem.costs) > 1 else sol

    monkeypatch.setattr(ilp, "solve", stalled)
    args = dict(global_batch=256, seq_len=4096)  # 32 GPUs: most candidates need recomputation, some cannot fit
    rushed = mp.autoparallelize("llama3-70b", "h100-sxm:4x8", time_limit_s=1e-6, **args)
    monkeypatch.setattr(ilp, "solve", real)
    proper = mp.autoparallelize("llama3-70b", "h100-sxm:4x8", **args)
    assert rushed.solver.status == "FEASIBLE" and 0 <= rushed.solver.gap < 1
    assert rushed.prediction.step_time_s >= proper.prediction.step_time_s
    assert rushed.prediction.peak_memory_bytes <= rushed.prediction.memory_limit_bytes


def test_solver_statistics_time_each_phase_and_survive_json() -> None:
    plan = mp.autoparallelize("llama3-8b", "h100-sxm:1x8", global_batch=16, seq_len=4096)
    phases = plan.solver.phases
    assert list(phases) == ["enumerate + bound", "window + ILP", "runners-up", "fit + layouts"]
    assert all(t >= 0 for t in phases.values()) and sum(phases.values()) <= plan.solver.wall_s + 1e-6
    assert "phases: enumerate + bound" in plan.report()
    assert ir.Plan.from_json(plan.to_json()).solver.phases == pytest.approx(phases)


def test_nvl72_rack_is_one_scale_up_domain_for_tensor_parallelism() -> None:
    """A GB200 tray holds 4 GPUs but NVLink joins all 72 of the rack: tp may span trays (a group of 8
    is one NVLink phase) and a Llama 3 405B plan on 576 GPUs with tp 8 is feasible; on H100 nodes of 8
    tp never exceeds 8. (The planner's own choice there is pp=36 x tp=2: under meshplan's runtime,
    DTensor's sequence parallelism keeps each column-parallel input gathered, which tp 8 pays for in
    activation memory, and was seen to pick tp 8 only while the cost model divided those inputs by tp.)"""
    from meshplan.cost_model import parse_cluster
    from meshplan.cost_model.collectives import group_phases
    from meshplan.solver.space import scale_up_gpus, tp_degrees

    nvl72 = parse_cluster("gb200-nvl72:144x4")
    assert scale_up_gpus(nvl72) == 72 and scale_up_gpus(parse_cluster("h100-sxm:8x8")) == 8
    dims = ir.ModelDims(family="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248,
                        vocab=128256)
    assert max(tp_degrees(dims, scale_up_gpus(nvl72), nvl72.world_size)) == 8
    assert [(tier.kind.value, k) for tier, k in group_phases(8, 1, nvl72)] == [("scale-up", 8.0)]
    plan = mp.autoparallelize("llama3-405b", nvl72, global_batch=512, seq_len=8192, fixed={"tp": 8})
    assert plan.mesh.tp > nvl72.gpus_per_node, plan.report()
    assert plan.prediction.peak_memory_bytes <= plan.prediction.memory_limit_bytes


def test_the_plan_returned_is_the_fastest_once_fitted_not_the_ilp_objective_s() -> None:
    """An MPT-3b-shaped GPT on 8 A100 40GB (seq 1024, global batch 1024, llm-foundry's PURE mixed precision): the
    ILP's linear recompute deltas rank ZeRO-2 first, but its exact estimate needs layers recomputed to fit and comes
    out slower than ZeRO-3 without recomputation, as llm-foundry runs its MPT tables (FSDP FULL_SHARD). The search
    fits candidates in objective order while one could still win (search._fastest_fitted) and returns the fastest
    (bench/expert_plans.py: MPT-1b on A100 40GB went from 0.98 to 1.00 with it; that model moved out of this regime
    when the allocator allowance stopped counting the parameters and optimizer states, footprint.py)."""
    from meshplan import zoo
    from meshplan.cost_model import Cluster, software_named
    from meshplan.solver import Request, solve
    from meshplan.solver.space import RUNTIME

    cfg = dict(family="gpt", layers=32, hidden=2560, heads=20, kv_heads=20, ffn_hidden=10240, vocab=50368,
               max_seq_len=1024)
    dims = ir.ModelDims(**{k: v for k, v in cfg.items() if k != "max_seq_len"}, head_dim=128)
    graph = ir.Graph(nodes=(), params=(ir.Param(name="all", shape=(zoo.param_count(zoo.ModelConfig(**cfg)),)),),
                     blocks=(), dims=dims)
    req = Request(graph=graph, cluster=Cluster.preset("a100-40gb", 1, 8), model=cfg, global_batch=1024, seq_len=1024,
                  dtype="bfloat16", runtime=RUNTIME, top=3, time_limit_s=30,
                  software=software_named("llm-foundry-2023-pure"))
    found = solve(req)
    best = found[0].prediction
    assert best.peak_memory_bytes <= best.memory_limit_bytes
    assert (found[0].zero_stage, set(found[0].recompute)) == (3, {ir.Recompute.NONE}), found[0].summary()
    fitting = [p.prediction.step_time_s for p in found if p.prediction.peak_memory_bytes <= best.memory_limit_bytes]
    assert best.step_time_s == min(fitting)
