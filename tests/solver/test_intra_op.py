"""The intra-op program (solver/intra_op.py): known answers, brute force, tying, determinism."""
from __future__ import annotations

import dataclasses
from itertools import product

import pytest
import torch

import meshplan as mp
from meshplan import ir, zoo
from meshplan.cost_model import parse_cluster
from meshplan.frontend import trace
from meshplan.ir import BATCH as b, SEQ as s
from meshplan.solver import intra_op
from meshplan.solver.layouts import tp_placement

H100 = parse_cluster("h100-sxm:1x8")
GPT = dict(family="gpt", layers=2, hidden=2048, heads=16, ffn_hidden=8192, vocab=51200, max_seq_len=4096)
LLAMA = dict(family="llama", layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
             max_seq_len=8192)
MEGATRON = {"gpt": {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise", "attn.wo": "rowwise",
                    "mlp.fc1": "colwise", "mlp.fc2": "rowwise"},
            "llama": {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise", "attn.wo": "rowwise",
                      "mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise"}}


def _graph(cfg: dict) -> ir.Graph:
    with torch.device("meta"):
        return trace(zoo.build_from_config(cfg), batch=1, seq_len=64)


@pytest.fixture(scope="module")
def graphs() -> dict[str, ir.Graph]:
    return {"gpt": _graph(GPT), "llama": _graph(LLAMA)}


def _dtype(cluster) -> str:
    return "bfloat16" if "bfloat16" in cluster.accelerator.peak_flops else "float32"


def _solve(graph: ir.Graph, **kw) -> intra_op.Solution:
    kw = dict(tp=4, cluster=H100, micro_batch=1, seq_len=4096, sp=False) | kw
    kw.setdefault("dtype", _dtype(kw["cluster"]))
    return intra_op.solve(intra_op.block_problem(graph, graph.blocks[0].kind, **kw))


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("sp", [False, True])
def test_block_at_tp4_recovers_megatron(graphs, family: str, sp: bool) -> None:
    sol = _solve(graphs[family], sp=sp)  # replicated linears offered too
    assert sol.status == "OPTIMAL" and dict(sol.linears) == MEGATRON[family]
    expect = {"all-gather": 2, "reduce-scatter": 2} if sp else {"all-reduce": 2}  # one pair per sublayer
    assert sol.forward_collectives() == expect, sol.collectives
    assert 0 < sol.block_comm_s < sol.block_time_s


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_solution_is_what_the_fixed_rules_say(graphs, family: str) -> None:
    graph = graphs[family]
    got = intra_op.solve_graph(graph, tp=4, cluster=H100, micro_batch=1, seq_len=4096, sp=True)
    placements = got.tp_placements(graph)
    assert placements and placements == {n: tp_placement(n) for b in graph.blocks for n in b.params}


def test_tp1_replicates_everything_without_communication(graphs) -> None:
    sol = _solve(graphs["llama"], tp=1)
    assert {style for _, style in sol.linears} == {"replicate"}
    assert sol.collectives == () and sol.block_comm_s == 0.0


def _slow(cluster):
    tiers = tuple(dataclasses.replace(t, bandwidth_Bps=1e6, collectives=()) for t in cluster.tiers)
    return dataclasses.replace(cluster, tiers=tiers)


def test_tiny_block_on_slow_interconnect_prefers_replicate() -> None:
    graph = _graph(dict(GPT, hidden=64, heads=4, ffn_hidden=256, vocab=512, max_seq_len=128))
    slow = _slow(parse_cluster("cpu:1x4"))
    sol = _solve(graph, cluster=slow, seq_len=128)
    assert {style for _, style in sol.linears} == {"replicate"} and sol.block_comm_s == 0.0
    # offered only what the runtime executes today, it still splits (Megatron is the one layout left)
    runtime = _solve(graph, cluster=slow, seq_len=128, replicate=False)
    assert dict(runtime.linears) == MEGATRON["gpt"]


def test_memory_limit_binds_and_forces_sharding() -> None:
    graph = _graph(dict(GPT, hidden=64, heads=4, ffn_hidden=256, vocab=512, max_seq_len=128))
    slow = _slow(parse_cluster("cpu:1x4"))
    free = _solve(graph, cluster=slow, seq_len=128)
    limit = 0.6 * free.memory_bytes  # replicated weights and activations do not fit
    tight = _solve(graph, cluster=slow, seq_len=128, memory_limit_bytes=limit)
    assert tight.status == "OPTIMAL" and tight.memory_bytes <= limit < free.memory_bytes
    assert {"colwise", "rowwise"} <= {style for _, style in tight.linears}
    assert tight.block_time_s > free.block_time_s
    assert _solve(graph, cluster=slow, seq_len=128, memory_limit_bytes=1e3).status == "INFEASIBLE"


def _mlp_graph() -> ir.Graph:
    """norm -> fc1 -> gelu -> fc2 -> residual add, one block, read by a node outside it."""
    h, f = 256, 1024
    act = lambda n: ir.TensorMeta(shape=(b, s, n))  # noqa: E731
    params = (ir.Param(name="layers.0.norm.weight", shape=(h,)), ir.Param(name="layers.0.fc1.weight", shape=(f, h)),
              ir.Param(name="layers.0.fc2.weight", shape=(h, f)))
    nodes = (
        ir.Node(name="n", op="norm", target="ln", inputs=("x",), input_metas=(act(h),), outputs=(act(h),),
                flops=5 * h * b * s, bytes=8 * h * b * s, module_path="layers.0.norm", params=(params[0].name,)),
        ir.Node(name="fc1", op="matmul", target="linear", inputs=("n",), input_metas=(act(h),), outputs=(act(f),),
                flops=2 * h * f * b * s, module_path="layers.0.fc1", params=(params[1].name,)),
        ir.Node(name="g", op="elementwise", target="gelu", inputs=("fc1",), input_metas=(act(f),),
                outputs=(act(f),), flops=f * b * s, bytes=8 * f * b * s, module_path="layers.0"),
        ir.Node(name="fc2", op="matmul", target="linear", inputs=("g",), input_metas=(act(f),), outputs=(act(h),),
                flops=2 * h * f * b * s, module_path="layers.0.fc2", params=(params[2].name,)),
        ir.Node(name="add", op="elementwise", target="add", inputs=("x", "fc2"), input_metas=(act(h), act(h)),
                outputs=(act(h),), flops=h * b * s, bytes=12 * h * b * s, module_path="layers.0"),
        ir.Node(name="head", op="reduction", target="sum", inputs=("add",), input_metas=(act(h),),
                outputs=(ir.TensorMeta(shape=()),)))
    block = ir.Block(name="layers.0", kind="Mlp#0", index=0, nodes=("n", "fc1", "g", "fc2", "add"),
                     params=tuple(p.name for p in params))
    dims = ir.ModelDims(family="gpt", layers=1, hidden=h, heads=4, kv_heads=4, ffn_hidden=f, vocab=8)
    return ir.Graph(nodes=nodes, params=params, blocks=(block,), dims=dims)


@pytest.mark.parametrize("cluster", ["h100-sxm:1x8", "cpu:1x4"])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("transitions", [intra_op.RUNTIME_TRANSITIONS, intra_op.ALL_TRANSITIONS])
def test_program_equals_brute_force(cluster: str, sp: bool, transitions) -> None:
    graph = _mlp_graph()
    for limit in (float("inf"), None):
        cl = parse_cluster(cluster)
        p = intra_op.block_problem(graph, "Mlp#0", tp=2, cluster=cl, micro_batch=2, seq_len=512, sp=sp,
                                   transitions=transitions, dtype=_dtype(cl))
        every = {c: intra_op.objective_s(p, c) for c in product(*(range(len(op.strategies)) for op in p.ops))}
        if limit is None:  # a limit between the leanest and the fastest assignment
            feasible = [c for c in every if every[c] is not None]
            mem = {c: sum(op.strategies[i].memory_bytes for op, i in zip(p.ops, c)) for c in feasible}
            limit = (min(mem.values()) + mem[min(feasible, key=every.get)]) / 2 + 4096  # + KiB rounding
            p = dataclasses.replace(p, memory_limit_bytes=limit)
            every = {c: intra_op.objective_s(p, c) for c in every}
        best = min(v for v in every.values() if v is not None)
        sol = intra_op.solve(p)
        assert sol.status == "OPTIMAL" and sol.block_time_s == pytest.approx(best, abs=1e-9)
        assert intra_op.objective_s(p, sol.choice) == pytest.approx(best, abs=1e-9)


def test_identical_layers_are_decided_once() -> None:
    small, deep = _graph(dict(GPT, layers=2)), _graph(dict(GPT, layers=6))
    a, b_ = _solve(small, sp=True), _solve(deep, sp=True)
    assert (a.variables, a.constraints) == (b_.variables, b_.constraints)
    assert (a.count, b_.count) == (2, 6) and a.linears == b_.linears


def test_same_input_same_answer(graphs) -> None:
    a, b_ = _solve(graphs["llama"], sp=True), _solve(graphs["llama"], sp=True)
    assert dataclasses.replace(a, wall_s=0.0) == dataclasses.replace(b_, wall_s=0.0)


def test_plan_takes_its_tp_layouts_from_the_program_and_reports_them() -> None:
    plan = mp.autoparallelize("gpt-tiny", "cpu:1x4", global_batch=4, seq_len=16,
                              fixed={"tp": 2, "dp": 2, "zero": 0, "micro_batch": 2, "recompute": "none"})
    info = plan.solver
    assert info.intra_op.startswith("tp=2") and "6 linears: 4 colwise, 2 rowwise, 0 replicate" in info.intra_op
    assert info.intra_op_variables > 0 and "intra-op: tp=2" in plan.report()
    assert plan.param_layouts["layers.1.attn.wo.weight"][ir.AXES.index("tp")] == "S(1)"
    again = ir.Plan.from_json(plan.to_json())
    assert again.solver.intra_op == info.intra_op


def test_planner_replicates_attention_on_slow_tp_links_and_lowering_runs_it_plain() -> None:
    """With "tp_replicate" in the runtime's capabilities, a tiny GPT on 100 MB/s links keeps attention
    replicated over tp (an all-gather costs less than the split saves there) and splits the MLP;
    lowering then gives the attention linears no style. tests/runtime/test_runtime_tp_layouts.py
    trains this very plan on 4 gloo processes against one."""
    from meshplan.codegen import TensorParallel, lower
    from meshplan.solver import RUNTIME

    assert "tp_replicate" in RUNTIME
    slow = dataclasses.replace(parse_cluster("cpu:1x4"), tiers=tuple(
        dataclasses.replace(t, bandwidth_Bps=1e8, collectives=()) for t in parse_cluster("cpu:1x4").tiers))
    plan = mp.autoparallelize("gpt-tiny", slow, global_batch=8, seq_len=16, fixed={"tp": 2, "dp": 2})
    assert "6 linears: 1 colwise, 1 rowwise, 4 replicate" in plan.solver.intra_op
    tp = ir.AXES.index("tp")
    for i in range(4):
        got = {lin: plan.param_layouts[f"layers.{i}.{lin}.weight"][tp]
               for lin in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc1", "mlp.fc2")}
        assert got == {"attn.wq": "R", "attn.wk": "R", "attn.wv": "R", "attn.wo": "R", "mlp.fc1": "S(0)",
                       "mlp.fc2": "S(1)"}
    styled = {path for s in lower(plan).steps if isinstance(s, TensorParallel) and s.module == "layers.0"
              for path, _ in s.plan}
    assert {"mlp.fc1", "mlp.fc2"} <= styled and not any(p.startswith("attn.") for p in styled)
    # on the cluster as it is, splitting both sublayers still wins (Megatron)
    fast = mp.autoparallelize("gpt-tiny", "cpu:1x4", global_batch=8, seq_len=16, fixed={"tp": 2, "dp": 2})
    assert "0 replicate" in fast.solver.intra_op


def test_hugging_face_attention_splits_its_heads_and_reads_the_mask_whole() -> None:
    """HF's SDPA takes a (b, 1, s, s) causal mask from outside the block: broadcast over the heads, every rank reads
    it whole beside its own heads, so the heads split the Megatron way (the program found no split before, and kept
    HF attention replicated at any size). Under sequence parallelism the attention of a model that takes its input
    by keyword is kept split (``split_under_sp``): replicated, its tuple output could not be cut to S(1)."""
    transformers = pytest.importorskip("transformers")
    import user_models

    cfg = transformers.LlamaConfig(**user_models.hf_llama_config(hidden_size=1024, intermediate_size=4096,
                                                                 num_attention_heads=16, num_key_value_heads=4))
    with torch.device("meta"):
        graph = trace(transformers.LlamaForCausalLM(cfg), batch=1, seq_len=64)
    mask = [m for n in graph.nodes_of(graph.blocks[0]) if n.op == ir.OpKind.ATTENTION for m in n.input_metas[3:]]
    assert mask and mask[0].shape[1] == 1
    for sp, split in ((False, ()), (True, ("self_attn",))):
        sol = _solve(graph, tp=4, sp=sp, replicate=False, split_under_sp=split)
        assert sol.status == "OPTIMAL" and dict(sol.linears) == {
            "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
            "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
            "mlp.down_proj": "rowwise"}, sol.linears
    kept = _solve(graph, tp=4, sp=True, split_under_sp=("self_attn",), cluster=parse_cluster("cpu:1x4"),
                  seq_len=64)
    assert all(style != "replicate" for name, style in kept.linears if name.startswith("self_attn."))


def test_an_attention_the_runtime_keeps_whole_is_only_replicated(graphs) -> None:
    """``keep_whole`` (an attention a head split would change, ``ModelStructure.attn_whole``: OPT's) leaves its linears
    one strategy, replicate, even where Megatron's split wins, and the program still splits the MLP around it; without
    tp_replicate offered too (the runtime runs a whole sublayer as plain modules either way)."""
    for replicate in (True, False):
        sol = _solve(graphs["llama"], replicate=replicate, keep_whole=("attn",))
        linears = dict(sol.linears)
        assert sol.status == "OPTIMAL" and {v for k, v in linears.items() if k.startswith("attn.")} == {"replicate"}
        assert {v for k, v in linears.items() if k.startswith("mlp.")} == {"colwise", "rowwise"}, linears
