"""Lowering expert parallelism (mesh.ep > 1, MoE models), and how its steps print.

    BuildMesh                          ("dp", dp) [("dp_shard", 1)] [("tp", tp)]   as without ep
    ExpertMesh                         ("edp", dp/ep) ("ep", ep) [("dp_shard", 1)] [("tp", tp)]
    ExpertParallel(layers.i.mlp.experts)   after tensor parallelism, before recompute
    FullyShard(layers.i.mlp.experts)   over ("edp", "dp_shard") (zero 0) or "edp" (zero 2/3), before
                                       the blocks' FullyShard over dp, which then skips the experts

The mesh is Megatron-Core's: ep is folded inside dp (``ir.Mesh``: ep divides dp * cp), ep innermost,
so dp rank ``d = edp_rank * ep + ep_rank``; the expert mesh is the same rank tensor reshaped.
Non-expert parameters stay data-parallel over all of dp; an expert shard is replicated only over
edp (the ranks holding the same experts): "expert data parallelism". torchtitan builds the same
pair of meshes (``dp_shard_mod_ep`` x ``dp_shard_in_ep``) and orders the steps the same way
(``apply_moe_ep_tp`` before ``apply_ac`` before ``apply_fsdp``, experts sharded before their block).

Plain DP (zero 0) becomes HSDP with a shard group of 1 for both meshes (DDP semantics; DDP over the
root would all-reduce the expert shards over all of dp). Under context parallelism an ep group is the
ep ranks of one cp rank (its tokens are that cp rank's share of each sequence), and an expert shard is
data-parallel over edp x cp, flattened on the expert mesh (``FlattenMesh(edp, cp -> edp_cp)``), as the
rest of the model is over dp x cp. Why the gradients come out right, and the dispatch itself:
``meshplan.runtime.expert``.
"""
from __future__ import annotations

from typing import Any

from ..ir import InvalidPlanError, ModelStructure, Plan
from . import safe
from .program import EXPERT_AXES, ExpertMesh, ExpertParallel, FlattenMesh, FullyShard, Step

# under context parallelism an expert shard's replicas are its edp ranks times the cp ranks (each sees other tokens),
# flattened into one axis of the expert mesh that FSDP averages its gradients over
EXPERT_DATA_AXIS = "edp_cp"

# the stacked experts of a MoE block are at ``structure.experts`` in each block but ``structure.dense_blocks``
# (DeepSeek-V3's leading dense layers): the zoo's ``mlp.experts`` (w1, w3: (E, h, f); w2: (E, f, h)), Hugging
# Face Mixtral's and DeepSeek-V3's ``mlp.experts`` (gate_up_proj, down_proj)


def check_expert_parallel(plan: Plan, cfg: dict[str, Any]) -> None:
    """Raise for expert-parallel plans the runtime cannot execute, with the numbers."""
    m, experts = plan.mesh, int(plan.model.get("experts") or 0)
    if not cfg["structure"].experts or experts < 2:
        raise InvalidPlanError(f"expert parallelism (ep={m.ep}) needs a MoE model, but plan.model is family "
                               f"{cfg['family']!r} with {experts} experts; plan with ep=1")
    if experts % m.ep:
        raise InvalidPlanError(f"expert parallelism splits the experts over ep ranks, but experts({experts}) "
                               f"does not divide by ep({m.ep}); use an ep that divides {experts}")
    if m.fold_ep:
        raise InvalidPlanError(f"mesh.fold_ep puts each expert whole on the ranks of an ep({m.ep}) group over tp "
                               f"({m.tp}) x dp ranks (Megatron-Core's --expert-tensor-parallel-size 1, which "
                               "`meshplan export --to megatron` writes), but the runtime splits the experts over tp "
                               "as the dense MLP is; set fold_ep to false to run it here")
    if m.dp % m.ep:
        folded = (" (it takes tp ranks too: Megatron-Core's MoE folding, which `meshplan export --to megatron` "
                  "writes)" if m.ep_over_tp else "")
        raise InvalidPlanError(f"the runtime folds ep inside dp (not dp x cp, as Megatron-Core may), but "
                               f"ep({m.ep}) does not divide dp({m.dp}){folded}; use an ep that divides {m.dp}")
    if plan.zero_stage == 1:
        raise InvalidPlanError(f"zero_stage 1 with ep({m.ep}) > 1 is not supported by the runtime yet "
                               "(ZeroRedundancyOptimizer under DDP would mix the expert shards of all dp ranks); "
                               "use zero_stage 0, 2 or 3")


def hsdp_for_plain_dp(plan: Plan) -> bool:
    """Plain DP beside expert parallelism is HSDP with a shard group of 1 (see the module docstring)."""
    return plan.mesh.ep > 1 and plan.zero_stage == 0


def expert_parallel(plan: Plan, mesh_dims: tuple[tuple[str, int], ...], s: ModelStructure) -> list[Step]:
    """The expert mesh, then each block's experts sharded over ep."""
    ep, dp = plan.mesh.ep, plan.mesh.dp
    dims: list[tuple[str, int]] = []
    for name, size in mesh_dims:
        dims += [("edp", dp // ep), ("ep", ep)] if name == "dp" else [(name, size)]
    steps: list[Step] = [ExpertMesh(dims=tuple(dims))]
    if plan.mesh.cp > 1:  # the cp ranks of an expert shard see other tokens: its replicas are edp x cp
        steps.append(FlattenMesh(axes=("edp", "cp"), name=EXPERT_DATA_AXIS))
    num_experts = int(plan.model["experts"])
    steps += [ExpertParallel(module=f"{s.block_path(i)}.{s.experts}", num_experts=num_experts, ep_size=ep)
              for i in s.expert_blocks()]
    return steps


def expert_data_parallel(plan: Plan, s: ModelStructure) -> list[Step]:
    """FSDP of each block's expert shard over edp: HSDP-as-DDP (zero 0) or ZeRO-2/3 over edp."""
    zero, edp = plan.zero_stage, EXPERT_DATA_AXIS if plan.mesh.cp > 1 else "edp"
    axes = (edp, "dp_shard") if zero == 0 else (edp,)
    return [FullyShard(module=f"{s.block_path(i)}.{s.experts}", mesh_axes=axes, reshard_after_forward=zero == 3)
            for i in s.expert_blocks()]


def on_expert_mesh(axes: tuple[str, ...]) -> bool:
    """Whether mesh axes name the expert mesh (``expert_mesh`` in a script) rather than BuildMesh's."""
    return any(axis in EXPERT_AXES or axis == EXPERT_DATA_AXIS for axis in axes)


# ---- printing (codegen.emit.EMITTERS) ---------------------------------------------------------

def expert_mesh_lines(step: ExpertMesh, target: str) -> tuple[str, list[str]]:
    sizes = ", ".join(str(safe.integer(n, f"ExpertMesh size of {a!r}")) for a, n in step.dims)
    names = ", ".join(f'"{safe.name(a, "ExpertMesh axis")}"' for a, _ in step.dims)
    return "parallelize", [f"expert_mesh = DeviceMesh(mesh.device_type, mesh.mesh.reshape({sizes}), "
                           f"mesh_dim_names=({names}))"]


def expert_parallel_lines(step: ExpertParallel, target: str) -> tuple[str, list[str]]:
    return "parallelize", [f'shard_experts({target}, expert_mesh["{safe.name(step.mesh_axis, "ExpertParallel.mesh_axis")}"])']


def comment(step: Step) -> str | None:
    """The comment above an expert-parallel step (lines joined by newlines), or None for other steps."""
    if isinstance(step, ExpertMesh):
        edp, ep = (safe.integer(dict(step.dims)[a], f"ExpertMesh size of {a!r}") for a in ("edp", "ep"))
        split = safe.name(step.split_axis, "ExpertMesh.split_axis")
        return (f"# the experts' view of the same ranks: {split} split into edp({edp}) x ep({ep}), ep "
                "innermost (Megatron-Core):\n# an ep group shares its tokens among its experts, an edp group "
                "holds replicas of the same experts")
    if isinstance(step, ExpertParallel):
        experts = safe.integer(step.num_experts, "ExpertParallel.num_experts")
        per_rank = experts // safe.integer(step.ep_size, "ExpertParallel.ep_size")
        return (f"# expert parallelism over ep: each rank keeps {per_rank} of the "
                f"{experts} experts of every MoE block, and token slots\n# reach them by "
                "all_to_all_single (PyTorch has no ready-made MoE dispatch: meshplan.runtime.expert has it)")
    if isinstance(step, FullyShard) and on_expert_mesh(step.mesh_axes):
        how = ("as HSDP with a shard group of 1" if len(step.mesh_axes) == 2
               else f"as ZeRO-{3 if step.reshard_after_forward else 2} over edp")
        return (f"# expert data parallelism: each expert shard is data-parallel over edp only, {how}\n"
                "# (the dispatch makes their gradient the ep group's mean, so the edp average is the global mean)")
    return None
