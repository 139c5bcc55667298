"""A plan as a torchtitan job config (TOML), for ``torchtitan`` 0.2.2's ``JobConfig``
(``torchtitan/config/job_config.py``; read with ``--job.config_file``).

Mapping: data parallelism is ``data_parallel_replicate_degree x data_parallel_shard_degree``: ZeRO-0
replicates (DDP), ZeRO-3 shards with FSDP2 (``fsdp_reshard_after_forward = "always"``), ZeRO-2 is FSDP2
keeping the parameters gathered after the forward (``"never"``), HSDP shards over ``zero_group`` and
replicates across. torchtitan has no ZeRO-1. Pipeline chunks are listed in
``module_fqns_per_model_part`` (chunk c on pipeline rank c % pp, as in meshplan); torchtitan's
``local_batch_size`` is a data-parallel rank's batch per optimizer step under a pipeline (split into
``pipeline_parallel_microbatch_size`` micro-batches) and one micro-batch without one (the rest is
gradient accumulation: ``global / (local * dp)`` steps, ``Trainer.__init__``). A plan costed with torch.compile
(``--software torchtitan+compile``) turns on ``[compile]``; a float8 plan converts the blocks' linears to torchao's
Float8Linear with tensorwise scaling (``model.converters``, ``[quantize.linear.float8]``), keeping the output layer
in bf16 as the cost model prices it.
"""
from __future__ import annotations

import json

from ..ir import Plan, Recompute, Schedule
from .common import full_every_nth, recompute_kinds, refuse

VERSION = "torchtitan 0.2.2"
SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED_1F1B: "Interleaved1F1B",
             Schedule.ZERO_BUBBLE: "InterleavedZeroBubble"}
MODELS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B")}


def unsupported(plan: Plan) -> list[str]:
    m, missing = plan.mesh, []
    if plan.zero_stage == 1 and m.dp > 1:
        missing.append("ZeRO-1 (torchtitan replicates with DDP or shards with FSDP2: zero 0, 2 or 3)")
    if m.tp > 1 and not plan.sequence_parallel:
        missing.append("tensor parallelism without sequence parallelism (torchtitan's TP plans shard the "
                       "norms over the sequence)")
    if m.pp > 1 and plan.schedule == Schedule.ZERO_BUBBLE and plan.vp < 2:
        missing.append("zero-bubble with one stage per pipeline rank (torchtitan's zero-bubble schedules "
                       "InterleavedZeroBubble and ZBVZeroBubble need at least 2 stages per rank)")
    if m.ep > 1 and m.ep != m.dp * m.cp and m.tp > 1:
        missing.append(f"ep({m.ep}) != dp*cp with tp({m.tp}) (torchtitan takes ep from dp_shard*cp, etp = 1 or tp)")
    if plan.dtype == "float4":
        missing.append("NVFP4 GEMMs (torchtitan's quantize converters run Float8 and MX formats)")
    kinds = recompute_kinds(plan)
    if Recompute.OFFLOAD in kinds:
        missing.append("activation offloading to host memory (torchtitan's activation_checkpoint has modes "
                       "none, selective and full only)")
    elif len(kinds) > 1 and full_every_nth(plan) is None:
        missing.append("per-layer recomputation other than 'full on every n-th layer' "
                       f"({', '.join(f'{plan.recompute.count(k)} {k}' for k in sorted(kinds))})")
    return missing


def _data_parallel(plan: Plan) -> dict[str, object]:
    dp = plan.mesh.dp
    if plan.zero_stage == 0 or dp == 1:
        return {"data_parallel_replicate_degree": dp, "data_parallel_shard_degree": 1}
    shard = plan.zero_group or dp
    return {"data_parallel_replicate_degree": dp // shard, "data_parallel_shard_degree": shard,
            "fsdp_reshard_after_forward": "always" if plan.zero_stage == 3 else "never"}


def _pipeline(plan: Plan) -> dict[str, object]:
    if plan.mesh.pp == 1:
        return {}
    parts = [[f"layers.{i}" for i in range(first, last)] for first, last in plan.stages]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return {"pipeline_parallel_degree": plan.mesh.pp, "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
            "pipeline_parallel_microbatch_size": plan.micro_batch_size, "module_fqns_per_model_part": parts}


def _activation_checkpoint(plan: Plan) -> dict[str, object]:
    kinds = recompute_kinds(plan)
    if kinds == {Recompute.NONE}:
        return {"mode": "none"}
    if kinds == {Recompute.FULL}:
        return {"mode": "full"}
    if kinds == {Recompute.SELECTIVE}:
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": "selective", "selective_ac_option": str(full_every_nth(plan))}


def sections(plan: Plan) -> dict[str, dict[str, object]]:
    """The job config as nested tables (what the TOML holds)."""
    refuse("torchtitan", unsupported(plan))
    m = plan.mesh
    name, flavor = MODELS.get(plan.model.get("name", ""), (plan.model.get("family", "llama3"), "custom"))
    local = plan.micro_batch_size * (plan.num_microbatches if m.pp > 1 else 1)
    parallelism = {**_data_parallel(plan), "tensor_parallel_degree": m.tp, **_pipeline(plan),
                   "context_parallel_degree": m.cp, "expert_parallel_degree": m.ep}
    if m.ep > 1:
        parallelism["expert_tensor_parallel_degree"] = 1
    out = {"job": {"description": f"meshplan: {plan.summary()}"},
           "model": {"name": name, "flavor": flavor},
           "training": {"local_batch_size": local, "global_batch_size": plan.global_batch, "seq_len": plan.seq_len,
                        "mixed_precision_param": "float32" if plan.dtype == "float32" else "bfloat16"},
           "parallelism": parallelism,
           "activation_checkpoint": _activation_checkpoint(plan)}
    if "compile" in plan.software.split("+")[1:]:  # the plan was costed with torch.compile (Software.compiled)
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
    if plan.dtype == "float8":  # torchao's Float8Linear, tensorwise, the output layer in bf16 as the cost model has it
        out["model"]["converters"] = ["quantize.linear.float8"]
        out["quantize.linear.float8"] = {"recipe_name": "tensorwise", "filter_fqns": ["output"]}
    return out


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string with ASCII escapes is a TOML basic string
    return str(int(v))


def to_torchtitan(plan: Plan) -> str:
    """The torchtitan job config for ``plan``, as TOML text."""
    out = [f"# {VERSION} job config written by meshplan; run with --job.config_file <this file>"]
    for section, table in sections(plan).items():
        out += ["", f"[{section}]"] + [f"{key} = {_value(v)}" for key, v in table.items()]
    return "\n".join(out) + "\n"
