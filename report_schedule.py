"""The pipeline schedule of a plan as a timeline: which micro-batch each pipeline rank runs when,
forward (F), backward (B, or B then W for zero-bubble) and the idle time between (the bubble).

The orders are the published ones, one list of operations per rank, and a list-scheduling pass
starts each operation when its rank is free and its inputs exist (F of chunk c after F of chunk
c - 1; B of chunk c after B of chunk c + 1 and its own F; W after its B):
* GPipe (Huang et al. 2019): every forward, then every backward.
* 1F1B (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2): rank r warms up with p - r - 1 forwards,
  then alternates one forward and one backward, then drains the backwards.
* interleaved 1F1B (same paper, sec. 2.2): v chunks per rank (chunk c on rank c % p), micro-batches
  in groups of p per chunk, (p - r - 1) * 2 + (v - 1) * p warm-up forwards (Megatron-Core's order).
* zero bubble ZB-H1 (Qi et al. 2023, arXiv:2401.10241, fig. 3): 1F1B with each backward split into
  input (B) and weight (W) gradients; rank r defers p - r - 1 of its W into the drain, where 1F1B idles.
Durations: a layer's forward is one unit, its backward two (B and W one each) plus one more when it
is fully recomputed; the unit is set so that the slowest rank's work equals the plan's predicted
compute time. The picture shows the order and the shape of the bubble; the plan's bubble number is
the cost model's (``cost_model.pipeline``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import Plan, Recompute, Schedule


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    kind: str  # "F", "B" or "W"
    chunk: int  # global chunk index: c runs on pipeline rank c % pp
    microbatch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    rank: int
    op: Op
    start_s: float
    end_s: float


def _order_1f1b(rank: int, p: int, m: int, chunk: int, split_w: bool) -> list[Op]:
    warm = min(p - rank - 1, m)
    ops = [Op(kind="F", chunk=chunk, microbatch=i) for i in range(warm)]
    deferred: list[Op] = []
    for i in range(m):
        if warm + i < m:
            ops.append(Op(kind="F", chunk=chunk, microbatch=warm + i))
        ops.append(Op(kind="B", chunk=chunk, microbatch=i))
        if split_w:
            w = Op(kind="W", chunk=chunk, microbatch=i)
            (deferred if len(deferred) < p - rank - 1 and i < m - 1 else ops).append(w)
    return ops + deferred


def _order_interleaved(rank: int, p: int, v: int, m: int) -> list[Op]:
    def sequence(kind: str, reverse: bool) -> list[Op]:
        out = []
        for group in range(0, m, p):
            for vs in range(v):
                chunk = (v - 1 - vs if reverse else vs) * p + rank
                out += [Op(kind=kind, chunk=chunk, microbatch=mb) for mb in range(group, min(group + p, m))]
        return out

    forwards, backwards = sequence("F", False), sequence("B", True)
    warm = min((p - rank - 1) * 2 + (v - 1) * p, m * v)
    ops = forwards[:warm]
    for i in range(m * v):
        if warm + i < m * v:
            ops.append(forwards[warm + i])
        ops.append(backwards[i])
    return ops


def orders(plan: Plan) -> list[list[Op]]:
    """The operations of each pipeline rank, in the order the plan's schedule runs them."""
    p, v, m = plan.mesh.pp, plan.vp, plan.num_microbatches
    if plan.schedule == Schedule.INTERLEAVED_1F1B and v > 1:
        return [_order_interleaved(r, p, v, m) for r in range(p)]
    if plan.schedule == Schedule.GPIPE:
        return [[Op(kind=k, chunk=r, microbatch=i) for k in "FB" for i in range(m)] for r in range(p)]
    return [_order_1f1b(r, p, m, r, plan.schedule == Schedule.ZERO_BUBBLE) for r in range(p)]


def _durations(plan: Plan, split_w: bool) -> dict[tuple[str, int], float]:
    """Units of each (kind, chunk), before scaling to seconds."""
    stages = plan.stages or ((0, plan.layers or 1),)
    out = {}
    for c, (first, last) in enumerate(stages):
        layers = last - first
        full = sum(1 for r in plan.recompute[first:last] if r == Recompute.FULL)
        out["F", c] = float(layers)
        out["B", c] = float(layers + full) if split_w else float(2 * layers + full)
        out["W", c] = float(layers)
    return out


def timeline(plan: Plan) -> list[Block]:
    """Every operation of one step on every pipeline rank, with start and end in seconds."""
    p = plan.mesh.pp
    ops = orders(plan)
    units = _durations(plan, plan.schedule == Schedule.ZERO_BUBBLE)
    chunks = len(plan.stages) or 1
    busiest = max(sum(units[o.kind, o.chunk] for o in rank_ops) for rank_ops in ops)
    compute_s = plan.prediction.time_s["compute"] if plan.prediction else float(busiest)
    scale = compute_s / busiest
    done: dict[Op, float] = {}
    free = [0.0] * p
    nxt = [0] * p
    blocks: list[Block] = []
    while len(blocks) < sum(len(o) for o in ops):
        progressed = False
        for r in range(p):
            while nxt[r] < len(ops[r]):
                op = ops[r][nxt[r]]
                deps = _deps(op, chunks)
                if any(d not in done for d in deps):
                    break
                start = max([free[r], *(done[d] for d in deps)])
                end = start + units[op.kind, op.chunk] * scale
                done[op], free[r] = end, end
                blocks.append(Block(rank=r, op=op, start_s=start, end_s=end))
                nxt[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {plan.schedule} order deadlocks at {[o[n] for o, n in zip(ops, nxt)]}")
    return blocks


def _deps(op: Op, chunks: int) -> list[Op]:
    c, mb = op.chunk, op.microbatch
    if op.kind == "F":
        return [Op(kind="F", chunk=c - 1, microbatch=mb)] if c > 0 else []
    if op.kind == "W":
        return [Op(kind="B", chunk=c, microbatch=mb)]
    after = [Op(kind="B", chunk=c + 1, microbatch=mb)] if c + 1 < chunks else []
    return [Op(kind="F", chunk=c, microbatch=mb), *after]


def idle(blocks: list[Block], ranks: int) -> list[tuple[int, float, float]]:
    """(rank, start, end) of every gap in a rank's work before the step ends (the bubble)."""
    end = max(b.end_s for b in blocks)
    gaps = []
    for r in range(ranks):
        t = 0.0
        for b in sorted((b for b in blocks if b.rank == r), key=lambda b: b.start_s):
            if b.start_s > t + 1e-12:
                gaps.append((r, t, b.start_s))
            t = b.end_s
        if end > t + 1e-12:
            gaps.append((r, t, end))
    return gaps
