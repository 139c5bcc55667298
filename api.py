"""The user's entry points: ``autoparallelize`` runs the stages in order (trace, cost, solve) and
returns a ``Plan`` that can be reported, saved, emitted as a program, or applied to a model."""
from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable

import torch

from . import ir, solver, zoo
from .codegen.fusion import find_fusions, fusion_names
from .cost_model import Cluster, estimate, parse_cluster, worthwhile
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

    def apply(self, model: torch.nn.Module, *, optimizer: Callable | None = None, fuse: bool | None = None) -> Any:
        """Shard ``model`` in place as the plan says (inside torchrun); returns a ``PlannedModule``.
        ``fuse``: run the plan's fusions as generated Triton kernels; by default (None) when the plan
        records fusions and a GPU is there to compile them (on CPU they would run in Triton's
        interpreter: ask for it with ``fuse=True`` and ``TRITON_INTERPRET=1``)."""
        from .runtime import apply

        if fuse is None:
            fuse = bool(self.fusions) and torch.cuda.is_available()
        return apply(self, model, optimizer=optimizer, fuse=fuse)


def as_api_plan(plan: ir.Plan) -> Plan:
    return Plan(**{f.name: getattr(plan, f.name) for f in fields(plan)})


def model_config(model: torch.nn.Module | str | dict) -> dict[str, Any]:
    if isinstance(model, str):
        return zoo.config(model).to_dict()
    if isinstance(model, dict):
        return zoo.ModelConfig.from_dict(model).to_dict()
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, zoo.ModelConfig):
        raise ir.UnsupportedModelError(
            f"{type(model).__name__} has no zoo config (a .config ModelConfig); meshplan plans zoo models and "
            "models that carry one: build with meshplan.zoo.build(...) or build_from_config({...})")
    return cfg.to_dict()


def _as_module(model: torch.nn.Module | str | dict) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    with torch.device("meta"):
        return zoo.build(model) if isinstance(model, str) else zoo.build_from_config(model)


def plans(model: torch.nn.Module | str | dict, cluster: Cluster | str, *, global_batch: int, seq_len: int,
          fixed: dict[str, Any] | None = None, dtype: str | None = None, time_limit_s: float = 30.0, top: int = 5,
          progress: Callable[[str], None] | None = None) -> tuple[Plan, ...]:
    """The best plan and up to ``top - 1`` runners-up."""
    cluster = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    for name, value in (("global_batch", global_batch), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ir.PlanError(f"{name} must be a positive integer, got {value!r}")
    config = model_config(model)
    if seq_len > config["max_seq_len"]:
        raise ir.PlanError(f"seq_len {seq_len} exceeds the model's max_seq_len {config['max_seq_len']}")
    graph = trace(_as_module(model), batch=1, seq_len=min(seq_len, 64))
    peaks = cluster.accelerator.peak_flops
    dtype = dtype or ("bfloat16" if "bfloat16" in peaks else "float32")
    req = solver.Request(graph=graph, cluster=cluster, model=config, global_batch=global_batch, seq_len=seq_len,
                         dtype=dtype, fixed=fixed, time_limit_s=time_limit_s, top=top)
    fusions = fusion_names(find_fusions(graph))  # the chains whose fused kernel moves fewer bytes
    return tuple(as_api_plan(_with_fusions(p, fusions, graph, cluster)) for p in solver.solve(req, progress=progress))


def _with_fusions(plan: ir.Plan, found: tuple[str, ...], graph: ir.Graph, cluster: Cluster) -> ir.Plan:
    """``plan`` recording the fusions of ``found`` that the cost model says save time in its program,
    its prediction counting them; the unfused program (``--no-fuse``) becomes an alternative."""
    if cluster.cpu_ranks:
        return plan  # CPU ranks: Triton compiles for GPUs (on CPU only its interpreter runs the kernels)
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


def autoparallelize(model: torch.nn.Module | str | dict, cluster: Cluster | str, *, global_batch: int, seq_len: int,
                    fixed: dict[str, Any] | None = None, dtype: str | None = None, time_limit_s: float = 30.0,
                    progress: Callable[[str], None] | None = None) -> Plan:
    """Plan ``model`` on ``cluster``. ``fixed`` pins choices, e.g. ``{"tp": 2, "zero": 3}``; with every
    choice pinned it evaluates that plan."""
    return plans(model, cluster, global_batch=global_batch, seq_len=seq_len, fixed=fixed, dtype=dtype,
                 time_limit_s=time_limit_s, progress=progress)[0]


def load(path: str | Path) -> Plan:
    return Plan.load(path)
