"""The search space: every strategy the solver may choose, as plain values.

A *candidate* fixes the discrete, non-additive choices — the mesh (tp inside a scale-up domain,
dp over the rest), the ZeRO stage over dp, sequence parallelism and the micro-batch size. What is
additive over layers (how many layers recompute, and how) is left to the ILP (``ilp.py``).

Divisibility rules, so that every candidate is one the runtime can execute:
``tp`` divides the attention heads, the key/value heads, the FFN width and the vocabulary (column-
and row-sharded projections split those dims evenly); ``tp`` stays inside one node;
``micro_batch * num_microbatches * dp = global_batch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir import InfeasibleError, ModelDims, PlanError

ZERO_STAGES = (0, 2, 3)  # what the runtime executes today (ZeRO-1 is planned: issue "runtime")
FIXED_KEYS = ("tp", "dp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "num_microbatches", "recompute",
              "schedule", "vp")
MAX_MICROBATCHES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    tp: int
    dp: int
    zero: int
    sp: bool
    micro_batch: int
    num_microbatches: int

    @property
    def group(self) -> tuple[int, int, int, bool]:
        """Candidates of one group differ only in micro-batching."""
        return (self.tp, self.dp, self.zero, self.sp)

    def describe(self) -> str:
        sp = "+sp" if self.sp else ""
        return (f"tp={self.tp}{sp} dp={self.dp} zero-{self.zero} "
                f"micro-batch {self.micro_batch}x{self.num_microbatches}")


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def check_fixed(fixed: dict[str, Any] | None) -> dict[str, Any]:
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(FIXED_KEYS))
    if unknown:
        raise PlanError(f"fixed: unknown choice(s) {unknown}; pin among {list(FIXED_KEYS)}")
    for key in ("pp", "cp", "ep", "vp"):
        if fixed.get(key, 1) != 1:
            raise PlanError(f"fixed: {key}={fixed[key]} is not searched yet (only tp, dp, zero, sp, micro-batching "
                            f"and recompute are); leave {key} unset or 1")
    if "zero" in fixed and fixed["zero"] not in ZERO_STAGES:
        raise PlanError(f"fixed: zero={fixed['zero']!r}; the runtime executes ZeRO stages {ZERO_STAGES}")
    if "recompute" in fixed and fixed["recompute"] not in ("none", "selective", "full"):
        raise PlanError(f"fixed: recompute={fixed['recompute']!r}; expected none, selective or full")
    return fixed


def tp_degrees(dims: ModelDims, gpus_per_node: int, world: int) -> tuple[int, ...]:
    """tp degrees that shard every projection evenly and stay inside a node."""
    ok = []
    for tp in divisors(min(gpus_per_node, world)):
        if all(x % tp == 0 for x in (dims.heads, dims.kv_heads, dims.ffn_hidden, dims.vocab)) and world % tp == 0:
            ok.append(tp)
    return tuple(ok)


def candidates(dims: ModelDims, *, world: int, gpus_per_node: int, global_batch: int, seq_len: int,
               fixed: dict[str, Any]) -> tuple[Candidate, ...]:
    """Every candidate allowed by the divisibility rules and the pinned choices."""
    out = []
    for tp in tp_degrees(dims, gpus_per_node, world):
        dp = world // tp
        if global_batch % dp or fixed.get("tp", tp) != tp or fixed.get("dp", dp) != dp:
            continue
        if dims.experts and tp > 1:
            continue  # MoE blocks run data-parallel only until expert parallelism lands
        for zero in ZERO_STAGES:
            if fixed.get("zero", zero) != zero or (zero and dp == 1):
                continue
            for sp in ((False, True) if tp > 1 and seq_len % tp == 0 else (False,)):
                if fixed.get("sp", sp) != sp:
                    continue
                out.extend(_micro_batchings(tp, dp, zero, sp, global_batch // dp, fixed))
    return tuple(out)


def _micro_batchings(tp: int, dp: int, zero: int, sp: bool, per_rank: int, fixed: dict[str, Any]) -> list[Candidate]:
    out = []
    for mb in divisors(per_rank):
        n = per_rank // mb
        if n > MAX_MICROBATCHES and "micro_batch" not in fixed:
            continue
        if fixed.get("micro_batch", mb) != mb or fixed.get("num_microbatches", n) != n:
            continue
        out.append(Candidate(tp=tp, dp=dp, zero=zero, sp=sp, micro_batch=mb, num_microbatches=n))
    return out


def explain_empty(dims: ModelDims, *, world: int, gpus_per_node: int, global_batch: int,
                  fixed: dict[str, Any]) -> InfeasibleError:
    """Why no candidate exists at all (before memory is even considered)."""
    tps = tp_degrees(dims, gpus_per_node, world)
    dps = sorted({world // tp for tp in tps})
    return InfeasibleError(
        f"no strategy divides the work: {world} GPUs allow tp in {list(tps)} (tp must divide heads "
        f"({dims.heads}), kv_heads ({dims.kv_heads}), ffn ({dims.ffn_hidden}) and vocab ({dims.vocab}) and stay "
        f"within {gpus_per_node} GPUs per node), so dp in {dps}, but the global batch {global_batch} must divide by dp"
        + (f" and the pinned choices {fixed} must hold" if fixed else "")
        + "; change the global batch or the GPU count")
