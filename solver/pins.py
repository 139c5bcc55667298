"""Pinned choices checked against the model, the cluster and the batch, one rule at a time.

``space.check_fixed`` checks the pins alone (known keys, positive ints within ``ir/limits.py``,
combinations the runtime cannot run). Here each pin meets the request: a pin no candidate can
satisfy is refused with its own rule (``ep=2 needs a model with experts; llama3-8b has none``)
instead of the search's catch-all "no strategy divides the work" (``space.explain_empty``), which
remains for combinations that only fail together.
"""
from __future__ import annotations

from math import prod
from typing import Any

from ..ir import InfeasibleError, ModelDims
from .space import EP_OVER_CP, MIN_CP_TOKENS, divisors, tp_degrees


def check_pins_fit(dims: ModelDims, *, world: int, domain: int, global_batch: int, seq_len: int,
                   fixed: dict[str, Any], runtime: frozenset[str], model_name: str) -> None:
    """Raise ``InfeasibleError`` naming the first pin that no candidate can satisfy."""
    _check_mesh_product(world, fixed)
    _check_tp(dims, world, domain, fixed)
    _check_experts(dims, model_name, fixed, runtime)
    _check_sequence(seq_len, fixed)
    _check_layers(dims, model_name, fixed)
    if fixed.get("vp", 1) > 1 and world == 1:
        raise InfeasibleError(f"fixed: vp={fixed['vp']} needs pp > 1 but the cluster has 1 GPU; leave vp unset")
    _check_zero_group(world, global_batch, fixed)
    _check_batch(global_batch, fixed)


def _check_zero_group(world: int, global_batch: int, fixed: dict[str, Any]) -> None:
    """An HSDP shard group of g ranks needs a data-parallel degree that is a larger multiple of g: one that divides
    the GPUs and the global batch."""
    g = fixed.get("zero_group", 0)
    if not g or "dp" in fixed:  # a pinned dp is checked with the pins alone (space.check_fixed)
        return
    if not any(dp > g and dp % g == 0 and global_batch % dp == 0 for dp in divisors(world)):
        raise InfeasibleError(f"fixed: zero_group={g} needs a data-parallel degree that is a multiple of it, larger "
                              f"than it, and divides the {world} GPUs and the global batch {global_batch}; none does: "
                              "pin a smaller shard group, or 0 (shard over all of dp)")


def _check_mesh_product(world: int, fixed: dict[str, Any]) -> None:
    pinned = {k: fixed[k] for k in ("pp", "dp", "cp", "tp") if k in fixed}
    if not pinned:
        return
    size = prod(pinned.values())
    text = " * ".join(f"{k}({v})" for k, v in pinned.items()) + f" = {size}"
    if len(pinned) == 1:
        text = "{}={}".format(*next(iter(pinned.items())))
    if len(pinned) == 4 and size != world:
        raise InfeasibleError(f"fixed: {text} != {world} GPUs of the cluster; make the degrees multiply to {world}")
    if world % size:
        raise InfeasibleError(f"fixed: {text} does not divide the {world} GPUs ({world} % {size} = "
                              f"{world % size}); pin degrees whose product divides {world}")


def _check_tp(dims: ModelDims, world: int, domain: int, fixed: dict[str, Any]) -> None:
    tp = fixed.get("tp", 1)
    if tp == 1:
        return
    allowed = list(tp_degrees(dims, domain, world))
    if tp > domain:
        raise InfeasibleError(f"fixed: tp={tp} exceeds the scale-up domain of {domain} GPUs (tp stays on the "
                              f"fastest links); pin tp in {allowed}")
    sizes = {"heads": dims.heads, "kv_heads": dims.kv_heads, "ffn": dims.ffn_hidden, "vocab": dims.vocab}
    bad = [f"{k} ({v})" for k, v in sizes.items() if v % tp]
    if bad:
        raise InfeasibleError(f"fixed: tp={tp} does not divide {', '.join(bad)}; every projection must shard "
                              f"evenly: pin tp in {allowed}")


def _check_experts(dims: ModelDims, name: str, fixed: dict[str, Any], runtime: frozenset[str]) -> None:
    ep = fixed.get("ep", 1)
    if ep == 1:
        return
    if not dims.experts:
        raise InfeasibleError(f"fixed: ep={ep} needs a model with experts; {name} has none; leave ep unset or 1")
    if dims.experts % ep:
        raise InfeasibleError(f"fixed: ep={ep} does not divide the {dims.experts} experts of {name}; pin a "
                              f"divisor of {dims.experts}")
    if "dp" in fixed and EP_OVER_CP not in runtime and fixed["dp"] % ep:
        raise InfeasibleError(f"fixed: ep={ep} does not divide dp={fixed['dp']}; expert ranks are taken from "
                              "the data-parallel ranks: pin dp to a multiple of ep (Megatron-Core also folds ep "
                              "over the tp ranks: --software megatron-core-2024 plans for that program)")


def _check_sequence(seq_len: int, fixed: dict[str, Any]) -> None:
    cp, tp = fixed.get("cp", 1), fixed.get("tp", 1)
    if cp == 1:
        return
    if seq_len // cp < MIN_CP_TOKENS:
        raise InfeasibleError(f"fixed: cp={cp} leaves {seq_len // cp} tokens per rank of the {seq_len}-token "
                              f"sequence; a rank keeps at least {MIN_CP_TOKENS}: pin cp <= "
                              f"{max(1, seq_len // MIN_CP_TOKENS)} or a longer sequence")
    if seq_len % (cp * tp):
        raise InfeasibleError(f"fixed: cp({cp}) * tp({tp}) = {cp * tp} does not divide seq_len {seq_len}; "
                              "pin degrees whose product divides the sequence")


def _check_layers(dims: ModelDims, name: str, fixed: dict[str, Any]) -> None:
    pp, vp = fixed.get("pp", 1), fixed.get("vp", 1)
    if pp > dims.layers:
        raise InfeasibleError(f"fixed: pp={pp} exceeds the {dims.layers} layers of {name}; a stage holds at "
                              f"least one layer: pin pp <= {dims.layers}")
    # a chunk holds a layer, except chunk 0 and the last (the embedding or the head alone; solver/stages.py)
    if vp > 1 and 2 * vp > dims.layers + 2:
        raise InfeasibleError(f"fixed: vp={vp} needs at least pp(2) * vp({vp}) - 2 = {2 * vp - 2} layers but {name} "
                              f"has {dims.layers}; pin vp <= {(dims.layers + 2) // 2}")
    if vp > 1 and pp * vp > dims.layers + 2:
        raise InfeasibleError(f"fixed: pp({pp}) * vp({vp}) = {pp * vp} chunks but {name} has {dims.layers} "
                              "layers; a chunk holds at least one layer (the first and last chunk may hold only "
                              "the embedding or the head): pin a smaller pp or vp")


def _check_batch(global_batch: int, fixed: dict[str, Any]) -> None:
    dp, mb, n = fixed.get("dp"), fixed.get("micro_batch"), fixed.get("num_microbatches")
    for key, value in (("dp", dp), ("micro_batch", mb), ("num_microbatches", n)):
        if value is not None and global_batch % value:
            raise InfeasibleError(f"fixed: {key}={value} does not divide the global batch {global_batch} "
                                  f"({global_batch} % {value} = {global_batch % value}); pin a divisor of "
                                  f"{global_batch}")
    pinned = {k: v for k, v in (("dp", dp), ("micro_batch", mb), ("num_microbatches", n)) if v is not None}
    size = prod(pinned.values())
    text = " * ".join(f"{k}({v})" for k, v in pinned.items())
    if len(pinned) == 3 and size != global_batch:
        raise InfeasibleError(f"fixed: {text} = {size} != global batch {global_batch}; the three must multiply "
                              "to the global batch")
    if len(pinned) == 2 and global_batch % size:
        raise InfeasibleError(f"fixed: {text} = {size} does not divide the global batch {global_batch}; pin "
                              f"values whose product divides {global_batch}")
