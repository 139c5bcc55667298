"""The generated swiglu kernel on the user's own MLP (issue 11): a Hugging Face ``LlamaForCausalLM`` or a
torchtitan-style Llama whose block MLP is exactly ``down(silu(gate(x)) * up(x))`` gets ``swiglu`` in its
plan, costed; lowering swaps ``<blocks>.N.<mlp>`` for a subclass of the model's own MLP class that calls
its children by name; in the Triton interpreter that model's loss and gradients match eager, and the
emitted script trains like the unfused one. An MLP that is anything else records no swiglu, and the
report says why."""
from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
import transformers

import meshplan as mp
import user_models
from meshplan.codegen import FuseKernel, lower
from meshplan.codegen.fused import kernels_used, skipped, user_fusions
from meshplan.frontend import trace
from meshplan.runtime import fused as runtime_fused
from meshplan.runtime.interpret import State
from test_codegen_fuse import assert_trains_alike
from test_codegen_run import _losses, _torchrun
from test_kernels import interpret  # noqa: F401  the Triton interpreter, as a fixture

HF_CHILDREN = ("gate_proj", "up_proj", "down_proj")


def _hf_llama(**overrides) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(**{**dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=128, vocab_size=128,
                                             max_position_embeddings=64, tie_word_embeddings=False), **overrides})
    return transformers.LlamaForCausalLM(cfg)


class UpFirstFeedForward(user_models.TitanFeedForward):
    """The product written the other way round: the up projection (w3) runs first, the gate (w1) second."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.w3(x) * F.silu(self.w1(x)))


class ScaledFeedForward(user_models.TitanFeedForward):
    """SwiGLU and one op more, which a fused forward of the chain alone would drop."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x)) * 0.5


def _titan(feed_forward: type = user_models.TitanFeedForward) -> torch.nn.Module:
    model = user_models.titan_llama(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, ffn=96, vocab=128,
                                    max_seq_len=64)
    for block in model.layers.values():
        block.feed_forward.__class__ = feed_forward
    return model


def _plan(model: torch.nn.Module) -> mp.Plan:
    """Planned for GPUs (a CPU cluster records no fusions: Triton compiles for GPUs), data parallel, fp32."""
    return mp.autoparallelize(model, "h100-sxm:1x2", global_batch=8, seq_len=64,
                              fixed={"dp": 2, "tp": 1, "pp": 1, "cp": 1}, dtype="float32")


@pytest.fixture(scope="module")
def hf_plan() -> mp.Plan:
    with torch.device("meta"):
        return _plan(_hf_llama())


def test_hf_llama_records_swiglu_costed_and_lowers_on_its_own_paths(hf_plan) -> None:
    assert hf_plan.fusions == ("swiglu",)
    unfused = next(a for a in hf_plan.solver.alternatives if a.get("fuse") is False)
    assert hf_plan.prediction.step_time_s < unfused["step_time_s"]  # the prediction counts the kernel
    assert hf_plan.structure["mlp_in"] == ["mlp.gate_proj", "mlp.up_proj"]
    report = hf_plan.report()
    assert re.search(r"fused kernels +1  swiglu: save [0-9.]+ ms/step", report)
    assert "note: fusion swiglu can run on the model's own MLP (model.layers.N.mlp: down_proj(silu(gate_proj(x)) " \
           "* up_proj(x)))" in report
    program = lower(hf_plan, fuse=True)
    steps = [s for s in program.steps if isinstance(s, FuseKernel)]
    assert steps == [FuseKernel(module=f"model.layers.{i}.mlp", kernel="swiglu", submodules=HF_CHILDREN)
                     for i in range(2)]
    assert program.kinds()[1:3] == ("FuseKernel",) * 2 and kernels_used(program) == ("swiglu",)
    assert skipped(hf_plan) == ()
    # the add + norm kernels are the zoo's: recorded for this model (a hand-edited plan), skipped, saying so
    edited = dataclasses.replace(hf_plan, fusions=("add_rmsnorm", "swiglu"))
    assert kernels_used(lower(edited, fuse=True)) == ("swiglu",)
    assert skipped(edited) == ("fusion add_rmsnorm not applied: it runs on meshplan's zoo blocks only (on this "
                               "model's own modules: swiglu)",)


def test_the_gate_is_the_projection_fed_to_silu_whatever_runs_first() -> None:
    with torch.device("meta"):
        model = _titan(UpFirstFeedForward)
    graph = trace(model, batch=1, seq_len=16)
    assert graph.structure.mlp_in == ("feed_forward.w3", "feed_forward.w1")  # the frontend's order: the graph's
    fusions, structure = user_fusions(graph, graph.structure)
    assert fusions == ("swiglu",) and structure.mlp_in == ("feed_forward.w1", "feed_forward.w3")
    assert "w2(silu(w1(x)) * w3(x))" in structure.notes[-1]


@pytest.mark.parametrize("build, why", [
    (lambda: _hf_llama(hidden_act="gelu"), "model.layers.0.mlp runs no single silu(gate) * up chain (its other "
                                           "ops: ['aten.gelu.default', 'aten.mul.Tensor'])"),
    (lambda: _titan(ScaledFeedForward), "layers.0.feed_forward runs ['aten.mul.Tensor'] besides "
                                        "down(silu(gate(x)) * up(x)); the fused forward would skip them"),
    (lambda: transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
        **user_models.hf_mixtral_config())), "the blocks' MLP holds routed experts"),
    (lambda: transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
        **user_models.hf_gpt2_config())), "is not two input projections (gate and up)"),
], ids=["hf-llama-gelu", "swiglu-and-more", "hf-mixtral", "hf-gpt2"])
def test_an_mlp_that_is_not_exactly_swiglu_gets_no_kernel_and_the_reason(build, why) -> None:
    with torch.device("meta"):
        model = build()
    graph = trace(model, batch=1, seq_len=16)
    fusions, structure = user_fusions(graph, graph.structure)
    assert fusions == ()
    assert structure.notes[-1].startswith("fusion swiglu is not offered: ") and why in structure.notes[-1]


def test_a_plan_of_a_gelu_llama_records_no_fusion_and_its_report_says_why() -> None:
    with torch.device("meta"):
        plan = _plan(_hf_llama(hidden_act="gelu"))
    assert plan.fusions == ()
    why = "note: fusion swiglu is not offered: model.layers.0.mlp runs no single silu(gate) * up chain"
    assert why in plan.report()
    assert skipped(plan) == ("fusion: the plan records none (meshplan.autoparallelize records those the cost model "
                             "finds faster)",)


@pytest.mark.parametrize("build, children", [(_hf_llama, HF_CHILDREN), (lambda: _titan(UpFirstFeedForward),
                                                                       ("w1", "w3", "w2"))],
                         ids=["hf-llama", "titan-up-first"])
def test_fused_user_model_matches_eager_in_process(tmp_path, monkeypatch, build, children) -> None:
    """The lowered FuseKernel steps run by the runtime (kernels interpreted) against the eager model: loss and
    every gradient, fp32; the kernel runs once per block, and the modules keep their class and parameters."""
    monkeypatch.setenv("MESHPLAN_KERNEL_CACHE", str(tmp_path))
    runtime_fused.load_kernels.cache_clear()
    runtime_fused.fused_class.cache_clear()
    with torch.device("meta"):
        plan = _plan(build())
    torch.manual_seed(0)
    eager = build()
    fused = copy.deepcopy(eager)
    steps = [s for s in lower(plan, fuse=True).steps if isinstance(s, FuseKernel)]
    assert [s.submodules for s in steps] == [children] * 2
    state = State(model=fused, device=torch.device("cpu"))
    for step in steps:
        mlp_class = type(state.get(step.module))
        runtime_fused.fuse_kernel(step, state)
        assert isinstance(state.get(step.module), mlp_class) and type(state.get(step.module)) is not mlp_class
    kernels = runtime_fused.load_kernels(("swiglu",))
    calls = []
    monkeypatch.setattr(kernels, "swiglu_fwd", lambda *a, _f=kernels.swiglu_fwd: (calls.append(1), _f(*a))[1])
    x, y = (torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(i)) for i in (1, 2))

    def loss_fn(out, y: torch.Tensor) -> torch.Tensor:
        logits = out.logits if hasattr(out, "logits") else out
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    assert_trains_alike(eager, fused, x, y, loss_fn)
    assert len(calls) == 2


def test_a_module_without_the_named_children_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESHPLAN_KERNEL_CACHE", str(tmp_path))
    state = State(model=_hf_llama(), device=torch.device("cpu"))
    step = FuseKernel(module="model.layers.0.mlp", kernel="swiglu", submodules=("w1", "up_proj", "down_proj"))
    with pytest.raises(mp.ir.InvalidPlanError, match="calls the module's gate 'w1', which LlamaMLP does not have"):
        runtime_fused.fuse_kernel(step, state)
    assert type(state.get("model.layers.0.mlp")) is transformers.models.llama.modeling_llama.LlamaMLP


@pytest.mark.slow
def test_emitted_hf_script_with_swiglu_trains_like_the_unfused_one(hf_plan, tmp_path) -> None:
    """Two gloo processes, kernels in the Triton interpreter: the fused script's losses are the eager script's."""
    plan = dataclasses.replace(hf_plan, cluster="cpu:1x2")
    fused = plan.emit(tmp_path / "train_fused.py", fuse=True)
    source = fused.read_text()
    assert source.count("__class__ = fused_class(FusedSwiGLUMLP, type(model.model.layers[") == 2
    assert "meshplan.zoo" not in source
    plain = plan.emit(tmp_path / "train_plain.py", fuse=False)
    env = {"TRITON_INTERPRET": "1", "MESHPLAN_KERNEL_CACHE": str(tmp_path / "cache")}
    fused_losses = _losses(_torchrun([str(fused)], tmp_path, nproc=2, env=env))
    plain_losses = _losses(_torchrun([str(plain)], tmp_path, nproc=2, env=env))
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(plain_losses), atol=1e-5, rtol=1e-5)
