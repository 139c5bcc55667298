"""Activation offloading (``Recompute.OFFLOAD``): an offloaded layer keeps none of its activations on the GPU
but the one layer whose copy is under way, and its copies cross the GPU's host link
(``Accelerator.host_link_Bps``), exposed in meshplan's runtime (blocking copies) and hidden under the
layer's compute where the program copies on streams of its own (Megatron-Core through Transformer Engine)."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan import ir
from meshplan.cost_model import Cluster, LayerShape, estimate, layer_cost, software_named
from meshplan.cost_model.estimate import DEFAULT as DEFAULT_SOFTWARE
from meshplan.cost_model.footprint import offloaded_layer_bytes
from meshplan.cost_model.summary import summary_of

LAYERS = 8


def _plans(make_plan, make_gpt, cluster, offloaded: int, dtype: str = "bfloat16"):
    cfg = make_gpt(LAYERS, 2048, 16, seq=4096)
    base = make_plan(cfg, cluster, global_batch=16, seq_len=4096, dp=8, micro_batch=1, zero=3, dtype=dtype)
    plan = dataclasses.replace(base, recompute=("offload",) * offloaded + ("none",) * (LAYERS - offloaded))
    return cfg, base, plan


@pytest.mark.parametrize("preset", ["h100-sxm", "gb200-nvl72"])
def test_an_offloaded_layer_leaves_the_gpu_and_its_copies_cross_the_host_link(make_graph, make_plan, make_gpt,
                                                                              preset) -> None:
    per_node = Cluster.preset(preset).gpus_per_node
    cluster = Cluster.preset(preset, nodes=max(1, 8 // per_node), gpus_per_node=min(8, per_node))
    cfg, base, plan = _plans(make_plan, make_gpt, cluster, offloaded=4)
    graph = make_graph(cfg)
    none, off = estimate(graph, cluster, base), estimate(graph, cluster, plan)
    per_layer = offloaded_layer_bytes(summary_of(graph), base, DEFAULT_SOFTWARE)
    # 4 layers' activations leave, one comes back as the copy in flight
    assert none.memory_bytes["activations"] - off.memory_bytes["activations"] == pytest.approx(3 * per_layer)
    # meshplan's runtime copies in order on the compute stream: out in the forward, back in the backward
    copy_s = per_layer / cluster.accelerator.host_link_Bps
    per_step = plan.num_microbatches * 4 * 2 * copy_s
    # exposed copies, outside the compute the preset's calibration scales (estimate.calibrated)
    assert off.step_time_s - none.step_time_s == pytest.approx(per_step, rel=1e-6)


def test_megatron_hides_the_copies_under_each_layers_compute(make_graph, make_plan, make_gpt) -> None:
    """Transformer Engine's double-buffered offload costs only what a copy exceeds its layer's compute by."""
    cluster = Cluster.preset("h100-sxm", nodes=1)
    cfg, base, plan = _plans(make_plan, make_gpt, cluster, offloaded=4)
    megatron = software_named("megatron-core-perf-recipes")
    assert megatron.offload_overlap and not DEFAULT_SOFTWARE.offload_overlap
    graph = make_graph(cfg)
    none, off = (estimate(graph, cluster, p, software=megatron) for p in (base, plan))
    layer = layer_cost(LayerShape(dims=summary_of(graph).dims, micro_batch=1, seq_len=4096, dtype="bfloat16",
                                  software=megatron), cluster)
    copy_s = offloaded_layer_bytes(summary_of(graph), base, megatron) / cluster.accelerator.host_link_Bps
    exposed = max(0.0, copy_s - layer.fwd_compute_s) + max(0.0, copy_s - layer.bwd_compute_s)
    assert off.step_time_s - none.step_time_s == pytest.approx(
        plan.num_microbatches * 4 * exposed, rel=1e-6)  # exposed copies: not calibrated, as above
    # a slower link (PCIe 3, 16 GB/s) exposes more
    slow = dataclasses.replace(cluster, accelerator=dataclasses.replace(cluster.accelerator, host_link_Bps=16e9))
    assert estimate(graph, slow, plan, software=megatron).step_time_s > off.step_time_s


def test_a_cpu_rank_offloads_nothing(make_graph, make_plan, make_gpt) -> None:
    """Without a host link the activations are in host memory already: the same memory and time as none."""
    cluster = Cluster.preset("cpu", nodes=1, gpus_per_node=8)
    assert cluster.accelerator.host_link_Bps == 0
    cfg, base, plan = _plans(make_plan, make_gpt, cluster, offloaded=4, dtype="float32")
    graph = make_graph(cfg)
    none, off = estimate(graph, cluster, base), estimate(graph, cluster, plan)
    assert off.memory_bytes == none.memory_bytes and off.step_time_s == none.step_time_s


def test_a_host_link_is_a_cluster_file_field_and_a_bad_one_is_refused() -> None:
    accel = Cluster.preset("h100-sxm").accelerator
    assert accel.host_link_Bps == 64e9  # PCIe Gen5 x16, each way
    with pytest.raises(ir.InvalidClusterError, match="host_link_Bps"):
        dataclasses.replace(accel, host_link_Bps=float("nan"))
