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



def _plan(model: str = "llama-tiny", *, dp: int = 2, tp: int = 1, fusions=("add_rmsnorm", "swiglu"), **kw) -> api.Plan:
    cfg = zoo.config(model).to_dict()
    return api.Plan(model=cfg, cluster="cpu:1x4", global_batch=8, seq_len=16, mesh=ir.Mesh(dp=dp, tp=tp),
                    micro_batch_size=8 // dp, num_microbatches=1, fusions=fusions, **kw)


def test_lower_fuse_adds_one_swiglu_step_per_block_first() -> None:
    plan = _plan(tp=2, zero_stage=3, recompute=("full",) * 4)
    plain, fused = lower(plan), lower(plan, fuse=True)
    assert "FuseKernel" not in plain.kinds()
    steps = [s for s in fused.steps if isinstance(s, FuseKernel)]
    assert steps == [FuseKernel(module=f"layers.{i}.mlp", kernel="swiglu") for i in range(4)]
    # right after the mesh: before TP, recompute and FSDP wrap or shard the module
    assert fused.kinds()[1:5] == ("FuseKernel",) * 4 and fused.steps[5:] == plain.steps[1:]
    assert kernels_used(fused) == ("swiglu",)
    assert FuseKernel in STEP_KINDS and FuseKernel in EXECUTORS


def test_lower_fuse_only_what_the_plan_records_and_the_family_supports() -> None:
    assert "FuseKernel" not in lower(_plan(fusions=("add_rmsnorm",)), fuse=True).kinds()
    assert "FuseKernel" not in lower(_plan("gpt-tiny", fusions=("bias_gelu",)), fuse=True).kinds()
    assert kernels_source(lower(_plan("gpt-tiny"), fuse=True)) is None


def test_emit_fuse_writes_kernels_beside_the_script(tmp_path) -> None:
    path = _plan().emit(tmp_path / "train.py", fuse=True)
    kernels = tmp_path / "train_kernels.py"
    source = path.read_text()
    ast.parse(source)
    ast.parse(kernels.read_text())
    assert "import train_kernels as kernels" in source and "class FusedSwiGLU(" in source
    assert "model.layers[i].mlp.__class__ = FusedSwiGLU" in source
    assert "def swiglu(" in kernels.read_text()
    plain = _plan().emit(tmp_path / "plain.py")
    assert not (tmp_path / "plain_kernels.py").exists() and "kernels" not in plain.read_text()
    assert plain.read_text() == emit_source(_plan())


def _interpret(cwd: Path) -> dict[str, str]:
    """Triton's CPU interpreter, and a kernel cache inside the test's folder."""
    return {"TRITON_INTERPRET": "1", "MESHPLAN_KERNEL_CACHE": str(cwd / "cache")}


@pytest.mark.slow
def test_fused_script_and_runtime_train_like_the_unfused_script(tmp_path) -> None:
    plan = _plan()
    fused = plan.emit(tmp_path / "train_fused.py", fuse=True)
    plain = plan.emit(tmp_path / "train_plain.py")
    fused_out = _torchrun([str(fused)], tmp_path, nproc=2, env=_interpret(tmp_path))
    fused_losses = _losses(fused_out)
    tol = dict(atol=1e-5, rtol=1e-5)
    plain_losses = _losses(_torchrun([str(plain)], tmp_path, nproc=2, env=_interpret(tmp_path)))
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(plain_losses), **tol)
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(_reference("llama-tiny")), **tol)
    plan_file = plan.save(tmp_path / "plan.json")
    from_runtime = _torchrun(["-m", "meshplan.runtime.train", str(plan_file), "--fuse"], tmp_path, nproc=2,
                             env=_interpret(tmp_path))
    assert LINE.findall(from_runtime) == LINE.findall(fused_out)
    assert list((tmp_path / "cache").glob("meshplan_kernels_*.py"))  # the runtime's generated module


def test_cli_emit_fuse_writes_both_files(tmp_path, capsys) -> None:
    from meshplan.cli import main

    plan_file = _plan().save(tmp_path / "plan.json")
    assert main(["emit", str(plan_file), "-o", str(tmp_path / "run.py"), "--fuse"]) == 0
    assert (tmp_path / "run.py").exists() and (tmp_path / "run_kernels.py").exists()
    assert "run_kernels.py" in capsys.readouterr().out
