"""The frontend: an ``nn.Module`` -> ``ir.Graph``, traced with torch.export on the meta device.

    graph = trace(model, batch=1, seq_len=128)   # shapes, FLOPs, bytes in ir.BATCH and ir.SEQ
    dims = dims_of(model)                         # from model.config, without tracing

Modules that cannot be traced (data-dependent routing) are kept whole as leaf ops with a declared
cost, by the rules in ``LEAF_RULES``; pass more as ``trace(model, leaf_rules={...})``.
"""
from .dims import dims_of
from .leaves import LEAF_RULES, LeafCost, LeafRule, qualname, routed_swiglu_cost
from .trace import trace

__all__ = ["LEAF_RULES", "LeafCost", "LeafRule", "dims_of", "qualname", "routed_swiglu_cost", "trace"]
