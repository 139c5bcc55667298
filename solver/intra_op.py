r"""Per-op tensor-parallel sharding inside a block: Alpa's intra-operator ILP (Zheng et al. 2022,
OSDI, sec. 4.1), over the layouts torch's ParallelStyles can execute.

Each op ``v`` of one block kind picks a strategy ``i`` from a small rule table (``_RULES``):

    linear       replicate  R -> R                       weight R
                 colwise    R -> S(h)                    weight S(0)  (ColwiseParallel)
                 rowwise    S(h) -> R,     all-reduce    weight S(1)  (RowwiseParallel)
                 rowwise-rs S(h) -> S(s),  reduce-scatter (sequence parallel only)
    norm         R -> R, or S(s) -> S(s) under sequence parallelism (SequenceParallel)
    attention    R or S(h) (whole heads per rank), inputs and output alike
    elementwise, view, softmax, param-less matmul: R, S(h), or S(s) (sp), inputs and output alike
    moe leaf, anything else: R

Layouts are over the one tp mesh axis: ``R``; ``S(h)`` split on the feature dim (hidden, heads or
FFN width: the last dim of ``[b, s, h]``, the heads dim of ``[b, s, a, d]``); ``S(s)`` split on the
sequence dim. An input of a strategy is a pair (forward layout, gradient layout): colwise reads
``R`` but hands back a partial gradient ``P``, which Megatron's ``f`` operator all-reduces.

Data: ``c_vi`` compute seconds (forward + backward, from ``cost_model.kernels``, sharded work
divided by tp); ``k_vi`` the strategy's own collectives (forward and backward); ``m_vi`` bytes of
training state (``STATE_BYTES`` per parameter, sharded where the weight is) and saved output
activation; for a producer ``u`` in strategy ``i`` and a consumer interface ``σ = (fwd, grad)``,
``R_uiσ`` the resharding seconds: the forward transition ``out(u,i) -> fwd`` plus the backward
one ``grad -> out(u,i)`` (``_TRANSITION``: all-gather, reduce-scatter, all-reduce, all-to-all, or
a free slice R -> S). Times come from ``collective_time`` over ``tp`` neighbouring ranks.

Variables:

    x_vi ∈ {0, 1}     op v uses strategy i
    r_uiσ ∈ {0, 1}    u's output, in strategy i, is resharded once to interface σ; every
                      consumer asking for σ shares it (one all-gather feeds wq, wk and wv)

Constraints:

    Σ_i x_vi = 1                                            ∀v      (add_one_strategy)
    x_ui + x_vj ≤ 1     where out(u,i) -> fwd(v,j) is not executable  (add_executable_edges)
    r_uiσ ≥ x_ui + x_vj − 1   ∀ edge u->v, j with σ(v,j) = σ          (add_resharding)
    Σ_vi m_vi·x_vi ≤ M                                               (add_memory_limit)

Objective (add_objective), in integer nanoseconds (``TIME_SCALE``; memory in KiB, ``MEMORY_SCALE``):

    min Σ_vi (c_vi + k_vi)·x_vi + Σ_uiσ R_uiσ·r_uiσ

Structurally identical layers share ``Block.kind`` (``frontend/blocks.py``): the program is built
for the first block of a kind and its answer applies to all ``count`` of them, so its size does not
grow with depth; the kind's time is ``count`` times the block's. The block's input and output are
the residual stream, fixed at ``S(s)`` under sequence parallelism and ``R`` otherwise, so that layer
``n``'s output is layer ``n+1``'s input. Executable forward transitions (``RUNTIME_TRANSITIONS``)
are those the styles perform at a module boundary: ``S(s) -> R`` (PrepareModuleInput, or the
all-gather inside ColwiseParallel) and ``R -> S(s)`` (PrepareModuleOutput); ``S(h)`` tensors live
only as local shards between a colwise and a rowwise linear. Solved with one worker and a fixed
seed, so the same input gives the same answer.

What the runtime executes of the answer is each linear's weight placement (``tp_placements``, into
``plan.param_layouts``; ``codegen/tp_plans.py`` turns it into styles), per sublayer: all split the
Megatron way, or all replicated. The rules above allow nothing else under ``RUNTIME_TRANSITIONS``:
the attention core takes q, k and v alike (R or S(h)), so wq, wk and wv are all colwise or all
replicated (which matters: the zoo's attention counts its heads from the projections' widths), and
a colwise linear's ``S(h)`` output reaches the ``R``/``S(s)`` stream only through a rowwise one, so
wo (fc2, w2) is rowwise exactly when the sublayer's first linears are colwise. A replicated
sublayer needs no tp reduction of its weight gradients: every rank sees the whole input.
Lowering refuses any other mix with the placements it found. Replicated linears are offered only
when the search's ``Request.runtime`` has ``"tp_replicate"`` (``space.RUNTIME`` does).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ortools.sat.python import cp_model

from ..cost_model import Cluster, collective_time
from ..cost_model.kernels import attention_fwd_bwd_s, matmul_fwd_bwd_s, memory_time_s
from ..cost_model.memory import STATE_BYTES
from ..ir import BATCH, DTYPE_BYTES, SEQ, Graph, Node, OpKind, evaluate
from .ilp import run_deterministic

TIME_SCALE = 1e9  # seconds -> ns
MEMORY_SCALE = 1 / 1024  # bytes -> KiB
R, SH, SS, P = "R", "S(h)", "S(s)", "P"
# forward (or backward) transition -> collective; "slice" is free (each rank keeps its part)
_TRANSITION = {(SS, R): "all-gather", (SH, R): "all-gather", (R, SS): "slice", (R, SH): "slice",
               (SH, SS): "all-to-all", (SS, SH): "all-to-all", (P, R): "all-reduce",
               (P, SS): "reduce-scatter", (P, SH): "reduce-scatter"}
RUNTIME_TRANSITIONS = frozenset({(SS, R), (R, SS)})
ALL_TRANSITIONS = frozenset((a, b) for a, b in _TRANSITION if a != P)

# role -> (name, input (fwd, grad), output, shards compute, own collectives (kind, phase), needs sp)
_Rule = tuple[str, tuple[str, str], str, bool, tuple[tuple[str, str], ...], bool]
_RULES: dict[str, tuple[_Rule, ...]] = {
    "linear": (("replicate", (R, R), R, False, (), False),
               ("colwise", (R, P), SH, True, (), False),
               ("rowwise", (SH, SH), R, True, (("all-reduce", "fwd"),), False),
               ("rowwise-rs", (SH, SH), SS, True, (("reduce-scatter", "fwd"), ("all-gather", "bwd")), True)),
    "norm": ((R, (R, R), R, False, (), False), (SS, (SS, SS), SS, True, (), True)),
    "attention": ((R, (R, R), R, False, (), False), (SH, (SH, SH), SH, True, (), False)),
    "pass": ((R, (R, R), R, False, (), False), (SH, (SH, SH), SH, True, (), False),
             (SS, (SS, SS), SS, True, (), True)),
    "whole": ((R, (R, R), R, False, (), False),),
}
LINEAR_PLACEMENT = {"replicate": ("R", "R"), "colwise": ("S(0)", "S(0)"), "rowwise": ("S(1)", "R"),
                    "rowwise-rs": ("S(1)", "R")}  # (weight, bias) over tp
STYLE = {"replicate": "replicate", "colwise": "colwise", "rowwise": "rowwise", "rowwise-rs": "rowwise"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    name: str
    inputs: tuple[tuple[str, str], ...]  # per activation input: (forward layout, gradient layout)
    out: str
    compute_s: float
    comm_s: float
    collectives: tuple[tuple[str, str], ...]  # own (kind, "fwd" | "bwd")
    memory_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    name: str  # node name, or "<in>" / "<out>" for the block's boundary
    module: str  # module path relative to the block, e.g. "attn.wq"
    role: str
    inputs: tuple[int, ...]  # producer op indices
    strategies: tuple[Strategy, ...]
    out_bytes: float  # whole output tensor in the plan's dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    ops: tuple[Op, ...]
    tp: int
    count: int = 1  # layers of this kind: the answer applies to each
    memory_limit_bytes: float = float("inf")
    reshard_s: dict  # (producer op, src layout, (fwd, grad)) -> seconds, executable ones only
    kind: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    kind: str
    count: int
    status: str
    choice: tuple[int, ...]  # strategy index per op
    strategies: tuple[tuple[str, str], ...]  # (node name, strategy name)
    linears: tuple[tuple[str, str], ...]  # (module path in the block, colwise | rowwise | replicate)
    block_time_s: float  # compute + communication of one block, forward + backward
    block_comm_s: float
    collectives: tuple[tuple[str, str, str], ...]  # (where, kind, fwd | bwd), per block
    memory_bytes: float
    variables: int
    constraints: int
    wall_s: float

    def forward_collectives(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, kind, phase in self.collectives:
            if phase == "fwd":
                out[kind] = out.get(kind, 0) + 1
        return out

    def summary(self) -> str:
        counts = {s: sum(style == s for _, style in self.linears) for s in ("colwise", "rowwise", "replicate")}
        fwd = self.forward_collectives()
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(fwd.items()))
        return (f"{len(self.linears)} linears: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                + f"; {sum(fwd.values())} forward collectives per block" + (f" ({kinds})" if kinds else ""))


def _int(x: float) -> int:
    return int(round(x))


# ---- the program, one function per family --------------------------------------------------

@dataclass(slots=True)
class _Vars:
    x: list  # x[v][i]
    r: dict  # (u, i, σ) -> bool var


def add_variables(model: cp_model.CpModel, p: Problem) -> _Vars:
    x = [[model.new_bool_var(f"x{v}_{i}") for i in range(len(op.strategies))] for v, op in enumerate(p.ops)]
    return _Vars(x=x, r={})


def add_one_strategy(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    for xs in v.x:
        model.add_exactly_one(xs)


def _edges(p: Problem):
    """(u, i, v, j, σ): op v's strategy j reads u's output (in u's strategy i) through interface σ."""
    for vi, op in enumerate(p.ops):
        for pos, u in enumerate(op.inputs):
            for i, j in product(range(len(p.ops[u].strategies)), range(len(op.strategies))):
                yield u, i, vi, j, op.strategies[j].inputs[pos]


def add_executable_edges(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    for u, i, vi, j, sigma in _edges(p):
        if (u, p.ops[u].strategies[i].out, sigma) not in p.reshard_s:
            model.add_bool_or([v.x[u][i].Not(), v.x[vi][j].Not()])


def add_resharding(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    for u, i, vi, j, sigma in _edges(p):
        cost = p.reshard_s.get((u, p.ops[u].strategies[i].out, sigma))
        if not cost:
            continue  # free, or forbidden by add_executable_edges
        key = (u, i, sigma)
        if key not in v.r:
            v.r[key] = model.new_bool_var(f"r{u}_{i}_{sigma[0]}_{sigma[1]}")
        model.add_bool_or([v.x[u][i].Not(), v.x[vi][j].Not(), v.r[key]])  # r >= x_ui + x_vj - 1


def add_memory_limit(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    if p.memory_limit_bytes == float("inf"):
        return
    model.add(sum(_int(s.memory_bytes * MEMORY_SCALE) * v.x[o][i] for o, op in enumerate(p.ops)
                  for i, s in enumerate(op.strategies)) <= _int(p.memory_limit_bytes * MEMORY_SCALE))


def add_objective(model: cp_model.CpModel, p: Problem, v: _Vars) -> None:
    terms = [_int((s.compute_s + s.comm_s) * TIME_SCALE) * v.x[o][i]
             for o, op in enumerate(p.ops) for i, s in enumerate(op.strategies)]
    terms += [_int(p.reshard_s[(u, p.ops[u].strategies[i].out, sigma)] * TIME_SCALE) * var
              for (u, i, sigma), var in v.r.items()]
    model.minimize(sum(terms))


FAMILIES = (add_one_strategy, add_executable_edges, add_resharding, add_memory_limit, add_objective)


def objective_s(p: Problem, choice: tuple[int, ...]) -> float | None:
    """The program's objective for one assignment, in seconds (None where a constraint fails):
    what brute force enumerates, and what the solution reports."""
    total, memory, reshards = 0.0, 0.0, {}
    for vi, op in enumerate(p.ops):
        s = op.strategies[choice[vi]]
        total += _int((s.compute_s + s.comm_s) * TIME_SCALE)
        memory += _int(s.memory_bytes * MEMORY_SCALE)
        for pos, u in enumerate(op.inputs):
            key = (u, p.ops[u].strategies[choice[u]].out, s.inputs[pos])
            if key not in p.reshard_s:
                return None
            reshards[key] = _int(p.reshard_s[key] * TIME_SCALE)
    if p.memory_limit_bytes != float("inf") and memory > _int(p.memory_limit_bytes * MEMORY_SCALE):
        return None
    return (total + sum(reshards.values())) / TIME_SCALE


def solve(p: Problem, *, time_limit_s: float = 10.0) -> Solution:
    model = cp_model.CpModel()
    v = add_variables(model, p)
    for add in FAMILIES:
        add(model, p, v)
    run = run_deterministic(model, time_limit_s)
    if not run.found:
        return Solution(kind=p.kind, count=p.count, status=run.status_name, choice=(), strategies=(),
                        linears=(), block_time_s=0.0, block_comm_s=0.0, collectives=(), memory_bytes=0.0,
                        variables=run.variables, constraints=run.constraints, wall_s=run.wall_s)
    choice = tuple(next(i for i, x in enumerate(xs) if run.solver.value(x)) for xs in v.x)
    return _read(p, choice, run.status_name, run.variables, run.constraints, run.wall_s)


def _read(p: Problem, choice: tuple[int, ...], status: str, n_vars: int, n_cons: int, wall_s: float) -> Solution:
    comm, colls, seen = 0.0, [], set()
    for vi, op in enumerate(p.ops):
        s = op.strategies[choice[vi]]
        comm += s.comm_s
        colls += [(op.module or op.name, kind, phase) for kind, phase in s.collectives]
        for pos, u in enumerate(op.inputs):
            src, sigma = p.ops[u].strategies[choice[u]].out, s.inputs[pos]
            if (u, src, sigma) in seen:
                continue
            seen.add((u, src, sigma))
            comm += p.reshard_s[(u, src, sigma)]
            where = f"{p.ops[u].module or p.ops[u].name} -> {op.module or op.name}"
            for phase, a, b in (("fwd", src, sigma[0]), ("bwd", sigma[1], src)):
                kind = _TRANSITION.get((a, b), "slice")
                if a != b and kind != "slice":
                    colls.append((where, kind, phase))
    ops = [(op, op.strategies[c]) for op, c in zip(p.ops, choice)]
    return Solution(kind=p.kind, count=p.count, status=status, choice=choice,
                    strategies=tuple((op.name, s.name) for op, s in ops),
                    linears=tuple((op.module, STYLE[s.name]) for op, s in ops if op.role == "linear"),
                    block_time_s=objective_s(p, choice) or 0.0, block_comm_s=comm, collectives=tuple(colls),
                    memory_bytes=sum(s.memory_bytes for _, s in ops), variables=n_vars, constraints=n_cons,
                    wall_s=wall_s)


# ---- from the traced graph to the program ---------------------------------------------------

def _role(node: Node) -> str:
    if node.op == OpKind.MATMUL:
        return "linear" if node.params else "attention"  # a param-less matmul batches over heads
    if node.op == OpKind.ATTENTION:
        return "attention"
    if node.op == OpKind.NORM:
        return "norm"
    if node.op in (OpKind.ELEMENTWISE, OpKind.VIEW, OpKind.SOFTMAX, OpKind.REDUCTION):
        return "pass"
    return "whole"


def _batched(shape) -> bool:
    return any(BATCH in getattr(d, "free_symbols", ()) for d in shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ctx:
    cluster: Cluster
    tp: int
    sp: bool
    batch: int
    seq: int
    dtype: str
    replicate: bool
    param_numel: dict
    keep_split: tuple[str, ...] = ()  # module paths whose linears are never replicated (``block_problem``)
    keep_whole: tuple[str, ...] = ()  # module paths whose linears are only replicated (``block_problem``)


def _allowed(rule: _Rule, role: str, node: Node, c: _Ctx) -> bool:
    name, _, out, _, _, needs_sp = rule
    if c.tp == 1:
        return out == R and name in ("replicate", R)  # nothing to split: one strategy, no ties
    if needs_sp and not c.sp:
        return False
    if role == "norm":
        return (out == SS) == c.sp  # the runtime puts SequenceParallel on every norm under sp
    if role == "linear":
        if node.module_path.startswith(c.keep_whole):
            return name == "replicate"
        return name != "replicate" or (c.replicate and not node.module_path.startswith(c.keep_split))
    shape = node.outputs[0].shape
    return (out != SH or len(shape) >= 3) and (out != SS or any(SEQ in getattr(d, "free_symbols", ()) for d in shape))


def _compute_s(node: Node, role: str, rule: _Rule, c: _Ctx) -> float:
    accel, elem, tp = c.cluster.accelerator, DTYPE_BYTES[c.dtype], c.tp if rule[3] else 1
    if role == "linear":  # (m, k) @ (k, n), colwise splits n, rowwise k
        n, k = float(node.outputs[0].shape[-1]), float(node.input_metas[0].shape[-1])
        m = evaluate(node.outputs[0].numel, batch=c.batch, seq=c.seq) / n
        n, k = (n / tp, k) if rule[0] == "colwise" else (n, k / tp)
        return sum(matmul_fwd_bwd_s(accel, c.dtype, m, n, k, elem))
    flops = evaluate(node.flops, batch=c.batch, seq=c.seq) / tp
    if role == "attention":
        return sum(attention_fwd_bwd_s(accel, c.dtype, flops)) if node.op == OpKind.ATTENTION else \
            3 * flops / accel.achievable_flops(c.dtype)
    if node.op == OpKind.VIEW:
        return 0.0
    moved = evaluate(node.bytes, batch=c.batch, seq=c.seq) * elem / DTYPE_BYTES[node.outputs[0].dtype] / tp
    extra = 3 * flops / accel.achievable_flops(c.dtype) if role == "whole" else 0.0
    return memory_time_s(accel, 3 * moved, 2) + extra  # backward moves about twice the forward bytes


def _memory_bytes(node: Node, role: str, rule: _Rule, out_bytes: float, c: _Ctx) -> float:
    per_param = sum(STATE_BYTES.get(c.dtype, STATE_BYTES["float32"]))
    params = 0.0
    for name in node.params:
        numel = c.param_numel.get(name, 0)
        if role == "linear":
            placement = LINEAR_PLACEMENT[rule[0]][0 if name.endswith("weight") else 1]
            numel /= c.tp if placement != "R" else 1
        params += numel * per_param
    saved = 0.0 if node.op == OpKind.VIEW else out_bytes / (c.tp if rule[2] != R else 1)
    return params + saved


def _head_broadcast(meta) -> bool:
    """An attention input of one head broadcast over all (Hugging Face's (b, 1, s, s) mask): every rank reads it
    whole beside its own heads, so it stays ``R`` when the heads are split."""
    return len(meta.shape) >= 4 and meta.shape[1] == 1


def _strategies(node: Node, role: str, out_bytes: float, c: _Ctx) -> tuple[Strategy, ...]:
    batched = [m for m in node.input_metas if _batched(m.shape)]
    out = []
    for rule in _RULES[role]:
        if not _allowed(rule, role, node, c):
            continue
        comm = sum(collective_time(kind, out_bytes, c.tp, 1, c.cluster) for kind, _ in rule[4])
        split_heads = role == "attention" and rule[2] == SH
        inputs = tuple((R, R) if split_heads and _head_broadcast(m) else rule[1] for m in batched)
        out.append(Strategy(name=rule[0], inputs=inputs, out=rule[2],
                            compute_s=_compute_s(node, role, rule, c), comm_s=comm, collectives=rule[4],
                            memory_bytes=_memory_bytes(node, role, rule, out_bytes, c)))
    return tuple(out)


def _boundary(name: str, stream: str, reads: tuple[int, ...]) -> Op:
    s = Strategy(name=stream, inputs=((stream, stream),) * len(reads), out=stream, compute_s=0.0, comm_s=0.0,
                 collectives=(), memory_bytes=0.0)
    return Op(name=name, module="", role="boundary", inputs=reads, strategies=(s,), out_bytes=0.0)


def block_problem(graph: Graph, kind: str, *, tp: int, cluster: Cluster, micro_batch: int, seq_len: int,
                  sp: bool, dtype: str = "bfloat16", memory_limit_bytes: float = float("inf"),
                  replicate: bool = True, transitions: frozenset = RUNTIME_TRANSITIONS,
                  split_under_sp: tuple[str, ...] = (), keep_whole: tuple[str, ...] = ()) -> Problem:
    """The program for the first block of ``kind``; ``replicate`` offers replicated linears, except, under
    sequence parallelism, those of the block's sublayers named in ``split_under_sp`` (e.g. ``"self_attn"``). The
    linears of the sublayers in ``keep_whole`` are only replicated (an attention a head split would change,
    ``ModelStructure.attn_whole``: the runtime keeps it whole)."""
    blocks = [b for b in graph.blocks if b.kind == kind]
    block = blocks[0]
    sp = sp and tp > 1
    keep_split = tuple(f"{block.name}.{sub}." for sub in split_under_sp) if sp else ()
    c = _Ctx(cluster=cluster, tp=tp, sp=sp, batch=micro_batch, seq=seq_len, dtype=dtype,
             replicate=replicate, param_numel={p.name: p.numel for p in graph.params}, keep_split=keep_split,
             keep_whole=tuple(f"{block.name}.{sub}." for sub in keep_whole))
    stream = SS if c.sp else R
    nodes = [n for n in graph.nodes_of(block) if n.outputs and _batched(n.outputs[0].shape)]
    inside = {n.name for n in nodes}
    index: dict[str, int] = {}
    ops: list[Op] = []
    for node in nodes:
        reads = []
        for name, meta in zip(node.inputs, node.input_metas):
            if not _batched(meta.shape):
                continue  # a constant (rope table, mask): every rank holds it, slicing is free
            if name not in index:  # the residual stream coming in
                index[name] = len(ops)
                ops.append(_boundary(f"<in:{name}>", stream, ()))
            reads.append(index[name])
        role = _role(node)
        out_bytes = evaluate(node.outputs[0].numel, batch=micro_batch, seq=seq_len) * DTYPE_BYTES[dtype]
        module = node.module_path.removeprefix(block.name).lstrip(".")
        index[node.name] = len(ops)
        ops.append(Op(name=node.name, module=module, role=role, inputs=tuple(reads),
                      strategies=_strategies(node, role, out_bytes, c), out_bytes=out_bytes))
    read_outside = {i for n in graph.nodes if n.name not in inside for i in n.inputs if i in inside}
    for name in sorted(read_outside, key=index.get):
        ops.append(_boundary(f"<out:{name}>", stream, (index[name],)))
    return Problem(ops=tuple(ops), tp=tp, count=len(blocks), memory_limit_bytes=memory_limit_bytes,
                   reshard_s=_reshard_table(ops, tp, cluster, transitions), kind=kind)


def _reshard_table(ops: list[Op], tp: int, cluster: Cluster, transitions: frozenset) -> dict:
    """Seconds to hand u's output in layout ``src`` to a consumer asking for σ = (fwd, grad): the
    forward transition plus the backward one; executable forward transitions only."""
    asks: dict[int, set] = {}
    for op in ops:
        for pos, u in enumerate(op.inputs):
            asks.setdefault(u, set()).update(s.inputs[pos] for s in op.strategies)
    table = {}
    for u, sigmas in asks.items():
        for src, sigma in product({s.out for s in ops[u].strategies}, sigmas):
            if src != sigma[0] and (src, sigma[0]) not in transitions:
                continue
            kinds = [_TRANSITION[t] for t in ((src, sigma[0]), (sigma[1], src)) if t[0] != t[1]]
            table[(u, src, sigma)] = sum(collective_time(k, ops[u].out_bytes, tp, 1, cluster)
                                         for k in kinds if k != "slice")
    return table


# ---- every block kind of a graph, cached for the search ---------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSolution:
    tp: int
    sp: bool
    solutions: tuple[Solution, ...]  # one per block kind

    @property
    def ok(self) -> bool:
        return bool(self.solutions) and all(s.choice for s in self.solutions)

    def tp_placements(self, graph: Graph) -> dict[str, str]:
        """Parameter name -> placement over tp, for every block parameter of every layer."""
        by_kind = {s.kind: dict(s.linears) for s in self.solutions}
        out = {}
        for block in graph.blocks:
            linears = by_kind.get(block.kind, {})
            for name in block.params:
                module, _, leaf = name.removeprefix(block.name + ".").rpartition(".")
                style = linears.get(module)
                out[name] = LINEAR_PLACEMENT[style][0 if leaf == "weight" else 1] if style else "R"
        return out

    def summary(self) -> str:
        return "; ".join(f"{s.summary()} (x{s.count} {s.kind})" if len(self.solutions) > 1 else s.summary()
                         for s in self.solutions)

    @property
    def variables(self) -> int:
        return sum(s.variables for s in self.solutions)

    @property
    def constraints(self) -> int:
        return sum(s.constraints for s in self.solutions)


_CACHE: dict[tuple, tuple[Graph, GraphSolution]] = {}


def solve_graph(graph: Graph, *, tp: int, cluster: Cluster, micro_batch: int, seq_len: int, sp: bool,
                dtype: str = "bfloat16", replicate: bool = False,
                split_under_sp: tuple[str, ...] = (), keep_whole: tuple[str, ...] = ()) -> GraphSolution:
    """Each block kind solved once; cached per (graph, tp, sp, cluster, micro-batch, sequence, dtype)."""
    key = (id(graph), tp, sp, cluster, micro_batch, seq_len, dtype, replicate, split_under_sp, keep_whole)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    sols = tuple(solve(block_problem(graph, kind, tp=tp, cluster=cluster, micro_batch=micro_batch,
                                     seq_len=seq_len, sp=sp, dtype=dtype, replicate=replicate,
                                     split_under_sp=split_under_sp, keep_whole=keep_whole))
                 for kind in graph.block_kinds)
    result = GraphSolution(tp=tp, sp=sp, solutions=sols)
    if len(_CACHE) >= 64:
        _CACHE.clear()
    _CACHE[key] = (graph, result)
    return result
