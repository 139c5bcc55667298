"""Context parallelism on gloo: gpt-tiny and llama-tiny (and moe-tiny once) train 3 AdamW steps with every
sequence split over cp ranks (alone, beside dp, beside tp with sp) and must match one process (losses and final
parameters, fp32, 1e-5). One zoo attention module is checked alone first, in the same launch."""
from __future__ import annotations

import pytest

from meshplan import zoo
from parity_support import GLOBAL_BATCH, SEQ_LEN, assert_matches_reference, launch

FULL, SEL = ("full",) * 4, ("selective",) * 4

CASES_4 = [
    # FSDP over the flattened dp x cp ranks
    dict(name="gpt dp2 x cp2 zero3", model="gpt-tiny", plan=dict(dp=2, cp=2, zero=3)),
    # DDP over dp x cp, micro-batches accumulated locally, full recompute (the gather runs again)
    dict(name="llama dp2 x cp2 zero0 full", model="llama-tiny", plan=dict(dp=2, cp=2, nmb=2, recompute=FULL)),
    # tp splits the heads of each cp rank's tokens, sp splits those tokens further; HSDP-as-DDP over dp x cp
    dict(name="llama cp2 x tp2 sp zero0", model="llama-tiny", plan=dict(cp=2, tp=2, sp=True)),
    dict(name="gpt cp2 x tp2 sp zero3 selective", model="gpt-tiny",
         plan=dict(cp=2, tp=2, sp=True, zero=3, recompute=SEL)),
    dict(name="gpt cp4 zero0", model="gpt-tiny", plan=dict(cp=4)),
    dict(name="llama cp4 zero3", model="llama-tiny", plan=dict(cp=4, zero=3)),
    # a hand-written loop: pm.local_batch, pm.module, pm.optimizer, the loss averaged over pm.loss_group
    dict(name="llama dp2 x cp2 zero2 hand", model="llama-tiny", plan=dict(dp=2, cp=2, zero=2), mode="hand"),
    # ep beside cp: an ep group is the dp ranks of one cp rank; an expert shard is data-parallel over edp x cp
    dict(name="moe dp2 x cp2 ep2 zero2", model="moe-tiny", plan=dict(dp=2, cp=2, ep=2, zero=2)),
    dict(name="moe dp2 x cp2 ep2 zero0 full", model="moe-tiny", plan=dict(dp=2, cp=2, ep=2, nmb=2, recompute=FULL)),
]
CASES_2 = [
    dict(name="gpt cp2 zero0", model="gpt-tiny", plan=dict(cp=2, nmb=2)),
    dict(name="llama cp2 zero3 selective", model="llama-tiny", plan=dict(cp=2, zero=3, recompute=SEL)),
    dict(name="llama cp2 zero1", model="llama-tiny", plan=dict(cp=2, zero=1)),
    # MoE routes each token alone: only its attention needs the other chunks
    dict(name="moe cp2 zero3", model="moe-tiny", plan=dict(cp=2, zero=3)),
]


def _launch(tmp_path_factory, world_size: int, payload: dict) -> list[dict]:
    return launch(tmp_path_factory, world_size, "context_cases:run_cases", payload)


@pytest.fixture(scope="module")
def ranks4(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory, 4, {"cases": CASES_4, "alone": True})


@pytest.fixture(scope="module")
def ranks2(tmp_path_factory) -> list[dict]:
    return _launch(tmp_path_factory, 2, {"cases": CASES_2, "alone": True})


def _check(ranks: list[dict], case: dict) -> None:
    assert_matches_reference(ranks, case["name"], case.get("model", "moe-tiny"))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_4, ids=[c["name"] for c in CASES_4])
def test_four_processes_match_one(ranks4, case) -> None:
    _check(ranks4, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_2, ids=[c["name"] for c in CASES_2])
def test_two_processes_match_one(ranks2, case) -> None:
    _check(ranks2, case)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_one_attention_module_matches_the_whole_sequence(ranks2, ranks4, world) -> None:
    """Output on each rank's tokens and weight gradients summed over cp, with and without load balance."""
    for rank, result in enumerate(ranks2 if world == 2 else ranks4):
        alone = result["alone"]
        for key, errors in alone.items():
            if key != "positions":
                assert max(errors.values()) < 1e-5, f"cp{world} rank {rank} {key}: {errors}"


@pytest.mark.slow
def test_ranks_hold_chunks_that_cover_each_sequence(ranks4) -> None:
    held = [r["alone"]["positions"] for r in ranks4]
    assert held[0][True] == [0, 1, 14, 15] and held[3][True] == [6, 7, 8, 9]  # chunks r and 2cp - 1 - r
    assert held[1][False] == [4, 5, 6, 7]
    for balance in (True, False):
        assert sorted(p for h in held for p in h[balance]) == list(range(SEQ_LEN))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_4, ids=[c["name"] for c in CASES_4])
def test_each_rank_holds_its_tokens_and_its_share(ranks4, case) -> None:
    """Parity would also hold if every rank ran whole sequences; check what each rank takes and holds."""
    p = case["plan"]
    dp, cp, tp, zero = p.get("dp", 1), p["cp"], p.get("tp", 1), p.get("zero", 0)
    layers = zoo.config(case["model"]).layers
    results = [r[case["name"]] for r in ranks4]
    assert all(r["local_shape"] == [GLOBAL_BATCH // dp, SEQ_LEN // cp] for r in results)
    assert sorted({r["cp_rank"] for r in results}) == list(range(cp))
    assert all(r["swapped"] == layers + (case["model"] == "gpt-tiny") for r in results)  # attention, gpt's positions
    params = results[0]["params"]
    total = sum(t.numel() for t in params.values())
    experts = sum(t.numel() for name, t in params.items() if ".experts." in name)
    # 1/tp, and 1/(dp cp) under ZeRO-2/3; an expert stack 1/ep, and 1/(edp cp) under ZeRO-2/3
    ep = p.get("ep", 1)
    dense_share = 1 / ((dp * cp if zero >= 2 else 1) * tp)
    expert_share = 1 / (ep * (dp // ep * cp if zero >= 2 else 1) * tp)
    share = (dense_share * (total - experts) + expert_share * experts) / total
    assert 0.95 * share <= results[0]["local_numel"] / total <= 1.15 * share
