"""A plan as a DeepSpeed config (JSON), checked against DeepSpeed 0.19.8's ``DeepSpeedConfig``.

DeepSpeed reads the batch as ``train_batch_size = train_micro_batch_size_per_gpu *
gradient_accumulation_steps * data-parallel size`` (its ``_configure_train_batch_size``); ZeRO as
``zero_optimization.stage``; tensor parallelism as ``tensor_parallel.autotp_size`` (AutoTP training,
0.16.4+). Pipeline parallelism is the model's ``PipelineModule(num_stages=pp)``, not a config key: the
stage count is written under ``"meshplan"`` for the reader. DeepSpeed's pipeline engine runs one
schedule (1F1B, its ``TrainSchedule``) and only with ZeRO-0/1; expert parallelism is ``ep_size`` of the
model's ``deepspeed.moe.layer.MoE``; meshplan plans never offload, so no ``offload_*`` key is written.
"""
from __future__ import annotations

import json

from ..ir import Plan, Recompute, Schedule
from .common import refuse

DTYPE_KEYS = {"bfloat16": "bf16", "float16": "fp16"}


def unsupported(plan: Plan) -> list[str]:
    m, missing = plan.mesh, []
    if m.pp > 1 and plan.schedule != Schedule.ONE_F_ONE_B:
        missing.append(f"the {plan.schedule} pipeline schedule (DeepSpeed's pipeline engine runs 1F1B only)")
    if m.pp > 1 and plan.zero_stage > 1:
        missing.append(f"ZeRO-{plan.zero_stage} under pipeline parallelism (DeepSpeed pipelines take ZeRO-0 or 1)")
    if m.cp > 1:
        missing.append(f"context parallelism cp={m.cp} (DeepSpeed's Ulysses splits heads, not ring attention)")
    if plan.sequence_parallel:
        missing.append("Megatron-style sequence parallelism with tp (AutoTP replicates norms and dropout)")
    if m.ep > 1:
        missing.append(f"expert parallelism ep={m.ep} (set in the model's deepspeed.moe.layer.MoE(ep_size=...), "
                       "not in the config)")
    if plan.zero_group:
        missing.append(f"HSDP zero_group={plan.zero_group} (DeepSpeed's hpZ shards a secondary copy only)")
    if Recompute.SELECTIVE in plan.recompute:
        missing.append("selective recomputation of the attention core (DeepSpeed checkpoints whole layers)")
    if Recompute.OFFLOAD in plan.recompute:
        missing.append("activation offloading of whole layers (DeepSpeed's cpu_checkpointing offloads only the "
                       "inputs of checkpointed layers)")
    return missing


def to_deepspeed(plan: Plan) -> str:
    """The DeepSpeed config for ``plan``, as JSON text."""
    refuse("DeepSpeed", unsupported(plan))
    m = plan.mesh
    config = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": plan.zero_stage},
        "bf16": {"enabled": plan.dtype == "bfloat16"},
        "fp16": {"enabled": plan.dtype == "float16"},
    }
    if m.tp > 1:
        config["tensor_parallel"] = {"autotp_size": m.tp}
    if Recompute.FULL in plan.recompute:
        # which layers checkpoint is the model's call (deepspeed.checkpointing.checkpoint); listed below
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False}
    config["meshplan"] = {"summary": plan.summary(), "pipeline_stages": m.pp, "data_parallel_size": m.dp,
                          "layers_per_stage": [b - a for a, b in plan.stages] if plan.stages else [],
                          "recompute_layers": [i for i, r in enumerate(plan.recompute) if r == Recompute.FULL]}
    return json.dumps(config, indent=2) + "\n"
