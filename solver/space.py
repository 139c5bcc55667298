"""The search space: every strategy the solver may choose, as plain values.

A *candidate* fixes the discrete, non-additive choices: the mesh (pp, dp, cp, tp, ep), the ZeRO
stage over dp, sequence parallelism, the micro-batch size and count, the pipeline schedule with
its virtual stages and stage boundaries. What is additive over layers (how many layers of each
pipeline stage recompute, and how) is left to the integer program (``ilp.py``).

Rules, so that every candidate is one the runtime can execute and the topology respects:

* ``tp`` divides heads, key/value heads, FFN width and vocabulary, and stays inside a node;
  with ``tp > 1`` sequence parallelism is on unless pinned off: it moves the same bytes as plain
  TP (an all-gather + reduce-scatter per all-reduce) and stores ``1/tp`` of the norm and dropout
  activations (Korthikanti et al. 2022, sec. 4.2.2), so plain TP never wins on our cost model.
* ``cp`` splits the sequence; a rank keeps at least ``MIN_CP_TOKENS`` tokens. ZeRO shards over the
  dp x cp ranks (every one sees other tokens), so it needs ``dp * cp > 1``; beside pp each rank cuts its
  tokens before the schedule (``CP_WITH_PP``); beside ep an expert shard is data-parallel over edp x cp
  (``CP_WITH_EP``; ep itself is taken from dp alone, ``EP_OVER_CP`` is Megatron's).
* ``ep`` divides the experts and ``dp * cp`` (Megatron-Core folds experts inside data parallelism);
  under pipelining each stage's experts are split over the ep ranks of that stage (``EP_WITH_PP``).
* ``pp * vp <= layers``; interleaving needs the micro-batch count to divide by ``pp``; 1F1B needs at
  least ``pp`` micro-batches and zero bubble a count that splits into rounds of ``pp`` (torch's
  schedules). Under pipelining the runtime has no ZeRO-1 (DDP breaks under
  ``torch.distributed.pipelining``) and no ZeRO-3 with zero bubble (FSDP2's resharding after
  forward loses the deferred weight gradients): ``ZERO1_WITH_PP``, ``ZERO3_WITH_ZB``.
* ``micro_batch * num_microbatches * dp = global_batch``; micro-batches of at most
  ``MAX_MICRO_BATCH_TOKENS`` tokens per rank (one sequence at least) unless pinned. A GEMM of 128K rows
  is 512 rows of the 256 x 128 output tiles the presets' ``matmul_tile_elems`` describe, so rounding it
  to whole waves costs under 0.2%; a larger micro-batch saves only the fixed cost per kernel and adds
  activation memory. (The bound was 8 sequences, which left out the plans llm-foundry runs small
  models with at short sequences: MPT-125m at 512 tokens in micro-batches of 128, 64K tokens; then 64K
  tokens, which left out its MPT-125m at 2048 tokens in micro-batches of 40, 80K tokens.)

``RUNTIME`` names what the runtime executes today; the search offers nothing else. ``tp_replicate``:
inside a tp block the intra-op program (``intra_op.py``) may keep a sublayer's linears replicated
(codegen/tp_plans.py runs them as plain modules on the whole stream). ``sp_whole_attn``: it may do so for the
attention under sequence parallelism too, where ``PrepareModuleInputOutput`` gathers the attention's input and
cuts its one output; not on a model whose attention returns a tuple (Hugging Face's, ``api.offered``), whose
attention then stays split over tp under sp.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from itertools import product
from typing import Any

import sympy

from ..cost_model import TierKind
from ..ir import InfeasibleError, Mesh, ModelDims, PlanError, Schedule, limits

ZERO1_WITH_TP = "zero1_tp"  # ZeRO-1 beside tensor parallelism (the runtime's ZeRO-1 is DDP + ZeroRedundancyOptimizer)
ZERO1_WITH_EP = "zero1_ep"  # ZeRO-1 beside expert parallelism (DDP would mix the expert shards of all dp ranks)
EP_WITH_PP = "ep_pp"  # expert parallelism beside pipeline parallelism
ZERO1_WITH_PP = "zero1_pp"  # ZeRO-1 (DDP + ZeroRedundancyOptimizer) beside pipeline parallelism
ZERO3_WITH_ZB = "zero3_zb"  # ZeRO-3 under the zero-bubble schedule
EP_OVER_CP = "ep_cp"  # ep ranks taken from cp as well as dp (the runtime folds ep inside dp only)
EP_OVER_TP = "ep_tp"  # ep ranks taken from tp too, experts whole (Megatron-Core's MoE folding, ETP 1; ir.Mesh.ep_over_tp)
CP_WITH_PP = "cp_pp"  # context parallelism beside pipeline parallelism
CP_WITH_EP = "cp_ep"  # context parallelism beside expert parallelism
OFFLOAD = "offload"  # a layer's saved activations kept in host memory (Recompute.OFFLOAD)
OFFLOAD_WITH_TP = "offload_tp"  # offloading beside tensor parallelism (the runtime keeps DTensors on the GPU)
OFFLOAD_WITH_PP = "offload_pp"  # offloading under pipelining (Megatron-Core: "no support for Pipeline parallelism
OFFLOAD_WITH_RECOMPUTE = "offload_rc"  # with CPU offloading"); offloading beside recomputation (Megatron-Core:
# "CPU offloading does not work when activation recomputation is enabled", TransformerConfig.__post_init__)
RUNTIME = frozenset({"tp", "sp", "zero1", "zero2", "zero3", "moe_tp", "ep", "pp", "cp", "hsdp",
                     "tp_replicate", "sp_whole_attn", "gpipe", "zero_bubble", "offload", "offload_pp",
                     "offload_rc", EP_WITH_PP, CP_WITH_PP, CP_WITH_EP})  # grows with it
# What Megatron-Core runs (plans costed for its presets, ``plan --software``): TP with SP, the distributed
# optimizer (ZeRO-1) beside every other axis, Megatron-FSDP as ZeRO-3, EP (with TP for the experts, or folded
# over the tp ranks with the experts whole), PP
# with 1F1B and interleaved 1F1B, CP beside all of them, activation offloading (--cpu-offloading-num-layers);
# not ZeRO-2, HSDP, GPipe or zero-bubble.
MEGATRON = frozenset({"tp", "sp", "zero1", "zero3", "moe_tp", "ep", "pp", "cp", ZERO1_WITH_TP, ZERO1_WITH_EP,
                      EP_WITH_PP, ZERO1_WITH_PP, EP_OVER_CP, EP_OVER_TP, CP_WITH_PP, CP_WITH_EP, OFFLOAD,
                      OFFLOAD_WITH_TP})
FIXED_KEYS = ("tp", "dp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "num_microbatches", "recompute",
              "schedule", "vp", "fold_ep", "zero_group")
MAX_MICROBATCHES = 1024  # Megatron runs go to 512 per step (GPT-1T: global batch 512, dp 1, micro-batch 1)
MAX_MICRO_BATCH_TOKENS = 131072
MIN_CP_TOKENS = 1024
# virtual stages per pipeline rank the search offers: the interleavings published Megatron runs use (GPT-3 175B: vp 12
# in MLPerf Training v3.x, 6 in v4.1; Llama 3.1 405B: 8; Llama 3 70B: 5; Qwen3-235B: 3 and 12), kept where pp x vp
# chunks fit the layers (_schedules)
VIRTUAL_STAGES = (2, 3, 4, 5, 6, 8, 12)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    pp: int = 1
    dp: int
    cp: int = 1
    tp: int
    ep: int = 1
    zero: int
    sp: bool
    micro_batch: int
    num_microbatches: int
    schedule: Schedule = Schedule.ONE_F_ONE_B
    vp: int = 1
    zero_group: int = 0  # HSDP: ZeRO-2/3 inside groups of this many dp ranks (within or across nodes); 0 = all of dp
    fold_ep: bool = False  # the ep group over tp ranks where ep divides dp * cp too (ir.Mesh.fold_ep; EP_OVER_TP)

    @property
    def group(self) -> tuple:
        """Candidates of one group differ only in micro-batching and schedule."""
        return (self.pp, self.dp, self.cp, self.tp, self.ep, self.zero, self.sp, self.zero_group, self.fold_ep)

    def describe(self) -> str:
        parts = [f"{a}={getattr(self, a)}" for a in ("pp", "dp", "cp", "tp", "ep") if getattr(self, a) > 1]
        mesh = " ".join(parts) + (" (ep over tp)" if self.fold_ep else "") or "1 GPU"
        pipe = f" {self.schedule}" + (f" vp={self.vp}" if self.vp > 1 else "") if self.pp > 1 else ""
        return (f"{mesh}{' +sp' if self.sp else ''} zero-{self.zero}"
                + (f" hsdp={self.zero_group}" if self.zero_group else "") + " "
                f"micro-batch {self.micro_batch}x{self.num_microbatches}{pipe}")


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending, from its prime factorization (``sympy.divisors``): well under a
    millisecond for any size ``ir/limits.py`` lets through, where trial division up to sqrt(n) spun
    without end on a mistyped cluster of 10^20 GPUs."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise PlanError(f"divisors: expected a positive integer, got {n!r}")
    return tuple(sympy.divisors(int(n)))


def zero_stages(runtime: frozenset[str] = RUNTIME) -> tuple[int, ...]:
    return (0,) + tuple(z for z in (1, 2, 3) if f"zero{z}" in runtime)


def check_fixed(fixed: dict[str, Any] | None, runtime: frozenset[str] = RUNTIME) -> dict[str, Any]:
    if fixed is not None and not isinstance(fixed, dict):
        raise PlanError(f"fixed must be a dict of pinned choices, got {type(fixed).__name__}; e.g. {{'tp': 2}}")
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(FIXED_KEYS), key=str)
    if unknown:
        raise PlanError(f"fixed: unknown choice(s) {unknown}; pin among {list(FIXED_KEYS)}")
    limits.check_pins(fixed)  # every pinned degree and count a positive int within its limit
    for key in ("sp", "fold_ep"):
        if key in fixed and not isinstance(fixed[key], bool):
            raise PlanError(f"fixed: {key}={fixed[key]!r}; expected True or False")
    if fixed.get("fold_ep") and EP_OVER_TP not in runtime:
        raise PlanError("fixed: fold_ep=True, but this program splits each expert over the tp ranks (the runtime "
                        "does); folding the ep group over tp with the experts whole is Megatron-Core's "
                        "--expert-tensor-parallel-size 1: plan with --software megatron-core-2024 (or another "
                        "Megatron-Core preset), or leave fold_ep unset")
    if fixed.get("sp") and fixed.get("tp") == 1:
        raise PlanError("fixed: sp=True with tp=1; sequence parallelism splits the sequence over the tp ranks, "
                        "so sp needs tp > 1: pin tp > 1 or leave sp unset")
    for key in ("pp", "cp", "ep"):
        if fixed.get(key, 1) != 1 and key not in runtime:
            raise PlanError(f"fixed: {key}={fixed[key]}, but the runtime cannot execute {key} > 1 yet; "
                            f"leave {key} unset or 1")
    if "zero" in fixed and (isinstance(fixed["zero"], bool) or fixed["zero"] not in zero_stages(runtime)):
        raise PlanError(f"fixed: zero={fixed['zero']!r}; the runtime executes ZeRO stages {zero_stages(runtime)}")
    _check_zero_group_pin(fixed, runtime)
    if "recompute" in fixed and fixed["recompute"] not in ("none", "selective", "full", OFFLOAD):
        raise PlanError(f"fixed: recompute={fixed['recompute']!r}; expected none, selective, full or offload")
    if fixed.get("recompute") == OFFLOAD and OFFLOAD not in runtime:
        raise PlanError("fixed: recompute=offload, but this program does not offload activations to host memory; "
                        "pin none, selective or full")
    if fixed.get("recompute") == OFFLOAD and fixed.get("tp", 1) != 1 and OFFLOAD_WITH_TP not in runtime:
        raise PlanError(f"fixed: recompute=offload with tp={fixed['tp']}, but the runtime offloads activations "
                        "without tensor parallelism only (its DTensors stay on the GPU); pin tp=1 or another recompute")
    if "schedule" in fixed:
        try:
            fixed["schedule"] = Schedule(fixed["schedule"])
        except ValueError:
            raise PlanError(f"fixed: schedule={fixed['schedule']!r}; expected one of "
                            f"{[str(s) for s in Schedule]}") from None
    _check_pipeline_pins(fixed, runtime)
    _check_context_pins(fixed, runtime)
    return fixed


def _check_zero_group_pin(fixed: dict[str, Any], runtime: frozenset[str]) -> None:
    """``zero_group``: 0 shards ZeRO-2/3 over all of dp (what Megatron-FSDP and DeepSpeed run), g > 1 over HSDP
    groups of g dp ranks (``ir.Plan.zero_group``), where the program runs them."""
    if "zero_group" not in fixed:
        return
    zg = fixed["zero_group"]
    if isinstance(zg, bool) or not isinstance(zg, int) or zg < 0 or zg == 1:
        raise PlanError(f"fixed: zero_group={zg!r}; expected 0 (shard over all of dp) or a shard group of g > 1 "
                        "data-parallel ranks")
    if zg and "hsdp" not in runtime:
        raise PlanError(f"fixed: zero_group={zg}, but this program shards ZeRO state over all of dp only (no HSDP "
                        "groups): pin zero_group 0 or leave it unset")
    if zg and fixed.get("zero") in (0, 1):
        raise PlanError(f"fixed: zero_group={zg} with zero={fixed['zero']}; HSDP groups shard ZeRO-2/3 state: "
                        "pin zero 2 or 3, or leave zero_group unset")
    if zg and "dp" in fixed and (zg >= fixed["dp"] or fixed["dp"] % zg):
        raise PlanError(f"fixed: zero_group={zg} with dp={fixed['dp']}; a shard group must be smaller than dp and "
                        "divide it: pin a divisor of dp, or 0")


def _check_context_pins(fixed: dict[str, Any], runtime: frozenset[str]) -> None:
    """Pinned combinations the runtime cannot split the sequence with, said before the search finds nothing."""
    for key, rule in (("pp", CP_WITH_PP), ("ep", CP_WITH_EP)):
        if fixed.get("cp", 1) > 1 and fixed.get(key, 1) > 1 and rule not in runtime:
            raise PlanError(f"fixed: cp={fixed['cp']} with {key}={fixed[key]}; the runtime has no context "
                            f"parallelism beside {key} yet; pin cp=1 or {key}=1")


def _check_pipeline_pins(fixed: dict[str, Any], runtime: frozenset[str]) -> None:
    """Pinned combinations the runtime cannot pipeline, said before the search finds nothing."""
    if fixed.get("vp", 1) > 1:
        if fixed.get("pp") == 1:
            raise PlanError(f"fixed: vp={fixed['vp']} with pp=1; virtual stages interleave the chunks of "
                            "pipeline ranks, so vp needs pp > 1: pin pp > 1 or leave vp unset")
        if fixed.get("schedule", Schedule.INTERLEAVED_1F1B) != Schedule.INTERLEAVED_1F1B:
            raise PlanError(f"fixed: vp={fixed['vp']} with schedule={fixed['schedule']}; only "
                            f"{Schedule.INTERLEAVED_1F1B} runs virtual stages: pin that schedule or leave vp unset")
    if fixed.get("schedule") == Schedule.INTERLEAVED_1F1B and fixed.get("vp") == 1:
        raise PlanError(f"fixed: schedule={Schedule.INTERLEAVED_1F1B} with vp=1; interleaving needs vp > 1 "
                        "chunks per pipeline rank: pin vp > 1 or another schedule")
    if fixed.get("schedule") not in (None, Schedule.ONE_F_ONE_B) and fixed.get("pp") == 1:
        raise PlanError(f"fixed: schedule={fixed['schedule']} with pp=1; a pipeline schedule needs pp > 1: "
                        "pin pp > 1 or leave schedule unset")
    if fixed.get("zero") == 1 and fixed.get("pp", 1) > 1 and ZERO1_WITH_PP not in runtime:
        raise PlanError(f"fixed: zero=1 with pp={fixed['pp']}; the runtime has no ZeRO-1 under pipelining "
                        "(DDP breaks under torch.distributed.pipelining); pin zero 0 or 2")
    if fixed.get("zero") == 3 and fixed.get("schedule") == Schedule.ZERO_BUBBLE and ZERO3_WITH_ZB not in runtime:
        raise PlanError("fixed: zero=3 with the zero-bubble schedule; the runtime cannot reshard parameters "
                        "between zero bubble's deferred weight gradients; pin zero 2 or another schedule")


def scale_up_gpus(cluster) -> int:
    """GPUs one scale-up domain joins (the first scale-up tier's, within the world), where tp and
    sharding groups belong; a node where the cluster has no scale-up tier (CPU processes)."""
    tiers = [t for t in cluster.tiers if t.kind == TierKind.SCALE_UP]
    return min(tiers[0].domain_size, cluster.world_size) if tiers else cluster.gpus_per_node


def tp_degrees(dims: ModelDims, domain: int, world: int) -> tuple[int, ...]:
    """tp degrees that shard every projection evenly and stay inside a scale-up domain (a node of 8,
    an NVL72 rack of 72, a TPU slice): ``domain`` GPUs on the fastest links."""
    return tuple(tp for tp in divisors(min(domain, world))
                 if world % tp == 0 and all(x % tp == 0 for x in (dims.heads, dims.kv_heads, dims.ffn_hidden,
                                                                   dims.vocab)))


def _meshes(dims: ModelDims, world: int, domain: int, seq_len: int, fixed: dict, runtime: frozenset):
    """(pp, dp, cp, tp, ep) that multiply to the world and respect the rules above (and ``fold_ep`` where the
    program folds ep over tp ranks by choice: ``EP_OVER_TP``)."""
    for tp in tp_degrees(dims, domain, world):
        if tp > 1 and ("tp" not in runtime or (dims.experts and "moe_tp" not in runtime)):
            continue
        rest = world // tp
        cps = [c for c in divisors(rest) if c == 1 or ("cp" in runtime and seq_len // c >= MIN_CP_TOKENS
                                                       and seq_len % (c * tp) == 0)]
        for cp in cps:
            pps = [p for p in divisors(rest // cp) if p == 1 or ("pp" in runtime and p <= dims.layers
                                                                 and (cp == 1 or CP_WITH_PP in runtime))]
            for pp in pps:
                dp = rest // cp // pp
                for ep in _expert_degrees(dims, dp, cp, pp, runtime, tp):
                    mesh = dict(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep)
                    if all(fixed.get(k, v) == v for k, v in mesh.items()):
                        if not fixed.get("fold_ep", False):
                            yield mesh
                        # Megatron's ETP 1 where ep fits in dp * cp too: each expert whole, tp ranks routing apart
                        if (EP_OVER_TP in runtime and tp > 1 and ep > 1 and (dp * cp) % ep == 0
                                and fixed.get("fold_ep", True)):
                            yield {**mesh, "fold_ep": True}


def _expert_degrees(dims: ModelDims, dp: int, cp: int, pp: int, runtime: frozenset, tp: int = 1) -> list[int]:
    """ep degrees: divisors of the experts and of dp * cp (of dp alone, and without pp, where the
    runtime says so), or of tp * dp * cp where the program folds ep over tp (``EP_OVER_TP``)."""
    if not dims.experts or "ep" not in runtime or (pp > 1 and EP_WITH_PP not in runtime):
        return [1]
    if cp > 1 and CP_WITH_EP not in runtime:
        return [1]
    ranks = (dp * cp if EP_OVER_CP in runtime else dp) * (tp if EP_OVER_TP in runtime else 1)
    return [e for e in divisors(ranks) if dims.experts % e == 0]


def _schedules(pp: int, layers: int, microbatches: int, fixed: dict,
               runtime: frozenset[str] = RUNTIME) -> list[tuple[Schedule, int]]:
    """(schedule, vp) pairs; a pinned vp is offered as given (the search tries ``VIRTUAL_STAGES``)."""
    if pp == 1:
        out = [(Schedule.ONE_F_ONE_B, 1)]
    else:
        out = ([(Schedule.ONE_F_ONE_B, 1)] if microbatches >= pp else []) + (
            [(Schedule.GPIPE, 1)] if "gpipe" in runtime else [])
        if "zero_bubble" in runtime and microbatches % max(1, microbatches // pp) == 0:
            out.append((Schedule.ZERO_BUBBLE, 1))
        if microbatches % pp == 0:
            vps = (fixed["vp"],) if fixed.get("vp", 1) > 1 else VIRTUAL_STAGES
            out += [(Schedule.INTERLEAVED_1F1B, v) for v in vps if pp * v <= layers + 2]  # stages.max_chunks
    return [(s, v) for s, v in out if fixed.get("schedule", s) == s and fixed.get("vp", v) == v]


def candidates(dims: ModelDims, *, world: int, domain: int, global_batch: int, seq_len: int,
               fixed: dict[str, Any], runtime: frozenset[str] = RUNTIME) -> tuple[Candidate, ...]:
    """Every candidate allowed by the rules and the pinned choices."""
    out = []
    for mesh in _meshes(dims, world, domain, seq_len, fixed, runtime):
        if global_batch % mesh["dp"]:
            continue
        sps = (True,) if mesh["tp"] > 1 and seq_len % mesh["tp"] == 0 and "sp" in runtime else (False,)
        if "sp" in fixed:
            sps = (fixed["sp"],) if fixed["sp"] in (True, False) and (not fixed["sp"] or mesh["tp"] > 1) else ()
        if Mesh(**mesh).ep_over_tp:  # ep over tp ranks: each routes its own sequence slice
            sps = tuple(sp for sp in sps if sp)
        zeros = [z for z in zero_stages(runtime) if fixed.get("zero", z) == z
                 and (z == 0 or mesh["dp"] * mesh["cp"] > 1)  # ZeRO shards over dp x cp
                 and not (z == 1 and mesh["tp"] > 1 and ZERO1_WITH_TP not in runtime)
                 and not (z == 1 and mesh["ep"] > 1 and ZERO1_WITH_EP not in runtime)
                 and not (z == 1 and mesh["pp"] > 1 and ZERO1_WITH_PP not in runtime)]
        for zero, sp, zg in product(zeros, sps, _zero_groups(mesh, domain, fixed, runtime)):
            if zg and zero < 2:
                continue
            for mb, n in _micro_batchings(global_batch // mesh["dp"], seq_len // mesh["cp"], fixed):
                for schedule, vp in _schedules(mesh["pp"], dims.layers, n, fixed, runtime):
                    if zero == 3 and schedule == Schedule.ZERO_BUBBLE and ZERO3_WITH_ZB not in runtime:
                        continue
                    out.append(Candidate(**mesh, zero=zero, sp=sp, micro_batch=mb, num_microbatches=n,
                                         schedule=schedule, vp=vp, zero_group=zg))
    return tuple(out)


def _zero_groups(mesh: dict[str, int], domain: int, fixed: dict[str, Any], runtime: frozenset) -> tuple[int, ...]:
    """0 (shard over all of dp), and HSDP shard groups of every size g with 1 < g < dp, g | dp, that fit a
    scale-up domain's data ranks or are a whole number of them: inside a node, or spanning nodes (a group
    of 32 on 64 GPUs, as NeMo Automodel runs Llama 3 70B; the cost model prices the cross-node part on
    the network tier). The runtime: without pp, cp or ep."""
    node = max(1, domain // (mesh["tp"] * mesh["cp"]))
    ok = "hsdp" in runtime and mesh["pp"] == mesh["cp"] == mesh["ep"] == 1
    groups = [g for g in divisors(mesh["dp"]) if 1 < g < mesh["dp"] and (node % g == 0 or g % node == 0)] if ok else []
    out = (0, *groups)
    return tuple(z for z in out if fixed.get("zero_group", z) == z)


def _micro_batchings(per_rank: int, tokens_per_sequence: int, fixed: dict[str, Any]) -> list[tuple[int, int]]:
    """(micro-batch, count) pairs for ``per_rank`` sequences of ``tokens_per_sequence`` tokens on a rank."""
    out = []
    for mb in divisors(per_rank):
        n = per_rank // mb
        too_large = mb > 1 and mb * tokens_per_sequence > MAX_MICRO_BATCH_TOKENS
        if not {"micro_batch", "num_microbatches"} & set(fixed) and (too_large or n > MAX_MICROBATCHES):
            continue
        if fixed.get("micro_batch", mb) == mb and fixed.get("num_microbatches", n) == n:
            out.append((mb, n))
    return out


def explain_empty(dims: ModelDims, *, world: int, domain: int, global_batch: int,
                  fixed: dict[str, Any]) -> InfeasibleError:
    """Why no candidate exists at all (before memory is even considered)."""
    tps = tp_degrees(dims, domain, world)
    return InfeasibleError(
        f"no strategy divides the work: {world} GPUs allow tp in {list(tps)} (tp must divide heads "
        f"({dims.heads}), kv_heads ({dims.kv_heads}), ffn ({dims.ffn_hidden}) and vocab ({dims.vocab}) and stay "
        f"within a scale-up domain of {domain} GPUs), and the global batch {global_batch} must divide by dp"
        + (f"; the pinned choices {fixed} must hold too" if fixed else "")
        + "; change the global batch, the pins or the GPU count")
