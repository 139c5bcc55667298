"""A model without repeated blocks (the caller's ``nn.Sequential`` of Linear + GELU, fed features, not
token ids), planned from its traced graph with data parallelism and ZeRO (``solver/blockless.py``) and
run through ``apply`` on 4 gloo processes: every ZeRO stage, with and without gradient accumulation,
must match one process (losses and final parameters within 1e-5, fp32, 3 AdamW steps)."""
from __future__ import annotations

import pytest
import torch

import meshplan as mp
from parity_support import assert_ranks_match, launch

import blockless_cases  # noqa: E402

WORLD = 4


def _plans(**fixed) -> dict[int, mp.Plan]:
    """The solver's best plan of each ZeRO stage (it returns one per stage), by stage."""
    with torch.device("meta"):
        model = blockless_cases.mlp()
    example = (torch.randn(blockless_cases.GLOBAL_BATCH, blockless_cases.IN_FEATURES, device="meta"),)
    found = mp.plans(model, f"cpu:1x{WORLD}", global_batch=blockless_cases.GLOBAL_BATCH, seq_len=1,
                     example_inputs=example, fixed=fixed)
    return {p.zero_stage: p for p in found}


@pytest.fixture(scope="module")
def plans() -> dict[str, mp.Plan]:
    whole, accumulated = _plans(micro_batch=4), _plans(micro_batch=2)  # local batch 4: 1 or 2 micro-batches
    out = {f"zero{z} mb4x1": p for z, p in whole.items()}
    out.update({f"zero{z} mb2x2": accumulated[z] for z in (0, 3)})
    return out


@pytest.fixture(scope="module")
def ranks(plans, tmp_path_factory) -> list[dict]:
    cases = [{"name": name, "plan": plan.to_json()} for name, plan in plans.items()]
    return launch(tmp_path_factory, WORLD, "blockless_cases:run_cases", {"cases": cases})


def test_every_zero_stage_is_planned(plans) -> None:
    assert sorted(plans) == ["zero0 mb2x2", "zero0 mb4x1", "zero1 mb4x1", "zero2 mb4x1", "zero3 mb2x2", "zero3 mb4x1"]
    for name, plan in plans.items():
        assert plan.mesh == mp.ir.Mesh(dp=WORLD) and plan.recompute == () and plan.prediction is not None, name
        assert plan.num_microbatches == (2 if "mb2x2" in name else 1)


@pytest.mark.parametrize("name", ["zero0 mb4x1", "zero1 mb4x1", "zero2 mb4x1", "zero3 mb4x1", "zero0 mb2x2",
                                  "zero3 mb2x2"])
def test_blockless_model_matches_one_process(plans, ranks, name) -> None:
    ref_losses, ref_params = blockless_cases.reference()
    assert_ranks_match(ranks, name, ref_losses, ref_params)


def test_zero_stages_run_ddp_and_fsdp(ranks) -> None:
    """The stages are the programs they say: DDP for 0, ZeroRedundancyOptimizer for 1, FSDP2 for 2 and 3."""
    steps = {name: ranks[0][name]["steps"] for name in ranks[0]}
    assert "DataParallel" in steps["zero0 mb4x1"] and "FullyShard" not in steps["zero0 mb4x1"]
    assert "ShardOptimizer" in steps["zero1 mb4x1"]
    assert "FullyShard" in steps["zero3 mb4x1"] and "FullyShard" in steps["zero2 mb4x1"]
