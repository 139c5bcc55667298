"""A sublayer the plan keeps whole over tp (the intra-op program's choice) is priced whole: its
parameters on every tp rank, its compute at tp = 1, the layer's activations unsplit."""
from __future__ import annotations

import dataclasses

import pytest

from meshplan import ir, zoo
from meshplan.cost_model import Cluster, estimate
from meshplan.cost_model.flops import dense_mlp_params
from meshplan.cost_model.sublayers import replicated_sublayers


def _layouts(cfg: zoo.ModelConfig, mlp: str) -> dict[str, tuple[str, ...]]:
    tp = ir.AXES.index("tp")

    def lay(p: str) -> tuple[str, ...]:
        out = ["R"] * len(ir.AXES)
        out[tp] = p
        return tuple(out)

    return {f"layers.{i}.{name}.weight": lay(p) for i in range(cfg.layers)
            for name, p in (("attn.wq", "S(0)"), ("attn.wo", "S(1)"), ("mlp.fc1", mlp), ("mlp.fc2", "R" if mlp == "R"
                                                                                            else "S(1)"))}


def test_replicated_mlp_holds_its_weights_whole_and_computes_them_whole(make_graph, make_plan) -> None:
    cfg = zoo.config("gpt3-1.3b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    base = make_plan(cfg, cluster, global_batch=8, seq_len=2048, tp=4, dp=2)
    split = dataclasses.replace(base, param_layouts=_layouts(cfg, "S(0)"))
    whole = dataclasses.replace(base, param_layouts=_layouts(cfg, "R"))
    assert replicated_sublayers(split) == frozenset() and replicated_sublayers(whole) == {"mlp"}
    a, b = estimate(graph, cluster, split), estimate(graph, cluster, whole)
    extra = cfg.layers * dense_mlp_params(graph.dims) * (1 - 1 / 4)
    # meshplan's runtime holds fp32 parameters (the master weights; cost_model.software.fp32_params) and AdamW's
    # two fp32 moments
    assert b.memory_bytes["params"] - a.memory_bytes["params"] == pytest.approx(4 * extra)
    assert b.memory_bytes["optimizer"] - a.memory_bytes["optimizer"] == pytest.approx(8 * extra)
    assert b.memory_bytes["activations"] > a.memory_bytes["activations"]
    assert b.time_s["compute"] > a.time_s["compute"]
    assert estimate(graph, cluster, base).step_time_s == pytest.approx(a.step_time_s)  # no layouts: all split
