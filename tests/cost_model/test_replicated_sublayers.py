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


def _structure(**over) -> dict:
    base = dict(blocks="model.layers", num_blocks=2, attn="self_attn", q="self_attn.q_proj", k="self_attn.k_proj",
                v="self_attn.v_proj", o="self_attn.o_proj", mlp="mlp", mlp_in=["mlp.gate_proj", "mlp.up_proj"],
                mlp_out="mlp.down_proj")
    return ir.ModelStructure.from_dict({**base, **over}).to_dict()


def test_a_model_on_its_own_modules_is_read_at_its_own_paths(make_graph, make_plan) -> None:
    """A Hugging Face or user model's plan names its own linears (``model.layers.0.self_attn.q_proj``), not the zoo's
    (``layers.0.attn.wq``): the sublayer its layouts keep whole is read there, and one tensor parallelism cannot split
    at all (GPT-2's Conv1D, a fused q/k/v projection: the runtime keeps it whole, ``ModelStructure.tp_linears``) is
    whole whatever the layouts say; an MoE's experts are not a dense MLP kept whole."""
    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    base = make_plan(cfg, cluster, global_batch=8, seq_len=2048, tp=4, dp=2)
    tp = ir.AXES.index("tp")
    lay = {f"model.layers.{i}.self_attn.q_proj.weight": tuple("R" if a != tp else p for a in range(len(ir.AXES)))
           for i, p in ((0, "R"), (1, "R"))}
    own = dataclasses.replace(base, structure=_structure())
    assert replicated_sublayers(own) == frozenset()  # no layouts: the runtime runs Megatron's split
    assert replicated_sublayers(dataclasses.replace(own, param_layouts=lay)) == {"attn"}
    fused = dataclasses.replace(base, structure=_structure(q="", k="", v="", qkv="self_attn.qkv_proj"))
    assert replicated_sublayers(fused) == {"attn"}
    # one laid out by heads (GPT-NeoX's): split by its rows, priced split
    grouped = dataclasses.replace(base, structure=_structure(q="", k="", v="", qkv="self_attn.qkv_proj",
                                                             qkv_grouped=True))
    assert replicated_sublayers(grouped) == frozenset()
    assert estimate(graph, cluster, grouped).step_time_s == pytest.approx(estimate(graph, cluster, own).step_time_s)
    conv = dataclasses.replace(base, structure=_structure(linear_kind="conv1d"))
    assert replicated_sublayers(conv) == {"attn", "mlp"}
    moe = dataclasses.replace(base, structure=_structure(mlp_in=[], mlp_out="", experts="mlp.experts",
                                                         router="mlp.gate"))
    assert replicated_sublayers(moe) == frozenset()
    no_tp = make_plan(cfg, cluster, global_batch=8, seq_len=2048, tp=1, dp=8)
    assert replicated_sublayers(dataclasses.replace(no_tp, structure=conv.structure)) == set()
    # priced whole: the fused-q/k/v plan computes and holds attention on every tp rank
    split, whole = estimate(graph, cluster, own), estimate(graph, cluster, fused)
    assert whole.time_s["compute"] > split.time_s["compute"]
    assert whole.memory_bytes["params"] > split.memory_bytes["params"]


def test_norms_over_split_features_add_one_small_all_reduce_each(make_graph, make_plan) -> None:
    """OLMo 2's q_norm / k_norm over every head's features (``ModelStructure.feature_norms``): split with q_proj and
    k_proj, each reduces its mean of squares over tp, one fp32 number a token, in the forward and the backward
    (``runtime.styles.FeatureShardedNorm``); nothing without tp, or where attention is kept whole."""
    from meshplan.cost_model.collectives import collective_time
    from meshplan.cost_model.sublayers import norm_reductions

    cfg = zoo.config("llama3-8b")
    graph, cluster = make_graph(cfg), Cluster.preset("h100-sxm")
    base = make_plan(cfg, cluster, global_batch=8, seq_len=2048, tp=4, dp=2)
    plain = dataclasses.replace(base, structure=_structure())
    normed = dataclasses.replace(base, structure=_structure(feature_norms=["self_attn.q_norm", "self_attn.k_norm"]))
    assert norm_reductions(plain, frozenset()) == 0 and norm_reductions(normed, replicated_sublayers(normed)) == 2
    whole = dataclasses.replace(normed, structure=_structure(q="", k="", v="", feature_norms=["self_attn.q_norm"]))
    assert norm_reductions(whole, replicated_sublayers(whole)) == 0  # attention whole: nothing split
    a, b = estimate(graph, cluster, plain), estimate(graph, cluster, normed)
    one = collective_time("all-reduce", 4.0 * base.micro_batch_size * base.seq_len, 4, 1, cluster)
    per_step = 2 * 2 * one * cfg.layers * base.num_microbatches  # 2 norms, forward and backward, every layer
    assert b.time_s["exposed_comm"] - a.time_s["exposed_comm"] == pytest.approx(per_step, rel=1e-6)
    assert b.time_s["compute"] == pytest.approx(a.time_s["compute"])
