"""The cost model: time, memory and bytes moved of a plan on a cluster. Pure: the hardware comes in
as a value (``Cluster``), nothing here queries a device, torch or the environment.

    hardware.py      Accelerator, Tier, Cluster (frozen values)
    catalog.py       presets/<name>.json data files, "NAME:NODESxGPUS" specs
    profile.py       a cluster from the timings `meshplan calibrate` measured
    flops.py         parameters and FLOPs from the model's dimensions (Korthikanti eq. 7)
    software.py      what the training program does beyond the plan (attention kernel, overlaps)
    kernels.py       roofline time of a matmul, an attention core (fused or plain), a memory-bound kernel
    collectives.py   NCCL collective time on the tiers a group crosses (nccl-tests busbw)
    memory.py        ZeRO model states, activations per layer (Korthikanti sec. 4)
    layer_cost.py    one layer's forward/backward time on one GPU, with TP/EP/CP traffic
    fusion.py        memory traffic the fused kernels of plan.fusions save in a layer
    pipeline.py      stages per pipeline rank, bubble, micro-batches in flight
    data_parallel.py DP/ZeRO traffic and overlap, the optimizer step
    footprint.py     peak memory per GPU
    sublayers.py     sublayers a plan keeps whole over tp (the intra-op program's choice), priced whole
    estimate.py      estimate(graph, cluster, plan) -> ir.Prediction; step_time(...) its step alone
"""
from .catalog import cluster_from_dict, parse_cluster, preset_data, preset_names
from .collectives import Collective, bus_bytes, collective_time, flat_collective_time, group_phases
from .data_parallel import data_parallel_cost, optimizer_step_s
from .estimate import check_plan, estimate, host_offload_layers, memory_breakdown, step_time
from .flops import (attention_core_flops, hardware_flops_per_step, layer_matmul_params, layer_params,
                    model_flops_per_step, recompute_flops_per_step)
from .footprint import ALLOCATOR_FRACTION, rank_memory
from .fusion import FUSED_TRAFFIC, fusion_saving, worthwhile
from .hardware import BUS_EFFICIENCY, Accelerator, Cluster, Tier, TierKind
from .kernels import attention_fwd_bwd_s, matmul_fwd_bwd_s, matmul_time_s, memory_time_s, plain_attention_fwd_bwd_s
from .layer_cost import LayerCost, LayerShape, layer_cost
from .memory import activation_units, layer_activation_bytes, logits_bytes, state_bytes
from .pipeline import bubble_s, inflight_microbatches, rank_layers
from .profile import cluster_from_profile, load_profile
from .software import DEFAULT as DEFAULT_SOFTWARE
from .software import SOFTWARE, Software, software_named
from .summary import ModelSummary, summary_of

__all__ = [
    "ALLOCATOR_FRACTION", "Accelerator", "BUS_EFFICIENCY", "Cluster", "Collective", "DEFAULT_SOFTWARE", "LayerCost",
    "FUSED_TRAFFIC", "LayerShape", "ModelSummary", "SOFTWARE", "Software", "Tier", "TierKind", "activation_units",
    "attention_core_flops", "attention_fwd_bwd_s", "bubble_s", "bus_bytes", "check_plan", "cluster_from_dict",
    "cluster_from_profile", "collective_time", "data_parallel_cost", "estimate", "flat_collective_time",
    "fusion_saving", "group_phases", "hardware_flops_per_step", "inflight_microbatches", "layer_activation_bytes",
    "layer_cost",
    "layer_matmul_params", "layer_params", "load_profile", "logits_bytes", "matmul_fwd_bwd_s", "matmul_time_s",
    "host_offload_layers", "memory_breakdown", "memory_time_s", "model_flops_per_step", "optimizer_step_s", "parse_cluster",
    "plain_attention_fwd_bwd_s", "preset_data", "preset_names", "rank_layers", "rank_memory", "step_time",
    "recompute_flops_per_step", "software_named", "state_bytes", "summary_of", "worthwhile",
]
