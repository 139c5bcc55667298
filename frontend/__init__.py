"""The frontend: an ``nn.Module`` -> ``ir.Graph``, traced with torch.export on the meta device.

    graph = trace(model, batch=1, seq_len=128)   # shapes, FLOPs, bytes in ir.BATCH and ir.SEQ
    graph.structure                               # ir.ModelStructure: blocks, q/k/v/o, MLP, experts, ...
    dims = dims_of(model)                         # from model.config, without tracing

A Hugging Face model is traced on ``input_ids=`` and ``use_cache=False``; a model whose input is not
token ids takes ``trace(model, example_inputs=(torch.randn(8, 512),))``.

Modules that cannot be traced (data-dependent routing) are kept whole as leaf ops with a declared
cost, by the rules in ``LEAF_RULES``; pass more as ``trace(model, leaf_rules={...})``.
"""
from .dims import dims_of
from .leaves import GROUPED_EXPERTS, LEAF_RULES, LeafCost, LeafRule, qualname, routed_swiglu_cost
from .structure import find_structure
from .trace import trace

__all__ = ["GROUPED_EXPERTS", "LEAF_RULES", "LeafCost", "LeafRule", "dims_of", "find_structure", "qualname",
           "routed_swiglu_cost", "trace"]
