"""An accelerator calibrated against published runs (``Accelerator.calibration``, fitted by
``bench/reference_runs.py --write-calibration``): its prediction is the priced step plus an ``unpriced`` part of
(1/c - 1) of the priced compute outside the attention core (``Prediction.attention_s``), which every report shows
and which leaves the priced parts as they are; an accelerator without one (a CPU profile, a cluster file that gives
none) prices as before; a bad value is refused naming the field."""
from __future__ import annotations

import copy
import json

import pytest

from meshplan import ir
from meshplan.cost_model import estimate, parse_cluster, preset_data
from meshplan.ir.errors import InvalidClusterError


def _file(tmp_path, calibration=None, name="h100.json") -> str:
    data = copy.deepcopy(preset_data("h100-sxm"))
    data["accelerator"].pop("calibration", None)
    if calibration is not None:
        data["accelerator"]["calibration"] = {"value": calibration, "source": "test"}
    data["nodes"] = {"value": 1, "source": "test"}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_the_gpu_presets_carry_a_calibration_and_the_cpu_none() -> None:
    for name in ("a100-80gb", "h100-sxm", "h200", "b200", "gb200-nvl72", "gb300-nvl72"):
        entry = preset_data(name)["accelerator"]["calibration"]
        assert 0.8 < entry["value"] < 1 and "--write-calibration" in entry["source"], name
    assert parse_cluster("cpu:1x4").accelerator.calibration == 1.0
    assert "calibration" not in preset_data("tpu-v5p")["accelerator"]  # no published run to fit it on


def test_calibration_adds_an_unpriced_part_of_the_compute_outside_attention_and_moves_nothing_else(
        tmp_path, make_graph, make_plan, make_gpt) -> None:
    cfg = make_gpt(8, 2048, 16, seq=2048)
    graph = make_graph(cfg)
    bare, half = parse_cluster(_file(tmp_path)), parse_cluster(_file(tmp_path, 0.5, "half.json"))
    assert (bare.accelerator.calibration, half.accelerator.calibration) == (1.0, 0.5)
    for dp, zero, recompute in ((8, 1, "none"), (8, 3, "selective"), (4, 0, "full")):
        plan = make_plan(cfg, bare, global_batch=32, seq_len=2048, dp=dp, tp=8 // dp, zero=zero, recompute=recompute)
        priced, shipped = estimate(graph, bare, plan), estimate(graph, half, plan)
        assert "unpriced" not in priced.time_s
        assert {k: shipped.time_s[k] for k in priced.time_s} == priced.time_s
        assert 0 < priced.attention_s == shipped.attention_s < priced.time_s["compute"]
        # 1/0.5 - 1 = 1 of the compute outside the attention core
        assert shipped.time_s["unpriced"] == pytest.approx(priced.time_s["compute"] - priced.attention_s)
        assert shipped.step_time_s == pytest.approx(priced.step_time_s + shipped.time_s["unpriced"])
        assert shipped.mfu == pytest.approx(priced.mfu * priced.step_time_s / shipped.step_time_s)


def test_the_attention_core_is_counted_once_a_pass_and_again_where_it_is_recomputed(
        tmp_path, make_graph, make_plan, make_gpt) -> None:
    """``Prediction.attention_s``: each layer's attention core forward and backward per micro-batch, and its forward
    once more under selective or full recomputation; nothing on a model without blocks."""
    from meshplan.cost_model.layer_cost import LayerShape, layer_cost
    from meshplan.cost_model.summary import summary_of

    cfg = make_gpt(8, 2048, 16, seq=2048)
    graph = make_graph(cfg)
    bare = parse_cluster(_file(tmp_path))
    shape = LayerShape(dims=summary_of(graph).dims, micro_batch=4, seq_len=2048)
    layer = layer_cost(shape, bare)
    assert layer.core_bwd_s > layer.core_fwd_s > 0
    for recompute, again in (("none", 0), ("selective", 1), ("full", 1)):
        plan = make_plan(cfg, bare, global_batch=32, seq_len=2048, dp=8, zero=1, recompute=recompute, micro_batch=4)
        per_layer = layer.core_fwd_s + layer.core_bwd_s + again * layer.core_fwd_s
        assert estimate(graph, bare, plan).attention_s == pytest.approx(
            plan.num_microbatches * cfg.layers * per_layer)


def test_the_unpriced_part_is_reported_and_survives_the_plan_file(tmp_path) -> None:
    import meshplan as mp

    cluster = parse_cluster(_file(tmp_path, 0.8))
    plan = mp.autoparallelize("gpt2-small", cluster, global_batch=16, seq_len=1024)
    p = plan.prediction
    assert p.time_s["unpriced"] == pytest.approx((p.time_s["compute"] - p.attention_s) * 0.25)  # 1/0.8 - 1
    text = ir.report.report(plan)
    assert "unpriced" in text
    again = ir.Plan.from_json(plan.to_json())
    assert again.prediction.time_s == plan.prediction.time_s
    assert again.prediction.attention_s == plan.prediction.attention_s > 0


@pytest.mark.parametrize("value", [0, -0.5, 1.5, "0.9", True, float("nan")])
def test_a_calibration_outside_zero_to_one_is_refused_naming_the_field(tmp_path, value) -> None:
    path = tmp_path / "bad.json"
    data = json.loads(open(_file(tmp_path)).read())
    data["accelerator"]["calibration"] = {"value": value, "source": "test"}
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidClusterError, match="calibration"):
        parse_cluster(str(path))
