"""The plan: how the work is split over the GPUs, what that is predicted to cost, and how the
solver got there. A frozen value that round-trips through JSON (schema ``meshplan.plan/1``);
loading validates every field and never executes code.

Mesh axes are ``pp, dp, cp, tp, ep``. The world is ``pp * dp * cp * tp`` ranks; ``ep`` is folded
inside them as in Megatron-Core (experts are sharded over a subgroup of the ranks that hold the same
dense layers' shards). It takes its ranks from ``dp * cp`` when it divides that, the experts split over
tp as the dense MLP is; otherwise (``Mesh.ep_over_tp``) from ``tp * dp * cp``, each expert whole on its
ranks and the tp ranks' tokens routed apart: Megatron-Core's MoE parallel folding with
``--expert-tensor-parallel-size 1`` (Liu et al. 2025, arXiv:2504.14960), as NVIDIA runs Qwen3-235B on
H100 (tp 2, ep 32 on 256 GPUs). So ``ep`` must divide ``tp * dp * cp``. ``Mesh.fold_ep`` asks for that folding
where ``ep`` divides ``dp * cp`` too: NVIDIA's MoE model zoo sets ``--expert-tensor-parallel-size 1`` for every
Qwen3-235B layout, e.g. tp 2 with ep 8 over one node's tp 2 x dp 4 ranks (yanring/Megatron-MoE-ModelZoo
best_practice/qwen3).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from .errors import InvalidPlanError
from .readfile import parse_json, read_json_file

SCHEMA = "meshplan.plan/1"
AXES = ("pp", "dp", "cp", "tp", "ep")


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE = "zero-bubble"


class Recompute(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # the attention core (Korthikanti et al. 2022, sec. 5)
    FULL = "full"  # the whole layer: keep only its input
    # keep what NONE keeps, in host memory: copied out as the forward saves it and back for the backward
    # (torch.autograd.graph.save_on_cpu; Megatron-Core --cpu-offloading-num-layers)
    OFFLOAD = "offload"


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1
    # the ep group takes tp ranks even where ep divides dp * cp: each expert whole on its ranks (Megatron-Core's
    # --expert-tensor-parallel-size 1; ``ep_over_tp``); written to a plan file only when set
    fold_ep: bool = False

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise InvalidPlanError(f"mesh.{axis} must be a positive integer, got {size!r}")
        if (self.tp * self.dp * self.cp) % self.ep:
            raise InvalidPlanError(
                f"ep({self.ep}) must divide tp({self.tp}) * dp({self.dp}) * cp({self.cp}) = "
                f"{self.tp * self.dp * self.cp}: experts are sharded over a subgroup of the ranks of one "
                "pipeline stage")
        if not isinstance(self.fold_ep, bool):
            raise InvalidPlanError(f"mesh.fold_ep must be true or false, got {self.fold_ep!r}")
        if self.fold_ep and (self.tp == 1 or self.ep == 1):
            raise InvalidPlanError(
                f"mesh.fold_ep folds the expert-parallel group over tp ranks, but tp({self.tp}) and ep({self.ep}) "
                "must both be > 1 for that; set fold_ep to false")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def ep_over_tp(self) -> bool:
        """Whether the expert-parallel group takes tp ranks too (``ep`` does not divide ``dp * cp``, or
        ``fold_ep``): each expert whole on its ranks, every tp rank routing its own tokens (Megatron-Core's MoE
        folding with expert tensor parallelism 1; module docstring)."""
        return self.fold_ep or (self.dp * self.cp) % self.ep != 0

    @property
    def expert_replicas(self) -> int:
        """Ranks of one pipeline stage holding the same experts: ``dp * cp / ep``, or ``tp * dp * cp / ep``
        when the experts fold over tp (``ep_over_tp``)."""
        return (self.tp if self.ep_over_tp else 1) * self.dp * self.cp // self.ep

    def __str__(self) -> str:
        parts = [f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1]
        return (" x ".join(parts) if parts else "single GPU") + (" (ep over tp)" if self.fold_ep else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: float  # the largest over GPUs
    memory_bytes: dict[str, float]  # params, grads, optimizer, activations, buffers
    time_s: dict[str, float]  # compute, exposed_comm, bubble; unpriced on a calibrated accelerator
    memory_limit_bytes: float = 0.0
    comm_bytes: dict[str, float] = field(default_factory=dict)  # per collective family, per GPU per step
    # of time_s["compute"]: the fused attention core's seconds (forward, backward, recomputed), which the calibration
    # leaves out (cost_model.estimate.calibrated)
    attention_s: float = 0.0

    def __post_init__(self) -> None:
        for key in ("params", "grads", "optimizer", "activations", "buffers"):
            if key not in self.memory_bytes:
                raise InvalidPlanError(f"prediction.memory_bytes lacks {key!r}")
        for key in ("compute", "exposed_comm", "bubble"):
            if key not in self.time_s:
                raise InvalidPlanError(f"prediction.time_s lacks {key!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverInfo:
    status: str  # OPTIMAL, FEASIBLE, EVALUATED (everything pinned), ...
    wall_s: float
    gap: float  # relative optimality gap, 0.0 when proven optimal
    candidates: int = 0  # strategies considered
    pruned: int = 0  # of them, rejected before the solve (memory, divisibility)
    variables: int = 0
    constraints: int = 0
    binding: str = ""  # the constraint that binds, in words
    alternatives: tuple[dict, ...] = ()  # runners-up: {"summary", "step_time_s", "peak_memory_bytes", "why"}
    intra_op: str = ""  # the per-op tp layout inside a block, in words (solver/intra_op.py)
    intra_op_variables: int = 0
    intra_op_constraints: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase of the search, in order


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: dict[str, Any]  # the zoo config (family, layers, hidden, ...) and its name if any
    cluster: str  # the cluster spec, e.g. "h100-sxm:8x8"
    global_batch: int
    seq_len: int
    mesh: Mesh
    zero_stage: int = 0
    zero_group: int = 0  # HSDP: shard ZeRO state over groups of this many dp ranks, replicate across; 0 = all of dp
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    num_microbatches: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    vp: int = 1  # virtual pipeline stages per rank (interleaved-1f1b)
    recompute: tuple[Recompute, ...] = ()  # one per layer
    stages: tuple[tuple[int, int], ...] = ()  # [first, last) layer per pipeline stage
    param_layouts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> placement per axis of AXES
    fusions: tuple[str, ...] = ()
    dtype: str = "bfloat16"
    # the program whose cost the prediction is (cost_model.software): "meshplan", the runtime that emit, run
    # and apply execute, or another framework's preset (plan --software; export --to carries the plan there)
    software: str = "meshplan"
    # where the model comes from, so that emit and run rebuild that very model: {"kind": "zoo", "name": ...},
    # {"kind": "hf", "config": {...}}, {"kind": "builder", "target": "pkg.mod:fn", "kwargs": {...}} or
    # {"kind": "module"} (a model only the caller holds: apply works, emit needs one of the others)
    source: dict[str, Any] = field(default_factory=dict)
    # the model's structure as the frontend found it (ir.structure.ModelStructure.to_dict): the block
    # container, and the module path of each role (attention projections, MLP, norms, embedding, head)
    structure: dict[str, Any] = field(default_factory=dict)
    prediction: Prediction | None = None
    solver: SolverInfo | None = None

    def __post_init__(self) -> None:
        _check(self)

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def layers(self) -> int:
        return len(self.recompute)

    def summary(self) -> str:
        counts = {r: self.recompute.count(r) for r in Recompute if r in self.recompute}
        rc = "none" if set(counts) <= {Recompute.NONE} else (
            next(iter(counts)) if len(counts) == 1 else ", ".join(f"{n} {r}" for r, n in counts.items()))
        return (f"{self.mesh}, zero-{self.zero_stage}"
                + (f" hsdp={self.zero_group}" if self.zero_group else "")
                + f"{', sp' if self.sequence_parallel else ''}, "
                f"micro-batch {self.micro_batch_size} x {self.num_microbatches}, recompute {rc}"
                + (f", {self.schedule}" + (f" vp={self.vp}" if self.vp > 1 else "") if self.mesh.pp > 1 else ""))

    # ---- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {"schema": SCHEMA}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mesh):  # fold_ep only where set, so that other plans' files stay as they were
                value = {k: v for k, v in asdict(value).items() if k != "fold_ep" or v}
            elif isinstance(value, (Prediction, SolverInfo)):
                value = asdict(value)
            elif f.name == "stages":
                value = [list(s) for s in value]
            elif f.name == "param_layouts":
                value = {k: list(v) for k, v in value.items()}
            elif isinstance(value, tuple):
                value = [str(v) if isinstance(v, StrEnum) else v for v in value]
            elif isinstance(value, StrEnum):
                value = str(value)
            data[f.name] = value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "plan") -> "Plan":
        from .plan_json import plan_kwargs_from_dict

        return cls(**plan_kwargs_from_dict(data, where=where))

    @classmethod
    def from_json(cls, text: str, *, where: str = "plan") -> "Plan":
        return cls.from_dict(parse_json(text, where=where, error=InvalidPlanError), where=where)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """The plan in the file ``path``: a regular file of UTF-8 JSON within the bounds of ``readfile``."""
        return cls.from_dict(read_json_file(path, what="plan file", error=InvalidPlanError), where=str(path))

    def with_prediction(self, prediction: Prediction, solver: SolverInfo | None = None) -> "Plan":
        return replace(self, prediction=prediction, solver=solver if solver is not None else self.solver)


def _check(plan: Plan) -> None:
    def bad(msg: str) -> None:
        raise InvalidPlanError(msg)

    for name in ("global_batch", "seq_len", "micro_batch_size", "num_microbatches", "vp"):
        value = getattr(plan, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            bad(f"{name} must be a positive integer, got {value!r}")
    if plan.zero_stage not in (0, 1, 2, 3):
        bad(f"zero_stage must be 0, 1, 2 or 3, got {plan.zero_stage!r}")
    zg = plan.zero_group
    if not isinstance(zg, int) or isinstance(zg, bool) or zg < 0:
        bad(f"zero_group must be a non-negative integer (0 = shard over all of dp), got {zg!r}")
    if zg:
        if plan.zero_stage not in (2, 3):
            bad(f"zero_group({zg}) needs zero_stage 2 or 3, got zero_stage({plan.zero_stage})")
        if not 1 < zg < plan.mesh.dp or plan.mesh.dp % zg:
            bad(f"zero_group({zg}) must be > 1, < dp({plan.mesh.dp}) and divide it: "
                f"dp({plan.mesh.dp}) % zero_group({zg}) = {plan.mesh.dp % zg}")
    object.__setattr__(plan, "schedule", Schedule(plan.schedule))
    if not all(type(r) is Recompute for r in plan.recompute):  # names from a plan file, or a list
        object.__setattr__(plan, "recompute", tuple(Recompute(r) for r in plan.recompute))
    elif type(plan.recompute) is not tuple:
        object.__setattr__(plan, "recompute", tuple(plan.recompute))
    m = plan.mesh
    per_step = plan.micro_batch_size * plan.num_microbatches * m.dp
    if per_step != plan.global_batch:
        bad(f"micro_batch_size({plan.micro_batch_size}) * num_microbatches({plan.num_microbatches}) * "
            f"dp({m.dp}) = {per_step} != global_batch({plan.global_batch})")
    if plan.sequence_parallel and m.tp == 1:
        bad("sequence_parallel needs tp > 1")
    if plan.seq_len % (m.cp * (m.tp if plan.sequence_parallel else 1)):
        bad(f"seq_len({plan.seq_len}) must divide by cp({m.cp})"
            + (f" * tp({m.tp})" if plan.sequence_parallel else ""))
    if plan.stages:
        if len(plan.stages) != m.pp * plan.vp:
            bad(f"{len(plan.stages)} stages given but pp({m.pp}) * vp({plan.vp}) = {m.pp * plan.vp}")
        expect = 0
        for c, (first, last) in enumerate(plan.stages):
            # only chunk 0 (the embedding alone) and the last chunk (the head alone) may hold no layer
            ends = c in (0, len(plan.stages) - 1) and len(plan.stages) > 1
            if first != expect or last < first or (last == first and not ends):
                bad(f"stages must cover the layers in order without gaps or empty stages (only the first and "
                    f"last may be empty: the embedding or the head alone); got {list(plan.stages)}")
            expect = last
        if plan.recompute and expect != len(plan.recompute):
            bad(f"stages cover {expect} layers but the model has {len(plan.recompute)}")
    elif m.pp > 1:
        bad(f"pp({m.pp}) > 1 needs stages")
    if plan.vp > 1 and plan.schedule != Schedule.INTERLEAVED_1F1B:
        bad(f"vp({plan.vp}) > 1 needs schedule 'interleaved-1f1b', got {str(plan.schedule)!r}")
    if plan.vp > 1 and m.pp == 1:
        bad(f"vp({plan.vp}) > 1 needs pp > 1 (virtual stages split each pipeline rank's layers), got pp(1); "
            "set vp to 1")
    for name, layout in plan.param_layouts.items():
        if len(layout) != len(AXES):
            bad(f"param_layouts[{name!r}] has {len(layout)} placements; expected one per axis {AXES}")
