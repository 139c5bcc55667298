"""A plan as Megatron-LM / NeMo (Megatron-Core) command-line arguments for ``pretrain_gpt.py``.

The flags are those of Megatron-LM's ``megatron/training/arguments.py`` at commit d98e8a6
(megatron-core 0.20.0): ``FLAGS`` below was read from that parser (``add_megatron_arguments``), each
with its destination and kind, so that ``parse`` reads the text back as Megatron would.

Mapping: ZeRO-1 and 2 are Megatron's distributed optimizer (optimizer states sharded, gradients
reduce-scattered); HSDP is ``--num-distributed-optimizer-instances dp / zero_group``; ZeRO-3 is Megatron-FSDP,
which the Megatron-Core presets price it as (``--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params``, with the ``fsdp_dtensor`` checkpoints Megatron requires of it; with expert parallelism too, as
NVIDIA's MoE model zoo runs Qwen3-235B), not exported under pipeline parallelism. Uneven first or
last pipeline stages are ``--decoder-first/last-pipeline-num-layers`` (the middle stages even), other
layouts ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` layer, ``L`` loss, ``|`` between
chunks, chunk ``i`` on pipeline rank ``i % pp``, as in meshplan). Recompute: selective is Megatron's
selective (the attention core, Korthikanti et al. 2022); full on the first n layers of every chunk is
``--recompute-method block --recompute-num-layers n``; full on all layers is ``uniform 1``. Offloading
the first n layers' activations is ``--cpu-offloading-num-layers n`` (without pipelining or recomputation,
as TransformerConfig requires). Modules the software name recomputes (``+recompute-layernorm-moe_act``) are
``--recompute-granularity selective --recompute-modules`` (with ``core_attn`` where the plan recomputes the
attention core, and ``--moe-grouped-gemm``, which ``moe_act`` needs), refused beside full recomputation or
offloading, and under FP8 delayed scaling, as TransformerConfig refuses them. The software name's other
modifiers are flags (``--grad-reduce-in-bf16`` for the presets priced with bf16 gradients, not under ``+fp32-grads``;
``+mxfp8``: ``--fp8-recipe mxfp8``; ``+fp8-delayed``: no ``--fp8-recipe``, Megatron's default
delayed scaling; ``+ep-overlap``: ``--overlap-moe-expert-parallel-comm`` where Megatron allows it; ``+no-dropout``:
``--hidden-dropout 0.0 --attention-dropout 0.0``, which every model priced without dropout is given) or environment
named in the header (``+expandable``, ``+fused-mlp``)."""
from __future__ import annotations

import argparse
import shlex

from ..ir import Plan, Recompute, Schedule
from .common import layer_counts, recompute_kinds, refuse

VERSION = "Megatron-LM d98e8a6 (megatron-core 0.20.0)"
# the software presets the cost model prices with Megatron's flex dispatcher and the HybridEP backend
# (cost_model.software: Software.ep_dispatch "hybridep"); export may not import the cost model, so by name
HYBRIDEP_SOFTWARE = frozenset({"megatron-core-perf-recipes-hybridep",
                               "nemo-automodel-2025"})  # DeepEP there: Megatron's nearest is the same dispatcher
# the presets the cost model prices with FP8 current scaling (Software.fp8_recipe "tensorwise"), by name as above
TENSORWISE_FP8_SOFTWARE = frozenset({"megatron-core-perf-recipes", "megatron-core-perf-recipes-hybridep"})
# the Megatron-Core presets the cost model prices with bf16 gradients reduced in bf16 (Software.fp32_grad_reduce
# False: NVIDIA's perf recipes' grad_reduce_in_fp32=False), by name as above: Megatron-LM reduces them in fp32 unless
# told --grad-reduce-in-bf16 (megatron/training/arguments.py), which a +fp32-grads name does not ask for
BF16_GRADS_SOFTWARE = frozenset({"megatron-core-perf-recipes", "megatron-core-perf-recipes-hybridep",
                                 "nemo-perf-recipes-2024"})
# the presets the cost model prices with dropout in a GPT model (Software.dropout, Megatron's default 0.1), by name as
# above; every other program, every non-GPT model and a +no-dropout name are priced without it, which Megatron runs
# only when told (--hidden-dropout and --attention-dropout default to 0.1 in megatron/training/arguments.py)
DROPOUT_SOFTWARE = frozenset({"megatron-lm-2021", "deepspeed-zero3-2021", "megatron-core-2024",
                              "megatron-core-perf-recipes", "megatron-core-perf-recipes-hybridep",
                              "nemo-perf-recipes-2024"})
# what a software name adds after "+" (cost_model.software.MODIFIERS, read by name as above): the settings Megatron
# takes as flags are written; those NVIDIA's scripts set in the environment are named in the header
ENVIRONMENT = {"expandable": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
               # Megatron-Bridge scripts/performance/perf_plugins.py @v0.5.0, for cutedsl_fused_grouped_mlp
               "fused-mlp": "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1"}
# flag -> (dest, kind, choices); kind "int", "str", "list" (one or more str) or "true" (store_true)
FLAGS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", "int", ()),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", "int", ()),
    "--num-virtual-stages-per-pipeline-rank": ("num_virtual_stages_per_pipeline_rank", "int", ()),
    "--decoder-first-pipeline-num-layers": ("decoder_first_pipeline_num_layers", "int", ()),
    "--decoder-last-pipeline-num-layers": ("decoder_last_pipeline_num_layers", "int", ()),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", "str", ()),
    "--context-parallel-size": ("context_parallel_size", "int", ()),
    "--expert-model-parallel-size": ("expert_model_parallel_size", "int", ()),
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", "int", ()),
    "--micro-batch-size": ("micro_batch_size", "int", ()),
    "--global-batch-size": ("global_batch_size", "int", ()),
    "--seq-length": ("seq_length", "int", ()),
    "--max-position-embeddings": ("max_position_embeddings", "int", ()),
    "--sequence-parallel": ("sequence_parallel", "true", ()),
    "--use-distributed-optimizer": ("use_distributed_optimizer", "true", ()),
    "--num-distributed-optimizer-instances": ("num_distributed_optimizer_instances", "int", ()),
    "--use-torch-fsdp2": ("use_torch_fsdp2", "true", ()),
    # common_config.py's use_megatron_fsdp (a flag by ArgumentGroupFactory), _add_distributed_args' sharding strategy,
    # and CheckpointConfig's ckpt_format, which Megatron-FSDP requires to be fsdp_dtensor
    "--use-megatron-fsdp": ("use_megatron_fsdp", "true", ()),
    "--data-parallel-sharding-strategy": ("data_parallel_sharding_strategy", "str",
                                          ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "--ckpt-format": ("ckpt_format", "str", ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor")),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", "true", ()),
    "--recompute-granularity": ("recompute_granularity", "str", ("full", "selective")),
    # TransformerConfig's cpu_offloading_num_layers, made a flag by ArgumentGroupFactory; > 0 turns on
    # cpu_offloading (megatron/training/arguments.py), activations only by default
    "--cpu-offloading-num-layers": ("cpu_offloading_num_layers", "int", ()),
    "--recompute-method": ("recompute_method", "str", ("uniform", "block")),
    # TransformerConfig.recompute_modules (List[str], default ["core_attn"], taken with selective granularity), made a
    # flag by ArgumentGroupFactory: the cost model prices "layernorm" and "moe_act" (Software.recompute_modules);
    # "moe_act" needs moe_grouped_gemm (TransformerConfig.__post_init__)
    "--recompute-modules": ("recompute_modules", "list", ("core_attn", "moe_act", "layernorm")),
    "--moe-grouped-gemm": ("moe_grouped_gemm", "true", ()),
    "--recompute-num-layers": ("recompute_num_layers", "int", ()),
    "--bf16": ("bf16", "true", ()),
    "--grad-reduce-in-bf16": ("grad_reduce_in_bf16", "true", ()),
    "--fp16": ("fp16", "true", ()),
    # megatron/core/transformer/transformer_config.py: fp8 (--fp8-format) e4m3 | hybrid; fp8_recipe (--fp8-recipe,
    # megatron/core/enums.py Fp8Recipe) defaults to delayed; the cost model prices delayed, tensorwise (current
    # scaling) and mxfp8 (layer_cost.fp8_cast_bytes)
    "--fp8-format": ("fp8", "str", ("e4m3", "hybrid")),
    # "Dropout probability for hidden state transformer" / "Post attention dropout probability" (float, default 0.1)
    "--hidden-dropout": ("hidden_dropout", "float", ()),
    "--attention-dropout": ("attention_dropout", "float", ()),
    "--fp8-recipe": ("fp8_recipe", "str", ("delayed", "tensorwise", "mxfp8", "blockwise", "custom")),
    # "Keep the compute param in fp8 (do not use any other intermediate dtype) and perform the param all-gather
    # in fp8"; only with the distributed optimizer (ZeRO-1 here), as arguments.py asserts
    "--fp8-param-gather": ("fp8_param_gather", "true", ()),
    # transformer_config.py: fp4 (--fp4-format) e2m1, "Currently only supports 'nvfp4' which uses
    # NVFP4BlockScaling recipe" (fp4_recipe defaults to nvfp4); fp4_param (--fp4-param-gather): "keep the
    # parameters in fp4 precision", only with --fp4-format (arguments.py)
    "--fp4-format": ("fp4", "str", ("e2m1",)),
    "--fp4-param-gather": ("fp4_param", "true", ()),
    "--num-layers": ("num_layers", "int", ()),
    "--hidden-size": ("hidden_size", "int", ()),
    "--ffn-hidden-size": ("ffn_hidden_size", "int", ()),
    "--num-attention-heads": ("num_attention_heads", "int", ()),
    "--group-query-attention": ("group_query_attention", "true", ()),
    "--num-query-groups": ("num_query_groups", "int", ()),
    "--num-experts": ("num_experts", "int", ()),
    "--moe-router-topk": ("moe_router_topk", "int", ()),
    # TransformerConfig fields made flags by ArgumentGroupFactory (megatron/core/transformer/transformer_config.py):
    # the flex dispatcher with its DeepEP-style backend, which sends a token once per remote node
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", "str", ("allgather", "alltoall", "flex")),
    "--moe-flex-dispatcher-backend": ("moe_flex_dispatcher_backend", "str", ("deepep", "hybridep", "ncclep")),
    # ModelParallelConfig.overlap_moe_expert_parallel_comm (megatron/core/model_parallel_config.py): Megatron's 1F1B
    # A2A overlap, the cost model's Software.ep_comm_overlap
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", "true", ()),
    "--swiglu": ("swiglu", "true", ()),
    "--normalization": ("normalization", "str", ("LayerNorm", "RMSNorm")),
    "--position-embedding-type": ("position_embedding_type", "str",
                                  ("learned_absolute", "rope", "yarn", "mrope", "relative", "none")),
}


def _software(plan: Plan) -> tuple[str, tuple[str, ...]]:
    """The plan's software preset and the modifiers its name adds (``megatron-core-perf-recipes+expandable``)."""
    base, *mods = plan.software.split("+")
    return base, tuple(mods)


def _recompute_modules(plan: Plan) -> list[str]:
    """The modules a ``+recompute-<modules>`` software name recomputes (layernorm, moe_act)."""
    mods = [mod for mod in _software(plan)[1] if mod.startswith("recompute-")]
    return mods[0][len("recompute-"):].split("-") if mods else []


def _fp8_recipe(plan: Plan) -> str | None:
    """The ``--fp8-recipe`` the plan's FP8 was priced with where it is not Megatron's default, delayed scaling:
    mxfp8 (block scaling) for a ``+mxfp8`` name, tensorwise (current scaling) for the perf recipes' presets unless
    the name adds ``+fp8-delayed``; None for delayed."""
    base, mods = _software(plan)
    if "mxfp8" in mods:
        return "mxfp8"
    return "tensorwise" if base in TENSORWISE_FP8_SOFTWARE and "fp8-delayed" not in mods else None


def unsupported(plan: Plan) -> list[str]:
    m, missing = plan.mesh, []
    modules = _recompute_modules(plan)
    if modules and Recompute.FULL in recompute_kinds(plan):
        missing.append(f"--recompute-modules {' '.join(modules)} beside full recomputation (Megatron takes them with "
                       "--recompute-granularity selective only)")
    if modules and plan.dtype == "float8" and _fp8_recipe(plan) is None:
        missing.append(f"--recompute-modules {' '.join(modules)} under FP8 delayed scaling (\"Delayed scaling does "
                       "not support moe_act and layernorm recompute for fp8\", TransformerConfig)")
    if m.pp > 1 and plan.schedule in (Schedule.GPIPE, Schedule.ZERO_BUBBLE):
        missing.append(f"the {plan.schedule} pipeline schedule (Megatron-LM runs 1F1B or interleaved 1F1B)")
    if plan.zero_stage == 3 and m.pp > 1:
        missing.append("ZeRO-3 under pipeline parallelism (Megatron-FSDP beside pipeline stages is not exported)")
    if plan.zero_group and plan.zero_stage == 3:
        missing.append(f"HSDP zero_group={plan.zero_group} with ZeRO-3 (distributed-optimizer instances are "
                       "ZeRO-1/2)")
    offloaded = plan.recompute.count(Recompute.OFFLOAD)
    if offloaded:  # TransformerConfig.__post_init__'s rules for cpu_offloading (megatron/core/transformer)
        if m.pp > 1:
            missing.append("activation offloading under pipeline parallelism (\"no support for Pipeline "
                           "parallelism with CPU offloading\")")
        if recompute_kinds(plan) & {Recompute.SELECTIVE, Recompute.FULL} or modules:
            missing.append("activation offloading beside recomputation (\"CPU offloading does not work when "
                           "activation recomputation is enabled\")")
        if set(plan.recompute[:offloaded]) != {Recompute.OFFLOAD} or offloaded >= plan.layers:
            missing.append("offloading other than the first n layers, n below the layer count "
                           "(--cpu-offloading-num-layers)")
    if recompute_kinds(plan) >= {Recompute.SELECTIVE, Recompute.FULL}:
        missing.append("selective and full recomputation in one model (--recompute-granularity is one value)")
    elif Recompute.FULL in plan.recompute and _block_layers(plan) is None:
        missing.append("full recomputation of other than the first n layers of every pipeline chunk")
    return missing


def _block_layers(plan: Plan) -> int | None:
    """n when every chunk recomputes exactly its first n layers in full (Megatron's 'block' method)."""
    bounds = plan.stages or ((0, plan.layers),)
    counts = {next((i for i, r in enumerate(plan.recompute[a:b]) if r != Recompute.FULL), b - a) for a, b in bounds}
    if len(counts) != 1:
        return None
    n = counts.pop()
    tails_clean = all(Recompute.FULL not in plan.recompute[a + n:b] for a, b in bounds)
    return n if tails_clean and n else None


def _pipeline_args(plan: Plan) -> list[str]:
    m = plan.mesh
    if m.pp == 1:
        return []
    args = ["--pipeline-model-parallel-size", str(m.pp)]
    counts = layer_counts(plan)
    if len(set(counts)) == 1:
        return args + (["--num-virtual-stages-per-pipeline-rank", str(plan.vp)] if plan.vp > 1 else [])
    middle = counts[1:-1]
    if plan.vp == 1 and len(set(middle)) <= 1:
        return args + ["--decoder-first-pipeline-num-layers", str(counts[0]),
                       "--decoder-last-pipeline-num-layers", str(counts[-1])]
    chunks = [f"t*{n}" for n in counts]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"  # 'E' and 'L' ride with the first and last chunk
    return args + ["--pipeline-model-parallel-layout", "|".join(chunks)]


def _memory_args(plan: Plan) -> list[str]:
    args = []
    if plan.zero_stage in (1, 2):
        args.append("--use-distributed-optimizer")
        if plan.zero_group:
            args += ["--num-distributed-optimizer-instances", str(plan.mesh.dp // plan.zero_group)]
    elif plan.zero_stage == 3:  # Megatron-FSDP, as the Megatron-Core presets price ZeRO-3
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                 "--ckpt-format", "fsdp_dtensor"]
    kinds, modules = recompute_kinds(plan), _recompute_modules(plan)
    if Recompute.OFFLOAD in kinds:
        args += ["--cpu-offloading-num-layers", str(plan.recompute.count(Recompute.OFFLOAD))]
    if modules:  # Megatron's selective granularity recomputes these, and the attention core where the plan does
        core = ["core_attn"] if Recompute.SELECTIVE in kinds else []
        args += ["--recompute-granularity", "selective", "--recompute-modules", *core, *modules]
        args += ["--moe-grouped-gemm"] if "moe_act" in modules else []
    elif Recompute.SELECTIVE in kinds:
        args += ["--recompute-granularity", "selective"]
    elif kinds == {Recompute.FULL}:
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif Recompute.FULL in kinds:
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(_block_layers(plan))]
    return args


def _model_args(plan: Plan) -> list[str]:
    c, (base, mods) = plan.model, _software(plan)
    args = ["--num-layers", str(c["layers"]), "--hidden-size", str(c["hidden"]),
            "--ffn-hidden-size", str(c["ffn_hidden"]), "--num-attention-heads", str(c["heads"]),
            "--seq-length", str(plan.seq_len), "--max-position-embeddings", str(c.get("max_seq_len", plan.seq_len))]
    if c.get("kv_heads") and c["kv_heads"] != c["heads"]:
        args += ["--group-query-attention", "--num-query-groups", str(c["kv_heads"])]
    if c.get("family") in ("llama", "moe"):
        args += ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"]
    if c.get("experts"):
        args += ["--num-experts", str(c["experts"]), "--moe-router-topk", str(c.get("top_k") or 1)]
    if c.get("family", "gpt") != "gpt" or base not in DROPOUT_SOFTWARE or "no-dropout" in mods:
        args += ["--hidden-dropout", "0.0", "--attention-dropout", "0.0"]  # priced without dropout (DROPOUT_SOFTWARE)
    return args


def to_megatron(plan: Plan) -> str:
    """Megatron-LM arguments for ``plan``: one flag per line, ready to follow ``pretrain_gpt.py``."""
    refuse("Megatron-LM", unsupported(plan))
    m, (base, mods) = plan.mesh, _software(plan)
    args = ["--tensor-model-parallel-size", str(m.tp), *_pipeline_args(plan),
            "--context-parallel-size", str(m.cp), "--expert-model-parallel-size", str(m.ep)]
    if m.ep > 1:  # experts split over tp as the dense MLP (the Megatron-Core presets' expert_tp), or whole when
        # the ep group takes tp ranks (MoE parallel folding: ir.Mesh.ep_over_tp)
        args += ["--expert-tensor-parallel-size", "1" if m.ep_over_tp else str(m.tp)]
        if base in HYBRIDEP_SOFTWARE:  # the dispatcher the plan was priced with
            args += ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"]
        if "ep-overlap" in mods and (m.pp == 1 or plan.vp > 1) and Recompute.FULL not in plan.recompute:
            # the 1F1B A2A overlap, where Megatron allows it and the cost model priced it (estimate._ep_overlap)
            args += ["--overlap-moe-expert-parallel-comm"]
    args += ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch)]
    args += ["--sequence-parallel"] if plan.sequence_parallel else []
    args += _memory_args(plan)
    args += {"bfloat16": ["--bf16"], "float16": ["--fp16"], "float8": ["--bf16", "--fp8-format", "hybrid"],
             "float4": ["--bf16", "--fp4-format", "e2m1"]}.get(
        plan.dtype, [])  # FP8 or NVFP4 GEMMs under Transformer Engine, bf16 elsewhere
    if plan.dtype in ("bfloat16", "float8", "float4") and base in BF16_GRADS_SOFTWARE and "fp32-grads" not in mods:
        args += ["--grad-reduce-in-bf16"]  # the gradients' wire dtype the plan was priced with
    recipe = _fp8_recipe(plan) if plan.dtype == "float8" else None
    if recipe:
        args += ["--fp8-recipe", recipe]  # block or current scaling, as the plan was priced
    if plan.dtype == "float8" and plan.zero_stage == 1:
        args += ["--fp8-param-gather"]  # FP8 weights, as the Megatron-Core presets price them (fp8_param_gather)
    if plan.dtype == "float4" and plan.zero_stage == 1:
        args += ["--fp4-param-gather"]  # NVFP4 weights, as Megatron-Bridge's bf16_with_nvfp4_mixed sets them
    args += _model_args(plan)
    lines, i = [], 0
    while i < len(args):
        kind = FLAGS[args[i]][1]
        takes = 0 if kind == "true" else 1
        if kind == "list":  # its values run to the next flag
            while i + 1 + takes < len(args) and not args[i + 1 + takes].startswith("--"):
                takes += 1
        lines.append(shlex.join(args[i:i + 1 + takes]))
        i += 1 + takes
    head = f"# {VERSION} arguments for: {plan.summary()} (meshplan)\n"
    env = [ENVIRONMENT[mod] for mod in mods if mod in ENVIRONMENT]
    if env:
        head += f"# priced as run with this environment: {' '.join(env)}\n"
    return head + " \\\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    """An argparse parser with Megatron's own definitions of ``FLAGS`` (to read an export back)."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, exit_on_error=False)
    for flag, (dest, kind, choices) in FLAGS.items():
        if kind == "true":
            p.add_argument(flag, dest=dest, action="store_true")
        elif kind == "list":
            p.add_argument(flag, dest=dest, nargs="+", choices=choices or None)
        else:
            p.add_argument(flag, dest=dest, type={"int": int, "float": float}.get(kind, str), choices=choices or None)
    return p


def parse(text: str) -> argparse.Namespace:
    """The values Megatron would read from ``to_megatron``'s text."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return parser().parse_args(shlex.split(body.replace("\\\n", " ")))
