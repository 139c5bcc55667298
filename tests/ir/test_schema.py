"""The plan schema (ir/schema.py): each invalid plan of the fuzzing findings is refused naming the field,
the value and the rule; anything thrown at Plan.from_json gives a PlanError or a valid plan; the committed
JSON Schema is the generated one; the closed sets are the code's."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan import ir
from meshplan.ir import schema

MODEL = {"family": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 160, "vocab": 512,
         "max_seq_len": 128, "name": "llama-tiny"}
STRUCTURE = {"blocks": "model.layers", "num_blocks": 4, "attn": "self_attn", "q": "self_attn.q_proj",
             "mlp_in": ["mlp.gate_proj", "mlp.up_proj"], "tied_head": True, "linear_kind": "linear",
             "notes": ["rotary embedding kept whole: no parameters"]}


def _good() -> dict:
    pred = ir.Prediction(step_time_s=0.1, tokens_per_s=1e4, model_tflops_per_gpu=1.5, hardware_tflops_per_gpu=2.0,
                         mfu=0.4, peak_memory_bytes=1e9,
                         memory_bytes={"params": 1, "grads": 1, "optimizer": 1, "activations": 1, "buffers": 1},
                         time_s={"compute": 0.08, "exposed_comm": 0.02, "bubble": 0.0})
    solver = ir.SolverInfo(status="OPTIMAL", wall_s=1.0, gap=0.0, phases={"enumerate": 0.5},
                           alternatives=({"summary": "dp=2", "step_time_s": 0.2, "peak_memory_bytes": 2e9,
                                          "why": "slower", "fuse": False},))
    plan = ir.Plan(model=MODEL, cluster="h100-sxm:1x8", global_batch=8, seq_len=128, mesh=ir.Mesh(pp=2, dp=2, tp=2),
                   micro_batch_size=1, num_microbatches=4, recompute=("none", "full", "none", "selective"),
                   stages=((0, 2), (2, 4)), param_layouts={"layers.3.attn.wq.weight": ("R", "R", "R", "S(0)", "R")},
                   fusions=("add_rmsnorm", "swiglu"), prediction=pred, solver=solver)
    return json.loads(plan.to_json())


def _error(edit) -> str:
    data = copy.deepcopy(_good())
    edit(data)
    with pytest.raises(ir.InvalidPlanError) as err:
        ir.Plan.from_json(json.dumps(data), where="p.json")
    return str(err.value)


def test_the_good_plan_and_a_users_model_round_trip() -> None:
    data = _good()
    data.update(source={"kind": "hf", "config": {"model_type": "llama", "rope_scaling": None, "dims": [1, 2.5]}},
                structure=STRUCTURE)
    data["param_layouts"] = {"model.layers.3.self_attn.q_proj.weight": ["R", "R", "R", "S(0)", "R"]}
    plan = ir.Plan.from_dict(data)
    assert plan.source["config"]["dims"] == [1, 2.5] and plan.structure == STRUCTURE
    assert ir.Plan.from_json(plan.to_json()) == plan and ir.Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    for source in ({"kind": "zoo", "name": "llama3-8b"}, {"kind": "module"}, {"kind": "zoo", "config": MODEL},
                   {"kind": "hf", "config": {"n_layer": 2}, "class": "GPT2LMHeadModel"},
                   {"kind": "builder", "target": "pkg.models:build", "kwargs": {"depth": 2}}):
        assert ir.Plan.from_dict({**data, "source": source}).source == source


@pytest.mark.parametrize("edit, message", [
    # the mesh fills the cluster (finding: emitted, then IndexError under torchrun)
    (lambda d: d.update(cluster="h100-sxm:2x8"),
     "p.json: mesh: pp(2) * dp(2) * cp(1) * tp(2) = 8 ranks but the cluster 'h100-sxm:2x8' has 2 x 8 = 16 GPUs"),
    (lambda d: d.update(cluster="h100-sxm:1x"), "p.json: cluster: is not of the form NAME:NODESxGPUS"),
    (lambda d: d.update(cluster="h100 sxm"), "cluster: is not of the form"),
    (lambda d: d.update(cluster="h100-sxm:0x8"), "cluster: 0x8 GPUs must be 1 to"),
    # stages and recompute cover the layers
    (lambda d: d.update(stages=[[0, 2], [2, 3]]), "stages: end at layer 3 but the model has 4 layers"),
    (lambda d: d.update(recompute=["none"] * 3), "recompute: has 3 entries but the model has layers(4)"),
    (lambda d: d.update(recompute=["none"] * 6_000_000), "recompute: may hold at most 1024 items"),
    (lambda d: d["model"].update(layers=6_000_000), "model.layers: must be at most 1024"),
    # layouts
    (lambda d: d.update(param_layouts={"w": ["R", "R"]}), "param_layouts['w']: must hold at least 5 items"),
    (lambda d: d.update(param_layouts={"w": ["R", "X", "R", "R", "R"]}),
     "param_layouts['w'][1]: must be a placement: S(dim), R or P, got 'X'"),
    (lambda d: d.update(param_layouts={"layers.7.mlp.w": ["R"] * 5}),
     "param_layouts['layers.7.mlp.w']: names block 7 of layers but the model has layers(4)"),
    (lambda d: d.update(param_layouts={"a b": ["R"] * 5}), "param_layouts['a b']: the key must be a module path"),
    # closed sets
    (lambda d: d.update(dtype="int64"), "dtype: expected 'float32', 'float16', 'bfloat16', 'float8' or 'float4', got 'int64'"),
    (lambda d: d.update(fusions=["warp_speed"]), "fusions[0]: expected 'add_layernorm'"),
    (lambda d: d.update(fusions=["swiglu", "swiglu"]), "fusions: names a fusion twice"),
    # model dims
    (lambda d: d["model"].update(heads=0), "model.heads: must be at least 1, got 0"),
    (lambda d: d["model"].update(vocab=-5), "model.vocab: must be at least 1, got -5"),
    (lambda d: d["model"].update(heads=6), "model.hidden: hidden(64) must divide by heads(6)"),
    (lambda d: d["model"].update(kv_heads=3), "model.kv_heads: heads(4) must divide by kv_heads(3)"),
    (lambda d: d["model"].update(layers=True), "model.layers: expected an integer, got True"),
    (lambda d: d["model"].update(hidden=64.0), "model.hidden: expected an integer, got 64.0"),
    (lambda d: d.update(seq_len=256), "seq_len: seq_len(256) exceeds the model's max_seq_len(128)"),
    # strict types and ranges
    (lambda d: d.update(global_batch=True), "global_batch: expected an integer, got True"),
    (lambda d: d.update(global_batch="8"), "global_batch: expected an integer, got '8'"),
    (lambda d: d.update(sequence_parallel=1), "sequence_parallel: expected true or false, got 1"),
    (lambda d: d["mesh"].update(tp=10**8), "mesh.tp: must be at most 10000000"),
    (lambda d: d.update(seq_len=2**40), "seq_len: must be at most 16777216"),
    (lambda d: d.update(global_batch=10**60), "p.json: global_batch: an integer of 61 digits (100000000000...), more than the limit of 40"),
    # predictions finite and non-negative
    (lambda d: d["prediction"].update(step_time_s=-0.1), "prediction.step_time_s: must be at least 0"),
    (lambda d: d["prediction"]["memory_bytes"].update(params=-1), "prediction.memory_bytes['params']: must be at least 0"),
    (lambda d: d["prediction"].update(mfu="high"), "prediction.mfu: expected a number, got 'high'"),
    (lambda d: d["solver"].update(gap=-1), "solver.gap: must be at least 0"),
    (lambda d: d["solver"]["alternatives"][0].pop("why"), "solver.alternatives[0].why: required field is missing"),
    (lambda d: d["solver"].update(binding=7), "solver.binding: expected a string, got 7"),
    # source and structure
    (lambda d: d.update(source={"kind": "builder", "target": "os.system"}),
     "source.target: must be 'package.module:function', got 'os.system'"),
    (lambda d: d.update(source={"kind": "url", "href": "http://x"}), "source: kind must be one of 'zoo', 'hf'"),
    (lambda d: d.update(source={"kind": "zoo", "name": "llama3-8b", "extra": 1}), "source.extra: unknown field"),
    (lambda d: d.update(source={"kind": "hf", "config": {"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}}),
     "source.config: a[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested more than 16 deep"),
    (lambda d: d.update(source={"kind": "hf", "config": "llama"}), "source.config: expected an object"),
    (lambda d: d.update(source={"kind": "hf", "config": {}, "class": "os.system"}),
     "source.class: must be a Python identifier, got 'os.system'"),
    (lambda d: d.update(source={"kind": "zoo"}), "source: a zoo source names a zoo model (name) or gives a zoo config"),
    (lambda d: d.update(structure={"blocks": "model..layers"}), "structure.blocks: must be a module path"),
    (lambda d: d.update(structure={"num_blocks": -1}), "structure.num_blocks: must be at least 0"),
    (lambda d: d.update(structure={"tied_head": 1}), "structure.tied_head: expected true or false, got 1"),
    (lambda d: d.update(structure={"mlp_in": ["a", "a"]}), "structure.mlp_in: lists a module path twice"),
    (lambda d: d.update(structure={"linear_kind": "conv3d"}), "structure.linear_kind: expected 'linear' or 'conv1d'"),
    (lambda d: d.update(structure={"num_blocks": 4}), "structure: num_blocks is 4 but blocks (the container) is empty"),
    (lambda d: d.update(structure={"roles": {}}), "structure.roles: unknown field"),
])
def test_invalid_plans_name_the_field_the_value_and_the_rule(edit, message) -> None:
    msg = _error(edit)
    assert message in msg
    assert "\n" not in msg and len(msg) < 600


def test_a_profile_cluster_is_checked_for_form_only() -> None:
    data = _good()
    assert ir.Plan.from_dict({**data, "cluster": "profiles/my-cluster.json"}).cluster.endswith(".json")
    assert ir.Plan.from_dict({**data, "cluster": "h100-sxm"}).cluster == "h100-sxm"  # preset size: cost_model's


def test_several_problems_are_counted() -> None:
    msg = _error(lambda d: d["prediction"].update(step_time_s=-1, mfu=-1, tokens_per_s=-1))
    assert msg.endswith("(and 2 more problems)")


def test_in_memory_values_are_bounded_too() -> None:
    data = _good()
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ir.InvalidPlanError, match="nested more than 64 deep"):
        ir.Plan.from_dict({**data, "model": {**MODEL, "extra": deep}})
    with pytest.raises(ir.InvalidPlanError, match="finite"):
        ir.Plan.from_dict({**data, "seq_len": float("nan")})
    with pytest.raises(ir.InvalidPlanError, match="not a JSON value"):
        ir.Plan.from_dict({**data, "model": {**MODEL, "name": object()}})


# ---- never another exception ------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_is_a_plan_error_or_a_plan(value) -> None:
    _plan_or_plan_error(json.dumps(value))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), json_values)
def test_a_valid_plan_with_any_field_replaced_is_a_plan_error_or_a_plan(data_strategy, value) -> None:
    data = _good()
    target = data_strategy.draw(st.sampled_from([data, data["mesh"], data["model"], data["prediction"],
                                                 data["prediction"]["memory_bytes"], data["solver"],
                                                 data["solver"]["alternatives"][0]]))
    key = data_strategy.draw(st.sampled_from(sorted(target)) | st.text(max_size=6))
    target[key] = value
    _plan_or_plan_error(json.dumps(data))


def _plan_or_plan_error(text: str) -> None:
    try:
        plan = ir.Plan.from_json(text)
    except ir.PlanError:
        return
    assert ir.Plan.from_json(plan.to_json()) == plan  # what loads, saves and loads again


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.sampled_from(["none", "selective", "full"]), st.sampled_from(["zoo", "hf", "module"]))
def test_saved_valid_plans_round_trip(tmp_path_factory, layers_off, rc, kind) -> None:
    data = _good()
    data["recompute"] = [rc] * 4
    data["source"] = {"zoo": {"kind": "zoo", "name": "llama-tiny"}, "hf": {"kind": "hf", "config": {"n": layers_off}},
                      "module": {"kind": "module"}}[kind]
    plan = ir.Plan.from_dict(data)
    path = plan.save(tmp_path_factory.mktemp("plans") / "p.json")
    again = ir.Plan.load(path)
    assert again == plan and again.to_json() == plan.to_json()


# ---- the schema file and the closed sets ------------------------------------------------------------------
def test_committed_json_schema_is_the_generated_one() -> None:
    committed = schema.SCHEMA_FILE.read_text()
    assert committed == schema.json_schema_text(), "run: python -m meshplan.ir.schema"
    parsed = json.loads(committed)
    assert parsed["$id"] == ir.SCHEMA and set(parsed["required"]) == {"schema", "model", "cluster", "global_batch",
                                                                      "seq_len", "mesh"}
    assert parsed["properties"]["dtype"]["enum"] == list(schema.TRAIN_DTYPES)


def test_schema_knows_every_field_of_the_plan() -> None:
    from dataclasses import fields
    assert {f.name for f in fields(ir.Plan)} | {"schema"} == {f.alias or n for n, f in schema.PlanFile.model_fields.items()}


def test_closed_sets_are_the_codes() -> None:
    from meshplan.codegen.kernels.patterns import PATTERNS
    assert set(schema.FUSION_NAMES) == {p.name for p in PATTERNS}
    assert set(schema.TRAIN_DTYPES) <= set(ir.DTYPE_BYTES) and "bfloat16" in schema.TRAIN_DTYPES
    assert "int64" not in schema.TRAIN_DTYPES
