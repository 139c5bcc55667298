"""Expert parallelism in the Program and in the emitted script: which steps, in which order, what is
refused; and emitted pp x ep and cp x ep scripts run with torchrun against one process."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_codegen_lower import plan
from test_codegen_run import _losses, _reference, _torchrun

from meshplan import ir
from meshplan.codegen import ExpertMesh, ExpertParallel, FullyShard, emit_source, lower
from meshplan.codegen.emit import group_steps


def test_ep_splits_dp_and_shards_each_blocks_experts() -> None:
    program = lower(plan("moe", dp=4, ep=2, recompute=("full", "none", "none", "selective")))
    assert program.mesh.dims == (("dp", 4), ("dp_shard", 1))  # plain DP beside ep is HSDP-as-DDP
    assert program.steps[1] == ExpertMesh(dims=(("edp", 2), ("ep", 2), ("dp_shard", 1)))
    eps = [s for s in program.steps if isinstance(s, ExpertParallel)]
    assert [s.module for s in eps] == [f"layers.{i}.mlp.experts" for i in range(4)]
    assert all(s.num_experts == 4 and s.ep_size == 2 and s.mesh_axis == "ep" for s in eps)
    shards = [(s.module, s.mesh_axes) for s in program.steps if isinstance(s, FullyShard)]
    assert shards == ([(f"layers.{i}.mlp.experts", ("edp", "dp_shard")) for i in range(4)]
                      + [(f"layers.{i}", ("dp", "dp_shard")) for i in range(4)] + [("", ("dp", "dp_shard"))])
    kinds = program.kinds()  # torchtitan's order: ep, then recompute, then FSDP (experts before their block)
    assert kinds.index("ExpertMesh") < kinds.index("ExpertParallel") < kinds.index("Recompute")
    assert max(i for i, k in enumerate(kinds) if k == "Recompute") < kinds.index("FullyShard")
    assert "DataParallel" not in kinds and not program.sync_every_microbatch


@pytest.mark.parametrize("zero, reshard", [(2, False), (3, True)])
def test_ep_with_zero_shards_experts_over_edp(zero: int, reshard: bool) -> None:
    program = lower(plan("moe", dp=8, ep=4, zero=zero))
    assert program.mesh.dims == (("dp", 8),)
    assert program.steps[1] == ExpertMesh(dims=(("edp", 2), ("ep", 4)))
    experts = [s for s in program.steps if isinstance(s, FullyShard) and "experts" in s.module]
    assert len(experts) == 4 and all(s.mesh_axes == ("edp",) and s.reshard_after_forward == reshard for s in experts)


def test_ep_beside_tp_keeps_tp_innermost() -> None:
    program = lower(plan("moe", dp=2, tp=2, ep=2, sp=True))
    assert program.mesh.dims == (("dp", 2), ("dp_shard", 1), ("tp", 2))
    expert_mesh = next(s for s in program.steps if isinstance(s, ExpertMesh))
    assert expert_mesh.dims == (("edp", 1), ("ep", 2), ("dp_shard", 1), ("tp", 2))
    kinds = program.kinds()
    assert max(i for i, k in enumerate(kinds) if k == "TensorParallel") < kinds.index("ExpertMesh")


@pytest.mark.parametrize("kwargs, message", [
    (dict(family="llama", dp=2, ep=2), "expert parallelism (ep=2) needs a MoE model"),
    (dict(dp=3, ep=3), "experts(4) does not divide by ep(3); use an ep that divides 4"),
    (dict(dp=4, ep=2, zero=1), "zero_stage 1 with ep(2) > 1 is not supported by the runtime yet"),
    (dict(dp=2, cp=2, ep=4), "the runtime folds ep inside dp (not dp x cp, as Megatron-Core may), but ep(4) does "
                             "not divide dp(2)"),
    (dict(dp=2, tp=2, ep=4, sp=True), "ep(4) does not divide dp(2) (it takes tp ranks too: Megatron-Core's MoE "
                                      "folding, which `meshplan export --to megatron` writes)"),
])
def test_unsupported_expert_plans_say_why(kwargs, message) -> None:
    family = kwargs.pop("family", "moe")
    with pytest.raises(ir.InvalidPlanError) as err:
        lower(plan(family, **kwargs))
    assert message in str(err.value)


def _ep_pipelined(**kw) -> ir.Plan:
    """moe-tiny (4 layers, 4 experts) over pp=2 x dp=2 with its experts split over ep=2 within each stage."""
    return dataclasses.replace(plan("moe", dp=2, ep=2, **kw), mesh=ir.Mesh(pp=2, dp=2, ep=2), stages=((0, 2), (2, 4)),
                               num_microbatches=2, micro_batch_size=2, global_batch=8)


def test_ep_with_pipeline_splits_the_stages_first_then_their_experts() -> None:
    """Each pp rank holds its stage's blocks; the expert mesh keeps pp outermost, so an ep group is the ep ranks of
    one stage (the all-to-all never crosses stages) and an edp group their replicas in that stage."""
    program = lower(_ep_pipelined(zero=2))
    assert program.mesh.dims == (("pp", 2), ("dp", 2))
    expert_mesh = next(s for s in program.steps if isinstance(s, ExpertMesh))
    assert expert_mesh.dims == (("pp", 2), ("edp", 1), ("ep", 2))
    kinds = program.kinds()
    assert kinds.index("SplitPipeline") < kinds.index("ExpertMesh") < kinds.index("ExpertParallel")
    assert [s.module for s in program.steps if isinstance(s, ExpertParallel)] == [
        f"layers.{i}.mlp.experts" for i in range(4)]  # the whole model's names: each stage finds its own
    experts = [s for s in program.steps if isinstance(s, FullyShard) and "experts" in s.module]
    assert len(experts) == 4 and all(s.mesh_axes == ("edp",) for s in experts)
    src = emit_source(_ep_pipelined(zero=2))  # each rank shards the experts of the blocks its stage holds
    assert ('mesh.mesh.reshape(2, 1, 2), mesh_dim_names=("pp", "edp", "ep"))' in src
            and 'for i in held(model, range(4)):\n        shard_experts(model.layers[i].mlp.experts, expert_mesh["ep"])'
            in src)


def test_expert_steps_check_themselves() -> None:
    with pytest.raises(ir.InvalidPlanError, match=r"ep_size\(3\) must be at least 2 and divide num_experts\(4\)"):
        ExpertParallel(module="layers.0.mlp.experts", num_experts=4, ep_size=3)
    with pytest.raises(ir.InvalidPlanError, match="include"):
        ExpertMesh(dims=(("dp", 4),))


def test_ep_script_reads_like_a_recipe() -> None:
    program = lower(plan("moe", dp=4, ep=2, zero=3, recompute=("full",) * 4))
    groups = [(type(s).__name__, getattr(s, "module", None), idx) for s, idx in group_steps(program.steps)]
    assert ("ExpertParallel", "layers.{i}.mlp.experts", (0, 1, 2, 3)) in groups
    src = emit_source(program)
    compile(src, "t.py", "exec")
    assert "from torch.distributed.device_mesh import DeviceMesh, init_device_mesh" in src
    assert "from meshplan.runtime.expert import shard_experts" in src
    assert ('expert_mesh = DeviceMesh(mesh.device_type, mesh.mesh.reshape(2, 2), mesh_dim_names=("edp", "ep"))'
            in src)
    assert '    for i in range(4):\n        shard_experts(model.layers[i].mlp.experts, expert_mesh["ep"])' in src
    assert ('fully_shard(model.layers[i].mlp.experts, mesh=expert_mesh["edp"], reshard_after_forward=True)'
            in src)
    assert "PyTorch has no ready-made MoE dispatch" in src
    order = [src.index(s) for s in ("expert_mesh = ", "shard_experts(model", "checkpoint_wrapper(",
                                    "fully_shard(model.layers[i].mlp", "fully_shard(model.layers[i],")]
    assert order == sorted(order)


def test_scripts_without_ep_do_not_import_the_dispatch() -> None:
    src = emit_source(plan("moe", dp=4, zero=3))
    assert "shard_experts" not in src and "DeviceMesh," not in src and "expert_mesh" not in src


@pytest.mark.slow
@pytest.mark.parametrize("beside", ["pp", "cp"], ids=["pp2 x dp2 ep2 zero2", "dp2 x cp2 ep2 zero0"])
def test_emitted_ep_script_matches_one_process(tmp_path, beside) -> None:
    """ep over the dp ranks of each pipeline stage, or of each cp rank (the expert shards then data-parallel over
    edp x cp, HSDP-as-DDP). (The runtime back end of the same steps is checked in-process:
    tests/runtime/test_runtime_expert.py, test_runtime_pipeline.py and test_runtime_context.py.)"""
    p = (_ep_pipelined(zero=2) if beside == "pp" else
         dataclasses.replace(plan("moe", dp=2, cp=2, ep=2, nmb=2), global_batch=8, micro_batch_size=2))
    script = tmp_path / "train_ep.py"
    script.write_text(emit_source(p))
    losses = _losses(_torchrun([str(script)], tmp_path))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("moe-tiny")), atol=1e-5, rtol=1e-5)
