"""Context parallelism in the Program and in the emitted script: which steps, in which order, what is
refused; and an emitted dp x cp script run with torchrun against one process."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_codegen_lower import plan
from test_codegen_run import _losses, _reference, _torchrun

from meshplan import ir
from meshplan.codegen import (ContextParallel, DataParallel, FlattenMesh, FullyShard, ShardOptimizer, emit_source,
                              lower)
from meshplan.codegen.emit import group_steps
from meshplan.runtime.context import sequence_share
from meshplan.runtime.train import synthetic_batch


def test_cp_flattens_dp_x_cp_and_splits_each_attention() -> None:
    program = lower(plan("gpt", dp=2, cp=2, zero=3, recompute=("selective",) * 4))
    assert program.mesh.dims == (("dp", 2), ("cp", 2))  # ranks: dp outer, cp inner (ir.Mesh's order)
    assert program.steps[1] == FlattenMesh(axes=("dp", "cp"), name="dp_cp")
    cps = [s for s in program.steps if isinstance(s, ContextParallel)]
    assert [s.module for s in cps] == [f"layers.{i}.attn" for i in range(4)] + ["embed"]  # gpt: learned positions
    assert all(s.cp_size == 2 and s.load_balance and s.mesh_axis == "cp" for s in cps)
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    assert len(shards) == 7 and all(s.mesh_axes == ("dp_cp",) for s in shards)  # blocks, embedding, head, root
    kinds = program.kinds()  # recompute wraps attn, so the module swap comes first; FSDP last
    assert max(i for i, k in enumerate(kinds) if k == "ContextParallel") < kinds.index("Recompute")
    assert max(i for i, k in enumerate(kinds) if k == "Recompute") < kinds.index("FullyShard")


def test_llama_keeps_its_embedding_and_plain_dp_runs_over_dp_x_cp() -> None:
    program = lower(plan("llama", cp=4, zero=1))
    assert program.mesh.dims == (("dp", 1), ("cp", 4))
    modules = [s.module for s in program.steps if isinstance(s, ContextParallel)]
    assert modules == [f"layers.{i}.attn" for i in range(4)]
    assert program.steps[-2:] == (DataParallel(module="", mesh_axis="dp_cp"), ShardOptimizer(mesh_axis="dp_cp"))


def test_cp_beside_tp_sits_between_dp_and_tp() -> None:
    program = lower(plan("llama", cp=2, tp=2, sp=True))
    assert program.mesh.dims == (("dp", 1), ("cp", 2), ("dp_shard", 1), ("tp", 2))  # HSDP-as-DDP over dp x cp
    assert {s.mesh_axes for s in program.steps if isinstance(s, FullyShard)} == {("dp_cp", "dp_shard")}
    kinds = program.kinds()
    assert max(i for i, k in enumerate(kinds) if k == "TensorParallel") < kinds.index("ContextParallel")


def test_load_balance_needs_two_chunks_per_rank() -> None:
    p = dataclasses.replace(plan("gpt", cp=4), seq_len=12)  # 12 tokens: 4 chunks of 3, not 8
    assert not any(s.load_balance for s in lower(p).steps if isinstance(s, ContextParallel))


def test_cp_with_ep_averages_expert_shards_over_edp_x_cp() -> None:
    """An ep group is the dp ranks of one cp rank; an expert shard's replicas are its edp ranks times the cp ranks,
    flattened on the expert mesh, as the rest of the model is data-parallel over dp x cp."""
    program = lower(plan("moe", dp=2, cp=2, ep=2, zero=2))
    flats = [s for s in program.steps if isinstance(s, FlattenMesh)]
    assert [(f.axes, f.name) for f in flats] == [(("dp", "cp"), "dp_cp"), (("edp", "cp"), "edp_cp")]
    experts = [s for s in program.steps if isinstance(s, FullyShard) and "experts" in s.module]
    assert len(experts) == 4 and all(s.mesh_axes == ("edp_cp",) for s in experts)
    others = [s for s in program.steps if isinstance(s, FullyShard) and "experts" not in s.module]
    assert others and all(s.mesh_axes == ("dp_cp",) for s in others)
    src = emit_source(plan("moe", dp=2, cp=2, ep=2, zero=0))
    assert 'expert_mesh["edp", "cp"]._flatten("edp_cp")' in src
    assert 'mesh=expert_mesh["edp_cp", "dp_shard"]' in src


def test_cp_with_pipeline_splits_then_cuts_each_stages_attention_and_replicates_over_dp_cp() -> None:
    """pp beside cp: SplitPipeline first, each block's attention made context-parallel where its stage holds it,
    plain DP as HSDP over the flattened dp x cp axis (dp_shard after cp, so dp and cp stay adjacent to flatten)."""
    p = dataclasses.replace(plan("llama"), mesh=ir.Mesh(pp=2, cp=2), stages=((0, 2), (2, 4)), schedule="gpipe",
                            num_microbatches=2, micro_batch_size=4)
    program = lower(p)
    assert program.mesh.dims == (("pp", 2), ("dp", 1), ("cp", 2), ("dp_shard", 1))
    kinds = program.kinds()
    assert kinds[:3] == ("BuildMesh", "SplitPipeline", "FlattenMesh")
    assert [s.module for s in program.steps if isinstance(s, ContextParallel)] == [
        f"layers.{i}.attn" for i in range(4)]
    shards = [s for s in program.steps if isinstance(s, FullyShard)]
    assert shards and all(s.mesh_axes == ("dp_cp", "dp_shard") and not s.reshard_after_forward for s in shards)
    assert "module.position_ids" not in emit_source(p)  # a zoo model numbers its tokens in its attention


def test_context_steps_check_themselves() -> None:
    with pytest.raises(ir.InvalidPlanError, match=r"cp_size\(1\) must be at least 2"):
        ContextParallel(module="layers.0.attn", cp_size=1)
    with pytest.raises(ir.InvalidPlanError, match="two or more axes"):
        FlattenMesh(axes=("dp",), name="dp_cp")


def test_cp_script_reads_like_a_recipe() -> None:
    program = lower(plan("gpt", dp=2, cp=2, zero=3, recompute=("full",) * 4))
    groups = [(type(s).__name__, getattr(s, "module", None), idx) for s, idx in group_steps(program.steps)]
    assert ("ContextParallel", "layers.{i}.attn", (0, 1, 2, 3)) in groups
    src = emit_source(program)
    compile(src, "t.py", "exec")
    assert "from meshplan.runtime.context import context_parallel, sequence_positions, sequence_share" in src
    assert 'mesh["dp", "cp"]._flatten("dp_cp")' in src
    loop = '    for i in range(4):\n        context_parallel(model.layers[i].attn, mesh["cp"], load_balance=True)'
    assert loop in src
    assert 'context_parallel(model.embed, mesh["cp"], load_balance=True)' in src
    assert 'fully_shard(model.layers[i], mesh=mesh["dp_cp"], reshard_after_forward=True)' in src
    assert "CP_SIZE = 2" in src and "loss = loss_sum.item() / (DP_SIZE * CP_SIZE)" in src
    assert 'data_group = mesh["dp_cp"].get_group()' in src and "over dp x cp" in src
    order = [src.index(s) for s in ("context_parallel(model.layers", "checkpoint_wrapper(", "fully_shard(model")]
    assert order == sorted(order)


def test_scripts_without_cp_do_not_import_it() -> None:
    src = emit_source(plan("llama", dp=2, tp=2, sp=True, zero=3))
    assert "context_parallel" not in src and "CP_SIZE" not in src and "_flatten" not in src


def test_cp_script_takes_each_ranks_tokens() -> None:
    p = plan("llama", dp=2, cp=2)
    namespace: dict = {"__name__": "emitted"}
    exec(compile(emit_source(p), "emitted.py", "exec"), namespace)
    x, y = synthetic_batch(512, p.global_batch, p.seq_len, seed=7, step=3)
    for dp_rank in range(2):
        rows = slice(8 * dp_rank, 8 * dp_rank + 8)
        for cp_rank in range(2):
            xs, ys = namespace["synthetic_batch"](3, 7, dp_rank, cp_rank)
            assert torch.equal(xs, sequence_share(x[rows], 2, cp_rank)) and xs.shape == (8, 8)
            assert torch.equal(ys, sequence_share(y[rows], 2, cp_rank))
    assert torch.equal(namespace["synthetic_batch"](3, 7, 0, 1)[0][:, :4], x[:8, 4:8])  # chunks 1 and 2 of 4


@pytest.mark.slow
def test_emitted_dp_x_cp_script_matches_one_process(tmp_path) -> None:
    """(The runtime back end of the same steps is checked in-process: tests/runtime/test_runtime_context.py.)"""
    p = dataclasses.replace(plan("llama", dp=2, cp=2, nmb=2, recompute=("selective", "none", "full", "none")),
                            global_batch=8, micro_batch_size=2)
    script = tmp_path / "train_cp.py"
    script.write_text(emit_source(p))
    losses = _losses(_torchrun([str(script)], tmp_path))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("llama-tiny")), atol=1e-5, rtol=1e-5)
