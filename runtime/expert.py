"""Expert parallelism: each rank of an ep group keeps ``E / ep`` of a MoE block's experts, and token
slots travel to their expert and back with ``all_to_all_single`` (GShard, Lepikhin et al. 2020,
sec. 3.2; Megatron-Core's ``MoEAlltoAllTokenDispatcher``).

PyTorch has no ready-made MoE dispatch, so this module is it, written on public calls:
``dist.all_to_all_single`` with split sizes (gloo cannot do ``all_to_all`` with a list of uneven
tensors; split sizes work on gloo and NCCL) inside an autograd Function whose backward is the
reverse exchange. ``shard_experts`` applies it to a stacked-experts module (dim 0 is the expert),
keeping its parameter names, so the zoo's ``Experts.forward`` runs unchanged on the local experts.

The mesh (Megatron-Core): ep groups are sub-groups of the data-parallel ranks, ep innermost, so
dp ``d = edp_rank * ep + ep_rank``. Non-expert parameters are data-parallel over all dp ranks; an
expert shard is replicated only over "edp" (expert data parallel, the ``dp / ep`` ranks that hold
the same experts), and FSDP over the edp mesh averages its gradient there.

Gradient scale. Each rank's loss ``L_r`` is the mean over its own slice, and the global loss is
``L = (1/dp) sum_r L_r``. A non-expert gradient is ``dL_r/dw`` on rank ``r``; averaging over dp gives
``dL/dw``. An expert replica on rank (g, j) is reached by the tokens of all ``ep`` ranks of its ep
group g, so autograd gives it ``sum_{r in g} dL_r/dw``; the edp average of that would be
``ep`` times too large: ``(1/edp) sum_g sum_{r in g} = ep * dL/dw``. So the local experts run
between two gradient scalings: ``1/ep`` on their output (their weights get the gradient of their
ep group's *mean* loss, the role a local gradient plays for DP) and ``ep`` on their input (the
tokens' gradient is unchanged). FSDP's default averaging over edp then yields exactly ``dL/dw``.
(FSDP2's ``set_gradient_divide_factor(dp)`` would say the same, but in torch 2.13 it needs
``PREMUL_SUM``, which gloo lacks, or forced sum reductions, which divide twice on a one-rank group.)
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from ..codegen import ExpertMesh, ExpertParallel
from ..ir import InvalidPlanError

if TYPE_CHECKING:
    from .interpret import State

LocalExperts = Callable[[torch.Tensor, list[int]], torch.Tensor]
EXPERT_WEIGHTS = ("w1", "w3", "w2")  # the zoo's stacked SwiGLU experts: (E, h, f), (E, h, f), (E, f, h)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with split sizes; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: dist.ProcessGroup) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient is multiplied by ``factor``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def exchange_counts(counts: list[int], group: dist.ProcessGroup, device: torch.device) -> torch.Tensor:
    """``counts[e]``: this rank's token slots for global expert e. Returns ``(ep, E / ep)``: row s holds
    what rank s sends to each of this rank's local experts."""
    ep = group.size()
    send = torch.tensor(counts, dtype=torch.int64, device=device)  # (E,) = (ep dst ranks, E / ep) flat
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # equal splits of E / ep
    return recv.view(ep, len(counts) // ep).cpu()


def dispatch_combine(x: torch.Tensor, counts: list[int], group: dist.ProcessGroup,
                     local_experts: LocalExperts) -> torch.Tensor:
    """Run token slots through experts sharded over ``group`` and bring the results back.

    ``x``: (n, h) slots sorted by global expert, ``counts[e]`` of them for expert e (E = len(counts),
    rank j of the group holds experts ``[j * E/ep, (j+1) * E/ep)``). ``local_experts(x_l, counts_l)``
    computes this rank's experts on slots sorted by local expert. Returns (n, h) in ``x``'s order.
    """
    ep = group.size()
    if len(counts) % ep:
        raise InvalidPlanError(f"{len(counts)} experts do not split over ep({ep}) ranks; use an ep that "
                               f"divides {len(counts)}")
    recv_counts = exchange_counts(counts, group, x.device)  # (ep src ranks, E / ep local experts)
    in_splits = torch.tensor(counts).view(ep, -1).sum(1).tolist()  # slots to each rank
    out_splits = recv_counts.sum(1).tolist()  # slots from each rank
    received = _AllToAll.apply(x, out_splits, in_splits, group)  # (m, h) by (src rank, local expert)
    # regroup by local expert, sources in rank order within each expert (stable sort)
    local = torch.arange(recv_counts.shape[1]).repeat(ep).repeat_interleave(recv_counts.flatten())
    order = local.argsort(stable=True).to(x.device)
    slots = _ScaleGrad.apply(received[order], float(ep))
    out = _ScaleGrad.apply(local_experts(slots, recv_counts.sum(0).tolist()), 1.0 / ep)
    unsorted = out[order.argsort()]  # back to (src rank, local expert) order
    return _AllToAll.apply(unsorted, in_splits, out_splits, group)


class ExpertParallelMixin:
    """Mixed into a stacked-experts module by ``shard_experts``: its forward takes all E experts'
    token slots and dispatches them; the original forward runs on the local experts."""

    ep_group: dist.ProcessGroup

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return dispatch_combine(x, counts, self.ep_group, super().forward)  # type: ignore[misc]


class RoutedExpertParallelMixin(ExpertParallelMixin):
    """The same for experts called with the router's choice, ``forward(hidden_states, top_k_index,
    top_k_weights)`` (Hugging Face's Mixtral / Qwen-MoE experts: (n, h), (n, k), (n, k) -> (n, h)).

    The token slots are sorted by global expert and dispatched as above; on the receiving rank the
    original forward runs each slot through its local expert with index ``e - first local`` and weight
    1, and the router's weights are applied back home, where the slots are summed per token in expert
    order, as the original forward sums them."""

    num_experts_global: int

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,  # type: ignore[override]
                top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        order = flat.argsort(stable=True)  # token slots grouped by global expert
        counts = torch.bincount(flat, minlength=self.num_experts_global).tolist()
        token_of_slot = order // k
        base = super(ExpertParallelMixin, self).forward

        def local_experts(slots: torch.Tensor, local_counts: list[int]) -> torch.Tensor:
            ids = torch.repeat_interleave(torch.arange(len(local_counts)), torch.tensor(local_counts)).to(slots.device)
            return base(slots, ids[:, None], torch.ones(len(ids), 1, dtype=slots.dtype, device=slots.device))

        out_sorted = dispatch_combine(hidden_states[token_of_slot], counts, self.ep_group, local_experts)
        weights = top_k_weights.reshape(-1)[order, None].to(out_sorted.dtype)
        out = torch.zeros_like(hidden_states)
        out.index_add_(0, token_of_slot, out_sorted * weights)
        return out


_CLASSES: dict[type, type] = {}


def _forward_params(cls: type) -> list[str]:
    return [p.name for p in inspect.signature(cls.forward).parameters.values() if p.name != "self"]


def _routed(cls: type) -> bool:
    """The experts' forward takes the router's choice (three tensors) rather than sorted slots and counts."""
    return len(_forward_params(cls)) == 3


def ep_blocker(experts: nn.Module) -> str:
    """Why ``shard_experts`` cannot split ``experts`` over ep ranks, in words, or "" where it can: its forward
    must take the token slots sorted by expert and the counts (``x, counts``: the zoo's grouped experts) or the
    router's choice (``hidden_states, top_k_index, top_k_weights``: Hugging Face's Mixtral, Qwen-MoE,
    DeepSeek). Llama 4's experts take one (E * tokens, h) tensor, every token copied to every expert and
    weighted by its score: there is no choice to dispatch by."""
    try:
        params = _forward_params(type(experts))
    except (TypeError, ValueError):
        return f"{type(experts).__name__}.forward has no signature to read"
    if len(params) in (2, 3):
        return ""
    return (f"{type(experts).__name__}.forward({', '.join(params)}) takes neither (tokens sorted by expert, "
            "counts) nor the router's choice (hidden_states, top_k_index, top_k_weights), by which the runtime "
            "dispatches tokens to the ranks holding their experts")


def _ep_class(cls: type) -> type:
    """``ExpertParallel<cls>``, one per class (as FSDP2 makes ``FSDP<cls>``)."""
    if issubclass(cls, ExpertParallelMixin):
        return cls
    if cls not in _CLASSES:
        mixin = RoutedExpertParallelMixin if _routed(cls) else ExpertParallelMixin
        _CLASSES[cls] = type(f"ExpertParallel{cls.__name__}", (mixin, cls), {})
    return _CLASSES[cls]


def shard_experts(experts: nn.Module, ep_mesh: DeviceMesh) -> nn.Module:
    """Keep this ep rank's slice of dim 0 of the stacked expert weights and dispatch tokens over
    ``ep_mesh`` (1-D): the module still takes ``(x sorted by global expert, counts for all E)``.

    Weights must be the same on every rank of the ep group beforehand (same seed, or loaded).
    Gradients of the kept weights are those of the ep group's mean loss: average them over the
    ranks that hold the same experts (FSDP over the edp mesh does).
    """
    if isinstance(experts, ExpertParallelMixin):
        raise InvalidPlanError(f"{type(experts).__name__} is already split over ep; shard its experts once")
    ep, ep_rank = ep_mesh.size(), ep_mesh.get_local_rank()
    params = dict(experts.named_parameters(recurse=False))
    num_experts = {p.shape[0] for p in params.values()}
    if len(num_experts) != 1 or next(iter(num_experts)) % ep:
        shapes = {name: tuple(p.shape) for name, p in params.items()}
        raise InvalidPlanError(f"expert parallelism splits dim 0 (the expert) of every weight over ep({ep}) ranks; "
                               f"the weights {shapes} do not all have an expert count divisible by {ep}")
    per_rank = next(iter(num_experts)) // ep
    for name, param in params.items():
        kept = param.detach()[ep_rank * per_rank:(ep_rank + 1) * per_rank].clone()  # (E / ep, ...)
        setattr(experts, name, nn.Parameter(kept, requires_grad=param.requires_grad))
    experts.__class__ = _ep_class(type(experts))
    experts.ep_group = ep_mesh.get_group()
    experts.num_experts_global = per_rank * ep
    if isinstance(getattr(experts, "num_experts", None), int):
        experts.num_experts = per_rank  # the original forward loops over the experts this rank holds
    return experts


def expert_shard_groups(model: nn.Module) -> dict[int, dist.ProcessGroup]:
    """``id(parameter) -> ep group`` for every parameter sharded by ``shard_experts`` (dim 0 split)."""
    return {id(p): m.ep_group for m in model.modules() if isinstance(m, ExpertParallelMixin)
            for p in m.parameters(recurse=False)}


def gather_expert_shard(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The whole stack of experts from each ep rank's slice (a collective over ``group``)."""
    parts = [torch.empty_like(local) for _ in range(group.size())]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)


def whole_parameters(model: nn.Module):
    """``(name, whole tensor)`` for every parameter of ``model``, names as ``named_parameters`` gives them: a
    DTensor's shards gathered, an expert stack gathered over its ep group. A collective: the ranks of an ep group
    hold the same blocks (under pipelining, the same stages), so they gather in the same order."""
    ep_groups = expert_shard_groups(model)
    for name, param in model.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param
        if id(param) in ep_groups:
            full = gather_expert_shard(full, ep_groups[id(param)])
        yield name, full.detach().cpu()


# ---- the runtime's executors for the two step kinds (interpret.EXECUTORS) ------------------------

def build_expert_mesh(step: ExpertMesh, state: State) -> None:
    """The experts' view of the mesh's ranks: ``step.split_axis`` split into (edp, ep), same order."""
    dense = tuple(zip(state.mesh.mesh_dim_names, state.mesh.shape))
    split = dict(step.dims)
    expect: list[tuple[str, int]] = []
    for name, size in dense:
        expect += [("edp", split["edp"]), ("ep", split["ep"])] if name == step.split_axis else [(name, size)]
    if tuple(expect) != step.dims or split["edp"] * split["ep"] != dict(dense).get(step.split_axis):
        raise InvalidPlanError(f"the expert mesh {step.dims} is not the mesh {dense} with {step.split_axis} "
                               f"split into (edp, ep); build both from the same plan")
    state.expert_mesh = DeviceMesh(state.mesh.device_type, state.mesh.mesh.reshape(tuple(n for _, n in step.dims)),
                                   mesh_dim_names=tuple(a for a, _ in step.dims))


def expert_parallel(step: ExpertParallel, state: State) -> None:
    if state.expert_mesh is None:
        raise InvalidPlanError("ExpertParallel needs an ExpertMesh step before it")
    shard_experts(state.get(step.module), state.expert_mesh[step.mesh_axis])
