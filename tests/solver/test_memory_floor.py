"""The window times only the candidates that can fit: ``search.memory_floor`` is exactly the least memory
``min_memory`` reads from the candidate's full cost, with and without a pinned recompute policy, offloading offered
(Megatron-Core, which offloads alone and keeps a layer on the GPU, on GB200; meshplan's runtime on H100), so
skipping the rest changes no answer; and the full cost, memory first and then the step, is the cost model's
``estimate`` of each uniform policy."""
from __future__ import annotations

import pytest

from meshplan import ir, zoo
from meshplan.cost_model import Cluster, estimate, software_named
from meshplan.solver.search import Request, cost_candidate, memory_floor, min_memory, plan_of
from meshplan.solver.space import MEGATRON, RUNTIME, candidates, scale_up_gpus


def _llama70b() -> ir.Graph:
    cfg = zoo.config("llama3-70b")
    dims = ir.ModelDims(family=cfg.family, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                        kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab)
    return ir.Graph(nodes=(), params=(ir.Param(name="all", shape=(zoo.param_count(cfg),)),), blocks=(), dims=dims)


CASES = [("gb200-nvl72", 16, 4, "megatron-core-perf-recipes"), ("h100-sxm", 4, 8, "meshplan")]


@pytest.mark.parametrize(("preset", "nodes", "per_node", "software"), CASES)
def test_the_floor_is_the_least_memory_of_the_full_costing(preset, nodes, per_node, software) -> None:
    cluster = Cluster.preset(preset, nodes=nodes, gpus_per_node=per_node)
    sw = software_named(software)
    runtime = RUNTIME if software == "meshplan" else MEGATRON
    req = Request(graph=_llama70b(), cluster=cluster, model={"name": "llama3-70b"}, global_batch=128, seq_len=8192,
                  runtime=runtime, software=sw)
    cands = candidates(req.graph.dims, world=cluster.world_size, domain=scale_up_gpus(cluster), global_batch=128,
                       seq_len=8192, fixed={}, runtime=runtime)
    sample = cands[:: max(1, len(cands) // 40)]
    offloads = fits = 0
    for cand in sample:
        cost = cost_candidate(req, cand)
        offloads += len(cost.saved_bytes) == 3
        none = estimate(req.graph, cluster, plan_of(req, cand), software=sw)
        assert (cost.time_s, cost.memory_bytes) == (none.step_time_s, none.peak_memory_bytes)
        for policy, extra, saved in zip(("selective", "full", "offload"), cost.extra_time_s, cost.saved_bytes):
            done = cost.layers if policy != "offload" or cost.offload_cap is None else min(cost.layers, cost.offload_cap)
            end = estimate(req.graph, cluster, plan_of(req, cand, **{policy: cost.layers}), software=sw)
            assert extra == max(0.0, (end.step_time_s - none.step_time_s) / max(done, 1))
            assert saved == max(0.0, (none.peak_memory_bytes - end.peak_memory_bytes) / max(done, 1))
        for pinned in (None, "none", "selective", "full", "offload"):
            floor = memory_floor(req, cand, pinned)
            assert floor == min_memory(cost, pinned), (cand.describe(), pinned)
        fits += memory_floor(req, cand) <= cluster.accelerator.usable_memory_bytes
    assert 0 < fits < len(sample)  # the sample holds candidates on both sides of the limit
    assert offloads > 0
