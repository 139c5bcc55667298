"""Pretrained weights and gradient clipping (4 gloo processes, one launch; ``pretrained_cases``).

A tiny Hugging Face Llama that transformers saves here loads under dp2 x tp2, ZeRO-3 dp4 and pp2 x dp2
(``load_pretrained``: DCP's HuggingFaceStorageReader, each rank reading its slices, each pipeline stage
its own layers); its first loss equals transformers' own model loaded by ``from_pretrained`` on the
same batch (fp32, 1e-4), and ``save_pretrained`` writes back the same tensors, with the config, in a
directory ``from_pretrained`` loads. A zoo model saved under ZeRO-3 dp4 loads under pp2 x dp2 (and
moe-tiny under ep2, and under pp2 x dp2 with ep2). Clipping by the global norm (SGD, so that a wrong norm shows in the parameters) matches
``torch.nn.utils.clip_grad_norm_`` in one process under TP, FSDP, pipeline and expert parallelism.
A checkpoint of another size is refused, naming the first parameter; through ``meshplan run`` bad
``--init-from`` input exits 2 with one line before torchrun starts."""
from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM  # noqa: E402

import meshplan as mp  # noqa: E402
import user_models  # noqa: E402
from checkpoint_cases import plan_for  # noqa: E402
from meshplan import zoo  # noqa: E402
from meshplan.runtime.planned import token_cross_entropy  # noqa: E402
from meshplan.runtime.pretrained import saved_shapes  # noqa: E402
from meshplan.runtime.source import build  # noqa: E402
from meshplan.runtime.train import synthetic_batch  # noqa: E402
from parity_support import GLOBAL_BATCH, SEED, SEQ_LEN, make_plan, run_ranks  # noqa: E402
from pretrained_cases import CLIP, SGD_LR  # noqa: E402

pytestmark = pytest.mark.slow

HF_LLAMA = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config()}
PINS = dict(pp=1, cp=1, ep=1, sp=False, recompute="none")
HF_CASES = {"dp2 x tp2": dict(dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
            "zero3 dp4": dict(dp=4, tp=1, zero=3, micro_batch=2, num_microbatches=1),
            # pipeline stages cut from HF's own modules, one decoder layer each: each stage loads its own tensors
            "pp2 x dp2": dict(pp=2, dp=2, tp=1, zero=0, micro_batch=2, num_microbatches=2),
            # a head tied to the embedding (Llama 3.2 1B, Gemma, GPT-2): transformers writes the weight once, under the
            # embedding's name; one process reads it into both names (one tensor), and under pp the last stage reads
            # it into its copy of the head (runtime.pipeline.TiedWeights), which clipping counts once
            "tied dp2 x tp2": dict(dp=2, tp=2, zero=0, micro_batch=2, num_microbatches=2),
            "tied pp2 x dp2": dict(pp=2, dp=2, tp=1, zero=2, micro_batch=2, num_microbatches=2)}
HF_TIED = {"kind": "hf", "class": "LlamaForCausalLM", "config": user_models.hf_llama_config(tie_word_embeddings=True)}
# a Mixtral as the Hub stores one: each expert's w1, w2, w3 apart, which transformers stacks at load (12 experts: the
# order is numeric, 10 after 9, not after 1), in several files
HF_MIXTRAL = {"kind": "hf", "class": "MixtralForCausalLM",
              "config": dict(model_type="mixtral", vocab_size=256, hidden_size=64, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=12,
                             num_experts_per_tok=2, max_position_embeddings=64)}
MOE_CASES = {"mixtral ep2 x dp4 zero3": dict(dp=4, ep=2, tp=1, zero=3, micro_batch=2, num_microbatches=1),
             # each stage assembles its own layer's experts, and of those its ep rank's
             "mixtral pp2 x dp2 ep2": dict(pp=2, dp=2, ep=2, tp=1, zero=0, micro_batch=2, num_microbatches=2)}
ZOO_CASES = {"gpt zero3 dp4 -> pp2 x dp2": ("gpt-tiny", dict(dp=4, zero=3), dict(pp=2, dp=2, nmb=2)),
             "moe zero3 dp4 -> ep2 x dp4 zero3": ("moe-tiny", dict(dp=4, zero=3), dict(dp=4, ep=2, zero=3)),
             # each stage reads its own layers' experts, and of those its ep rank's slice
             "moe zero3 dp4 -> pp2 x dp2 ep2 zero2": ("moe-tiny", dict(dp=4, zero=3),
                                                      dict(pp=2, dp=2, ep=2, zero=2, nmb=2))}


def _tied(name: str) -> bool:
    return name.startswith("tied")


@functools.cache
def _hf_model(tied: bool = False) -> torch.nn.Module:
    """Built once on meta: each plan of it after the first reuses its trace (api._traced)."""
    with torch.device("meta"):
        return build(HF_TIED if tied else HF_LLAMA)


def _hf_plan(tied: bool = False, **fixed) -> mp.Plan:
    return mp.autoparallelize(_hf_model(tied), "cpu:1x4", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN,
                              fixed={**PINS, **fixed})


@functools.cache
def _mixtral() -> torch.nn.Module:
    with torch.device("meta"):
        return build(HF_MIXTRAL)


def _zoo_plan(model: str, mesh: dict) -> str:
    return dataclasses.replace(plan_for(model, **mesh), cluster="cpu:1x4").to_json()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """The checkpoints transformers writes: the models the ranks load (untied and tied), and one of another size."""
    tmp = tmp_path_factory.mktemp("hf")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**user_models.hf_llama_config()))
    model.save_pretrained(tmp / "llama")
    LlamaForCausalLM(LlamaConfig(**{**user_models.hf_llama_config(), "intermediate_size": 96})).save_pretrained(tmp / "other")
    tied = LlamaForCausalLM(LlamaConfig(**HF_TIED["config"]))
    tied.save_pretrained(tmp / "tied")
    assert "lm_head.weight" not in saved_shapes(tmp / "tied")  # transformers writes a tied weight once
    MixtralForCausalLM(MixtralConfig(**HF_MIXTRAL["config"])).save_pretrained(tmp / "mixtral", max_shard_size="300KB")
    stored = saved_shapes(tmp / "mixtral")  # what makes the Mixtral cases tests: experts one by one, several files
    assert "model.layers.1.block_sparse_moe.experts.11.w3.weight" in stored
    assert len(list((tmp / "mixtral").glob("*.safetensors"))) > 1
    return {"dir": tmp / "llama", "other": tmp / "other", "tied": tmp / "tied", "mixtral": tmp / "mixtral",
            "tensors": {k: v.clone() for k, v in model.state_dict().items()},
            "tied tensors": {k: v.clone() for k, v in tied.state_dict().items()}}


@pytest.fixture(scope="module")
def ranks(saved, tmp_path_factory) -> list[dict]:
    hf = [{"name": f"{name}{' clip' if clip else ''}", "plan": _hf_plan(_tied(name), **fixed).to_json(), "clip": clip,
           "checkpoint": str(saved["tied" if _tied(name) else "dir"])}
          for name, fixed in HF_CASES.items() for clip in (False, True)]
    zoo_cases = [{"name": name, "model": model, "save_plan": _zoo_plan(model, save), "load_plan": _zoo_plan(model, load),
                  "clip": True} for name, (model, save, load) in ZOO_CASES.items()]
    moe = [{"name": name, "checkpoint": str(saved["mixtral"]),
            "plan": mp.autoparallelize(_mixtral(), "cpu:1x4", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN,
                                       fixed={**PINS, **fixed}).to_json()} for name, fixed in MOE_CASES.items()]
    tmp = tmp_path_factory.mktemp("pretrained4")
    run_ranks(4, "pretrained_cases:run_cases", {"hf": hf, "zoo": zoo_cases, "moe": moe, "checkpoint": str(saved["dir"]),
                                                 "other": str(saved["other"])}, tmp, timeout_s=600)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(4)]


def _hf_reference(saved: dict, clip: bool, tied: bool = False) -> tuple[float, float | None, dict[str, torch.Tensor]]:
    """transformers' own model, loaded from the checkpoint: the first loss, and with ``clip`` the
    gradient norm and the parameters after one clipped SGD step."""
    model = LlamaForCausalLM.from_pretrained(saved["tied" if tied else "dir"], torch_dtype=torch.float32)
    x, y = synthetic_batch(model.config.vocab_size, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    loss = token_cross_entropy(model(input_ids=x, use_cache=False).logits, y)
    norm, params = _clipped_step(model, loss) if clip else (None, {})
    return loss.item(), norm, params


def _clipped_step(model: torch.nn.Module, loss: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
    assert norm > CLIP  # the case really clips
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    opt.step()
    return norm, {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_params(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, atol=atol, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name", list(HF_CASES))
def test_a_transformers_checkpoint_loads_sharded_and_gives_transformers_loss(saved, ranks, name) -> None:
    ref_loss, _, _ = _hf_reference(saved, clip=False, tied=_tied(name))
    got = [r[name] for r in ranks]
    assert all(g["loss"] == got[0]["loss"] for g in got)
    assert got[0]["loss"] == pytest.approx(ref_loss, abs=1e-4)
    # and not by chance: the model started from other weights (pretrained_cases.OTHER_SEED)
    torch.manual_seed(1234)
    fresh = build(HF_TIED if _tied(name) else HF_LLAMA)
    x, y = synthetic_batch(fresh.config.vocab_size, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    assert token_cross_entropy(fresh(input_ids=x, use_cache=False).logits, y).item() != pytest.approx(ref_loss, abs=1e-3)


@pytest.mark.parametrize("name", list(MOE_CASES))
def test_experts_stored_one_by_one_are_assembled_as_transformers_stacks_them(saved, ranks, name) -> None:
    """Each rank reads its experts' slices of the per-expert tensors and stacks them as transformers does
    (``runtime.pretrained.Stacked``): the loaded parameters equal ``from_pretrained``'s, and so does the loss."""
    want = MixtralForCausalLM.from_pretrained(saved["mixtral"], torch_dtype=torch.float32)
    got = [r[name] for r in ranks]
    _assert_params(got[0]["loaded"], dict(want.named_parameters()), atol=0)
    x, y = synthetic_batch(want.config.vocab_size, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    ref_loss = token_cross_entropy(want(input_ids=x, use_cache=False).logits, y).item()
    assert all(g["loss"] == pytest.approx(ref_loss, abs=1e-4) for g in got)


@pytest.mark.parametrize("name", list(HF_CASES))
def test_save_pretrained_gives_back_the_same_tensors(saved, ranks, name) -> None:
    out = Path(ranks[0][name]["saved"])
    tensors = {}
    for file in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(file))
    want_tensors = saved["tied tensors" if _tied(name) else "tensors"]
    # a tied weight once, under its first name, as transformers writes it
    assert sorted(tensors) == sorted(k for k in want_tensors if not (_tied(name) and k == "lm_head.weight"))
    for key, want in want_tensors.items():
        assert torch.equal(tensors[key if key in tensors else "model.embed_tokens.weight"], want), key
    assert (out / "config.json").is_file() and not (out / "sharded").exists()
    again = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32)  # transformers reads it back
    assert torch.equal(again.model.embed_tokens.weight, want_tensors["model.embed_tokens.weight"])


@pytest.mark.parametrize("name", list(HF_CASES))
def test_clipping_by_the_global_norm_matches_one_process(saved, ranks, name) -> None:
    ref_loss, ref_norm, ref_params = _hf_reference(saved, clip=True, tied=_tied(name))
    got = [r[f"{name} clip"] for r in ranks]
    assert all(g["norm"] == pytest.approx(got[0]["norm"], rel=1e-6) for g in got)  # every rank clips alike
    assert got[0]["norm"] == pytest.approx(ref_norm, rel=1e-5)
    assert got[0]["loss"] == pytest.approx(ref_loss, abs=1e-4)
    _assert_params(got[0]["params"], ref_params)


@pytest.mark.parametrize("name", list(ZOO_CASES))
def test_zoo_weights_load_under_pipeline_and_experts_and_clip_alike(ranks, name) -> None:
    model = ZOO_CASES[name][0]
    got = [r[name] for r in ranks]
    _assert_params(got[0]["loaded"], got[0]["before"], atol=0)  # the saved weights, exactly
    torch.manual_seed(SEED)
    net = zoo.build(model)
    x, y = synthetic_batch(net.config.vocab, GLOBAL_BATCH, SEQ_LEN, SEED, 1)
    loss = zoo.loss_fn(net(x), y)
    ref_norm, ref_params = _clipped_step(net, loss)
    assert all(g["norm"] == pytest.approx(got[0]["norm"], rel=1e-6) for g in got)
    assert got[0]["norm"] == pytest.approx(ref_norm, rel=1e-5)
    assert got[0]["loss"] == pytest.approx(loss.item(), abs=1e-5)
    _assert_params(got[0]["params"], ref_params)


def test_a_checkpoint_of_another_size_is_refused_naming_the_first_parameter(ranks) -> None:
    errors = [r["mismatch"] for r in ranks]
    assert errors[0] is not None and all(e == errors[0] for e in errors)
    assert re.search(r"does not match the model: 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(128, 64\) "
                     r"in the model but \(96, 64\) in the checkpoint \(and 5 more", errors[0]), errors[0]


@pytest.mark.parametrize("case", ["missing", "other size"])
def test_bad_init_from_exits_2_with_one_line_before_torchrun(saved, tmp_path, case) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(_hf_plan(**HF_CASES["dp2 x tp2"]).to_json())
    path, want = ((tmp_path / "nowhere", r"--init-from \S+nowhere is not a directory") if case == "missing" else
                  (saved["other"], r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(128, 64\)"))
    proc = subprocess.run([sys.executable, "-m", "meshplan.cli", "run", str(plan), "--nproc", "4", "--steps", "1",
                           "--init-from", str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and re.search(want, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_the_cli_check_accepts_a_tied_checkpoint_and_names_a_missing_tensor(saved) -> None:
    """``meshplan run --init-from`` checks the whole model on meta before starting workers: a tied model's
    checkpoint holds the weight once (no ``lm_head.weight``), which is not a missing tensor; for the untied
    model of the same shapes it is, and the check names it."""
    from meshplan.runtime.checkpoint import CheckpointError
    from meshplan.runtime.pretrained import check_pretrained

    meta = _hf_model(tied=True)
    check_pretrained(meta, saved["tied"])  # no error
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' \(256, 64\) is not in the checkpoint"):
        check_pretrained(_hf_model(tied=False), saved["tied"])


def test_a_checkpoint_transformers_renames_or_stacks_at_load_loads_as_transformers_loads_it(tmp_path) -> None:
    """transformers renames some checkpoint tensors at load (GPT-NeoX's ``embed_out`` is the model's ``lm_head``)
    and stacks others (Mixtral's and Qwen3-MoE's experts stored one by one, into one tensor of all experts, gate
    and up concatenated): the loader does both as transformers does (``runtime.pretrained.checkpoint_layout``), and
    a checkpoint that lacks an expert is refused naming what is missing."""
    import transformers

    from meshplan.runtime.checkpoint import CheckpointError
    from meshplan.runtime.pretrained import check_pretrained, load_pretrained_into

    config = transformers.GPTNeoXConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_hidden_layers=2, max_position_embeddings=64)
    torch.manual_seed(0)
    saved = transformers.GPTNeoXForCausalLM(config)
    saved.save_pretrained(tmp_path / "neox")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "neox" / "model.safetensors"), "pt") as f:
        assert "embed_out.weight" in f.keys() and "lm_head.weight" not in f.keys()  # what makes this a test
    fresh = transformers.GPTNeoXForCausalLM(config)
    check_pretrained(fresh, tmp_path / "neox")
    load_pretrained_into(fresh, tmp_path / "neox")
    for (name, a), b in zip(saved.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    models = {}
    for name, config in [("mixtral", transformers.MixtralConfig(
            vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)),
                         ("qwen3_moe", transformers.Qwen3MoeConfig(
            vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64))]:
        cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
        cls(config).save_pretrained(tmp_path / name)
        with safe_open(str(tmp_path / name / "model.safetensors"), "pt") as f:
            assert any(".experts.3." in key for key in f.keys())  # one by one, as the Hub stores them
        want = cls.from_pretrained(tmp_path / name, torch_dtype=torch.float32)
        fresh = models[name] = cls(config)
        check_pretrained(fresh, tmp_path / name)
        load_pretrained_into(fresh, tmp_path / name)
        for (key, a), b in zip(want.state_dict().items(), fresh.state_dict().values()):
            assert torch.equal(a, b), f"{name} {key}"
    smaller = transformers.MixtralForCausalLM(dataclasses.replace(models["mixtral"].config, intermediate_size=64))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.experts\.gate_up_proj' \(4, 128, 64\) is "
                                              r"assembled from 'model\.layers\.0\.block_sparse_moe\.experts\.0\.w1\."
                                              r"weight' and the rest of its experts \(4, 192, 64\)"):
        check_pretrained(smaller, tmp_path / "mixtral")
    from safetensors.torch import save_file
    tensors = load_file(tmp_path / "mixtral" / "model.safetensors")
    del tensors["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, tmp_path / "mixtral" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"stores the experts of 'model\.layers\.0\.mlp\.experts\.gate_up_proj' "
                                              r"one by one but not each of 0\.\.E-1 for every part \(\[\[0, 1, 2, 3\], "
                                              r"\[0, 1, 3\]\]\)"):
        check_pretrained(models["mixtral"], tmp_path / "mixtral")
