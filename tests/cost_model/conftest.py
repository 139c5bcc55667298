"""Factories for the cost-model tests: graphs built by hand from zoo configs (dims and a parameter
total, no nodes) and plans with even pipeline stages."""
from __future__ import annotations

import pytest

from meshplan import ir, zoo
from meshplan.cost_model import Cluster


def graph_of(cfg: zoo.ModelConfig) -> ir.Graph:
    dims = ir.ModelDims(family=cfg.family, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                        kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab, experts=cfg.experts,
                        top_k=cfg.top_k)
    return ir.Graph(nodes=(), params=(ir.Param(name="all", shape=(zoo.param_count(cfg),)),), blocks=(), dims=dims)


def even_stages(layers: int, chunks: int) -> tuple[tuple[int, int], ...]:
    base, extra = divmod(layers, chunks)
    stages, start = [], 0
    for i in range(chunks):
        end = start + base + (1 if i < extra else 0)
        stages.append((start, end))
        start = end
    return tuple(stages)


def plan_of(cfg: zoo.ModelConfig, cluster: Cluster, *, global_batch: int, seq_len: int, tp: int = 1, pp: int = 1,
            dp: int = 1, cp: int = 1, ep: int = 1, micro_batch: int = 1, zero: int = 0, recompute: str = "none",
            schedule: str = "1f1b", vp: int = 1, sp: bool = False, dtype: str = "bfloat16") -> ir.Plan:
    return ir.Plan(model=cfg.to_dict(), cluster=cluster.spec, global_batch=global_batch, seq_len=seq_len,
                   mesh=ir.Mesh(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep), zero_stage=zero, sequence_parallel=sp,
                   micro_batch_size=micro_batch, num_microbatches=global_batch // (micro_batch * dp),
                   schedule=schedule, vp=vp, recompute=(recompute,) * cfg.layers,
                   stages=even_stages(cfg.layers, pp * vp) if pp > 1 else (), dtype=dtype)


def gpt(layers: int, hidden: int, heads: int, *, vocab: int = 51200, seq: int = 2048) -> zoo.ModelConfig:
    """A Megatron GPT (FFN = 4h) as in Narayanan et al. 2021 and Korthikanti et al. 2022."""
    return zoo.ModelConfig(family="gpt", layers=layers, hidden=hidden, heads=heads, vocab=vocab, max_seq_len=seq)


@pytest.fixture
def make_graph():
    return graph_of


@pytest.fixture
def make_plan():
    return plan_of


@pytest.fixture
def make_gpt():
    return gpt
