"""Pipeline stage boundaries: which layers each stage runs, balanced by the cost model or as Megatron writes them.

With ``pp`` pipeline ranks and ``vp`` chunks per rank (interleaving) there are ``pp * vp`` chunks;
chunk c runs on rank ``c mod pp``, so rank r holds chunks ``r, r + pp, ..., r + (vp - 1) pp``. The
embedding sits in chunk 0, the output layer and loss in the last chunk.

**Balanced (the search).** The output layer and loss cost, in FLOPs, ``2·h·V`` per token against a
layer's ``layer_forward_flops`` (for Llama 3 8B with its 128k vocabulary that is 2.4 layers), so an
even split makes the last rank the slowest and sets the pace of the whole pipeline (Narayanan et
al. 2021 sec. 3.2). We balance the ranks by water-filling: find the smallest load ``T`` such that
ranks of ``n_r = max(min_r, floor(T - e_r))`` layers cover all ``L`` layers, where ``e_r`` is the
extra load of rank r in layer units (the output layer on the last rank). That minimizes
``max_r (n_r + e_r)`` exactly over integers ``n_r >= min_r``. A rank's layers are then split over
its chunks (``split_rank``). For Llama 3.1 405B (126 layers, output layer 0.66 of a layer) on
``pp 16 x vp 8`` this gives the first and the last rank 7 layers and the others 8: Llama 3's own
layout (Dubey et al. 2024 sec. 3.3.2, "we reduce one Transformer layer each from the first and the
last stages"), found from the FLOPs, not written in.

**Megatron's flags (``megatron_counts``).** Megatron-LM (``megatron/core/transformer/
transformer_block.py`` ``get_num_layers_to_build``, ``transformer_layer.py``
``get_transformer_layer_offset``; flags in ``megatron/training/arguments.py``):

* ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers M``: the first /
  last rank hold F / M layers; the ranks in between share the rest equally; under interleaving each
  rank's layers are split equally over its ``vp`` chunks.
* ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding / the loss count as one layer each; the ``L + 1 (+ 1)`` slots are split equally over
  the chunks, and the embedding takes a slot of chunk 0, the loss a slot of the last chunk. With 126
  layers on ``pp 16 x vp 8`` that is 128 slots, one per chunk: chunk 0 holds only the embedding,
  chunk 127 only the norm, output layer and loss.

Megatron asserts that these splits divide evenly. Where they do not, we split as evenly as we can
instead of refusing: the middle ranks' remainder goes to the earlier ranks, a rank's remainder over
its chunks to its earlier chunks, except on the first rank (its lighter chunks come first, beside
the embedding) and the last rank (its lighter chunks come last, beside the output layer); where
they divide, the result is Megatron's. Only chunk 0 and the last chunk may be empty (the embedding
or the head alone), so ``pp * vp <= L + 2``.
"""
from __future__ import annotations

import math
from functools import lru_cache

from ..cost_model.flops import layer_forward_flops, logits_forward_flops
from ..ir import InvalidPlanError, ModelDims


def output_extra_layers(dims: ModelDims) -> float:
    """The output layer's forward FLOPs in units of one layer's."""
    return logits_forward_flops(dims, 1, 1) / layer_forward_flops(dims, 1, 1)


def balanced(layers: int, extra: tuple[float, ...], minimum: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Layers per stage minimizing the largest ``n_i + extra_i``, stage i holding at least ``minimum[i]``
    layers (default one each)."""
    stages = len(extra)
    low = minimum or (1,) * stages
    if layers < sum(low):
        raise ValueError(f"{layers} layers cannot fill {stages} stages of at least {list(low)} layers")
    lo, hi = 0.0, layers + max(extra) + 1.0
    for _ in range(60):  # bisection on the load T
        mid = (lo + hi) / 2
        if sum(max(m, math.floor(mid - e)) for m, e in zip(low, extra)) >= layers:
            hi = mid
        else:
            lo = mid
    counts = [max(m, math.floor(hi - e)) for m, e in zip(low, extra)]
    surplus = sum(counts) - layers
    for i in sorted(range(stages), key=lambda i: -(counts[i] + extra[i])):  # trim the most loaded first
        while surplus and counts[i] > low[i] and counts[i] + extra[i] >= max(c + e for c, e in zip(counts, extra)):
            counts[i] -= 1
            surplus -= 1
    for i in range(stages):
        while surplus and counts[i] > low[i]:
            counts[i] -= 1
            surplus -= 1
    return tuple(counts)


def split_rank(layers: int, vp: int, *, lighter_first: bool) -> tuple[int, ...]:
    """One rank's ``layers`` over its ``vp`` chunks as evenly as possible; the lighter chunks first
    (the first rank, whose chunk 0 embeds) or last (every other rank; the last rank's last chunk
    holds the output layer)."""
    base, rest = divmod(layers, vp)
    counts = [base + (1 if k < rest else 0) for k in range(vp)]  # heavier chunks first
    return tuple(reversed(counts)) if lighter_first else tuple(counts)


def chunks_of_ranks(per_rank: tuple[int, ...], vp: int) -> tuple[int, ...]:
    """Layers per chunk (chunk c on rank c % pp) from layers per rank."""
    pp = len(per_rank)
    split = [split_rank(n, vp, lighter_first=r == 0) for r, n in enumerate(per_rank)]
    return tuple(split[c % pp][c // pp] for c in range(pp * vp))


def bounds(counts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """``[first, last)`` ranges of consecutive chunks of ``counts`` layers."""
    out, first = [], 0
    for n in counts:
        out.append((first, first + n))
        first += n
    return tuple(out)


def rank_minimum(pp: int, vp: int) -> tuple[int, ...]:
    """Fewest layers a rank may hold: one per chunk, except chunk 0 and the last chunk (the first and
    last rank's), which may hold only the embedding or the head; without interleaving one layer."""
    if vp == 1:
        return (1,) * pp
    return (vp - 1,) + (vp,) * (pp - 2) + (vp - 1,)


@lru_cache(maxsize=4096)
def stage_ranges(dims: ModelDims, pp: int, vp: int = 1) -> tuple[tuple[int, int], ...]:
    """``[first, last)`` layer ranges for ``pp * vp`` chunks, the ranks balanced (module docstring);
    empty for no pipeline."""
    if pp == 1:
        return ()
    extra = (0.0,) * (pp - 1) + (output_extra_layers(dims),)  # the embedding is a gather: no FLOPs
    per_rank = balanced(dims.layers, extra, rank_minimum(pp, vp))
    return bounds(chunks_of_ranks(per_rank, vp))


def max_chunks(layers: int) -> int:
    """Most chunks ``layers`` layers fill: every chunk a layer, and chunk 0 and the last may hold only
    the embedding or the head (Megatron's account-for-embedding/loss split)."""
    return layers + 2


def megatron_counts(layers: int, pp: int, vp: int = 1, *, first: int | None = None, last: int | None = None,
                    embedding: bool = False, loss: bool = False) -> tuple[int, ...]:
    """Layers per chunk as Megatron-LM's flags place them (module docstring): ``first``/``last`` are
    ``--decoder-first/last-pipeline-num-layers``, ``embedding``/``loss`` the account-for flags."""
    if (first is not None or last is not None) and (embedding or loss):
        raise InvalidPlanError("first/last stage layers and the account-for-embedding/loss split are two "
                               "ways to say the same thing (Megatron refuses both at once); give one")
    if pp < 2:
        raise InvalidPlanError(f"first/last stage layers need pp > 1, got pp({pp})")
    if first is not None or last is not None:
        return _first_last_counts(layers, pp, vp, first, last)
    slots = layers + embedding + loss
    if slots < pp * vp:
        raise InvalidPlanError(f"pp({pp}) * vp({vp}) = {pp * vp} chunks but the model has {layers} layers"
                               + (f" (+{embedding + loss} for the embedding/loss)" if embedding or loss else "")
                               + "; pass fewer chunks or account for the embedding and the loss "
                               "(--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)")
    base, rest = divmod(slots, pp * vp)
    counts = [base + (1 if c < rest else 0) for c in range(pp * vp)]
    counts[0] -= embedding
    counts[-1] -= loss
    return check_counts(tuple(counts), layers, pp, vp)


def _first_last_counts(layers: int, pp: int, vp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    for name, value in (("first", first), ("last", last)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < max(vp - 1, 1)):
            raise InvalidPlanError(f"{name} stage layers({value!r}) must be an integer >= {max(vp - 1, 1)}: a "
                                   f"rank's {vp} chunk(s) hold a layer each, the {name} rank's "
                                   f"{'first' if name == 'first' else 'last'} one may hold only the "
                                   f"{'embedding' if name == 'first' else 'head'}")
    middle_ranks = pp - (first is not None) - (last is not None)
    middle_layers = layers - (first or 0) - (last or 0)
    if middle_layers < middle_ranks * vp or (middle_ranks == 0 and middle_layers):
        raise InvalidPlanError(f"first({first}) + last({last}) stage layers leave {middle_layers} of the {layers} "
                               f"layers for {middle_ranks} middle rank(s) of {vp} chunk(s) each; give smaller "
                               f"first/last counts so that they sum to {layers} with the middle ones")
    base, rest = divmod(middle_layers, max(middle_ranks, 1))
    middle = iter(base + (1 if r < rest else 0) for r in range(middle_ranks))
    per_rank = tuple(first if r == 0 and first is not None else last if r == pp - 1 and last is not None
                     else next(middle) for r in range(pp))
    return check_counts(chunks_of_ranks(per_rank, vp), layers, pp, vp)


def check_counts(counts: tuple[int, ...], layers: int, pp: int, vp: int) -> tuple[int, ...]:
    """``counts`` if it is a layout the runtime runs: ``pp * vp`` chunks of ``layers`` layers in all,
    each at least one layer except chunk 0 and the last (embedding or head alone)."""
    if len(counts) != pp * vp or sum(counts) != layers:
        raise InvalidPlanError(f"{len(counts)} chunks of {sum(counts)} layers; expected pp({pp}) * vp({vp}) = "
                               f"{pp * vp} chunks of {layers} layers in all")
    empty = [c for c, n in enumerate(counts) if n < 1 and not (n == 0 and c in (0, len(counts) - 1) and len(counts) > 1)]
    if empty:
        raise InvalidPlanError(f"chunk(s) {empty} of {list(counts)} hold no layer; only chunk 0 (the embedding) "
                               f"and chunk {len(counts) - 1} (the head) may be empty; use fewer chunks")
    return counts
