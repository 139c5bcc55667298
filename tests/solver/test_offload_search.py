"""The search offers activation offloading where the program runs it and the GPU has a host link: Megatron-Core
on GB200 (NVLink-C2C) offloads Llama 3 70B's layers under Megatron-FSDP at 8K tokens, the plan NVIDIA's
performance recipes run there (Megatron-Bridge 25.11: FSDP over 64 GPUs, micro-batch 2, 40 of 80 layers
offloaded), and the plan exports as Megatron's --cpu-offloading-num-layers. A CPU rank has nothing to
offload to, and meshplan's runtime does not offload beside tensor parallelism: pins that ask say why."""
from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import ir
from meshplan.export.megatron import parse, to_megatron

ARGS = dict(global_batch=128, seq_len=8192, dtype="bfloat16", software="megatron-core-perf-recipes")


@pytest.fixture(scope="module")
def free() -> ir.Plan:
    return mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", **ARGS)


def test_megatron_on_gb200_offloads_layers_of_llama3_70b_as_nvidia_runs_it(free) -> None:
    plan = free
    offloaded = plan.recompute.count("offload")
    assert plan.mesh.dp == 64 and plan.zero_stage == 3 and 0 < offloaded < plan.layers, plan.summary()
    assert set(plan.recompute[:offloaded]) == {"offload"}  # the first layers, as Megatron offloads them
    assert parse(to_megatron(plan)).cpu_offloading_num_layers == offloaded


def test_offloading_is_priced_against_recomputation_on_the_same_plan(free) -> None:
    """Pinned, every layer Megatron may offload (all but one): less memory than the search's own mix, and a
    slower step on the same cluster (the search would not have chosen it otherwise)."""
    pinned = mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", fixed={"recompute": "offload", "tp": 1, "pp": 1},
                                **ARGS)
    assert pinned.recompute.count("offload") == 79 and pinned.recompute[-1] == "none"
    assert pinned.prediction.peak_memory_bytes < free.prediction.peak_memory_bytes
    assert pinned.prediction.step_time_s >= free.prediction.step_time_s


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
