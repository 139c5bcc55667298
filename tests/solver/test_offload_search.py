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

ARGS = dict(global_batch=128, seq_len=8192, dtype="bfloat16")


def test_megatron_on_gb200_offloads_layers_of_llama3_70b_as_nvidia_runs_it() -> None:
    plan = mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", software="megatron-core-perf-recipes", **ARGS)
    offloaded = plan.recompute.count("offload")
    assert plan.mesh.dp == 64 and plan.zero_stage == 3 and 0 < offloaded < plan.layers, plan.summary()
    assert set(plan.recompute[:offloaded]) == {"offload"}  # the first layers, as Megatron offloads them
    assert parse(to_megatron(plan)).cpu_offloading_num_layers == offloaded


def test_offloading_is_priced_against_recomputation_on_the_same_plan() -> None:
    """Pinned, every layer offloaded: the memory of one layer in flight instead of 80, and a slower step than
    the search's own mix on the same cluster (the search would not have chosen it otherwise)."""
    free = mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", software="megatron-core-perf-recipes", **ARGS)
    pinned = mp.autoparallelize("llama3-70b", "gb200-nvl72:16x4", software="megatron-core-perf-recipes",
                                fixed={"recompute": "offload", "tp": 1, "pp": 1}, **ARGS)
    assert set(pinned.recompute) == {"offload"}
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
