"""Tensor- and sequence-parallel styles for the zoo's modules, as data (torchtitan's llama3 recipe).

Megatron-LM's split (Shoeybi et al. 2019, sec. 3): the first matmul of each sublayer is
column-parallel (``wq, wk, wv``, ``fc1``, ``w1, w3``: each rank owns whole heads or a slice of the
FFN), the second is row-parallel (``wo``, ``fc2``, ``w2``) and ends in one reduction. With sequence
parallelism (Korthikanti et al. 2022, sec. 4.2) the residual stream between sublayers is sharded
on the sequence dim, S(1): norms run on their slice, ``PrepareModuleInput`` all-gathers S(1) -> R
before the column-parallel matmuls, and the row-parallel reduction becomes a reduce-scatter to S(1).

MoE blocks keep their router and experts replicated over tp (each tp rank computes the whole MoE
on the whole sequence); only attention is split. Expert parallelism is the way to split experts.
"""
from __future__ import annotations

from .program import StyleKind, TPStyle

COL = TPStyle(kind=StyleKind.COLWISE)
SP_NORM = TPStyle(kind=StyleKind.SEQUENCE_PARALLEL)

# the two projections of each MLP family: (column-parallel, row-parallel)
_MLP = {"gpt": (("fc1",), "fc2"), "llama": (("w1", "w3"), "w2")}


def _stream(sp: bool) -> str:
    """Layout of the residual stream between sublayers: sequence-sharded under SP, else replicated."""
    return "S(1)" if sp else "R"


def root_plan(family: str, sp: bool) -> tuple[tuple[str, TPStyle], ...]:
    """Embedding, final norm and output head.

    The token embedding is vocab-parallel (RowwiseParallel shards the table's rows). GPT adds a
    replicated position embedding after it, so there the sum is made whole (R) and then cut to S(1)
    by ``PrepareModuleOutput`` on ``embed``; Llama/MoE reduce-scatter straight to S(1). The output
    head is column-parallel over the vocabulary and gathered to R so the loss sees whole logits.
    """
    plan: list[tuple[str, TPStyle]] = []
    if family == "gpt":
        plan.append(("embed.tok", TPStyle(kind=StyleKind.ROWWISE, src="R", out="R")))
        if sp:
            plan.append(("embed", TPStyle(kind=StyleKind.PREPARE_OUTPUT, src="R", dst="S(1)")))
    else:
        plan.append(("embed.tok", TPStyle(kind=StyleKind.ROWWISE, src="R", out=_stream(sp))))
    if sp:
        plan.append(("norm", SP_NORM))
    plan.append(("output", TPStyle(kind=StyleKind.COLWISE, src=_stream(sp), out="R")))
    return tuple(plan)


def block_plan(family: str, sp: bool) -> tuple[tuple[str, TPStyle], ...]:
    """One transformer block: attention heads split over tp, then the MLP (or a replicated MoE)."""
    stream = _stream(sp)
    plan: list[tuple[str, TPStyle]] = []
    if sp:
        plan.append(("attn_norm", SP_NORM))
        plan.append(("attn", TPStyle(kind=StyleKind.PREPARE_INPUT, src="S(1)", dst="R")))
    plan += [("attn.wq", COL), ("attn.wk", COL), ("attn.wv", COL),
             ("attn.wo", TPStyle(kind=StyleKind.ROWWISE, out=stream))]
    if sp:
        plan.append(("mlp_norm", SP_NORM))
    if family == "moe":
        if sp:  # whole sequence in, own slice out: S(1) -> R around the replicated MoE, R -> S(1) after
            plan.append(("mlp", TPStyle(kind=StyleKind.PREPARE_INPUT_OUTPUT, src="S(1)", dst="R",
                                        out_src="R", out="S(1)")))
        return tuple(plan)
    cols, row = _MLP[family]
    if sp:
        plan.append(("mlp", TPStyle(kind=StyleKind.PREPARE_INPUT, src="S(1)", dst="R")))
    plan += [(f"mlp.{name}", COL) for name in cols]
    plan.append((f"mlp.{row}", TPStyle(kind=StyleKind.ROWWISE, out=stream)))
    return tuple(plan)


# How each style maps onto its torch class: (class name, ((keyword, value), ...)), a value being a
# layout, a tuple of layouts, or a bool.
# Both back ends read this one table: the emitter prints the call, the runtime builds the object.
Kwargs = tuple[tuple[str, str | tuple[str, ...] | bool], ...]
_CLASS = {
    StyleKind.COLWISE: "ColwiseParallel",
    StyleKind.ROWWISE: "RowwiseParallel",
    StyleKind.SEQUENCE_PARALLEL: "SequenceParallel",
    StyleKind.PREPARE_INPUT: "PrepareModuleInput",
    StyleKind.PREPARE_OUTPUT: "PrepareModuleOutput",
    StyleKind.PREPARE_INPUT_OUTPUT: "PrepareModuleInputOutput",
}


def torch_call(style: TPStyle) -> tuple[str, Kwargs]:
    """The ``torch.distributed.tensor.parallel`` class and keyword arguments for ``style``."""
    kind = style.kind
    if kind in (StyleKind.COLWISE, StyleKind.ROWWISE):
        kwargs = (("input_layouts", style.src), ("output_layouts", style.out))
    elif kind == StyleKind.PREPARE_INPUT:
        kwargs = (("input_layouts", (style.src,)), ("desired_input_layouts", (style.dst,)))
    elif kind == StyleKind.PREPARE_OUTPUT:
        kwargs = (("output_layouts", (style.src,)), ("desired_output_layouts", (style.dst,)))
    elif kind == StyleKind.PREPARE_INPUT_OUTPUT:
        # the module between stays replicated with plain-tensor parameters: hand it plain tensors
        kwargs = (("input_layouts", (style.src,)), ("desired_input_layouts", (style.dst,)),
                  ("use_local_input", True), ("output_layouts", (style.out_src,)),
                  ("desired_output_layouts", (style.out,)))
    else:
        kwargs = ()
    return _CLASS[kind], tuple((k, v) for k, v in kwargs if v is not None and v != (None,))
