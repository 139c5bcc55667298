"""The runtime and the emitter are two back ends of one Program: same step kinds, same styles, same
data, same loss. These checks need no processes."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor import parallel as tp

from meshplan import ir, zoo
from meshplan.codegen import EMITTERS, SELECTIVE_SAVE_OPS, STEP_KINDS, StyleKind, TPStyle, emit_source
from meshplan.runtime import EXECUTORS, apply, synthetic_batch, token_cross_entropy
from meshplan.runtime.styles import parallel_style, placement, torch_op
from parity_support import make_plan


def test_every_step_kind_is_handled_by_both_back_ends() -> None:
    assert set(EXECUTORS) == set(STEP_KINDS) == set(EMITTERS)


def test_layouts_become_torch_placements() -> None:
    assert placement("R") == Replicate() and placement("S(1)") == Shard(1) and placement("S(-1)") == Shard(-1)


def test_styles_become_the_torch_style_objects() -> None:
    col = parallel_style(TPStyle(kind=StyleKind.COLWISE, src="S(1)", out="R"))
    assert isinstance(col, tp.ColwiseParallel)
    assert col.input_layouts == (Shard(1),) and col.output_layouts == (Replicate(),)
    row = parallel_style(TPStyle(kind=StyleKind.ROWWISE, out="S(1)"))
    assert isinstance(row, tp.RowwiseParallel) and row.output_layouts == (Shard(1),)
    prep = parallel_style(TPStyle(kind=StyleKind.PREPARE_INPUT, src="S(1)", dst="R"))
    assert isinstance(prep, tp.PrepareModuleInput) and prep.desired_input_layouts == (Replicate(),)
    both = parallel_style(TPStyle(kind=StyleKind.PREPARE_INPUT_OUTPUT, src="S(1)", dst="R", out_src="R", out="S(1)"))
    assert isinstance(both, tp.PrepareModuleInputOutput)
    assert isinstance(parallel_style(TPStyle(kind=StyleKind.SEQUENCE_PARALLEL)), tp.SequenceParallel)
    out = parallel_style(TPStyle(kind=StyleKind.PREPARE_OUTPUT, src="R", dst="S(1)"))
    assert isinstance(out, tp.PrepareModuleOutput)


def test_selective_ops_resolve_to_torch_ops() -> None:
    assert torch_op("aten.mm.default") is torch.ops.aten.mm.default
    for name in SELECTIVE_SAVE_OPS:
        assert isinstance(torch_op(name), torch._ops.OpOverload)


def test_emitted_script_reads_the_same_data_stream() -> None:
    plan = make_plan("gpt-tiny", dp=4, nmb=2)
    namespace: dict = {"__name__": "emitted"}
    exec(compile(emit_source(plan), "emitted.py", "exec"), namespace)
    x, y = synthetic_batch(512, plan.global_batch, plan.seq_len, seed=7, step=3)
    for dp_rank in range(4):
        xs, ys = namespace["synthetic_batch"](3, 7, dp_rank)
        assert torch.equal(xs, x[2 * dp_rank:2 * dp_rank + 2]) and torch.equal(ys, y[2 * dp_rank:2 * dp_rank + 2])
    assert torch.equal(y[:, :-1], x[:, 1:])  # targets are the next tokens


def test_runtime_loss_is_the_zoo_loss() -> None:
    logits, targets = torch.randn(2, 5, 11), torch.randint(11, (2, 5))
    assert torch.equal(token_cross_entropy(logits, targets), zoo.loss_fn(logits, targets))


def test_apply_outside_torchrun_says_how_to_launch(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="launch with torchrun"):
        apply(make_plan("gpt-tiny", dp=2), zoo.build("gpt-tiny"))


def test_apply_refuses_unsupported_plans_before_touching_processes() -> None:
    with pytest.raises(ir.InvalidPlanError, match="not supported by the runtime yet"):
        apply(make_plan("gpt-tiny", dp=2, tp=2, zero=1), zoo.build("gpt-tiny"))
