"""Plans survive a JSON round trip, and bad plan files are refused with where and why."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import ir

MODEL = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "max_seq_len": 128,
         "name": "gpt-tiny"}


def _prediction(step: float, mem: float) -> ir.Prediction:
    return ir.Prediction(step_time_s=step, tokens_per_s=1000 / step, model_tflops_per_gpu=1.5,
                         hardware_tflops_per_gpu=2.0, mfu=0.4, peak_memory_bytes=mem,
                         memory_bytes={"params": mem / 5, "grads": mem / 5, "optimizer": mem / 5,
                                       "activations": mem / 5, "buffers": mem / 5},
                         time_s={"compute": step * 0.8, "exposed_comm": step * 0.2, "bubble": 0.0},
                         memory_limit_bytes=80e9)


@st.composite
def plans(draw) -> ir.Plan:
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2]))
    mb = draw(st.integers(1, 4))
    n_mb = draw(st.integers(1, 4))
    layers = 4
    sp = tp > 1 and draw(st.booleans())
    stages = ((0, 2), (2, 4)) if pp == 2 else ()
    recompute = tuple(draw(st.lists(st.sampled_from(list(ir.Recompute)), min_size=layers, max_size=layers)))
    pred = draw(st.none() | st.builds(_prediction, st.floats(1e-3, 10), st.floats(1e6, 1e11)))
    solver = draw(st.none() | st.builds(ir.SolverInfo, status=st.sampled_from(["OPTIMAL", "FEASIBLE"]),
                                        wall_s=st.floats(0, 60), gap=st.floats(0, 1),
                                        candidates=st.integers(0, 999)))
    return ir.Plan(model=MODEL, cluster=f"h100-sxm:1x{tp * dp * pp}", global_batch=mb * n_mb * dp, seq_len=128,
                   mesh=ir.Mesh(pp=pp, dp=dp, tp=tp), zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
                   sequence_parallel=sp, micro_batch_size=mb, num_microbatches=n_mb, recompute=recompute,
                   stages=stages, param_layouts={"output.weight": ("R", "S(0)", "R", "S(0)", "R")},
                   prediction=pred, solver=solver)


@settings(max_examples=60, deadline=None)
@given(plans())
def test_json_round_trip(plan: ir.Plan) -> None:
    again = ir.Plan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()


def _good() -> dict:
    plan = ir.Plan(model=MODEL, cluster="cpu:1x4", global_batch=8, seq_len=16, mesh=ir.Mesh(dp=4),
                   micro_batch_size=2, recompute=("none",) * 4, prediction=_prediction(0.1, 1e9))
    return json.loads(plan.to_json())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="meshplan.plan/0"), "schema: this meshplan reads 'meshplan.plan/1', the file says"),
    (lambda d: d.pop("mesh"), "missing field(s) ['mesh']"),
    (lambda d: d["mesh"].update(tp="two"), "mesh.tp: expected an integer, got 'two'"),
    (lambda d: d.update(global_batch=9), "= 8 != global_batch(9)"),
    (lambda d: d.update(zero_stage=5), "zero_stage: expected 0, 1, 2 or 3, got 5"),
    (lambda d: d.update(recompute=["none", "some"]), "recompute[1]: expected 'none', 'selective', 'full' or 'offload', got 'some'"),
    (lambda d: d.update(schedule="fast"), "schedule: expected 'gpipe', '1f1b'"),
    (lambda d: d.update(surprise=1), "unknown field(s) ['surprise']"),
    (lambda d: d["prediction"].pop("step_time_s"), "prediction.step_time_s: required field is missing"),
    (lambda d: d.update(param_layouts={"w": ["S(x)"] + ["R"] * 4}),
     "param_layouts['w'][0]: must be a placement: S(dim), R or P, got 'S(x)'"),
    (lambda d: d.update(mesh={"dp": 4, "ep": 3}), "ep(3) must divide tp(1) * dp(4) * cp(1) = 4"),
    (lambda d: d.update(zero_stage=3, zero_group=3), "dp(4) % zero_group(3) = 1"),
    (lambda d: d.update(zero_stage=3, zero_group=4), "zero_group(4) must be > 1, < dp(4)"),
    (lambda d: d.update(zero_stage=1, zero_group=2), "zero_group(2) needs zero_stage 2 or 3"),
    (lambda d: d.update(zero_stage=3, zero_group="2"), "zero_group: expected an integer, got '2'"),
])
def test_bad_plan_files_say_what_and_where(tmp_path, edit, message) -> None:
    data = _good()
    edit(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ir.InvalidPlanError) as err:
        ir.Plan.load(path)
    assert message in str(err.value)


def test_not_json_and_missing_file(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ir.InvalidPlanError, match=r"p.json: not valid JSON .* line 1"):
        ir.Plan.load(path)
    with pytest.raises(ir.InvalidPlanError, match="cannot read plan file"):
        ir.Plan.load(tmp_path / "absent.json")


def test_loading_never_executes_code(tmp_path) -> None:
    data = _good()
    data["model"]["name"] = "__import__('os').system('touch pwned')"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    plan = ir.Plan.load(path)
    assert plan.model["name"].startswith("__import__")
    assert not (tmp_path / "pwned").exists()


def test_zero_group_round_trips() -> None:
    import dataclasses
    plan = ir.Plan.from_dict(_good())
    hybrid = dataclasses.replace(plan, zero_stage=3, zero_group=2)
    back = ir.Plan.from_json(hybrid.to_json())
    assert back == hybrid and back.zero_group == 2
    assert "hsdp=2" in back.summary()
    assert ir.Plan.from_json(plan.to_json()).zero_group == 0
