"""Pipeline candidates are ones the runtime executes: the schedules' micro-batch rules, no ZeRO-1 under
pipelining, no ZeRO-3 with zero bubble; and every pipelined plan the solver returns lowers."""
from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import ir
from meshplan.codegen import lower
from meshplan.solver.space import RUNTIME, candidates, check_fixed

DIMS = ir.ModelDims(family="llama", layers=8, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=512)


def test_pipeline_candidates_follow_the_runtime() -> None:
    found = [c for c in candidates(DIMS, world=8, domain=8, global_batch=16, seq_len=16, fixed={})
             if c.pp > 1]
    assert {str(c.schedule) for c in found} == {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}
    assert not [c for c in found if c.zero == 1]
    assert not [c for c in found if c.zero == 3 and c.schedule == ir.Schedule.ZERO_BUBBLE]
    assert all(c.num_microbatches >= c.pp for c in found if c.schedule == ir.Schedule.ONE_F_ONE_B)
    assert all(c.num_microbatches % max(1, c.num_microbatches // c.pp) == 0 for c in found
               if c.schedule == ir.Schedule.ZERO_BUBBLE)
    assert any(c.schedule == ir.Schedule.GPIPE and c.num_microbatches < c.pp for c in found)


def test_runtime_executes_pipelines() -> None:
    assert "pp" in RUNTIME


@pytest.mark.parametrize("fixed, message", [
    ({"pp": 2, "zero": 1}, "no ZeRO-1 under pipelining"),
    ({"zero": 3, "schedule": "zero-bubble"}, "zero=3 with the zero-bubble schedule"),
])
def test_pins_the_runtime_cannot_pipeline_say_why(fixed, message) -> None:
    with pytest.raises(ir.PlanError, match=message):
        check_fixed(fixed)


@pytest.mark.parametrize("schedule, zero", [("gpipe", 3), ("1f1b", 2), ("interleaved-1f1b", 0), ("zero-bubble", 2)])
def test_pipelined_plans_lower(schedule: str, zero: int) -> None:
    plan = mp.autoparallelize("gpt-tiny", "cpu:1x8", global_batch=16, seq_len=16,
                              fixed={"pp": 2, "schedule": schedule, "zero": zero})
    assert plan.mesh.pp == 2 and plan.schedule == schedule and plan.zero_stage == zero
    program = lower(plan)
    assert program.kinds()[:2] == ("BuildMesh", "SplitPipeline")


def test_micro_batches_are_bounded_in_tokens_not_sequences() -> None:
    """A short sequence may be batched up to 128K tokens a rank (llm-foundry runs MPT-125m at 512 tokens in
    micro-batches of 128 and at 2048 in micro-batches of 40), a long one is not batched beyond it, one sequence
    is always offered, and a pin goes past the bound."""
    from meshplan.solver.space import MAX_MICRO_BATCH_TOKENS

    def sizes(seq_len: int, fixed: dict | None = None) -> set[int]:
        return {c.micro_batch for c in candidates(DIMS, world=1, domain=1, global_batch=256, seq_len=seq_len,
                                                  fixed=fixed or {})}

    assert MAX_MICRO_BATCH_TOKENS == 131072
    assert max(sizes(512)) == 256 and 64 in sizes(512)
    assert max(sizes(2048)) == 64 and 32 in sizes(2048)
    assert max(sizes(8192)) == 16
    assert sizes(262144) == {1}
    assert sizes(8192, {"micro_batch": 32}) == {32}


def test_the_search_offers_the_interleavings_experts_publish() -> None:
    """Interleaved virtual stages as Megatron runs publish them (GPT-3 175B: pp 8 x vp 12 in MLPerf v3.x, vp 6 in
    v4.1; Llama 3 70B: pp 4 x vp 5; Llama 3.1 405B: pp 8 x vp 8; Qwen3-235B: vp 3), each while pp x vp chunks fit
    the layers (+2: the embedding and loss slots of an uneven split)."""
    gpt3 = ir.ModelDims(family="gpt", layers=96, hidden=128, heads=4, kv_heads=4, ffn_hidden=512, vocab=512)
    found = {c.vp for c in candidates(gpt3, world=64, domain=8, global_batch=128, seq_len=16, fixed={"pp": 8})
             if c.schedule == ir.Schedule.INTERLEAVED_1F1B}
    assert {3, 5, 6, 8, 12} <= found and all(8 * vp <= 96 + 2 for vp in found)
    small = {c.vp for c in candidates(DIMS, world=8, domain=8, global_batch=16, seq_len=16, fixed={"pp": 2})
             if c.schedule == ir.Schedule.INTERLEAVED_1F1B}
    assert small and max(small) * 2 <= DIMS.layers + 2
