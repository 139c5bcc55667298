"""The search offers activation offloading where the program runs it and the GPU has a host link: Megatron-Core
on GB200 (NVLink-C2C) offloads Llama 3 70B's layers under Megatron-FSDP at 8K tokens, the plan NVIDIA's
performance recipes run there (Megatron-Bridge 25.11: FSDP over 64 GPUs, micro-batch 2, 40 of 80 layers
offloaded), and the plan exports as Megatron's --cpu-offloading-num-layers. A CPU rank has nothing to
offload to, and meshplan's runtime does not offload beside tensor parallelism: pins that ask say why."""
from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import ir, zoo
from meshplan.cost_model import Cluster
from meshplan.export.megatron import parse, to_megatron

ARGS = dict(global_batch=128, seq_len=8192, dtype="bfloat16", software="megatron-core-perf-recipes")
GB200 = Cluster.preset("gb200-nvl72", nodes=16, gpus_per_node=4)


def _llama70b() -> ir.Graph:
    cfg = zoo.config("llama3-70b")
    dims = ir.ModelDims(family=cfg.family, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                        kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab)
    return ir.Graph(nodes=(), params=(ir.Param(name="all", shape=(zoo.param_count(cfg),)),), blocks=(), dims=dims)


@pytest.fixture(scope="module")
def free() -> ir.Plan:
    return mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", **ARGS)


def test_megatron_on_gb200_offloads_layers_of_llama3_70b_as_nvidia_runs_it(free) -> None:
    """The search offloads under ZeRO-3; NVIDIA's layout (FSDP over all 64 GPUs, micro-batch 2, layers offloaded)
    is its plan or a runner-up it prices within 0.5% of it (dp 32 x tp 2 and dp 64 tie within 0.1% here)."""
    plan = free
    offloaded = plan.recompute.count("offload")
    assert plan.zero_stage == 3 and 0 < offloaded < plan.layers, plan.summary()
    nvidia = "dp=64, zero-3, micro-batch 2 x 1"
    if not plan.summary().startswith(nvidia):
        close = [a for a in plan.solver.alternatives if a["summary"].startswith(nvidia) and "offload" in a["summary"]]
        assert close and close[0]["step_time_s"] <= 1.005 * plan.prediction.step_time_s, plan.solver.alternatives
    assert set(plan.recompute[:offloaded]) == {"offload"}  # the first layers, as Megatron offloads them
    assert parse(to_megatron(plan)).cpu_offloading_num_layers == offloaded


def test_offloading_is_priced_against_recomputation_on_the_same_plan(free) -> None:
    """Pinned, every layer Megatron may offload that the host memory holds (a GB200's share of its Grace's LPDDR5X,
    240 GB, takes 53 of these layers' activations, 4.5 GB each; Megatron's limit, all but one, would be 79): less
    memory than the search's own mix, and a slower step on the same cluster (the search would not have chosen it
    otherwise)."""
    from meshplan.cost_model import host_offload_layers, software_named
    from meshplan.cost_model.summary import summary_of

    pinned = mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", fixed={"recompute": "offload", "tp": 1, "pp": 1},
                                **ARGS)
    room = host_offload_layers(summary_of(_llama70b()), GB200, pinned, 0, software_named(ARGS["software"]))
    assert room == 53 and pinned.recompute.count("offload") == room and set(pinned.recompute[room:]) == {"none"}
    assert pinned.prediction.peak_memory_bytes < free.prediction.peak_memory_bytes
    assert pinned.prediction.step_time_s >= free.prediction.step_time_s


def test_a_plan_offloading_more_than_the_host_holds_keeps_the_rest_on_the_gpu(free) -> None:
    """The estimate of a plan that offloads more layers than the host memory holds keeps the others' activations
    on the GPU (and copies nothing for them): its memory is that of offloading only what fits, plus what the
    rest keep; NVIDIA's own plan (40 of 80 layers, Megatron-Bridge 25.11) fits the host."""
    import dataclasses

    from meshplan.cost_model import estimate, software_named

    graph, cluster = _llama70b(), GB200
    software = software_named(ARGS["software"])

    def offloading(n: int) -> ir.Prediction:
        plan = dataclasses.replace(free, recompute=("offload",) * n + ("none",) * (80 - n))
        return estimate(graph, cluster, plan, software=software)

    fits, over = offloading(53), offloading(79)
    per_layer = offloading(52).peak_memory_bytes - fits.peak_memory_bytes
    assert over.peak_memory_bytes == pytest.approx(fits.peak_memory_bytes)  # 26 layers more asked, none moved
    assert over.step_time_s == pytest.approx(fits.step_time_s)
    assert per_layer > 4e9 and offloading(40).peak_memory_bytes == pytest.approx(fits.peak_memory_bytes + 13 * per_layer)


@pytest.mark.parametrize("cluster, fixed, message", [
    ("cpu:1x8", {"recompute": "offload"}, "no host link"),
    ("h100-sxm:1x8", {"recompute": "offload", "tp": 2}, "without tensor parallelism only"),
])
def test_pins_that_cannot_offload_say_why(cluster, fixed, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        mp.autoparallelize("gpt-tiny" if cluster.startswith("cpu") else "llama3-8b", cluster, global_batch=8,
                           seq_len=128, fixed=fixed)


def test_megatron_offloads_without_recomputation_and_keeps_a_layer_on_the_gpu() -> None:
    """TransformerConfig refuses cpu_offloading beside recomputation and of every layer (``offload_alone``);
    meshplan's runtime mixes them and may offload every layer."""
    from meshplan.solver import ilp

    def cost(alone: bool) -> ilp.CandidateCost:  # per layer: selective, full, offload
        return ilp.CandidateCost(time_s=1.0, memory_bytes=100e9, extra_time_s=(0.01, 0.03, 0.001),
                                 saved_bytes=(1e9, 3e9, 4e9), layers=10, offload_alone=alone)

    def solve(alone: bool, limit: float) -> ilp.Solution:
        return ilp.solve(ilp.Problem(costs=(cost(alone),), memory_limit_bytes=limit))

    assert solve(True, 66e9).recompute_layers == (0, 0, 9)  # 34 GB to save: 9 offloaded layers
    assert solve(True, 63e9).candidate < 0  # 37 GB: 9 offloaded give 36, and no full recompute beside them
    assert sum(solve(False, 63e9).recompute_layers) == 10  # the runtime mixes (or offloads all 10)
    assert solve(False, 60e9).recompute_layers == (0, 0, 10)


def test_the_search_offloads_no_more_layers_than_the_host_memory_holds() -> None:
    """``offload_cap`` (the layers a rank's share of host memory holds) bounds what the ILP offloads, pinned or not:
    where 9 offloaded layers would be needed and the host holds 5, Megatron's program (offloading alone) has no
    plan, and meshplan's runtime offloads 5 and recomputes the rest of what it must save."""
    from meshplan.solver import ilp

    def cost(alone: bool, cap: int | None) -> ilp.CandidateCost:  # per layer: selective, full, offload
        return ilp.CandidateCost(time_s=1.0, memory_bytes=100e9, extra_time_s=(0.01, 0.03, 0.001),
                                 saved_bytes=(1e9, 3e9, 4e9), layers=10, offload_alone=alone, offload_cap=cap)

    def solve(alone: bool, cap: int | None, limit: float = 66e9, pinned: str | None = None) -> ilp.Solution:
        return ilp.solve(ilp.Problem(costs=(cost(alone, cap),), memory_limit_bytes=limit, pinned_recompute=pinned))

    assert solve(True, None).recompute_layers == (0, 0, 9) and solve(True, 5).candidate < 0
    selective, full, offload = solve(False, 5).recompute_layers
    assert offload == 5 and 4e9 * offload + 3e9 * full + 1e9 * selective >= 34e9
    assert solve(True, 5, limit=200e9, pinned="offload").recompute_layers == (0, 0, 5)
