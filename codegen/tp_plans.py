"""Tensor- and sequence-parallel styles for a model's modules (``ir.ModelStructure`` paths), as data
(torchtitan's llama3 recipe).

Megatron-LM's split (Shoeybi et al. 2019, sec. 3): the first matmul of each sublayer is
column-parallel (``wq, wk, wv``, ``fc1``, ``w1, w3``: each rank owns whole heads or a slice of the
FFN), the second is row-parallel (``wo``, ``fc2``, ``w2``) and ends in one reduction. With sequence
parallelism (Korthikanti et al. 2022, sec. 4.2) the residual stream between sublayers is sharded
on the sequence dim, S(1): norms run on their slice, ``PrepareModuleInput`` all-gathers S(1) -> R
before the column-parallel matmuls, and the row-parallel reduction becomes a reduce-scatter to S(1).

MoE blocks keep their router and experts replicated over tp (each tp rank computes the whole MoE
on the whole sequence); only attention is split. Expert parallelism is the way to split experts.

A plan's ``param_layouts`` may keep a dense sublayer (attention or MLP) replicated over tp too: the
intra-op program (``solver/intra_op.py``) picks that where splitting costs more communication than
it saves compute. ``replicated_sublayers`` reads it from the tp placement of each linear weight
(``S(0)`` column-parallel, ``S(1)`` row-parallel, ``R`` replicated): a sublayer is either split the
Megatron way or replicated whole, since attention (the zoo's, Hugging Face's) takes its head count from the
projections it runs (``view(b, s, -1, head_dim)``) and the residual stream only meets ``R`` or
``S(1)``. A replicated sublayer gets no style on its linears (plain modules, plain weights); its
input is the whole stream and so is its output, which every tp rank computes alike. Under sequence
parallelism the stream is ``S(1)``: ``PrepareModuleInputOutput`` gathers it before the sublayer
(handing it plain tensors) and keeps this rank's slice of the output (R -> S(1), a free slice; its
backward all-gathers the gradient), as for the MoE. Every tp rank then computes the same gradient
for a replicated weight from the same whole inputs, so no reduction over tp is needed.
"""
from __future__ import annotations

from collections.abc import Mapping

from ..ir import InvalidPlanError, ModelStructure, parse_placement
from .program import StyleKind, TPStyle

COL = TPStyle(kind=StyleKind.COLWISE)
SP_NORM = TPStyle(kind=StyleKind.SEQUENCE_PARALLEL)
# a norm over the features of a colwise projection's output (OLMo 2's q_norm / k_norm over every head's q / k): its
# weight split as those features are, its mean reduced over tp (runtime.styles.FeatureShardedNorm)
FEATURE_NORM = TPStyle(kind=StyleKind.FEATURE_NORM)
SUBLAYER_NAMES = ("attn", "mlp")


def _norm(s: ModelStructure, sub: str) -> str:
    return s.attn_norm if sub == "attn" else s.mlp_norm


def _stream(sp: bool) -> str:
    """Layout of the residual stream between sublayers: sequence-sharded under SP, else replicated."""
    return "S(1)" if sp else "R"


def _vocab_head(sp: bool) -> TPStyle:
    """The output head: column-parallel over the vocabulary from the stream's layout, its logits left
    sharded (a DTensor) for the vocab-parallel loss (``runtime.loss``)."""
    return TPStyle(kind=StyleKind.COLWISE, src=_stream(sp), out="S(-1)", dtensor_out=True)


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def embedding_sum(s: ModelStructure) -> str:
    """The module whose output is the token plus position embedding (the zoo GPT's ``embed``), where
    sequence parallelism cuts the stream to S(1); "" when the sum happens in a forward that also runs
    the blocks (GPT-2's ``transformer``), where no module boundary sits between them."""
    parent = _parent(s.embed)
    if not s.pos_embed or not parent or _parent(s.pos_embed) != parent:
        return ""
    return "" if s.blocks == parent or s.blocks.startswith(parent + ".") else parent


def root_plan(s: ModelStructure, sp: bool) -> tuple[tuple[str, TPStyle], ...]:
    """Embedding, final norm and output head.

    The token embedding is vocab-parallel (RowwiseParallel shards the table's rows). The output head
    is column-parallel over the vocabulary and keeps its logits sharded, ``S(-1)`` as a DTensor: the
    loss is vocab-parallel (``runtime.loss``) and no rank holds whole logits. A head tied to the
    embedding is split alike: both shard the (vocab, h) table by its rows, ``S(0)``, as Megatron-LM's
    output layer uses its vocab-parallel embedding's weight, and ``runtime.styles.kept_ties`` keeps it one
    parameter.

    Where sequence parallelism cuts the stream to S(1): on the zoo's modules, at the embedding (a
    reduce-scatter; with a learned position embedding the sum is made whole, R, then cut by
    ``PrepareModuleOutput`` on the module that adds them, ``embedding_sum``). On any other model,
    at the first block's input (``PrepareModuleInput`` R -> S(1), a free slice), because the model's
    own forward may still read the whole embedded sequence before its blocks (Hugging Face builds the
    causal mask and the rotary tables from it).
    """
    if not _cut_at_embedding(s):
        return _root_plan_cut_at_blocks(s, sp)
    plan: list[tuple[str, TPStyle]] = []
    if s.pos_embed:
        plan.append((s.embed, TPStyle(kind=StyleKind.ROWWISE, src="R", out="R")))
        if sp:
            plan.append((embedding_sum(s), TPStyle(kind=StyleKind.PREPARE_OUTPUT, src="R", dst="S(1)")))
    elif s.embed:
        plan.append((s.embed, TPStyle(kind=StyleKind.ROWWISE, src="R", out=_stream(sp))))
    if sp:
        plan.append((s.final_norm, SP_NORM))
    if s.head:
        plan.append((s.head, _vocab_head(sp)))
    return tuple(plan)


def _cut_at_embedding(s: ModelStructure) -> bool:
    from .structure import zoo_family

    return zoo_family(s) is not None


def _root_plan_cut_at_blocks(s: ModelStructure, sp: bool) -> tuple[tuple[str, TPStyle], ...]:
    plan: list[tuple[str, TPStyle]] = []
    if s.embed:
        plan.append((s.embed, TPStyle(kind=StyleKind.ROWWISE, src="R", out="R")))
    if sp:
        plan.append((s.block_path(0), TPStyle(kind=StyleKind.PREPARE_INPUT, src="R", dst="S(1)", local=True)))
        plan.append((s.final_norm, SP_NORM))
    if s.head:
        plan.append((s.head, _vocab_head(sp)))
    return tuple(plan)


def block_plan(s: ModelStructure, sp: bool, replicated: frozenset[str] = frozenset()) -> tuple[tuple[str, TPStyle], ...]:
    """One transformer block: each sublayer's heads or FFN width split over tp, except the sublayers
    in ``replicated`` (and those ``ModelStructure.tp_linears`` keeps whole), which every tp rank runs whole on
    the whole sequence."""
    stream = _stream(sp)
    plan: list[tuple[str, TPStyle]] = []
    for sub, linears in s.tp_linears().items():
        module = getattr(s, sub)
        if sp:
            plan.append((_norm(s, sub), SP_NORM))
        kwarg = (s.attn_kwarg or None) if sub == "attn" else None
        if sp and sub == "attn" and sub in replicated and linears is not None and attention_returns_tuple(s):
            raise InvalidPlanError(
                f"param_layouts keep {module!r} replicated over tp under sequence parallelism, but this model's "
                "attention returns a tuple (Hugging Face's (attn_output, attn_weights)), which "
                "PrepareModuleInputOutput cannot cut to S(1); re-plan (the search keeps it split under sp), or "
                "split its q/k/v/o linears (S(0), S(1)), or turn sequence parallelism off")
        if sp and sub == "mlp" and (linears is None or sub in replicated) and s.mlp_tuple:
            raise InvalidPlanError(f"sequence parallelism keeps {module!r} whole, but this model's MLP returns a tuple "
                                   "(Llama 4's MoE: (output, router logits)), which PrepareModuleInputOutput cannot "
                                   "cut to S(1); re-plan (the search does not offer sp here) or turn sp off")
        if linears is None or sub in replicated:
            if sp:  # whole sequence in, own slice out: S(1) -> R around the replicated sublayer, R -> S(1) after
                plan.append((module, TPStyle(kind=StyleKind.PREPARE_INPUT_OUTPUT, src="S(1)", dst="R",
                                             out_src="R", out="S(1)", kwarg=kwarg)))
            continue  # without sp the stream is a plain replicated tensor already
        cols, row = linears
        if sub == "attn" and s.head_params:  # GPT-OSS's sinks split with the heads; under sp, the input gathered too
            plan.append((module, TPStyle(kind=StyleKind.HEAD_PARAMS, src="S(1)" if sp else None,
                                         dst="R" if sp else None, kwarg=kwarg if sp else None)))
        elif sp:
            plan.append((module, TPStyle(kind=StyleKind.PREPARE_INPUT, src="S(1)", dst="R", kwarg=kwarg)))
        plan += [(name, COL) for name in cols]
        if sub == "attn":
            plan += [(norm, head_norm(s)) for norm in s.head_norms]
            plan += [(norm, FEATURE_NORM) for norm in s.feature_norms]
        plan.append((row, TPStyle(kind=StyleKind.ROWWISE, out=stream)))
    return tuple(plan)


def head_norm(s: ModelStructure) -> TPStyle:
    """A norm over each head's features inside split attention (Qwen3's q_norm): it runs on this rank's heads,
    ``S(head_norm_dim)`` of its input, with its (head_dim,) weight replicated (a DTensor whose gradient is the
    sum over tp of each rank's heads' parts, as the sequence-parallel norms' is over the sequence), and hands
    attention back its plain local heads."""
    return TPStyle(kind=StyleKind.SEQUENCE_PARALLEL, src=f"S({s.head_norm_dim})", local=True)


def attention_returns_tuple(s: ModelStructure) -> bool:
    """Whether the attention, kept whole under sequence parallelism, would hand ``PrepareModuleInputOutput`` a tuple
    it cannot cut to S(1): one the trace saw return a tuple (``attn_tuple``: Hugging Face's ``(attn_output,
    attn_weights)``, GPT-2's taken positionally too), or, in a structure saved before that was recorded, a model's
    own attention (not the zoo's) that takes the stream by keyword, as Hugging Face's does."""
    return s.attn_tuple or (bool(s.attn_kwarg) and not _cut_at_embedding(s))


def sp_blockers(s: ModelStructure) -> list[str]:
    """Why sequence parallelism cannot run on this model's modules (empty: it can)."""
    why = [f"no {what} norm was found in the blocks" for what, path in (("attention", s.attn_norm),
                                                                      ("MLP", s.mlp_norm)) if not path]
    why += [f"no {what} module was found" for what, path in (("attention", s.attn), ("MLP", s.mlp)) if not path]
    if not s.final_norm:
        why.append("no final norm was found")
    if _cut_at_embedding(s):
        if s.pos_embed and not embedding_sum(s):
            why.append(f"the position embedding {s.pos_embed!r} is added in a forward that also runs the blocks")
    elif attention_returns_tuple(s) and (s.tp_linears()["attn"] is None or s.whole_attn_blocks):
        which = f" in blocks {list(s.whole_attn_blocks)}" if s.tp_linears()["attn"] is not None else ""
        why.append(f"attention ({s.attn!r}) is kept whole over tp{which} and returns a tuple (Hugging Face's "
                   "(attn_output, attn_weights)), which PrepareModuleInputOutput cannot cut back to the sequence slice")
    if s.block_loose:
        why.append(f"the blocks hold {list(s.block_loose)} beside attention, the MLP and the norms before them (Gemma "
                   "2's post-attention and post-feedforward norms): on the sequence-sharded stream each tp rank would "
                   "reach only a partial sum of their gradients")
    if s.mlp_tuple and s.tp_linears()["mlp"] is None:
        why.append(f"the MLP ({s.mlp!r}) is kept whole over tp and returns a tuple (Llama 4's MoE: (output, router "
                   "logits)), which PrepareModuleInputOutput cannot cut back to the sequence slice")
    return why


def replicated_sublayers(s: ModelStructure, layer: str, weight_tp: Mapping[str, str]) -> frozenset[str]:
    """The sublayers of block ``layer`` that ``weight_tp`` (linear path in the block, e.g. ``"mlp.w1"``
    -> tp placement of its weight; a linear not listed is taken as split) keeps replicated.
    Raises ``InvalidPlanError`` for a sublayer that is neither split the Megatron way nor all ``R``."""
    out = set()
    for sub, linears in s.tp_linears().items():
        if linears is None:
            continue
        cols, row = linears
        names = (*cols, row)
        got = tuple(weight_tp.get(n) for n in names)
        split = tuple(g or want for g, want in zip(got, ("S(0)",) * len(cols) + ("S(1)",)))
        if all(g == "R" for g in got):
            out.add(sub)
        elif split != ("S(0)",) * len(cols) + ("S(1)",):
            have = ", ".join(f"{n} {g or '-'}" for n, g in zip(names, got))
            raise InvalidPlanError(
                f"param_layouts: {layer}.{getattr(s, sub)} has tp placements {have}; the runtime runs a sublayer "
                f"either split ({', '.join(cols)} S(0), {row} S(1)) or replicated (all R). Re-plan, or give its "
                "linear weights one of these two layouts")
    return frozenset(out)


# How each style maps onto its torch class: (class name, ((keyword, value), ...)), a value being a
# layout, a tuple of layouts, a dict of keyword argument -> layout, a bool, or an int (a dim).
# Both back ends read this one table: the emitter prints the call, the runtime builds the object.
Kwargs = tuple[tuple[str, str | tuple[str, ...] | dict[str, str] | bool | int], ...]
_CLASS = {
    StyleKind.COLWISE: "ColwiseParallel",
    StyleKind.ROWWISE: "RowwiseParallel",
    StyleKind.SEQUENCE_PARALLEL: "SequenceParallel",
    StyleKind.PREPARE_INPUT: "PrepareModuleInput",
    StyleKind.PREPARE_OUTPUT: "PrepareModuleOutput",
    StyleKind.PREPARE_INPUT_OUTPUT: "PrepareModuleInputOutput",
    StyleKind.FEATURE_NORM: "FeatureShardedNorm",
    StyleKind.HEAD_PARAMS: "HeadShardedParams",
}
# the styles that are meshplan's own (runtime/styles.py), not torch.distributed.tensor.parallel's
MESHPLAN_STYLES = ("FeatureShardedNorm", "HeadShardedParams")


def _input_layouts(style: TPStyle) -> Kwargs:
    """The input redistribution: of the first positional input, or of the keyword argument ``style.kwarg``
    (a dict value: ``{"hidden_states": "S(1)"}``)."""
    if style.kwarg:
        return (("input_kwarg_layouts", {style.kwarg: style.src}),
                ("desired_input_kwarg_layouts", {style.kwarg: style.dst}))
    return (("input_layouts", (style.src,)), ("desired_input_layouts", (style.dst,)))


def torch_call(style: TPStyle) -> tuple[str, Kwargs]:
    """The ``torch.distributed.tensor.parallel`` class and keyword arguments for ``style``."""
    kind = style.kind
    if kind in (StyleKind.COLWISE, StyleKind.ROWWISE):
        kwargs = (("input_layouts", style.src), ("output_layouts", style.out))
        if style.dtensor_out:
            kwargs += (("use_local_output", False),)
    elif kind == StyleKind.PREPARE_INPUT:
        kwargs = _input_layouts(style) + ((("use_local_output", True),) if style.local else ())
    elif kind == StyleKind.PREPARE_OUTPUT:
        kwargs = (("output_layouts", (style.src,)), ("desired_output_layouts", (style.dst,)))
    elif kind == StyleKind.PREPARE_INPUT_OUTPUT:
        # the module between stays replicated with plain-tensor parameters: hand it plain tensors
        kwargs = (*_input_layouts(style), ("use_local_input", True), ("output_layouts", (style.out_src,)),
                  ("desired_output_layouts", (style.out,)))
    elif kind == StyleKind.FEATURE_NORM:
        kwargs = ()
    elif kind == StyleKind.HEAD_PARAMS:
        kwargs = _input_layouts(style) if style.src else ()
    else:  # sequence parallel: the norm's input sharded on dim src (default S(1)), handed back plain if local
        kwargs = ((("sequence_dim", parse_placement(style.src).dim),) if style.src else ()) + (
            (("use_local_output", True),) if style.local else ())
    return _CLASS[kind], tuple((k, v) for k, v in kwargs if v is not None and v != (None,))
