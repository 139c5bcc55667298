"""``meshplan estimate``: the predicted time and memory of one plan, every choice given.

    meshplan estimate --model gpt3-175b --cluster a100-80gb:8x8 --global-batch 64 --seq-len 2048 \\
        --tp 8 --pp 8 --vp 3 --recompute selective [--software megatron-lm-2021] [--json]

No search runs: the plan is built as given (dp, when left out, is what the GPUs leave after
tp * pp * cp) and costed by ``cost_model.estimate``. Pipeline stages split the layers evenly, the
first chunks taking the remainder, unless ``--stages`` lists the layers per chunk or Megatron-LM's
uneven split is asked for (``--first-stage-layers``/``--last-stage-layers``, the account-for-embedding
/loss flags: ``solver/stages.megatron_counts``), e.g. Llama 3.1 405B's ``--pp 16 --vp 8
--first-stage-layers 7 --last-stage-layers 7``. The report is
the one ``meshplan plan`` prints, plus a line with model and hardware FLOP/s per GPU; ``--json``
prints the plan with its prediction instead. ``cli.py`` registers it with ``add_parser``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from . import ir, zoo
from .cost_model import Cluster, estimate, parse_cluster, software_named
from .cli_flags import software_name
from .cost_model.software import SOFTWARE

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "fp8": "float8",
          "float8": "float8", "nvfp4": "float4", "fp4": "float4", "float4": "float4", "fp32": "float32",
          "float32": "float32"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``estimate`` on the ``meshplan`` command's subparsers."""
    p = subparsers.add_parser("estimate", help="predict the time and memory of one plan, every choice given",
                              description=__doc__.split("\n\n")[0])
    from .cli_model import add_model_args

    add_model_args(p)  # a zoo name, hf:PATH or pkg.module:function (+ --model-kwargs), or --model-config
    p.add_argument("--cluster", required=True,
                   help="NAME:NODESxGPUS (e.g. h100-sxm:16x8), a cluster file CLUSTER.json (the presets' "
                        "format) or a profile written by `meshplan calibrate`")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, required=True)
    g = p.add_argument_group("the plan")
    for axis in ("tp", "pp", "cp", "ep"):
        g.add_argument(f"--{axis}", type=int, default=1)
    g.add_argument("--dp", type=int, help="default: the GPUs left after tp * pp * cp")
    g.add_argument("--vp", type=int, default=1, help="virtual stages per pipeline rank (interleaved 1F1B)")
    g.add_argument("--micro-batch", type=int, default=1)
    g.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    g.add_argument("--zero-group", type=int, default=0, metavar="G",
                   help="HSDP: ZeRO-2/3 shard groups of G data-parallel ranks, replicated across dp / G groups; "
                        "a group may span nodes (FSDP2's shard degree; default 0: shard over all of dp)")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default: on when tp > 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full", "offload"), default="none")
    g.add_argument("--schedule", choices=[str(s) for s in ir.Schedule],
                   help="default: interleaved-1f1b when vp > 1, else 1f1b")
    g.add_argument("--stages", help="layers per pipeline chunk, comma-separated (default: even)")
    g.add_argument("--first-stage-layers", type=int, metavar="N",
                   help="layers on the first pipeline rank, the other ranks sharing the rest evenly (Megatron-LM's "
                        "--decoder-first-pipeline-num-layers); with --vp its chunk 0 is the lighter one and may "
                        "hold only the embedding")
    g.add_argument("--last-stage-layers", type=int, metavar="M",
                   help="layers on the last pipeline rank (Megatron-LM's --decoder-last-pipeline-num-layers)")
    g.add_argument("--account-for-embedding-in-pipeline-split", dest="account_embedding", action="store_true",
                   help="the embedding counts as one layer of the first chunk (Megatron-LM's flag of that name)")
    g.add_argument("--account-for-loss-in-pipeline-split", dest="account_loss", action="store_true",
                   help="the output layer and loss count as one layer of the last chunk (Megatron-LM's flag)")
    g.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16, or fp32 where the cluster has no bf16")
    p.add_argument("--software", type=software_name, default="meshplan", metavar="NAME[+MODIFIER...]",
                   help="the program that runs the plan: its attention kernel and overlaps (default: meshplan). "
                        f"Presets: {', '.join(sorted(SOFTWARE))}; a framework preset may add modifiers after +, "
                        "as `meshplan plan --software` says")
    p.add_argument("--json", action="store_true", help="print the plan with its prediction as JSON")
    p.set_defaults(func=cmd_estimate)
    return p


def cmd_estimate(args: argparse.Namespace) -> int:
    cluster = parse_cluster(args.cluster)
    config, traced = _config(args)
    check_choices(args, config, cluster.world_size)
    plan = build_plan(config, cluster, args)  # bad degrees fail here, before the trace
    graph = traced.graph if traced is not None else _graph(config, args.seq_len)
    if traced is not None:  # the user's model: the plan says where it comes from and what was found in it
        plan = replace(plan, source=traced.source, structure=traced.structure)
    from .solver.layouts import param_layouts  # here, not at import: `meshplan run`'s workers build this parser

    names = tuple(p.name for p in graph.params)
    plan = replace(plan, param_layouts=param_layouts(names, tp=plan.mesh.tp, zero=plan.zero_stage, dp=plan.mesh.dp))
    plan = replace(plan, software=args.software)
    plan = plan.with_prediction(estimate(graph, cluster, plan, software=software_named(args.software)))
    if args.json:
        print(plan.to_json())
        return 0
    print(ir.report.report(plan))
    print(flops_line(plan.prediction, cluster, plan.dtype))
    if args.software != "meshplan":
        print(f"software: {args.software}")
    return 0


def flops_line(pred: ir.Prediction, cluster: Cluster, dtype: str) -> str:
    peak = cluster.accelerator.peak(dtype)
    model, hardware = pred.model_tflops_per_gpu * 1e12, pred.hardware_tflops_per_gpu * 1e12
    extra = hardware / model - 1 if model else 0.0
    return (f"FLOP/s per GPU: model {_rate(model)} (MFU {pred.mfu:.1%}), hardware {_rate(hardware)} "
            f"(HFU {hardware / peak:.1%}; recomputation adds {extra:.1%}) of a {_rate(peak)} {dtype} peak")


def _rate(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.1f} TF" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.2f} GF"


@dataclass(frozen=True)
class Traced:
    """A model that is not the zoo's, as ``estimate`` traced it."""

    graph: ir.Graph
    source: dict
    structure: dict


def _config(args: argparse.Namespace) -> tuple[zoo.ModelConfig, Traced | None]:
    """The model's sizes; for a model given as hf:PATH or pkg.module:function, also its traced graph."""
    from .cli_model import model_arg, model_kwargs

    if args.model and ":" in args.model:
        return _traced_config(model_arg(args), model_kwargs(args), args.seq_len)
    return _zoo_config(args), None


def _traced_config(model: Any, kwargs: dict | None, seq_len: int) -> tuple[zoo.ModelConfig, Traced]:
    from .api import model_and_source, model_config
    from .frontend import trace

    module, source = model_and_source(model, kwargs)
    graph = trace(module, batch=1, seq_len=min(seq_len, 64))
    if not graph.dims.layers:
        raise ir.UnsupportedModelError(f"{type(module).__name__} has no repeated blocks: the cost model prices a "
                                       "model block by block")
    cfg = model_config(module, graph, seq_len)
    if seq_len > cfg["max_seq_len"]:
        raise ir.PlanError(f"seq_len {seq_len} exceeds the model's max_seq_len {cfg['max_seq_len']}")
    structure = graph.structure.to_dict() if graph.structure is not None else {}
    # the sizes as a zoo config (its fields are the ones plan.model has), only to carry them here
    return zoo.ModelConfig.from_dict(cfg), Traced(graph=graph, source=source, structure=structure)


def _zoo_config(args: argparse.Namespace) -> zoo.ModelConfig:
    if args.model is not None:  # '' too: the zoo says it has no such model
        config = zoo.config(args.model)
    else:
        from .ir.readfile import MAX_CONFIG_BYTES, read_json_file  # as cli._model

        data = read_json_file(args.model_config, max_bytes=MAX_CONFIG_BYTES, what="model config")
        config = zoo.ModelConfig.from_dict(data)
    if args.seq_len > config.max_seq_len:
        raise ir.PlanError(f"seq_len {args.seq_len} exceeds the model's max_seq_len {config.max_seq_len}")
    ir.limits.check_positive_int("the model's layers", config.layers, ir.limits.MAX_LAYERS, what="layers")
    return config


def check_choices(args: argparse.Namespace, config: zoo.ModelConfig, world: int) -> None:
    """Choices that contradict each other or the model, each with its own rule, before any arithmetic
    divides by them (``cli_flags.check_flags`` has made every degree a positive int already)."""
    ir.limits.check_positive_int("the cluster's GPUs", world, ir.limits.MAX_GPUS, error=ir.InvalidClusterError,
                                 what="GPUs")
    name = args.model or config.name or config.family
    if args.ep > 1 and not config.experts:
        raise ir.InvalidPlanError(f"--ep {args.ep} needs a model with experts; {name} has none; drop --ep")
    if args.ep > 1 and config.experts % args.ep:
        raise ir.InvalidPlanError(f"--ep {args.ep} does not divide the {config.experts} experts of {name}; "
                                  f"pass a divisor of {config.experts}")
    if args.sp and args.tp == 1:
        raise ir.InvalidPlanError("--sp needs --tp > 1: sequence parallelism splits the sequence over the tp "
                                  "ranks; pass --tp or drop --sp")
    if args.vp > 1 and args.pp == 1:
        raise ir.InvalidPlanError(f"--vp {args.vp} needs --pp > 1: virtual stages interleave the chunks of "
                                  "pipeline ranks; pass --pp or drop --vp")
    if args.vp > 1 and args.schedule not in (None, str(ir.Schedule.INTERLEAVED_1F1B)):
        raise ir.InvalidPlanError(f"--vp {args.vp} needs --schedule {ir.Schedule.INTERLEAVED_1F1B}, "
                                  f"not {args.schedule}")


def _graph(config: zoo.ModelConfig, seq_len: int) -> ir.Graph:
    import torch

    from .frontend import trace

    with torch.device("meta"):
        model = zoo.build_from_config(config)
    return trace(model, batch=1, seq_len=min(seq_len, 64))


def _mesh(args: argparse.Namespace, world: int) -> ir.Mesh:
    model_parallel = args.tp * args.pp * args.cp
    dp = args.dp
    if dp is None:
        if world % model_parallel:
            rest = world % model_parallel
            raise ir.InvalidPlanError(f"tp({args.tp}) * pp({args.pp}) * cp({args.cp}) = {model_parallel} does not "
                                      f"divide the {world} GPUs ({world} % {model_parallel} = {rest}); "
                                      f"pick degrees whose product divides {world}")
        dp = world // model_parallel
    if model_parallel * dp != world:
        raise ir.InvalidPlanError(f"pp({args.pp}) * dp({dp}) * cp({args.cp}) * tp({args.tp}) = {model_parallel * dp} "
                                  f"!= {world} GPUs of the cluster; make the degrees multiply to {world}")
    return ir.Mesh(pp=args.pp, dp=dp, cp=args.cp, tp=args.tp, ep=args.ep)


def _stages(args: argparse.Namespace, layers: int) -> tuple[tuple[int, int], ...]:
    chunks = args.pp * args.vp
    megatron = dict(first=args.first_stage_layers, last=args.last_stage_layers, embedding=args.account_embedding,
                    loss=args.account_loss)
    given = [flag for flag, value in (("--first-stage-layers", megatron["first"]),
                                      ("--last-stage-layers", megatron["last"]),
                                      ("--account-for-embedding-in-pipeline-split", megatron["embedding"] or None),
                                      ("--account-for-loss-in-pipeline-split", megatron["loss"] or None))
             if value is not None]
    if given and (args.pp == 1 or args.stages):
        raise ir.InvalidPlanError(f"{given[0]} places layers on pipeline ranks: it needs --pp > 1 and no --stages "
                                  f"(got pp({args.pp}){', --stages' if args.stages else ''})")
    if args.pp == 1 and args.vp == 1 and not args.stages:
        return ()
    if given:
        from .solver.stages import megatron_counts

        counts = list(megatron_counts(layers, args.pp, args.vp, **megatron))
    elif args.stages:
        try:
            counts = [int(x) for x in args.stages.split(",")]
        except ValueError:
            raise ir.InvalidPlanError(f"--stages {args.stages!r}: expected layer counts like 12,12,11") from None
        if len(counts) != chunks or sum(counts) != layers or min(counts) < 1:
            raise ir.InvalidPlanError(f"--stages gives {len(counts)} chunks of {sum(counts)} layers; expected "
                                      f"pp({args.pp}) * vp({args.vp}) = {chunks} chunks of at least one layer, "
                                      f"{layers} layers in all")
    else:
        if layers < chunks:
            raise ir.InvalidPlanError(f"pp({args.pp}) * vp({args.vp}) = {chunks} chunks but the model has "
                                      f"{layers} layers; the first and last chunk may hold only the embedding "
                                      "and the head: pass --first-stage-layers/--last-stage-layers or "
                                      "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
        base, rest = divmod(layers, chunks)
        counts = [base + (1 if c < rest else 0) for c in range(chunks)]
    bounds = [0]
    for n in counts:
        bounds.append(bounds[-1] + n)
    return tuple(zip(bounds[:-1], bounds[1:]))


def build_plan(config: zoo.ModelConfig, cluster: Cluster, args: argparse.Namespace) -> ir.Plan:
    """The plan the arguments describe, without parameter layouts or a prediction."""
    mesh = _mesh(args, cluster.world_size)
    per_step = args.micro_batch * mesh.dp
    if args.global_batch % per_step:
        raise ir.InvalidPlanError(f"global_batch({args.global_batch}) is not a whole number of micro-batches: "
                                  f"micro_batch({args.micro_batch}) * dp({mesh.dp}) = {per_step} does not divide it")
    accel = cluster.accelerator
    dtype = DTYPES[args.dtype] if args.dtype else ("bfloat16" if "bfloat16" in accel.peak_flops else "float32")
    accel.peak(dtype)  # a dtype the preset has no peak for is refused here, saying which it has
    schedule = args.schedule or ("interleaved-1f1b" if args.vp > 1 else "1f1b")
    sp = (mesh.tp > 1) if args.sp is None else args.sp
    return ir.Plan(model=config.to_dict(), cluster=cluster.spec, global_batch=args.global_batch,
                   seq_len=args.seq_len, mesh=mesh, zero_stage=args.zero, zero_group=args.zero_group, sequence_parallel=sp,
                   micro_batch_size=args.micro_batch, num_microbatches=args.global_batch // per_step,
                   schedule=schedule, vp=args.vp, recompute=(args.recompute,) * config.layers,
                   stages=_stages(args, config.layers), dtype=dtype)

