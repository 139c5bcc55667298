"""A model without repeated blocks (issue 11, "Bad input"): it is still planned, with data parallelism
and ZeRO, priced node by node from its traced graph (``cost_model/graph_cost.py``,
``solver/blockless.py``), and the report says why tensor and pipeline parallelism are not offered.
Its runs on gloo are ``tests/runtime/test_runtime_blockless.py``."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import meshplan as mp
from meshplan import ir, solver
from meshplan.api import offered
from meshplan.cost_model import parse_cluster
from meshplan.cost_model.graph_cost import graph_work
from meshplan.frontend import trace
from meshplan.solver.blockless import solve_blockless

BATCH = 64


def issue_mlp() -> nn.Sequential:
    """Issue 11's example."""
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 512), nn.GELU(), nn.Linear(512, 10))


def example(batch: int = BATCH) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 256, device="meta"),)


@pytest.fixture(scope="module")
def found() -> tuple[mp.Plan, ...]:
    with torch.device("meta"):
        model = issue_mlp()
    return mp.plans(model, "cpu:1x4", global_batch=BATCH, seq_len=1, example_inputs=example())


@pytest.fixture(scope="module")
def graph() -> ir.Graph:
    with torch.device("meta"):
        model = issue_mlp()
    return trace(model, batch=1, seq_len=1, example_inputs=example())


def _request(graph: ir.Graph, cluster: str = "cpu:1x4", **kw) -> tuple[solver.Request, tuple[str, ...]]:
    runtime, why = offered(graph.structure, zoo_modules=False)
    req = solver.Request(graph=graph, cluster=parse_cluster(cluster), model={"name": "mlp", "family": "custom"},
                         global_batch=kw.pop("global_batch", BATCH), seq_len=1, dtype="float32", runtime=runtime, **kw)
    return req, why


def test_it_plans_data_parallelism_over_the_whole_cluster(found) -> None:
    best = found[0]
    assert best.mesh == ir.Mesh(dp=4) and best.recompute == () and best.stages == ()
    assert best.micro_batch_size * best.num_microbatches * 4 == BATCH
    assert sorted(p.zero_stage for p in found) == [0, 1, 2, 3]  # the best of each stage, best first
    assert [p.prediction.step_time_s for p in found] == sorted(p.prediction.step_time_s for p in found)
    assert best.prediction.peak_memory_bytes <= best.prediction.memory_limit_bytes
    assert best.solver.candidates == 4 * 5 and best.solver.pruned == 0  # 4 stages x micro-batches 16, 8, 4, 2, 1
    assert best.source == {"kind": "module"} and best.model["params"] == sum(p.numel() for p in issue_mlp().parameters())


def test_the_report_says_why_tp_and_pp_are_not_offered(found) -> None:
    text = found[0].report()
    assert "no repeated blocks" in text
    assert "tensor parallelism is not offered: no repeated blocks" in text
    assert "pipeline parallelism is not offered: no repeated blocks" in text
    assert "#2:" in found[0].explain()


def test_the_plan_survives_json(found) -> None:
    """Parameter names of a root nn.Sequential begin with a digit ("0.weight"): the schema takes them."""
    for plan in found:
        again = mp.Plan.from_json(plan.to_json())
        assert again.param_layouts == plan.param_layouts and again.prediction == plan.prediction
        assert "0.weight" in again.param_layouts


def test_flops_agree_with_torch_flop_counter(graph, found) -> None:
    """The graph's matmul FLOPs are FlopCounterMode's forward; with the backward (2x, the first linear's
    weight gradient alone: the input needs none) the step's FLOPs add only the biases and the GELUs (<1%)."""
    x = torch.randn(16, 256, device="meta")
    with torch.device("meta"):
        model = issue_mlp()
    with FlopCounterMode(display=False) as forward:
        out = model(x)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    at = {ir.graph.BATCH: 16}
    matmul = sum(float(n.flops.subs(at)) for n in graph.nodes if n.op == ir.OpKind.MATMUL)
    assert matmul - 16 * (1024 + 512 + 10) == forward.get_total_flops()  # the bias adds: one FLOP per output
    counted = forward.get_total_flops() + backward.get_total_flops()
    work = graph_work(graph, parse_cluster("cpu:1x4"), micro_batch=16, seq_len=1, dtype="float32")
    assert work.fwd_flops + work.bwd_flops == pytest.approx(counted, rel=0.01)
    pred = found[0].prediction
    step_flops = pred.model_tflops_per_gpu * 1e12 * pred.step_time_s * 4
    assert step_flops == pytest.approx(counted * BATCH / 16, rel=0.01)


def test_memory_follows_the_zero_stage(graph) -> None:
    """Optimizer states shard from stage 1, gradients and parameters at rest from stage 2 (the model is one
    FSDP unit, so stages 2 and 3 run the same program); activations grow with the micro-batch. DDP's
    gradients (bucket views) are held at the peak; FSDP2's, freed between steps, only beyond the
    activations of the first backward when there is one micro-batch (footprint._grads_at_peak)."""
    req, why = _request(graph, top=5)
    plans = {p.zero_stage: p for p in solve_blockless(req, why)}
    by_stage = {stage: p.prediction.memory_bytes for stage, p in plans.items()}
    params = sum(p.numel for p in graph.params)
    assert by_stage[0]["optimizer"] == 8 * params and by_stage[1]["optimizer"] == 2 * params
    assert by_stage[0]["grads"] == by_stage[1]["grads"] == 4 * params
    m = plans[3].num_microbatches
    held = params if m > 1 else max(0.0, params - by_stage[3]["activations"] / m)
    assert by_stage[3]["grads"] == pytest.approx(held)
    assert by_stage[2] == by_stage[3]
    small = solve_blockless(*_request(graph, fixed={"zero": 0, "micro_batch": 2}))[0].prediction.memory_bytes
    large = solve_blockless(*_request(graph, fixed={"zero": 0, "micro_batch": 16}))[0].prediction.memory_bytes
    assert large["activations"] == pytest.approx(8 * small["activations"])


def test_everything_pinned_is_evaluated(graph) -> None:
    plan = solve_blockless(*_request(graph, fixed={"zero": 3, "micro_batch": 8, "dp": 4}))[0]
    assert (plan.zero_stage, plan.micro_batch_size, plan.num_microbatches) == (3, 8, 2)
    assert plan.solver.status == "EVALUATED"


@pytest.mark.parametrize("fixed, words", [
    ({"tp": 2}, "fixed: tp=2, but tensor parallelism is not offered: no repeated blocks"),
    ({"pp": 2}, "fixed: pp=2, but pipeline parallelism is not offered: no repeated blocks"),
    ({"ep": 2}, "fixed: ep=2, but expert parallelism is not offered"),
    ({"recompute": "full"}, "recomputation is chosen per block and this model has no repeated blocks"),
    ({"dp": 2}, "runs data parallelism over all 4 GPUs of cpu:1x4; pin dp=4"),
    ({"micro_batch": 3}, "does not split the local batch 16"),
    ({"zero": 5}, "fixed: zero=5"),
])
def test_pins_it_cannot_honour_are_refused_with_the_reason(graph, fixed, words) -> None:
    with pytest.raises(ir.PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        solve_blockless(*_request(graph, fixed=fixed))


def test_a_batch_that_does_not_split_over_the_cluster_is_refused(graph) -> None:
    with pytest.raises(ir.InfeasibleError, match=r"global batch 30 does not split over dp\(4\): 30 % 4 = 2"):
        solve_blockless(*_request(graph, global_batch=30))


def test_a_model_too_big_for_the_memory_is_infeasible_with_the_arithmetic() -> None:
    """Four 16k x 16k linears: 1.07 G parameters, 17 GB of fp32 states; even sharded, ZeRO-2/3 gathers the
    one unit whole (parameters and gradients, 8.6 GB) on every CPU rank of 7.5 GB."""
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(16384, 16384) for _ in range(4)))
    with pytest.raises(ir.InfeasibleError) as err:
        mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=1,
                           example_inputs=(torch.randn(8, 16384, device="meta"),))
    message = str(err.value)
    assert "Sequential needs" in message and "GB per GPU at best" in message and "7.5 GB usable on cpu:1x4" in message
    assert "gathers a model without repeated blocks whole on every GPU" in message
