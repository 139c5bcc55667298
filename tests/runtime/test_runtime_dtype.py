"""A dtype the runtime or the device cannot train in is refused before any process starts (issue 12)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from meshplan import ir
from meshplan.cli import main
from meshplan.codegen import lower
from meshplan.codegen.precision import check_runnable

TINY = dict(family="llama", layers=2, hidden=64, heads=4, vocab=128, max_seq_len=32, name="llama-dtype")


def _plan(dtype: str) -> ir.Plan:
    return ir.Plan(model=TINY, cluster="cpu:1x2", global_batch=4, seq_len=16, mesh=ir.Mesh(dp=2), zero_stage=3,
                   micro_batch_size=2, num_microbatches=1, recompute=("none",) * 2, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float8", "float4"])
def test_low_precision_gemms_have_no_program(dtype) -> None:
    with pytest.raises(ir.InvalidPlanError, match=rf"trains in {dtype}.*--dtype bfloat16"):
        lower(_plan(dtype))


def test_bf16_refused_on_a_gpu_without_bf16_only() -> None:
    with pytest.raises(ir.InvalidPlanError, match="no bf16 arithmetic"):
        check_runnable("bfloat16", "cuda", bf16_supported=False)
    check_runnable("bfloat16", "cuda", bf16_supported=True)
    check_runnable("bfloat16", "cpu")
    check_runnable("float16", "cpu")


def test_meshplan_run_refuses_float8_in_one_line_before_torchrun(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    data = dataclasses.replace(_plan("float32")).to_dict()
    data["dtype"] = "float8"  # a plan file may name any dtype the cost model prices
    path.write_text(json.dumps(data))
    assert main(["run", str(path), "--nproc", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "float8" in err and "Traceback" not in err
