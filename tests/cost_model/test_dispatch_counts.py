"""The cost model's op counts (cost_model.dispatch) describe the program: a tiny GPT trained one step
by meshplan's runtime on 2 gloo processes, every aten op it dispatches counted per phase, equals the
counts the model derives from the program's structure: DTensor ops exactly (per layer, for the
embedding and output head, and in the optimizer step), plain ops per layer and in the optimizer."""
from __future__ import annotations

import json
import socket

import pytest

from meshplan import ir
from meshplan.cost_model.dispatch import (edge_dispatches, layer_dispatches, optimizer_dispatches,
                                          param_tensors, partial_grad_allreduces)

pytestmark = pytest.mark.slow

CASES = {
    "tp": dict(mesh=ir.Mesh(tp=2), micro_batch_size=4, num_microbatches=1),
    "tp_sp": dict(mesh=ir.Mesh(tp=2), sequence_parallel=True, micro_batch_size=4, num_microbatches=1),
    "zero3": dict(mesh=ir.Mesh(dp=2), zero_stage=3, micro_batch_size=2, num_microbatches=1),
    "ddp": dict(mesh=ir.Mesh(dp=2), micro_batch_size=2, num_microbatches=1),
}
SETUP = {"tp": (2, False, 0, 1), "tp_sp": (2, True, 0, 1), "zero3": (1, False, 3, 2), "ddp": (1, False, 0, 2)}


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> dict[str, dict[str, int]]:
    import torch.multiprocessing as mp

    import dispatch_cases

    out = tmp_path_factory.mktemp("dispatch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(dispatch_cases.run, args=(2, port, CASES, str(out)), nprocs=2)
    except Exception as exc:
        errors = [p.read_text() for p in sorted(out.glob("rank*.err"))]
        raise AssertionError("a rank failed:\n" + ("\n".join(errors) or str(exc))) from None
    return json.loads((out / "counts.json").read_text())


def dims_of(layers: int) -> ir.ModelDims:
    from meshplan import zoo
    from dispatch_cases import tiny

    cfg = zoo.ModelConfig(**tiny(layers))
    return ir.ModelDims(family=cfg.family, layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                        kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab)


def _get(counts: dict[str, int], key: str) -> int:
    return counts.get(key, 0)


@pytest.mark.parametrize("case", ["tp", "tp_sp"])
def test_dtensor_ops_per_layer_and_edges_equal_the_run(counted, case) -> None:
    tp, sp, _, _ = SETUP[case]
    one, two = counted[f"{case}/1"], counted[f"{case}/2"]
    layer = layer_dispatches(dims_of(1), tp, sp)
    edges = edge_dispatches(dims_of(1), tp, sp, first=True, last=True)
    assert _get(two, "fwd/dtensor") - _get(one, "fwd/dtensor") == layer.dtensor_fwd
    assert _get(two, "bwd/dtensor") - _get(one, "bwd/dtensor") == layer.dtensor_bwd
    assert _get(one, "fwd/dtensor") + _get(one, "loss/dtensor") == layer.dtensor_fwd + edges.dtensor_fwd
    assert _get(one, "bwd/dtensor") == layer.dtensor_bwd + edges.dtensor_bwd


@pytest.mark.parametrize("case", ["tp", "tp_sp"])
def test_plain_ops_per_layer_equal_the_run(counted, case) -> None:
    tp, sp, _, _ = SETUP[case]
    one, two = counted[f"{case}/1"], counted[f"{case}/2"]
    layer = layer_dispatches(dims_of(1), tp, sp)
    assert _get(two, "fwd/plain") - _get(one, "fwd/plain") == layer.plain_fwd
    assert _get(two, "bwd/plain") - _get(one, "bwd/plain") == layer.plain_bwd


@pytest.mark.parametrize("case", ["tp", "tp_sp", "zero3", "ddp"])
def test_optimizer_ops_equal_the_run(counted, case) -> None:
    tp, sp, zero, dp = SETUP[case]
    for layers in (1, 2):
        plain, dtensor = param_tensors(dims_of(layers), layers=layers, first=True, last=True, tp=tp, sp=sp)
        plain_ops, dtensor_ops = optimizer_dispatches(plain, dtensor, zero_stage=zero, dp=dp)
        got = counted[f"{case}/{layers}"]
        assert (_get(got, "opt/plain"), _get(got, "opt/dtensor")) == (plain_ops, dtensor_ops), layers


@pytest.mark.parametrize("case", ["tp", "tp_sp", "zero3", "ddp"])
def test_optimizer_all_reduces_of_partial_gradients_equal_the_run(counted, case) -> None:
    tp, sp, _, _ = SETUP[case]
    for layers in (1, 2):
        expect = partial_grad_allreduces(dims_of(layers), layers=layers, last=True, tp=tp, sp=sp)
        assert counted[f"{case}/{layers}"]["opt/all-reduce"] == expect, layers
    assert partial_grad_allreduces(dims_of(2), layers=2, last=True, tp=2, sp=True) > 0


def test_tensor_parallel_layers_dispatch_mostly_dtensor_ops(counted) -> None:
    """The reason they cost more on a CPU: under TP most of a layer's ops go through DTensor."""
    layer = layer_dispatches(dims_of(1), 2, False)
    assert layer.dtensor_fwd + layer.dtensor_bwd > layer.plain_fwd + layer.plain_bwd
    assert layer_dispatches(dims_of(1), 1, False).dtensor_fwd == 0
