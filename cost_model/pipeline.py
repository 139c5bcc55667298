"""Pipeline parallelism: which layers each pipeline rank runs, the bubble, and in-flight micro-batches.

``plan.stages`` lists ``pp * vp`` layer ranges ``[first, last)``; chunk c runs on pipeline rank
``c % pp`` (Megatron's interleaving). The embedding is on the first chunk (rank 0), the output
layer and loss on the last; either may hold no layer at all (``solver/stages.py``: Llama 3.1 405B's
126 layers on pp 16 x vp 8), so ranks may hold different layer counts and are costed one by one.

Bubble as a fraction of the ideal time ``m * t`` (m micro-batches of t seconds each on the slowest
rank; Narayanan et al. 2021, arXiv:2104.04473, sec. 2.2):

* GPipe and 1F1B (PipeDream-Flush): ``(p - 1) / m``;
* interleaved 1F1B with v chunks per rank: ``(p - 1) / (v * m)``;
* zero-bubble: Qi et al. 2023 (arXiv:2401.10241) ZB-H1 splits the backward into input and weight
  gradients and cuts 1F1B's bubble to about a third, at 1F1B's memory: ``(p - 1) / (3 * m)``.

With uneven stages (the embedding on the first rank, the output layer and loss on the last) the
slowest rank k sets the pace, and the bubble is the other ranks' warm-up and cool-down: the
first micro-batch's forward reaches k through the ranks before it, the last one's backward
leaves through them, and the ranks after k add their share of both. With t_r the time of one
micro-batch (forward and backward) on rank r the step is ``(m - 1) * t_k + sum_r t_r`` (the
latency of a pipeline of unequal stages; DAPPLE, Fan et al. 2021, arXiv:2007.01045, sec. 4), so
the bubble is ``sum_{r != k} t_r``, divided by v under interleaving and scaled like the even
case under zero bubble. With even stages this is ``(p - 1) * t``, Narayanan's formula.

Activations in flight (Narayanan sec. 2.2.1; Korthikanti et al. 2022 sec. 4.2.3): under 1F1B and
ZB-H1 pipeline rank r holds ``min(p - r, m)`` micro-batches, the first rank the most; interleaving
multiplies that by ``1 + (p - 1)/(p * v)``; GPipe holds all m. Without a pipeline, gradient
accumulation runs the micro-batches one after another and holds one.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..ir.plan import Plan, Schedule

BUBBLE_SHARE = {Schedule.GPIPE: 1.0, Schedule.ONE_F_ONE_B: 1.0, Schedule.INTERLEAVED_1F1B: 1.0,
                Schedule.ZERO_BUBBLE: 1.0 / 3.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLayers:
    """The layers one pipeline rank runs, counted by recomputation kind."""

    rank: int
    none: int = 0
    selective: int = 0
    full: int = 0
    offload: int = 0  # layers whose saved activations go to host memory (``Recompute.OFFLOAD``)
    first: bool = False  # holds the embedding
    last: bool = False  # holds the output layer and loss

    @property
    def layers(self) -> int:
        return self.none + self.selective + self.full + self.offload

    @property
    def kind(self) -> tuple:
        """What sets the rank's time and memory: everything but its index (ranks of one kind are costed once)."""
        return self.none, self.selective, self.full, self.offload, self.first, self.last


def rank_layers(plan: Plan, layers: int) -> tuple[RankLayers, ...]:
    """One entry per pipeline rank."""
    return _rank_layers(plan.mesh.pp, plan.stages or ((0, layers),), plan.recompute or ("none",) * layers)


@lru_cache(maxsize=4096)
def _rank_layers(pp: int, stages: tuple[tuple[int, int], ...], recompute: tuple[str, ...]) -> tuple[RankLayers, ...]:
    counts = [[0, 0, 0, 0] for _ in range(pp)]
    for chunk, (first, last) in enumerate(stages):
        row, part = counts[chunk % pp], recompute[first:last]
        selective, full, offload = part.count("selective"), part.count("full"), part.count("offload")
        row[0] += len(part) - selective - full - offload
        row[1] += selective
        row[2] += full
        row[3] += offload
    last_rank = (len(stages) - 1) % pp
    return tuple(RankLayers(rank=r, none=c[0], selective=c[1], full=c[2], offload=c[3], first=r == 0,
                            last=r == last_rank) for r, c in enumerate(counts))


def bubble_s(schedule: Schedule, vp: int, microbatch_s: Sequence[float]) -> float:
    """Idle time of the pipeline per step, given each pipeline rank's time per micro-batch: the
    other ranks' times besides the slowest one's (see the module docstring)."""
    if len(microbatch_s) <= 1:
        return 0.0
    return BUBBLE_SHARE[Schedule(schedule)] * (sum(microbatch_s) - max(microbatch_s)) / vp


def inflight_microbatches(schedule: Schedule, pp: int, vp: int, microbatches: int, rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak."""
    if pp <= 1:
        return 1.0
    if schedule == Schedule.GPIPE:
        return float(microbatches)
    held = float(min(pp - rank, microbatches))
    if schedule == Schedule.INTERLEAVED_1F1B:
        held *= 1.0 + (pp - 1) / (pp * vp)
    return held
