"""Kernel fusion end to end: ``lower(plan, fuse=True)`` adds FuseKernel steps, ``Plan.emit(fuse=True)``
writes the script and its generated kernels module side by side, and the fused script, trained 3
steps on 2 gloo processes with the kernels in the Triton interpreter, prints the unfused script's
losses (and those of one process); the runtime back end (``-m meshplan.runtime.train --fuse``) prints
the very same lines as the fused script."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from meshplan import api, ir, zoo
from meshplan.codegen import STEP_KINDS, FuseKernel, emit_source, lower
from meshplan.codegen.fused import kernels_source, kernels_used
from meshplan.runtime import EXECUTORS
from test_codegen_run import LINE, _losses, _reference, _torchrun
from test_kernels import interpret  # noqa: F401  the Triton interpreter, as a fixture



def assert_trains_alike(eager: torch.nn.Module, fused: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                        loss_fn) -> None:
    """One forward and backward of each model on ``(x, y)``: the same loss (1e-6) and the same gradient of
    every parameter, under the same names (1e-5), fp32."""
    losses = []
    for net in (eager, fused):
        loss = loss_fn(net(x), y)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    grads = dict(fused.named_parameters())
    assert grads.keys() == dict(eager.named_parameters()).keys()
    for name, p in eager.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def _plan(model: str = "llama-tiny", *, dp: int = 2, tp: int = 1, fusions=("add_rmsnorm", "swiglu"), **kw) -> api.Plan:
    cfg = zoo.config(model).to_dict()
    return api.Plan(model=cfg, cluster=f"cpu:1x{dp * tp}", global_batch=8, seq_len=16, mesh=ir.Mesh(dp=dp, tp=tp),
                    micro_batch_size=8 // dp, num_microbatches=1, fusions=fusions, **{"dtype": "float32", **kw})


def test_lower_fuse_adds_one_step_per_block_and_kernel_first() -> None:
    plan = _plan(tp=2, zero_stage=3, recompute=("full",) * 4)
    plain, fused = lower(plan), lower(plan, fuse=True)
    assert "FuseKernel" not in plain.kinds()
    steps = [s for s in fused.steps if isinstance(s, FuseKernel)]
    assert steps == ([FuseKernel(module=f"layers.{i}.mlp", kernel="swiglu") for i in range(4)]
                     + [FuseKernel(module=f"layers.{i}", kernel="add_rmsnorm") for i in range(4)])
    # right after the mesh: before TP, recompute and FSDP wrap or shard the module
    assert fused.kinds()[1:9] == ("FuseKernel",) * 8 and fused.steps[9:] == plain.steps[1:]
    assert kernels_used(fused) == ("swiglu", "add_rmsnorm")
    assert FuseKernel in STEP_KINDS and FuseKernel in EXECUTORS


def test_lower_fuse_skips_what_the_plan_rules_out_and_says_so() -> None:
    sp = _plan(tp=2, sequence_parallel=True)
    assert kernels_used(lower(sp, fuse=True)) == ("swiglu",)
    source = emit_source(sp, fuse=True)
    assert "fusion add_rmsnorm not applied: under sequence parallelism" in source
    assert "fusion" not in emit_source(sp)  # nothing fused, nothing said
    gpt_tp = _plan("gpt-tiny", tp=2, fusions=("add_layernorm", "bias_gelu", "softmax"))
    assert kernels_used(lower(gpt_tp, fuse=True)) == ("add_layernorm",)
    header = lower(gpt_tp, fuse=True).header
    assert any(line.startswith("fusion bias_gelu not applied: under tensor parallelism") for line in header)
    assert any(line.startswith("fusion softmax not applied") for line in header)
    assert kernels_used(lower(_plan("gpt-tiny", fusions=("add_layernorm", "bias_gelu")), fuse=True)) == (
        "bias_gelu", "add_layernorm")
    assert kernels_used(lower(_plan("moe-tiny", fusions=("add_rmsnorm",)), fuse=True)) == ("add_rmsnorm",)
    # only what the plan records, and only what the family's blocks hold
    assert kernels_used(lower(_plan(fusions=("swiglu",)), fuse=True)) == ("swiglu",)
    assert kernels_source(lower(_plan("gpt-tiny"), fuse=True)) is None
    assert kernels_source(lower(_plan(fusions=()), fuse=True)) is None


def test_fusion_keeps_parameter_names_and_the_cost_model_counts_what_lowering_applies() -> None:
    from meshplan.cost_model.fusion import FUSED_TRAFFIC, runs
    from meshplan.codegen.fused import FUSED_MODULES, USER_MODULES, applicable

    assert set(FUSED_TRAFFIC) == set(FUSED_MODULES)
    # a user's module runs a kernel for the families the cost model counts it in, as the zoo's does
    assert all(spec.families == FUSED_MODULES[k].families == FUSED_TRAFFIC[k].families
               for k, spec in USER_MODULES.items())
    for model in ("gpt-tiny", "llama-tiny", "moe-tiny"):
        for tp, sp in ((1, False), (2, False), (2, True)):
            plan = _plan(model, tp=tp, sequence_parallel=sp, fusions=tuple(FUSED_MODULES))
            family = plan.model["family"]
            assert applicable(plan) == tuple(k for k in FUSED_MODULES if runs(k, family, tp=tp, sp=sp)), (model, tp, sp)
    names = [n for n, _ in zoo.build("llama-tiny").named_parameters()]
    assert "layers.0.mlp_norm.weight" in names and "layers.3.attn_norm.weight" in names


def test_emit_fuse_writes_kernels_beside_the_script(tmp_path) -> None:
    path = _plan().emit(tmp_path / "train.py", fuse=True)
    kernels = tmp_path / "train_kernels.py"
    source = path.read_text()
    ast.parse(source)
    ast.parse(kernels.read_text())
    assert "import train_kernels as kernels" in source and "class FusedSwiGLU(" in source
    assert "class FusedAddRmsnormBlock(meshplan.zoo.models.Block)" in source
    assert "model.layers[i].mlp.__class__ = FusedSwiGLU" in source
    assert "model.layers[i].__class__ = FusedAddRmsnormBlock" in source
    assert "def swiglu(" in kernels.read_text() and "def add_rmsnorm(" in kernels.read_text()
    plain = _plan().emit(tmp_path / "plain.py", fuse=False)
    assert not (tmp_path / "plain_kernels.py").exists() and "kernels" not in plain.read_text()
    assert plain.read_text() == emit_source(_plan())
    # by default a plan that records fusions is emitted fused (its prediction counts them)
    assert _plan().fusions and _plan().emit(tmp_path / "default.py").read_text() == source.replace(
        "train_kernels", "default_kernels")
    assert (tmp_path / "default_kernels.py").exists()


@pytest.mark.parametrize("model, kernels", [("llama-tiny", ("swiglu", "add_rmsnorm")),
                                            ("gpt-tiny", ("bias_gelu", "add_layernorm")),
                                            ("moe-tiny", ("add_rmsnorm",))])
def test_fused_classes_match_the_zoo_model_in_process(interpret, tmp_path, monkeypatch, model, kernels) -> None:
    """The runtime's fused subclasses (kernels interpreted) against the unfused model: loss and every
    gradient, fp32; each kernel really runs."""
    from meshplan.codegen.fused import FUSED_MODULES
    from meshplan.runtime import fused as runtime_fused

    monkeypatch.setenv("MESHPLAN_KERNEL_CACHE", str(tmp_path))
    runtime_fused.load_kernels.cache_clear()
    runtime_fused.fused_class.cache_clear()
    torch.manual_seed(0)
    eager, fused = zoo.build(model), zoo.build(model)
    fused.load_state_dict(eager.state_dict())
    calls = []
    for block in fused.layers:
        for k in kernels:
            spec = FUSED_MODULES[k]
            module = block.get_submodule(spec.where) if spec.where else block
            module.__class__ = runtime_fused.fused_class(k, type(module))
    for k in kernels:
        module = runtime_fused.load_kernels((k,))
        monkeypatch.setattr(module, f"{k}_fwd", lambda *a, _f=getattr(module, f"{k}_fwd"), _k=k: (calls.append(_k), _f(*a))[1])
    x, y = (torch.randint(0, eager.config.vocab, (4, 16), generator=torch.Generator().manual_seed(i)) for i in (1, 2))
    assert_trains_alike(eager, fused, x, y, zoo.loss_fn)
    assert sorted(set(calls)) == sorted(kernels) and len(calls) == len(kernels) * len(fused.layers)


def _interpret(cwd: Path) -> dict[str, str]:
    """Triton's CPU interpreter, and a kernel cache inside the test's folder."""
    return {"TRITON_INTERPRET": "1", "MESHPLAN_KERNEL_CACHE": str(cwd / "cache")}


@pytest.mark.slow
@pytest.mark.parametrize("model, kw", [
    ("llama-tiny", dict(fusions=("add_rmsnorm", "swiglu"))),
    ("gpt-tiny", dict(fusions=("add_layernorm", "bias_gelu"), zero_stage=3)),
], ids=["llama-add_rmsnorm-swiglu", "gpt-zero3-add_layernorm-bias_gelu"])
def test_fused_script_and_runtime_train_like_one_process(tmp_path, model, kw) -> None:
    plan = _plan(model, **kw)
    fused = plan.emit(tmp_path / "train_fused.py", fuse=True)
    assert fused.read_text().count(".__class__ = Fused") == len(kw["fusions"])  # every fusion applied
    assert ".__class__ = Fused" not in plan.emit(tmp_path / "train_plain.py", fuse=False).read_text()
    fused_out = _torchrun([str(fused)], tmp_path, nproc=2, env=_interpret(tmp_path))
    # the unfused program's losses are the one-process reference's (the emitted-script parity tests,
    # test_codegen_run.py): the fused script is held to that reference directly
    torch.testing.assert_close(torch.tensor(_losses(fused_out)), torch.tensor(_reference(model)), atol=1e-5, rtol=1e-5)
    plan_file = plan.save(tmp_path / "plan.json")
    from_runtime = _torchrun(["-m", "meshplan.runtime.train", str(plan_file), "--fuse"], tmp_path, nproc=2,
                             env=_interpret(tmp_path))
    assert LINE.findall(from_runtime) == LINE.findall(fused_out)
    assert list((tmp_path / "cache").glob("meshplan_kernels_*.py"))  # the runtime's generated module


@pytest.mark.slow
def test_fused_script_under_tensor_parallelism_trains_like_one_process(tmp_path) -> None:
    """tp=2 without sequence parallelism: swiglu on ColwiseParallel's local shards, add_rmsnorm on the
    replicated stream and the attention output RowwiseParallel reduces (an AsyncCollectiveTensor), with
    full and selective recompute."""
    plan = _plan(dp=1, tp=2, recompute=("full", "none", "selective", "none"))
    script = plan.emit(tmp_path / "train-tp.py", fuse=True)  # kernels: train_tp_kernels.py
    assert script.read_text().count(".__class__ = Fused") == 2
    losses = _losses(_torchrun([str(script)], tmp_path, nproc=2, env=_interpret(tmp_path)))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("llama-tiny")), atol=1e-5, rtol=1e-5)


def test_cli_emit_fuse_writes_both_files(tmp_path, capsys) -> None:
    from meshplan.cli import main

    plan_file = _plan().save(tmp_path / "plan.json")
    assert main(["emit", str(plan_file), "-o", str(tmp_path / "run.py"), "--fuse"]) == 0
    assert (tmp_path / "run.py").exists() and (tmp_path / "run_kernels.py").exists()
    assert "run_kernels.py" in capsys.readouterr().out


def test_planner_records_fusions_for_gpus_only() -> None:
    """Triton compiles for GPUs: a CPU plan records none (emit and apply then run eager by default)."""
    import meshplan as mp
    gpu = mp.autoparallelize("llama-tiny", "h100-sxm:1x2", global_batch=8, seq_len=64)
    cpu = mp.autoparallelize("llama-tiny", "cpu:1x2", global_batch=8, seq_len=64)
    assert "add_rmsnorm" in gpu.fusions and cpu.fusions == ()
