"""The user's own model at the API and CLI: where it comes from, and each bad input refused with a
message that names what is wrong and what to do (no traceback)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import meshplan as mp
from meshplan import frontend, ir, zoo
from meshplan.runtime import source as sources

import user_models


def test_builder_that_does_not_import_is_named() -> None:
    with pytest.raises(ir.UnsupportedModelError, match="cannot import 'no_such_pkg.models'"):
        mp.autoparallelize("no_such_pkg.models:build", "cpu:1x4", global_batch=8, seq_len=16)


@pytest.mark.parametrize("target", ["__import__('os').system('true')", "pkg.mod", "pkg.mod:fn:x", "pkg-x.m:f"])
def test_builder_target_must_be_dotted_identifiers(target: str) -> None:
    with pytest.raises(ir.UnsupportedModelError, match="'package.module:function'"):
        sources.builder_source(target)


def test_builder_kwargs_must_be_json() -> None:
    with pytest.raises(ir.UnsupportedModelError, match="plain JSON"):
        sources.builder_source("user_models:nanogpt", {"n_layer": object()})


def test_hf_architecture_transformers_lacks_is_named() -> None:
    pytest.importorskip("transformers")
    with pytest.raises(ir.UnsupportedModelError, match="model_type 'no-such-arch'"):
        sources.build({"kind": "hf", "config": {"model_type": "no-such-arch"}})
    with pytest.raises(ir.UnsupportedModelError, match="no model class 'NoSuchForCausalLM'"):
        sources.build({"kind": "hf", "class": "NoSuchForCausalLM", "config": user_models.hf_llama_config()})


def test_a_model_without_repeated_blocks_plans_data_parallelism_with_the_reason() -> None:
    """Planned node by node (tests/test_blockless_models.py has the rest)."""
    plan = mp.autoparallelize(user_models.mlp_stack(), "cpu:1x4", global_batch=8, seq_len=16,
                              example_inputs=lambda b, s: (torch.randn(b, 32),))
    assert plan.mesh == ir.Mesh(dp=4)
    assert "tensor parallelism is not offered: no repeated blocks" in plan.report()


def test_sources_of_modules() -> None:
    pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = sources.build({"kind": "hf", "config": user_models.hf_llama_config()})
        zoo_model = mp.zoo.build("gpt-tiny")
    assert mp.api.source_of(hf)["class"] == "LlamaForCausalLM"
    assert mp.api.source_of(hf)["config"]["hidden_size"] == 64
    assert mp.api.source_of(zoo_model) == {"kind": "zoo", "config": zoo_model.config.to_dict()}
    assert mp.api.source_of(user_models.nanogpt()) == {"kind": "module"}


def test_a_plan_of_the_callers_module_is_not_emitted(tmp_path) -> None:
    with torch.device("meta"):
        model = user_models.nanogpt(n_layer=2, n_head=4, n_embd=32)
    plan = mp.autoparallelize(model, "cpu:1x2", global_batch=4, seq_len=16, fixed={"dp": 2, "tp": 1, "zero": 0})
    assert plan.source == {"kind": "module"}
    with pytest.raises(ir.InvalidPlanError, match="only the caller holds that model"):
        plan.emit(tmp_path / "train.py")
    assert not (tmp_path / "train.py").exists()


@pytest.mark.parametrize("args, message", [
    (["--model", "hf:/no/such/dir"], "no Hugging Face config there"),
    (["--model", "user_models:nanogpt", "--model-kwargs", "[1, 2]"], "must be a JSON object"),
    (["--model", "user_models:nanogpt", "--model-kwargs", "{\"n_layer\": NaN}"], "not a JSON object"),
    (["--model", "llama-tiny", "--model-kwargs", "{}"], "goes with --model pkg.module:function"),
])
def test_cli_model_forms_refuse_bad_input_in_one_line(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "meshplan.cli", "plan", *args, "--cluster", "cpu:1x4",
                           "--global-batch", "8", "--seq-len", "16"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_estimate_takes_a_builder_and_records_its_source() -> None:
    """``meshplan estimate`` reads the same model forms as ``plan``; its plan names the builder and the
    structure traced from it."""
    import json
    import os
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"
    done = subprocess.run([sys.executable, "-m", "meshplan.cli", "estimate", "--model", "user_models:nanogpt",
                           "--model-kwargs", '{"n_layer": 4, "n_head": 4, "n_embd": 64, "vocab_size": 128}',
                           "--cluster", "h100-sxm:1x8", "--global-batch", "16", "--seq-len", "64", "--tp", "2",
                           "--no-sp", "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(examples)})
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["source"] == {"kind": "builder", "target": "user_models:nanogpt",
                              "kwargs": {"n_layer": 4, "n_head": 4, "n_embd": 64, "vocab_size": 128}}
    assert plan["structure"]["blocks"] == "transformer.h" and plan["model"]["layers"] == 4
    assert plan["mesh"]["tp"] == 2 and plan["prediction"]["step_time_s"] > 0


def test_one_module_planned_again_is_traced_once_while_it_is_unchanged(monkeypatch) -> None:
    import gc
    import weakref

    from meshplan import api, zoo

    traced = []
    real = api.trace
    monkeypatch.setattr(api, "trace", lambda *a, **k: traced.append(1) or real(*a, **k))
    with torch.device("meta"):
        model = zoo.build_from_config(zoo.config("llama-tiny"))
    first = mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=64)
    again = mp.autoparallelize(model, "h100-sxm:1x8", global_batch=8, seq_len=64, fixed={"tp": 2})  # other cluster, pins
    assert len(traced) == 1 and again.mesh.tp == 2 and first.model == again.model
    mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=32)  # traced at another length: traced again
    assert len(traced) == 2
    model.layers[3] = torch.nn.Identity()  # a changed module is traced again
    mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=64)
    assert len(traced) == 3
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # the cache does not keep a module alive


def test_a_zoo_model_planned_again_is_built_and_traced_once(monkeypatch) -> None:
    """A zoo name or config fixes the module: a sweep over clusters builds and traces it once; a builder is
    built again on every call (its code may change between two)."""
    from meshplan import api

    traced = []
    real = api.trace
    monkeypatch.setattr(api, "trace", lambda *a, **k: traced.append(1) or real(*a, **k))
    config = {**zoo.config("llama-tiny").to_dict(), "layers": 3}  # a config no other test plans: not cached yet
    plans = [mp.autoparallelize(config, cluster, global_batch=8, seq_len=64) for cluster in ("cpu:1x2", "cpu:1x4")]
    assert len(traced) == 1 and [p.world_size for p in plans] == [2, 4] and plans[0].model == plans[1].model
    assert api.model_and_source(config)[0] is api.model_and_source(dict(config))[0]
    builder = "user_models:mlp_stack"
    assert api.model_and_source(builder, {})[0] is not api.model_and_source(builder, {})[0]


def test_hugging_face_attention_is_not_replicated_under_sp_and_a_plan_that_does_is_refused() -> None:
    """HF's attention takes ``hidden_states=`` and returns a tuple: the search offers no replicated attention under
    sequence parallelism for it (``sp_whole_attn`` off), and a plan file that keeps it replicated under sp is refused
    with the reason where the program is built, not by torch's "module outputs and output_layouts" in the workers."""
    from meshplan import api
    from meshplan.codegen import tp_plans

    with torch.device("meta"):
        module = sources.build({"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config()})
    graph = api._traced(module, api.source_of(module), seq_len=32, example_inputs=None)
    runtime, _ = api.offered(graph.structure, zoo_modules=False, cp_why=())
    assert "sp" in runtime and "tp_replicate" in runtime and "sp_whole_attn" not in runtime
    zoo_runtime, _ = api.offered(graph.structure, zoo_modules=True)
    assert "sp_whole_attn" in zoo_runtime
    assert tp_plans.block_plan(graph.structure, sp=False, replicated=frozenset({"attn"}))  # plain module: runs
    assert graph.structure.attn_tuple and graph.structure.attn_kwarg == "hidden_states"
    with pytest.raises(ir.InvalidPlanError, match="attention returns a tuple"):
        tp_plans.block_plan(graph.structure, sp=True, replicated=frozenset({"attn"}))


def test_gpt2_attention_returns_a_tuple_so_sequence_parallelism_is_not_offered() -> None:
    """GPT-2's blocks hand attention the stream positionally, and it returns ``(attn_output, attn_weights)``: the
    trace records the tuple (``attn_tuple``), and with its Conv1D projections kept whole over tp, sequence
    parallelism is not offered (it would have to cut that tuple; the workers died in torch's PrepareModuleInput)."""
    from meshplan import api

    with torch.device("meta"):
        module = sources.build({"kind": "hf", "class": "GPT2LMHeadModel", "config": user_models.hf_gpt2_config()})
    graph = api._traced(module, api.source_of(module), seq_len=32, example_inputs=None)
    assert graph.structure.attn_tuple and graph.structure.attn_kwarg == "" and graph.structure.linear_kind == "conv1d"
    runtime, why = api.offered(graph.structure, zoo_modules=False, cp_why=())
    assert "sp" not in runtime and "tp" in runtime
    assert any("sequence parallelism is not offered" in w and "returns a tuple" in w for w in why), why


def test_a_block_the_intra_op_program_cannot_split_gets_megatron_s_split_on_its_own_paths() -> None:
    """Gemma 2's eager attention (softcapped scores: matmuls and softmax the intra-op program keeps whole) has no
    head split there; the plan then writes Megatron's split on the model's own module paths (what the runtime runs
    on a plan without layouts), not ``TP_RULES``' zoo names, which kept every Hugging Face linear replicated."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, num_hidden_layers=2, vocab_size=256,
                                       max_position_embeddings=128, sliding_window=128, query_pre_attn_scalar=16)
    with torch.device("meta"):
        model = transformers.Gemma2ForCausalLM(config)
    plan = mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=32, fixed={"tp": 2})
    tp = {name.split(".")[-2]: lay[3] for name, lay in plan.param_layouts.items()
          if ".layers.0." in name and name.endswith("proj.weight")}
    # the MLP split Megatron's way; attention split so too or kept whole (the search's choice: without sequence
    # parallelism, which Gemma 2's post-norms rule out, replicating this tiny attention is cheaper), never in part
    assert {k: tp[k] for k in ("gate_proj", "up_proj", "down_proj")} == {"gate_proj": "S(0)", "up_proj": "S(0)",
                                                                        "down_proj": "S(1)"}, tp
    attn = tuple(tp[k] for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert attn in (("S(0)", "S(0)", "S(0)", "S(1)"), ("R",) * 4), tp


def test_blocks_returning_tuples_and_parameters_of_no_role_are_found() -> None:
    """Falcon's blocks return (hidden_states, ...): recorded, so a pipeline stage hands its activation on alike.
    BLOOM normalizes the embedding's output with a module of its own, which no pipeline stage is known to hold:
    pp is not offered, and a pp pin is refused naming it (a run would stop in its workers)."""
    import meshplan as mp

    with torch.device("meta"):
        falcon = sources.build({"kind": "hf", "class": "FalconForCausalLM", "config": user_models.hf_falcon_config()})
        bloom = sources.build({"kind": "hf", "class": "BloomForCausalLM", "config": user_models.hf_bloom_config()})
    found = frontend.trace(falcon, batch=2, seq_len=16).structure
    assert found.block_tuple and found.tied_head and found.loose == ()
    assert frontend.trace(bloom, batch=2, seq_len=16).structure.loose == ("transformer.word_embeddings_layernorm",)
    words = ("fixed: pp=2, but pipeline parallelism is not offered: 'transformer.word_embeddings_layernorm' holds "
             "parameters outside the blocks")
    with pytest.raises(ir.PlanError, match=re.escape(words)):
        mp.autoparallelize(bloom, "cpu:1x4", global_batch=8, seq_len=32, fixed={"pp": 2})


def test_a_fused_gate_and_up_projection_keeps_the_mlp_whole_over_tp() -> None:
    """Phi-3's MLP chunks one projection's output into gate and up: its rows cannot be split over tp (a rank would
    get only gate rows), so the MLP is found (its norm too) but has no column/row-parallel linears, and the report
    says why; Llama's two projections are split as before."""
    with torch.device("meta"):
        phi3 = sources.build({"kind": "hf", "class": "Phi3ForCausalLM", "config": user_models.hf_phi3_config()})
    found = frontend.trace(phi3, batch=2, seq_len=16).structure
    assert found.mlp == "mlp" and found.mlp_norm == "post_attention_layernorm" and found.mlp_in == ()
    assert found.tp_linears() == {"attn": None, "mlp": None}  # its q/k/v are fused too
    assert any("mlp.gate_up_proj's output features are cut apart (aten.chunk.default)" in n for n in found.notes)


def test_a_pin_the_model_rules_out_is_refused_with_the_model_s_reason() -> None:
    """GPT-2's attention returns a tuple while tp keeps it whole (no sp): pinning sp names that reason, where the
    search planned it anyway (its workers then died in torch's PrepareModuleInput). Its tied head no longer rules
    out pp: the first and the last stage each hold a copy (runtime.pipeline.TiedWeights)."""
    import meshplan as mp

    with torch.device("meta"):
        module = sources.build({"kind": "hf", "class": "GPT2LMHeadModel", "config": user_models.hf_gpt2_config()})
    words = "fixed: sp=True, but sequence parallelism is not offered: attention ('attn') is kept whole"
    with pytest.raises(ir.PlanError, match=re.escape(words)):
        mp.autoparallelize(module, "cpu:1x4", global_batch=8, seq_len=32, fixed={"tp": 2, "sp": True})
    assert mp.autoparallelize(module, "cpu:1x4", global_batch=8, seq_len=32, fixed={"pp": 2}).mesh.pp == 2
    plan = mp.autoparallelize(module, "cpu:1x4", global_batch=8, seq_len=32, fixed={"tp": 2, "sp": False})
    assert plan.mesh.tp == 2 and not plan.sequence_parallel


def test_attention_of_another_kind_in_some_blocks_is_kept_whole_over_tp() -> None:
    """MiniMax alternates softmax attention (q, k, v, o) with lightning attention (one fused qkv_proj, out_proj): the
    roles are the softmax blocks', so tensor parallelism keeps the lightning blocks' attention whole
    (``whole_attn_blocks``); the plan split it by roles it does not have, and every worker stopped on
    'model.layers.1.self_attn.q_proj'. Sequence parallelism is not offered: that whole attention returns a tuple."""
    from meshplan.codegen.lower import replicated_sublayers
    from meshplan.codegen.structure import structure_of

    pytest.importorskip("transformers")
    with torch.device("meta"):
        model = sources.build({"kind": "hf", "class": "MiniMaxForCausalLM", "config": user_models.hf_minimax_config()})
    assert model.config.layer_types == ["full_attention", "linear_attention"]
    plan = mp.autoparallelize(model, "cpu:1x4", global_batch=8, seq_len=32, fixed={"dp": 2, "tp": 2, "pp": 1})
    s = structure_of(plan)
    assert s.whole_attn_blocks == (1,) and s.q == "self_attn.q_proj" and not plan.sequence_parallel
    cfg = {"structure": s, "layers": 2}
    assert "attn" not in replicated_sublayers(plan, cfg, 0) and "attn" in replicated_sublayers(plan, cfg, 1)
    assert ir.ModelStructure.from_dict(s.to_dict()) == s  # it travels in plan files
    with pytest.raises(ir.InvalidPlanError, match="whole_attn_blocks"):
        ir.ModelStructure.from_dict({**s.to_dict(), "whole_attn_blocks": [2]})


def test_a_config_holding_infinity_round_trips_through_the_plan() -> None:
    """Nemotron-H's ``time_step_limit`` is (0.0, inf): transformers' config.json spells it
    ``{"__float__": "Infinity"}``, which ``hf:PATH`` handed on as a dict transformers refused ("doesn't match any
    type"); both directions now use that spelling, so a plan file stays strict JSON and builds the same config."""
    import json

    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("nemotron_h", hidden_size=64, num_hidden_layers=2, vocab_size=256)
    assert config.time_step_limit[1] == float("inf")
    data = sources.hf_config_dict(config)
    assert data["time_step_limit"][1] == {"__float__": "Infinity"}
    json.dumps(data, allow_nan=False)
    assert sources.hf_config({"config": data}).time_step_limit[1] == float("inf")
