"""The user's own models, planned from their traced graph and run through ``apply`` on 4 gloo processes:
tiny Hugging Face Llama and GPT-2 (transformers' own classes) and a hand-written nanoGPT named by a
``module:function`` builder. Each must match one process training the same model (losses and final
parameters within 1e-5, fp32, 3 AdamW steps)."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import meshplan as mp  # noqa: E402
from meshplan.runtime.source import build  # noqa: E402
from parity_support import GLOBAL_BATCH, SEQ_LEN, assert_ranks_match, launch  # noqa: E402

import user_model_cases  # noqa: E402
import user_models  # noqa: E402

HF_LLAMA = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config()}
# four blocks: two per pipeline stage, or one per virtual stage under interleaving
HF_LLAMA_4 = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config(num_hidden_layers=4)}
HF_MIXTRAL = {"kind": "hf", "class": "MixtralForCausalLM", "config": user_models.hf_mixtral_config()}
HF_GPT2 = {"kind": "hf", "class": "GPT2LMHeadModel", "config": user_models.hf_gpt2_config()}
# GPT-2 ties its head to the token embedding; built on meta and materialized, under DDP (no FSDP unit re-points
# the head at the embedding's parameter): the one process's model, one weight, not two
META_TIED = "hf gpt2 dp2 x tp2 zero0, built on meta (tied head)"
# a tied head under pipeline parallelism: the first stage holds the embedding, the last a copy of it as the head,
# the two copies' gradients summed after each backward (runtime.pipeline.TiedWeights); built on meta, the copy is
# filled with the embedding's values
HF_LLAMA_4_TIED = {"kind": "hf", "class": "LlamaForCausalLM",
                   "config": user_models.hf_llama_config(num_hidden_layers=4, tie_word_embeddings=True)}
HF_LLAMA_TIED = {"kind": "hf", "class": "LlamaForCausalLM",
                 "config": user_models.hf_llama_config(tie_word_embeddings=True)}
META_TIED_PP = "hf llama tied pp2 x dp2 vp2 zero3, built on meta"
# Qwen3: q_norm / k_norm weights inside attention (head_dim,): split with the heads, each tp rank reaches a partial
# sum of their gradients, so they are replicated DTensors whose gradients tp sums (codegen.tp_plans.head_norm)
HF_QWEN3 = {"kind": "hf", "class": "Qwen3ForCausalLM", "config": user_models.hf_llama_config(
    model_type="qwen3", head_dim=16, pad_token_id=0)}
# OLMo 2: q_norm / k_norm over every head's features (heads * head_dim,): split as q_proj's and k_proj's outputs are,
# their mean of squares reduced over tp (runtime.styles.FeatureShardedNorm)
HF_OLMO2 = {"kind": "hf", "class": "Olmo2ForCausalLM", "config": user_models.hf_llama_config(
    model_type="olmo2", pad_token_id=0, eos_token_id=1)}
OLMO2 = "hf olmo2 dp2 x tp2 (q/k norms over all heads)"
# GPT-OSS: per-head sinks (heads,) held by attention itself: a rank holds its heads' sinks
# (runtime.styles.HeadShardedParams)
HF_GPT_OSS = {"kind": "hf", "class": "GptOssForCausalLM", "config": user_models.hf_llama_config(
    model_type="gpt_oss", head_dim=16, num_local_experts=4, num_experts_per_tok=2, pad_token_id=0, eos_token_id=1)}
GPT_OSS = "hf gpt-oss dp2 x tp2 (per-head sinks)"
# GPT-NeoX: one fused query_key_value projection laid out by heads (ModelStructure.qkv_grouped): split by its rows
HF_NEOX = {"kind": "hf", "class": "GPTNeoXForCausalLM", "config": dict(
    model_type="gpt_neox", vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
    num_hidden_layers=2, max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=0,
    eos_token_id=1, bos_token_id=1)}
NEOX = "hf gpt-neox dp2 x tp2 sp (fused q/k/v by heads)"
META_APERTUS = "hf apertus dp2 x tp2, built on meta (xIELU slopes)"
META_BUILT = (META_TIED, META_TIED_PP, META_APERTUS)
# Falcon's blocks return (hidden_states, ...) and its model takes [0]: a later stage hands the previous stage's
# activation on as such a tuple (ModelStructure.block_tuple)
HF_FALCON = {"kind": "hf", "class": "FalconForCausalLM", "config": user_models.hf_falcon_config()}
# Phi-3 chunks one gate-and-up projection in two: split by rows over tp, a rank would hold whole gate rows and
# another whole up rows, so the MLP stays whole (as the fused q/k/v attention does)
HF_PHI3 = {"kind": "hf", "class": "Phi3ForCausalLM", "config": user_models.hf_phi3_config()}
# OPT reshapes q, k, v by its whole head count: the search keeps its attention whole over tp (frontend/head_split.py)
HF_OPT = {"kind": "hf", "class": "OPTForCausalLM", "config": user_models.hf_opt_config()}
# Llama 4: its model forward reads embed_tokens.weight.device (a later pipeline stage's EmptyEmbedding has one)
HF_LLAMA4 = {"kind": "hf", "class": "Llama4ForCausalLM", "config": user_models.hf_llama_config(
    model_type="llama4_text", num_hidden_layers=4, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
    intermediate_size_mlp=128, pad_token_id=0)}
# Apertus: its xIELU slopes are registered with values no init rewrites (runtime.materialize's MetaInit.constructed)
HF_APERTUS = {"kind": "hf", "class": "ApertusForCausalLM", "config": user_models.hf_llama_config(
    model_type="apertus", head_dim=16, pad_token_id=0)}
# Gemma 4: a heterogeneous config (head_dim 16 on the sliding layer, global_head_dim 32 on the full one, read per
# layer: frontend.dims), each layer's heads split over tp at its own width
HF_GEMMA4 = {"kind": "hf", "class": "Gemma4ForCausalLM", "config": user_models.hf_llama_config(
    model_type="gemma4_text", head_dim=16, global_head_dim=32, hidden_size_per_layer_input=0, pad_token_id=0)}
GEMMA4 = "hf gemma4 dp2 x tp2 (per-layer head_dim)"
# MiniMax: lightning attention (fused qkv_proj) in block 1 beside block 0's softmax q/k/v/o: kept whole over tp
# there (ModelStructure.whole_attn_blocks), split in block 0
HF_MINIMAX = {"kind": "hf", "class": "MiniMaxForCausalLM", "config": user_models.hf_minimax_config()}
MINIMAX = "hf minimax dp2 x tp2 ep2 (lightning attention kept whole)"
# Gemma 4's embedding gradient is far from exact in fp32 alone: one process's, against the same step in fp64, is off
# by up to 8.8e-7 (0.9% of a small entry; Gemma scales the embedding by sqrt(hidden)), which AdamW (lr 1e-3, eps 1e-4)
# turns into ~1e-5 a step on such entries; the 4-process run's differs from one process's by 1.6e-5 after 3 steps on
# 2 of its 16,384 entries, its losses within 2e-6 for 8 steps (bench/hf_parity.py)
PARAM_ATOL = {GEMMA4: 5e-5}
NANOGPT = dict(vocab_size=256, n_layer=2, n_head=4, n_embd=64)
PINS = dict(pp=1, cp=1, ep=1, sp=False, recompute="none")  # ep: pinned to 2 where a case says so


@functools.cache
def _built(source: str) -> torch.nn.Module:
    """One meta-built module per source: planning it again under other pins reuses its trace (api._traced)."""
    with torch.device("meta"):
        return build(json.loads(source))


def _plan(model, **fixed) -> mp.Plan:
    if isinstance(model, dict):
        model = _built(json.dumps(model, sort_keys=True))
    return mp.autoparallelize(model, "cpu:1x4", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, fixed={**PINS, **fixed})


def _with_cp(plan: mp.Plan, *, dp: int, cp: int) -> mp.Plan:
    """``plan`` with ``dp`` x ``cp`` ranks where it had dp, each dp rank's micro-batches unchanged in count."""
    return dataclasses.replace(plan, mesh=dataclasses.replace(plan.mesh, dp=dp, cp=cp),
                               micro_batch_size=GLOBAL_BATCH // (dp * plan.num_microbatches))


@pytest.fixture(scope="module")
def plans() -> dict[str, mp.Plan]:
    llama_tp = _plan(HF_LLAMA, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2)
    return {
        "hf llama dp2 x tp2 (solver's layouts)": llama_tp,
        # every sublayer split the Megatron way, whatever the intra-op program chose at this tiny size
        "hf llama dp2 x tp2 megatron split": dataclasses.replace(llama_tp, param_layouts={}),
        # sequence parallelism on HF's modules: the stream cut at the first block, attention's input
        # (passed by keyword, hidden_states=) gathered, every sublayer split
        "hf llama dp2 x tp2 sp": dataclasses.replace(
            _plan(HF_LLAMA, dp=2, tp=2, zero=3, sp=True, micro_batch=4, num_microbatches=1), param_layouts={}),
        # ... with the layouts the search picks under sp: HF's attention split (its tuple output rules out the
        # replicated attention PrepareModuleInputOutput would have to cut), its mask read whole beside the heads
        "hf llama dp2 x tp2 sp (solver's layouts)": _plan(HF_LLAMA, dp=2, tp=2, zero=0, sp=True, micro_batch=2,
                                                          num_microbatches=2),
        "hf llama zero3 dp4 full recompute": _plan(HF_LLAMA, dp=4, tp=1, zero=3, micro_batch=2,
                                                   num_microbatches=1, recompute="full"),
        # pipeline stages cut from HF's own modules: rotary tables and mask rebuilt on each stage
        "hf llama pp2 x dp2": _plan(HF_LLAMA_4, pp=2, dp=2, tp=1, zero=0, micro_batch=2, num_microbatches=2),
        # ... with the stream sequence-sharded between stages (the later stage's tables span tp x its length)
        "hf llama pp2 x tp2 sp": dataclasses.replace(
            _plan(HF_LLAMA_4, pp=2, dp=1, tp=2, zero=0, sp=True, micro_batch=2, num_microbatches=4), param_layouts={}),
        # ... interleaved, two virtual stages per rank, ZeRO-3 and full recompute in each stage
        "hf llama pp2 x dp2 vp2 zero3": _plan(HF_LLAMA_4, pp=2, dp=2, tp=1, zero=3, vp=2, micro_batch=1,
                                              num_microbatches=4, recompute="full"),
        # context parallelism on HF's own attention: its SDPA gathers K and V over cp, the model gets the
        # tokens' global position_ids (the solver keeps >= 1024 tokens per cp rank, so cp is set by hand here)
        "hf llama dp2 x cp2": _with_cp(_plan(HF_LLAMA, dp=4, tp=1, zero=2, micro_batch=1, num_microbatches=2),
                                       dp=2, cp=2),
        "hf llama cp2 x tp2 sp": dataclasses.replace(
            _with_cp(_plan(HF_LLAMA, dp=2, tp=2, zero=0, sp=True, micro_batch=4, num_microbatches=1), dp=1, cp=2),
            param_layouts={}),
        # ... beside pipeline parallelism: each rank cuts its tokens before the schedule, and every stage's model
        # forward gets their global position_ids (runtime.pipeline.Stage.position_ids)
        "hf llama pp2 x cp2 zero2": _with_cp(_plan(HF_LLAMA_4, pp=2, dp=2, tp=1, zero=2, micro_batch=2,
                                                   num_microbatches=2), dp=1, cp=2),
        "hf mixtral ep2 x dp4 zero3": _plan(HF_MIXTRAL, dp=4, tp=1, ep=2, zero=3, micro_batch=2, num_microbatches=1),
        "hf gpt2 dp2 x tp2": _plan(HF_GPT2, dp=2, tp=2, zero=2, micro_batch=4, num_microbatches=1),
        META_TIED: _plan(HF_GPT2, dp=2, tp=2, zero=0, micro_batch=4, num_microbatches=1),
        "hf gpt2 pp2 x dp2 zero2 (tied head)": _plan(HF_GPT2, pp=2, dp=2, tp=1, zero=2, micro_batch=2,
                                                    num_microbatches=2),
        META_TIED_PP: _plan(HF_LLAMA_4_TIED, pp=2, dp=2, tp=1, zero=3, vp=2, micro_batch=1, num_microbatches=4),
        "hf falcon pp2 x dp2 (blocks return tuples)": _plan(HF_FALCON, pp=2, dp=2, tp=1, zero=0, micro_batch=2,
                                                            num_microbatches=2),
        "hf phi3 dp2 x tp2 (fused gate and up)": _plan(HF_PHI3, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
        # the tied copies vocab-parallel on both end stages (the embedding's gradient comes back Replicate: aligned to
        # the weight's Shard(0) before the copies' shards are summed)
        "hf gpt2 pp2 x tp2 (tied, vocab-parallel)": _plan(HF_GPT2, pp=2, dp=1, tp=2, zero=0, micro_batch=2,
                                                         num_microbatches=4),
        # a tied head under sequence parallelism: vocab-parallel with its embedding, fed the sequence-sharded stream
        "hf llama tied dp2 x tp2 sp": dataclasses.replace(
            _plan(HF_LLAMA_TIED, dp=2, tp=2, zero=0, sp=True, micro_batch=2, num_microbatches=2), param_layouts={}),
        "hf opt dp2 x tp2": _plan(HF_OPT, dp=2, tp=2, zero=0, micro_batch=4, num_microbatches=1),
        "hf llama4 pp2 x dp2": _plan(HF_LLAMA4, pp=2, dp=2, tp=1, zero=0, micro_batch=2, num_microbatches=2),
        "hf qwen3 dp2 x tp2 (q/k norms)": _plan(HF_QWEN3, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
        GEMMA4: _plan(HF_GEMMA4, dp=2, tp=2, zero=2, micro_batch=2, num_microbatches=2),
        MINIMAX: _plan(HF_MINIMAX, dp=2, tp=2, ep=2, zero=2, micro_batch=2, num_microbatches=2),
        OLMO2: _plan(HF_OLMO2, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
        # every sublayer split, whatever the intra-op program chose at this tiny size (it keeps attention whole)
        GPT_OSS: dataclasses.replace(_plan(HF_GPT_OSS, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
                                     param_layouts={}),
        NEOX: dataclasses.replace(_plan(HF_NEOX, dp=2, tp=2, zero=0, sp=True, micro_batch=2, num_microbatches=2),
                                  param_layouts={}),
        META_APERTUS: _plan(HF_APERTUS, dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
        "nanogpt dp2 x tp2 sp": mp.autoparallelize("user_models:nanogpt", "cpu:1x4", global_batch=GLOBAL_BATCH,
                                                   seq_len=SEQ_LEN, model_kwargs=NANOGPT,
                                                   fixed={**PINS, "dp": 2, "tp": 2, "zero": 2, "sp": True,
                                                          "micro_batch": 4, "num_microbatches": 1}),
        "nanogpt dp2 x tp2": mp.autoparallelize("user_models:nanogpt", "cpu:1x4", global_batch=GLOBAL_BATCH,
                                                seq_len=SEQ_LEN, model_kwargs=NANOGPT,
                                                fixed={**PINS, "dp": 2, "tp": 2, "zero": 0, "micro_batch": 4,
                                                       "num_microbatches": 1}),
    }


@pytest.fixture(scope="module")
def ranks(plans, tmp_path_factory) -> list[dict]:
    cases = [{"name": name, "plan": plan.to_json(), "vocab": plan.model["vocab"], "meta": name in META_BUILT}
             for name, plan in plans.items()]
    mismatch = {"plan": plans["hf llama dp2 x tp2 (solver's layouts)"].to_json(), "source": HF_GPT2}
    eager = {**HF_LLAMA, "config": {**HF_LLAMA["config"], "attn_implementation": "eager"}}
    cp_eager = {"plan": plans["hf llama dp2 x cp2"].to_json(), "source": eager}
    # a tied head's optimizer state, stepped once under ZeRO-3 (one weight), read by the pipeline's last stage
    resume = {"save": _plan(HF_GPT2, dp=4, tp=1, zero=3, micro_batch=2, num_microbatches=1).to_json(),
              "load": plans["hf gpt2 pp2 x dp2 zero2 (tied head)"].to_json(), "vocab": HF_GPT2["config"]["vocab_size"]}
    return launch(tmp_path_factory, 4, "user_model_cases:run_cases",
                  {"cases": cases, "mismatch": mismatch, "cp_eager": cp_eager, "resume": resume})


def test_the_search_splits_hugging_face_attention_under_sp(plans) -> None:
    """Under sequence parallelism the search keeps HF's attention split over tp (its q/k/v column-, o row-parallel):
    replicated, PrepareModuleInputOutput would have to cut its (attn_output, attn_weights) tuple, which it cannot."""
    layouts = plans["hf llama dp2 x tp2 sp (solver's layouts)"].param_layouts
    tp = {name.split(".")[-2]: lay[3] for name, lay in layouts.items() if ".layers.0.self_attn." in name}
    assert tp == {"q_proj": "S(0)", "k_proj": "S(0)", "v_proj": "S(0)", "o_proj": "S(1)"}, tp


def test_opt_attention_stays_whole_over_tp(plans) -> None:
    """OPT's head split would fold the sequence (frontend/head_split.py): its q/k/v/o stay R under tp."""
    layouts = plans["hf opt dp2 x tp2"].param_layouts
    tp = {name.split(".")[-2]: lay[3] for name, lay in layouts.items() if ".layers.0.self_attn." in name}
    assert tp and set(tp.values()) == {"R"}, tp


def test_sources_are_recorded(plans) -> None:
    assert plans["hf llama dp2 x tp2 (solver's layouts)"].source["kind"] == "hf"
    assert plans["nanogpt dp2 x tp2"].source == {"kind": "builder", "target": "user_models:nanogpt", "kwargs": NANOGPT}
    structure = plans["hf llama dp2 x tp2 megatron split"].structure
    assert structure["blocks"] == "model.layers" and structure["q"] == "self_attn.q_proj"


@pytest.mark.parametrize("name", ["hf llama dp2 x tp2 (solver's layouts)", "hf llama dp2 x tp2 megatron split",
                                  "hf llama zero3 dp4 full recompute", "hf gpt2 dp2 x tp2",
                                  "hf mixtral ep2 x dp4 zero3", "hf llama dp2 x tp2 sp",
                                  "hf llama dp2 x tp2 sp (solver's layouts)", "nanogpt dp2 x tp2 sp",
                                  "nanogpt dp2 x tp2",
                                  "hf llama pp2 x dp2", "hf llama pp2 x tp2 sp", "hf llama pp2 x dp2 vp2 zero3",
                                  "hf llama dp2 x cp2", "hf llama cp2 x tp2 sp", "hf llama pp2 x cp2 zero2",
                                  META_TIED, "hf opt dp2 x tp2",
                                  "hf gpt2 pp2 x dp2 zero2 (tied head)", META_TIED_PP,
                                  "hf falcon pp2 x dp2 (blocks return tuples)", "hf llama tied dp2 x tp2 sp",
                                  "hf phi3 dp2 x tp2 (fused gate and up)", "hf gpt2 pp2 x tp2 (tied, vocab-parallel)",
                                  "hf llama4 pp2 x dp2", META_APERTUS,
                                  "hf qwen3 dp2 x tp2 (q/k norms)", OLMO2, GPT_OSS, NEOX, GEMMA4, MINIMAX])
def test_user_model_matches_one_process(plans, ranks, name) -> None:
    plan = plans[name]
    ref_losses, ref_params = user_model_cases.reference(plan.source, plan.model["vocab"])
    assert_ranks_match(ranks, name, ref_losses, ref_params, param_atol=PARAM_ATOL.get(name, 1e-5))


def test_a_tied_head_resumes_under_pipeline_parallelism(ranks) -> None:
    """GPT-2 saved under ZeRO-3 dp4 after one step, loaded under pp2 x dp2 into other weights: the last stage's
    copy of the tied head takes the embedding's weights and AdamW state, and training goes on as one process."""
    ref_losses, ref_params = user_model_cases.reference(HF_GPT2, HF_GPT2["config"]["vocab_size"])
    assert_ranks_match(ranks, "resume", ref_losses, ref_params)


def test_megatron_split_shards_the_users_attention(ranks) -> None:
    steps = ranks[0]["hf llama dp2 x tp2 megatron split"]["steps"]
    assert "TensorParallel(model.layers.0)" in steps and "self_attn.q_proj: colwise" in steps
    assert "self_attn.o_proj: rowwise" in steps and "lm_head: colwise" in steps


def test_a_tied_head_is_vocab_parallel_with_its_embedding(ranks) -> None:
    """GPT-2's tied head and embedding both shard the (vocab, h) table by rows over tp (Megatron's vocab-parallel
    embedding and output layer) and stay one parameter (runtime.styles.kept_ties): the parity cases above report
    the one process's names, which a second copy would add to."""
    for name, embed in (("hf gpt2 dp2 x tp2", "transformer.wte"), (META_TIED, "transformer.wte"),
                        ("hf llama tied dp2 x tp2 sp", "model.embed_tokens")):
        steps = ranks[0][name]["steps"]
        assert f"{embed}: rowwise" in steps and "lm_head: colwise" in steps, steps


def test_qwen3_attention_is_split_with_its_head_norms(ranks) -> None:
    steps = ranks[0]["hf qwen3 dp2 x tp2 (q/k norms)"]["steps"]
    assert "self_attn.q_proj: colwise" in steps and "self_attn.o_proj: rowwise" in steps, steps
    assert "self_attn.q_norm: sequence_parallel(S(2))" in steps and "self_attn.k_norm: sequence_parallel(S(2))" in steps


def test_olmo2_attention_is_split_with_its_norms_over_all_heads(ranks) -> None:
    steps = ranks[0][OLMO2]["steps"]
    assert "self_attn.q_proj: colwise" in steps and "self_attn.o_proj: rowwise" in steps, steps
    assert "self_attn.q_norm: feature_norm" in steps and "self_attn.k_norm: feature_norm" in steps


def test_gpt_oss_attention_is_split_with_its_sinks(ranks) -> None:
    steps = ranks[0][GPT_OSS]["steps"]
    assert "self_attn.q_proj: colwise" in steps and "self_attn.o_proj: rowwise" in steps, steps
    assert "self_attn: head_params" in steps, steps


def test_gpt_neox_fused_qkv_is_split_by_its_rows(ranks) -> None:
    steps = ranks[0][NEOX]["steps"]
    assert "attention.query_key_value: colwise" in steps and "attention.dense: rowwise" in steps, steps


def test_mixtral_experts_are_split_over_ep(ranks) -> None:
    steps = ranks[0]["hf mixtral ep2 x dp4 zero3"]["steps"]
    assert "ExpertParallel" in steps and "model.layers.1.mlp.experts" in steps


def test_sequence_parallel_gathers_hf_attention_by_keyword(ranks) -> None:
    steps = ranks[0]["hf llama dp2 x tp2 sp"]["steps"]
    assert "model.layers.0: prepare_input(R -> S(1))" in steps and "input_layernorm: sequence_parallel" in steps
    assert "self_attn: prepare_input(S(1) -> R)" in steps and "model.norm: sequence_parallel" in steps


def test_pipeline_stages_are_cut_from_the_users_modules(plans, ranks) -> None:
    """The pipeline split reads the traced structure: HF's container, embedding, final norm and head."""
    steps = ranks[0]["hf llama pp2 x dp2"]["steps"]
    assert "model.layers" in steps and "model.embed_tokens" in steps and "lm_head" in steps, steps
    assert plans["hf llama pp2 x dp2 vp2 zero3"].stages == ((0, 1), (1, 2), (2, 3), (3, 4))


def test_context_parallelism_runs_on_the_users_attention(ranks) -> None:
    steps = ranks[0]["hf llama dp2 x cp2"]["steps"]
    assert "ContextParallel(module='model.layers.0.self_attn'" in steps
    assert "ContextParallel(module='model.layers.1.self_attn'" in steps
    assert "FlattenMesh" in steps


def test_context_parallelism_refuses_attention_that_runs_no_sdpa(ranks) -> None:
    """HF's "eager" attention multiplies Q and K itself: no SDPA call to gather K and V in, so the first
    step stops with the reason instead of attending each rank's own tokens only."""
    message = ranks[0]["cp_eager"]
    assert "ran no torch.nn.functional.scaled_dot_product_attention" in message and "LlamaAttention" in message
    assert 'attn_implementation="sdpa"' in message


def test_builder_named_by_the_plan_was_called(ranks) -> None:
    assert "nanogpt" in ranks[0]["nanogpt dp2 x tp2"]["built"]


def test_plan_for_another_model_is_refused_naming_the_parameter(ranks) -> None:
    message = ranks[0]["mismatch"]
    assert "made for another model" in message and "'transformer.wte.weight'" in message
    assert "'model.embed_tokens.weight'" in message


def _torchrun_losses(script: Path, steps: int) -> list[float]:
    """Run an emitted script on 4 gloo processes (this folder importable, for the builder); its losses."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
           "--master-port", str(port), str(script), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "examples")}
    done = subprocess.run(cmd, cwd=script.parent, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)$", done.stdout, re.M)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf llama dp2 x tp2 megatron split", "nanogpt dp2 x tp2", "hf llama pp2 x dp2",
                                  "hf llama dp2 x cp2"])
def test_emitted_script_builds_the_users_model(plans, name, tmp_path) -> None:
    """The script builds the model from the plan's source (transformers' class from the inline config, or
    the user's builder), never a zoo stand-in, and trains it as one process does (AdamW, lr 1e-3); a
    pipelined one cuts its stages from that model (meshplan.runtime.pipeline.Stage)."""
    plan = plans[name]
    script = plan.emit(tmp_path / "train-user.py")
    text = script.read_text()
    assert "meshplan.zoo" not in text
    assert ('build_on_meta({"kind": "hf", "class": "LlamaForCausalLM", "config": HF_CONFIG}' in text
            if plan.source["kind"] == "hf" else "from user_models import nanogpt as build_user_model" in text)
    if plan.mesh.pp > 1:
        assert "Stage(model, *stage_layers[c]" in text and '"blocks": "model.layers"' in text
    if plan.mesh.cp > 1:
        assert "position_ids=cp_positions.expand(x.shape[0], -1)" in text
    losses = _torchrun_losses(script, steps=3)
    ref, _ = user_model_cases.reference(plan.source, plan.model["vocab"],
                                        lambda params: torch.optim.AdamW(params, lr=1e-3))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), atol=2e-5, rtol=1e-5)
