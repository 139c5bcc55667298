"""The user's entry points: ``autoparallelize`` runs the stages in order (trace, cost, solve) and
returns a ``Plan`` that can be reported, saved, emitted as a program, or applied to a model."""
from __future__ import annotations

import functools
import inspect
import json
import weakref
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable

import torch

from . import ir, solver, zoo
from .codegen.fusion import find_fusions, fusion_names
from .cost_model import DEFAULT_SOFTWARE, Cluster, Software, estimate, parse_cluster, software_named, worthwhile
from .frontend import trace


class Plan(ir.Plan):
    """``ir.Plan`` with the actions that need the later stages (codegen, runtime)."""

    __slots__ = ()

    def report(self) -> str:
        return ir.report.report(self)

    def explain(self) -> str:
        return ir.report.explain(self)

    def emit(self, path: str | Path, *, fuse: bool | None = None) -> Path:
        """Write a readable torchrun training script for this plan. With ``fuse`` the fusions the plan
        records run as generated Triton kernels, written beside the script as ``<stem>_kernels.py``
        (the stem made an importable name: ``train-70b.py`` -> ``train_70b_kernels.py``); by default
        (None) exactly when the plan records fusions, as its prediction assumes. Both sources are
        generated and compiled before either file is written (``InvalidPlanError`` otherwise)."""
        from .codegen import emit_source, lower
        from .codegen.fused import kernels_source
        from .codegen.safe import kernels_module_name

        fuse = bool(self.fusions) if fuse is None else fuse
        if not self.cluster.strip().endswith(".json"):  # a preset that exists (a profile may be elsewhere)
            parse_cluster(self.cluster)
        check_zoo_layouts(self)
        path = Path(path)
        kernels_module = kernels_module_name(path.stem)
        files = {}
        if fuse:
            source = kernels_source(lower(self, fuse=True))
            if source is not None:
                files[path.with_name(f"{kernels_module}.py")] = source
        files[path] = emit_source(self, fuse=fuse, kernels_module=kernels_module)
        for file, text in files.items():
            file.write_text(text, encoding="utf-8")
        return path

    def to_html(self, path: str | Path) -> Path:
        """Write this plan's report as one self-contained HTML file with plots (``report_html``)."""
        from .report_html import to_html

        return to_html(self, path)

    def apply(self, model: torch.nn.Module, *, optimizer: Callable | None = None, fuse: bool | None = None,
              loss_fn: Callable | None = None) -> Any:
        """Shard ``model`` in place as the plan says (inside torchrun); returns a ``PlannedModule``.
        ``fuse``: run the plan's fusions as generated Triton kernels; by default (None) when the plan
        records fusions and a GPU is there to compile them (on CPU they would run in Triton's
        interpreter: ask for it with ``fuse=True`` and ``TRITON_INTERPRET=1``). ``loss_fn(output,
        targets)`` for ``step``: default token cross-entropy on the logits (a tensor, ``.logits`` or a
        tuple's first item)."""
        from .runtime import apply

        if fuse is None:
            fuse = bool(self.fusions) and torch.cuda.is_available()
        return apply(self, model, optimizer=optimizer, fuse=fuse, loss_fn=loss_fn)


def check_zoo_layouts(plan: ir.Plan) -> None:
    """A zoo model's plan names a config the zoo can build and lays out parameters that model has, each ``S(dim)`` a dim of the parameter;
    ``InvalidPlanError`` naming the first that is not. Blocks are alike, so one block stands for all
    (the schema checked ``layers.N`` against the layer count). Other sources are checked when the script
    builds the model (``plan.apply``)."""
    source = plan.source or {"kind": "zoo"}
    if source.get("kind") != "zoo" or "family" not in plan.model and not source.get("name"):
        return
    cfg = source.get("config") or (zoo.config(source["name"]).to_dict() if source.get("name") else plan.model)
    known = {f.name for f in fields(zoo.ModelConfig)}
    zoo.ModelConfig.from_dict({k: v for k, v in cfg.items() if k in known})  # the zoo's rules (a moe has experts)
    differ = sorted(k for k in known - {"name"} if k in cfg and plan.model.get(k) != cfg[k])  # missing differs too
    if differ:
        got = plan.model.get(differ[0], "missing")
        raise ir.InvalidPlanError(f"plan.model.{differ[0]} is {got!r:.40} but the zoo model the "
                                  f"source names has {cfg[differ[0]]!r:.40}; the script builds the source's model, so "
                                  "re-plan it (meshplan plan)")
    if not plan.param_layouts:
        return
    with torch.device("meta"):
        model = zoo.build_from_config({**cfg, "layers": 1})
    ndims = {name: p.ndim for name, p in model.named_parameters()}
    for name, layout in plan.param_layouts.items():
        parts = name.split(".")
        key = ".".join(["layers", "0", *parts[2:]]) if parts[0] == "layers" and parts[1:2] != [] else name
        if key not in ndims or (key != name and not parts[1].isdigit()):
            what = cfg.get("name") or cfg.get("family")
            raise ir.InvalidPlanError(f"param_layouts names {name!r}, a parameter the model ({what}) does not have; "
                                      "re-plan this model (meshplan plan)")
        for axis, text in zip(ir.AXES, layout):
            placement = ir.parse_placement(text)
            if isinstance(placement, ir.Shard) and not -ndims[key] <= placement.dim < ndims[key]:
                raise ir.InvalidPlanError(f"param_layouts[{name!r}] shards dim {placement.dim} over {axis}, but "
                                          f"the parameter has {ndims[key]} dim(s); re-plan this model")
    layers = int(cfg.get("layers", 0))
    for name in ndims:  # and every parameter has its layout (the runtime checks the names before any step)
        wanted = [name.replace("layers.0.", f"layers.{i}.", 1) for i in range(layers)] \
            if name.startswith("layers.0.") else [name]
        missing = next((w for w in wanted if w not in plan.param_layouts), None)
        if missing is not None:
            raise ir.InvalidPlanError(f"param_layouts has no layout for {missing!r}, a parameter of the model; "
                                      "re-plan this model (meshplan plan)")


def as_api_plan(plan: ir.Plan) -> Plan:
    return Plan(**{f.name: getattr(plan, f.name) for f in fields(plan)})


ModelLike = torch.nn.Module | str | dict


def model_and_source(model: ModelLike, model_kwargs: dict[str, Any] | None = None
                     ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module to trace and where it comes from (``runtime.source``): a module as given (a zoo or
    Hugging Face model says where it comes from; another one is the caller's alone), a zoo name, a zoo
    config dict, or a builder ``"pkg.module:function"`` called with ``model_kwargs`` on the meta device."""
    from .runtime import source as sources

    if isinstance(model, torch.nn.Module):
        return model, source_of(model)
    if isinstance(model, str) and ":" in model:
        src = sources.builder_source(model, model_kwargs)
    elif isinstance(model, str):
        zoo.config(model)  # an unknown name is refused here, with the names there are
        src = {"kind": "zoo", "name": model}
    elif isinstance(model, dict):
        src = {"kind": "zoo", "config": zoo.ModelConfig.from_dict(model).to_dict()}
    else:
        raise ir.UnsupportedModelError(f"model must be an nn.Module, a zoo name, a zoo config dict or a builder "
                                       f"'pkg.module:function', got {type(model).__name__}")
    if src["kind"] == "zoo":
        return _zoo_module(json.dumps(src, sort_keys=True)), src
    with torch.device("meta"):
        return sources.build(src), src


@functools.lru_cache(maxsize=16)
def _zoo_module(src: str) -> torch.nn.Module:
    """The meta module of a zoo source (its JSON), built once: a zoo name or config fixes the module, so planning
    it on several clusters, or under several pins, builds it once and ``_traced`` traces it once (a builder or a
    Hugging Face directory may change between two calls, and is built each time). Only read from here on."""
    from .runtime import source as sources

    with torch.device("meta"):
        return sources.build(json.loads(src))


def source_of(model: torch.nn.Module) -> dict[str, Any]:
    """What a module says of where it comes from: a zoo config, a Hugging Face model's class and config,
    or nothing (``{"kind": "module"}``: emit and run then need a builder, ``"pkg.module:function"``)."""
    from .runtime import source as sources

    cfg = getattr(model, "config", None)
    if isinstance(cfg, zoo.ModelConfig):
        return {"kind": "zoo", "config": cfg.to_dict()}
    if sources.is_hf(model):
        return {"kind": "hf", "class": type(model).__name__, "config": sources.hf_config_dict(cfg)}
    return {"kind": "module"}


_MAX_SEQ_NAMES = ("max_seq_len", "max_position_embeddings", "n_positions", "block_size")


def model_config(module: torch.nn.Module, graph: ir.Graph, seq_len: int) -> dict[str, Any]:
    """The model's sizes as the plan records them (``plan.model``): a zoo model's config, else the traced
    dimensions, with the family being the kind of block the cost model prices (gpt, llama or moe)."""
    cfg = getattr(module, "config", None)
    if isinstance(cfg, zoo.ModelConfig):
        return cfg.to_dict()
    d = graph.dims
    max_seq = next((v for n in _MAX_SEQ_NAMES if isinstance(v := getattr(cfg, n, None), int) and v > 0), None)
    name = getattr(cfg, "name_or_path", "") or type(module).__name__
    out = {"family": d.family, "layers": d.layers, "hidden": d.hidden, "heads": d.heads, "kv_heads": d.kv_heads,
           "ffn_hidden": d.ffn_hidden, "vocab": d.vocab, "max_seq_len": max_seq or seq_len, "name": str(name)}
    if d.experts:
        out.update(experts=d.experts, top_k=d.top_k)
    return out


def cp_blockers(module: torch.nn.Module, graph: ir.Graph, seq_len: int) -> tuple[str, ...]:
    """Why the runtime cannot run context parallelism on this model (not the zoo's), in words; () when
    it can. ``runtime.context.ContextParallelSDPA`` takes over the SDPA its attention calls and hands
    the model the tokens' global ``position_ids``; a sliding window must span the whole sequence."""
    from .codegen.context import cp_blockers as structure_blockers
    from .runtime.context import sliding_window

    s = graph.structure
    if s is None:
        return ("no structure was found in the model",)
    why = list(structure_blockers(s))
    if not why:
        attn = f"{s.block_path(0)}.{s.attn}"
        ops = {n.target for n in graph.nodes if n.module_path == attn or n.module_path.startswith(attn + ".")}
        if "aten.scaled_dot_product_attention.default" not in ops:
            why.append(f"the attention module {attn!r} calls no scaled_dot_product_attention (Hugging Face: build "
                       "it with attn_implementation=\"sdpa\"), where the runtime gathers K and V over cp")
    try:
        takes_positions = "position_ids" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        takes_positions = False
    if not takes_positions:
        why.append(f"{type(module).__name__}.forward takes no position_ids, by which the runtime gives each "
                   "rank's tokens their places in the whole sequence")
    window = sliding_window(module)
    if window is not None and window < seq_len:
        why.append(f"its sliding-window attention ({window} tokens) is shorter than the sequence ({seq_len}); the "
                   "runtime masks causally only")
    return tuple(why)


def ep_blockers(module: torch.nn.Module, structure: ir.ModelStructure | None) -> tuple[str, ...]:
    """Why the runtime cannot split this model's experts over ep ranks (``runtime.expert.ep_blocker`` of the
    first block that holds experts), in words; () when it can or the model has none."""
    from .runtime.expert import ep_blocker

    if structure is None or not structure.experts or not structure.num_blocks:
        return ()
    first = next((i for i in range(structure.num_blocks) if i not in structure.dense_blocks), None)
    if first is None:
        return ()
    try:
        experts = module.get_submodule(f"{structure.block_path(first)}.{structure.experts}")
    except AttributeError:
        return ()
    why = ep_blocker(experts)
    return (why,) if why else ()


def offered(structure: ir.ModelStructure | None, zoo_modules: bool,
            cp_why: tuple[str, ...] = ("no structure was found in the model",), ep_why: tuple[str, ...] = ()
            ) -> tuple[frozenset[str], tuple[str, ...]]:
    """What the runtime executes on this model (``solver.RUNTIME`` less what its modules rule out), and
    why the rest is not offered, in words for the report. ``cp_why``: ``cp_blockers``' reasons; ``ep_why``:
    ``ep_blockers``'."""
    from .codegen.pipeline_lower import pipeline_blockers
    from .codegen.tp_plans import attention_returns_tuple, sp_blockers

    runtime, why = set(solver.RUNTIME), []
    if zoo_modules:
        return frozenset(runtime), ()
    if cp_why:
        runtime -= {"cp"}
        why.append(f"context parallelism is not offered: {'; '.join(cp_why)}")
    if ep_why:
        runtime -= {"ep"}
        why.append(f"expert parallelism is not offered: {'; '.join(ep_why)}")
    if blocker := (pipeline_blockers(structure) if structure is not None else "no structure was found in the model"):
        runtime -= {"pp"}
        why.append(f"pipeline parallelism is not offered: {blocker}")
    if structure is not None and (blockers := sp_blockers(structure)):
        runtime -= {"sp"}
        why.append(f"sequence parallelism is not offered: {'; '.join(blockers)}")
    elif structure is not None and attention_returns_tuple(structure):
        runtime -= {"sp_whole_attn"}  # kept whole under sp, its tuple output could not be cut (solver/space.py)
    if structure is None or not structure.num_blocks:
        runtime -= {"tp", "tp_replicate", "moe_tp"}
        why.append("tensor parallelism is not offered: no repeated blocks (a ModuleList or ModuleDict of alike "
                   "layers) were found")
    return frozenset(runtime), tuple(why)


def plans(model: ModelLike, cluster: Cluster | str, *, global_batch: int, seq_len: int,
          fixed: dict[str, Any] | None = None, dtype: str | None = None, time_limit_s: float = 30.0, top: int = 5,
          progress: Callable[[str], None] | None = None, model_kwargs: dict[str, Any] | None = None,
          example_inputs: Any = None, software: str | Software | None = None) -> tuple[Plan, ...]:
    """The best plan and up to ``top - 1`` runners-up. ``model``: an ``nn.Module`` (build it under
    ``torch.device("meta")``), a zoo name, a zoo config dict, or a builder ``"pkg.module:function"``
    (called with ``model_kwargs``). ``example_inputs``: for a model whose input is not token ids.
    ``software``: cost every candidate as that program runs it (a ``cost_model.software`` preset, e.g.
    ``"megatron-core-2024"``), so that its user gets its best plan (``meshplan export --to megatron``
    carries it there); default meshplan's own runtime, which emit, run and apply execute."""
    from .codegen.structure import zoo_family

    program = _software(software, dtype)
    cluster = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    ir.limits.check_sizes(global_batch=global_batch, seq_len=seq_len, world=cluster.world_size,
                          layers=1)  # ir/limits.py; a zoo config's layers are bounded by its own check
    module, source = model_and_source(model, model_kwargs)
    graph = _traced(module, source, seq_len=min(seq_len, 64), example_inputs=example_inputs)
    if not graph.dims.layers:
        if program.name != DEFAULT_SOFTWARE.name:
            raise ir.PlanError(f"--software {program.name}: the framework presets price transformer blocks and this "
                               "model has none; plan it for meshplan's runtime (no --software)")
        return _blockless_plans(module, graph, source, cluster, global_batch=global_batch, seq_len=seq_len,
                                fixed=fixed, dtype=dtype, time_limit_s=time_limit_s, top=top)
    config = model_config(module, graph, seq_len)
    if seq_len > config["max_seq_len"]:
        raise ir.PlanError(f"seq_len {seq_len} exceeds the model's max_seq_len {config['max_seq_len']}")
    structure = graph.structure
    zoo_modules = structure is not None and zoo_family(structure) is not None and source["kind"] == "zoo"
    peaks = cluster.accelerator.peak_flops
    dtype = dtype or ("bfloat16" if "bfloat16" in peaks else "float32")
    runtime, why_not = offered(structure, zoo_modules, () if zoo_modules else cp_blockers(module, graph, seq_len),
                               () if zoo_modules else ep_blockers(module, structure))
    _check_pins_offered(fixed, runtime, why_not)
    if program.search_space == "megatron":  # Megatron runs the plan: its options, not meshplan runtime's
        runtime, why_not = solver.space.MEGATRON, (
            f"costed as {program.name}: the search offers what Megatron-Core runs (the distributed optimizer "
            "as ZeRO-1, Megatron-FSDP as ZeRO-3, 1F1B and interleaved schedules; no ZeRO-2, HSDP, GPipe or "
            "zero-bubble)",)
    req = solver.Request(graph=graph, cluster=cluster, model=config, global_batch=global_batch, seq_len=seq_len,
                         dtype=dtype, fixed=fixed, time_limit_s=time_limit_s, top=top, runtime=runtime,
                         software=program)
    # fused kernels swap module classes (codegen.fused): the zoo's for every chain the fusion pass finds, a
    # user's own for swiglu where each block's MLP is exactly that chain (the structure's notes say which)
    from .codegen.fused import user_fusions
    fusions, structure = ((fusion_names(find_fusions(graph)), structure) if zoo_modules
                          else user_fusions(graph, structure))
    if structure is not None:
        structure = replace(structure, notes=structure.notes + why_not + _flops_note(graph))
    found = {"source": source, "structure": structure.to_dict() if structure is not None else {}}
    return tuple(as_api_plan(_with_fusions(replace(p, **found), fusions, graph, cluster))
                 for p in solver.solve(req, progress=progress))


# The graph of each module planned so far, with what it was traced from: planning one model on several
# clusters, or under several pins, traces it once. Weak keys: a module the caller drops is forgotten.
_TRACED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, ir.Graph]] = weakref.WeakKeyDictionary()


def _traced(module: torch.nn.Module, source: dict[str, Any], *, seq_len: int, example_inputs: Any) -> ir.Graph:
    """``trace(module)``, or the graph traced before from this very module while its source (the zoo or
    Hugging Face config), its submodules and its parameters' names, shapes and dtypes are as they were
    then. A model given its own example inputs is always traced again."""
    if example_inputs is not None:
        return trace(module, batch=1, seq_len=seq_len, example_inputs=example_inputs)
    key = (seq_len, json.dumps(source, sort_keys=True, default=str),
           tuple((name, type(m)) for name, m in module.named_modules()),
           tuple((name, tuple(p.shape), p.dtype) for name, p in module.named_parameters()))
    seen = _TRACED.get(module)
    if seen is not None and seen[0] == key:
        return seen[1]
    graph = trace(module, batch=1, seq_len=seq_len)
    _TRACED[module] = (key, graph)
    return graph


def _flops_note(graph: ir.Graph) -> tuple[str, ...]:
    """A note for the report where the blocks' FLOPs are the traced graph's, not the family formula's."""
    from .cost_model.summary import summary_of

    d = summary_of(graph).dims
    if (d.matmul_scale, d.core_scale) == (1.0, 1.0):
        return ()
    return (f"cost: the {d.family} formula's block shapes miss this model's (e.g. latent attention, shared "
            f"experts); each block is costed at the traced graph's FLOPs: weight matmuls x{d.matmul_scale:.2f} and "
            f"attention core x{d.core_scale:.2f} the formula's (activation and parameter memory still follow the "
            "formula's shapes)",)


def _software(software: str | Software | None, dtype: str | None) -> Software:
    """The program to cost plans for, refusing a dtype it cannot train in: float8 and float4 are priced for
    programs that run FP8 or NVFP4 GEMMs (Transformer Engine under Megatron), never for meshplan's runtime."""
    program = software_named(software) if isinstance(software, str) else (software or DEFAULT_SOFTWARE)
    if dtype == "float8" and program.name == DEFAULT_SOFTWARE.name:
        raise ir.PlanError("dtype float8: meshplan's runtime trains in bfloat16 or float32; FP8 is priced for "
                           "Megatron-Core's Transformer Engine program: add --software megatron-core-2024 "
                           "(or megatron-core-perf-recipes) and export the plan with `meshplan export --to megatron`")
    if dtype == "float4" and program.name == DEFAULT_SOFTWARE.name:
        raise ir.PlanError("dtype float4: meshplan's runtime trains in bfloat16 or float32; NVFP4 is priced for "
                           "Megatron-Core's Transformer Engine program on Blackwell: add --software "
                           "megatron-core-perf-recipes and export the plan with `meshplan export --to megatron`")
    return program


_PINNED_PARALLELISM = {"pp": "pipeline parallelism", "cp": "context parallelism", "sp": "sequence parallelism",
                       "tp": "tensor parallelism", "ep": "expert parallelism"}


def _check_pins_offered(fixed: dict[str, Any] | None, runtime: frozenset[str], why_not: tuple[str, ...]) -> None:
    """A pin asking for a parallelism this model's own modules rule out (``offered``) is refused with the model's
    reason (no blocks and pp, OPT's positions and cp), not the search's "the runtime cannot execute pp yet"."""
    for key, words in _PINNED_PARALLELISM.items():
        value = (fixed or {}).get(key)
        if value is None or value is False or (value == 1 and not isinstance(value, bool)) or key in runtime:
            continue
        reason = next((w for w in why_not if w.startswith(f"{words} is not offered")), "")
        if reason:
            raise ir.PlanError(f"fixed: {key}={value!r}, but {reason}; leave {key} unset")


def _blockless_plans(module: torch.nn.Module, graph: ir.Graph, source: dict[str, Any], cluster: Cluster, *,
                     global_batch: int, seq_len: int, fixed: dict[str, Any] | None, dtype: str | None,
                     time_limit_s: float, top: int) -> tuple[Plan, ...]:
    """A model without repeated blocks: data parallelism and ZeRO, priced node by node from its graph
    (``solver.blockless``, ``cost_model.graph_cost``); the report says why nothing else is offered.
    ``plan.model`` records the name, the family "custom", the parameter count and the sequence length:
    the transformer sizes the frontend guessed (hidden, heads, vocab) mean nothing here."""
    from .solver.blockless import solve_blockless

    cfg = getattr(module, "config", None)
    config = {"family": graph.dims.family, "name": str(getattr(cfg, "name_or_path", "") or type(module).__name__),
              "params": graph.param_count, "max_seq_len": seq_len}
    runtime, why_not = offered(graph.structure, zoo_modules=False)
    dtype = dtype or ("bfloat16" if "bfloat16" in cluster.accelerator.peak_flops else "float32")
    req = solver.Request(graph=graph, cluster=cluster, model=config, global_batch=global_batch, seq_len=seq_len,
                         dtype=dtype, fixed=fixed, time_limit_s=time_limit_s, top=top, runtime=runtime)
    structure = graph.structure or ir.ModelStructure()
    found = {"source": source, "structure": replace(structure, notes=structure.notes + why_not).to_dict()}
    return tuple(as_api_plan(replace(p, **found)) for p in solve_blockless(req, why_not))


def _with_fusions(plan: ir.Plan, found: tuple[str, ...], graph: ir.Graph, cluster: Cluster) -> ir.Plan:
    """``plan`` recording the fusions of ``found`` that the cost model says save time in its program,
    its prediction counting them; the unfused program (``--no-fuse``) becomes an alternative."""
    if cluster.cpu_ranks or plan.software != DEFAULT_SOFTWARE.name:
        return plan  # CPU ranks: Triton compiles for GPUs; another framework's program: not meshplan's kernels
    chosen = worthwhile(found, plan.model["family"], tp=plan.mesh.tp, sp=plan.sequence_parallel)
    if not chosen or plan.prediction is None:
        return replace(plan, fusions=chosen)
    fused = replace(plan, fusions=chosen)
    pred, unfused = estimate(graph, cluster, fused), plan.prediction
    saved_ms = (unfused.step_time_s - pred.step_time_s) * 1e3
    alt = {"summary": f"{plan.summary()}, unfused", "step_time_s": unfused.step_time_s, "fuse": False,
           "peak_memory_bytes": unfused.peak_memory_bytes,
           "why": f"with --no-fuse (eager ops): the fused kernels {', '.join(chosen)} save "
                  f"{saved_ms:.2f} ms/step of memory traffic"}
    info = plan.solver and replace(plan.solver, alternatives=(alt, *plan.solver.alternatives))
    return replace(fused, prediction=pred, solver=info)


def autoparallelize(model: ModelLike, cluster: Cluster | str, *, global_batch: int, seq_len: int,
                    fixed: dict[str, Any] | None = None, dtype: str | None = None, time_limit_s: float = 30.0,
                    progress: Callable[[str], None] | None = None, model_kwargs: dict[str, Any] | None = None,
                    example_inputs: Any = None, software: str | Software | None = None) -> Plan:
    """Plan ``model`` on ``cluster``. ``fixed`` pins choices, e.g. ``{"tp": 2, "zero": 3}``; with every
    choice pinned it evaluates that plan. ``model``, ``example_inputs`` and ``software`` as in ``plans``."""
    return plans(model, cluster, global_batch=global_batch, seq_len=seq_len, fixed=fixed, dtype=dtype,
                 time_limit_s=time_limit_s, progress=progress, model_kwargs=model_kwargs,
                 example_inputs=example_inputs, software=software)[0]


def load(path: str | Path) -> Plan:
    return Plan.load(path)
