"""Modules kept whole as leaf ops, with a declared cost, when their forward cannot be traced.

A routed mixture-of-experts layer decides from the data how many tokens each expert gets
(``bincount().tolist()``, ``argsort``), which neither the meta device nor torch.export's symbolic
shapes can follow. The frontend traces such a module as one opaque custom op,
``meshplan::leaf(inputs, path)``, whose fake implementation only makes an output of the right
shape; the module's cost then comes from its rule, here, not from the trace.

Rules are data: ``LEAF_RULES`` maps a module class (``module.qualname``, subclasses included) to a
``LeafRule``. The one built in, for the zoo's ``MoE``:

    n = b * s tokens, h hidden, E experts, f expert FFN width, k = top_k experts per token
    router   (n, h) @ (h, E)                        2 * n * h * E
    experts  k SwiGLU FFNs per token, 3 matmuls     2 * n * h * f * 3 * k
    bytes    every parameter (all experts) + input + output

Grouped experts (a module whose own parameters are all (E, ., .), as Hugging Face's
``MixtralExperts`` and ``Qwen3MoeExperts``) need no rule: when their routing cannot be traced
(``experts_implementation="eager"`` loops over ``nonzero``), ``GROUPED_EXPERTS`` keeps them whole
at 2 * n * k * (one expert's weights) FLOPs.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import sympy
import torch
from torch import nn

from ..ir import DTYPE_BYTES, OpKind, TensorMeta
from .symbolic import dtype_name


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafCost:
    """A leaf's forward cost, and the dimensions it reveals (for models without a config)."""

    flops: sympy.Expr
    bytes: sympy.Expr
    experts: int = 0
    top_k: int = 0
    ffn_hidden: int = 0


LeafCostFn = Callable[[nn.Module, tuple[TensorMeta, ...], tuple[TensorMeta, ...]], LeafCost]
OutputFn = Callable[[list[torch.Tensor]], torch.Tensor]


def like_first_input(inputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(inputs[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafRule:
    op: OpKind  # the node's kind, e.g. OpKind.MOE
    cost: LeafCostFn  # (module, input metas, output metas) -> LeafCost
    output: OutputFn = like_first_input  # a fresh fake output from the fake tensor inputs


def param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * DTYPE_BYTES[dtype_name(p.dtype)] for p in module.parameters())


def routed_swiglu_cost(module: nn.Module, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> LeafCost:
    """The zoo's MoE: a router and ``top_k`` of ``experts`` SwiGLU FFNs per token (module docstring)."""
    experts, hidden = module.router.weight.shape  # (E, h)
    ffn_hidden = module.experts.w1.shape[-1]  # (E, h, f)
    top_k = int(module.top_k)
    tokens = ins[0].numel / hidden  # n = b * s
    router = 2 * tokens * hidden * experts  # (n, h) @ (h, E)
    ffns = 2 * tokens * hidden * ffn_hidden * 3 * top_k  # w1, w3: (n, h) @ (h, f); w2: (n, f) @ (f, h)
    moved = param_bytes(module) + ins[0].nbytes + outs[0].nbytes
    return LeafCost(flops=router + ffns, bytes=moved, experts=int(experts), top_k=top_k, ffn_hidden=int(ffn_hidden))


def is_grouped_experts(module: nn.Module) -> bool:
    """Experts stored as grouped weights, Hugging Face's way (``MixtralExperts``: ``gate_up_proj``
    (E, 2f, h), ``down_proj`` (E, h, f)): every own parameter has 3 dims and the same E >= 2 first."""
    own = list(module.parameters(recurse=False))
    return bool(own) and all(p.dim() == 3 for p in own) and len({p.shape[0] for p in own}) == 1 \
        and own[0].shape[0] >= 2


def grouped_experts_cost(module: nn.Module, ins: tuple[TensorMeta, ...], outs: tuple[TensorMeta, ...]) -> LeafCost:
    """Grouped experts called as ``experts(x (n, h), top_k_index (n, k), top_k_weights (n, k))``: each
    token passes through k experts, each expert's weights one matmul: 2 * n * k * (weights of one expert)."""
    own = list(module.parameters(recurse=False))
    experts, hidden = own[0].shape[0], ins[0].shape[-1]
    top_k = int(ins[1].shape[-1]) if len(ins) > 1 and ins[1].shape else 1
    per_expert = sum(p[0].numel() for p in own)
    tokens = ins[0].numel / hidden
    widths = [d for p in own for d in p.shape[1:] if d != hidden]
    moved = param_bytes(module) + sum(i.nbytes for i in ins) + outs[0].nbytes
    return LeafCost(flops=2 * tokens * top_k * per_expert, bytes=moved, experts=int(experts), top_k=top_k,
                    ffn_hidden=int(min(widths, default=0)))


GROUPED_EXPERTS = LeafRule(op=OpKind.MOE, cost=grouped_experts_cost)

LEAF_RULES: Mapping[str, LeafRule] = MappingProxyType({
    "meshplan.zoo.models.MoE": LeafRule(op=OpKind.MOE, cost=routed_swiglu_cost),
})


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def rule_of(module: nn.Module, rules: Mapping[str, LeafRule]) -> tuple[str, LeafRule] | None:
    """The rule for a module's class or its nearest base class that has one, with that class's name;
    grouped experts (``is_grouped_experts``) without a rule of their own get ``GROUPED_EXPERTS``."""
    for cls in type(module).__mro__:
        if qualname(cls) in rules:
            return qualname(cls), rules[qualname(cls)]
    if is_grouped_experts(module):
        return qualname(type(module)), GROUPED_EXPERTS
    return None


# leaf path -> its rule's output function, for the fake implementation during one trace
_OUTPUTS: dict[str, OutputFn] = {}


@torch.library.custom_op("meshplan::leaf", mutates_args=())
def leaf_op(inputs: list[torch.Tensor], path: str) -> torch.Tensor:
    raise RuntimeError(f"meshplan::leaf ({path}) stands for a module only while meshplan traces; it never runs")


@leaf_op.register_fake
def _leaf_fake(inputs: list[torch.Tensor], path: str) -> torch.Tensor:
    return _OUTPUTS.get(path, like_first_input)(inputs)


def _leaf_forward(path: str) -> Callable[..., torch.Tensor]:
    def forward(*args: object, **kwargs: object) -> torch.Tensor:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return leaf_op(tensors, path)
    return forward


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    path: str
    cls_name: str  # the class the rule is registered for
    module: nn.Module
    rule: LeafRule


def patch_leaves(model: nn.Module, classes: frozenset[str], rules: Mapping[str, LeafRule]) -> dict[str, Leaf]:
    """Make every module whose rule's class is in ``classes`` a leaf op, in place: ``model`` must be
    the frontend's own meta copy, never the user's model."""
    leaves: dict[str, Leaf] = {}
    for path, module in model.named_modules():
        found = rule_of(module, rules)
        if not path or found is None or found[0] not in classes:
            continue
        if any(path.startswith(outer + ".") for outer in leaves):
            continue  # inside a leaf already
        module.forward = _leaf_forward(path)
        _OUTPUTS[path] = found[1].output
        leaves[path] = Leaf(path=path, cls_name=found[0], module=module, rule=found[1])
    return leaves
