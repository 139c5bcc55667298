"""The activation bytes the cost model prices for meshplan's own program (``memory.eager_layer_bytes``)
against what autograd really saves for one zoo block: every tensor ``torch.autograd.graph.saved_tensors_hooks``
sees during the forward, by distinct storage, parameters excluded. Three precisions as the runtime runs
them (``codegen/precision.py``): fp32; bf16 under autocast with fp32 parameters (DDP, TP or PP alone);
bf16 under autocast with bf16 parameters (FSDP2's gathered copies)."""
from __future__ import annotations

import pytest
import torch

from meshplan import ir, zoo
from meshplan.cost_model.memory import eager_layer_bytes

H, BATCH, SEQ = 256, 4, 128
FAMILIES = {"gpt": {}, "llama-gqa": dict(family="llama", kv_heads=2), "llama": {},
            "moe": dict(experts=4, top_k=2, kv_heads=2)}
MODES = ("float32", "bf16 fp32 params", "bf16 bf16 params")


def _saved_bytes(block: torch.nn.Module, x: torch.Tensor, autocast: bool) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    owned = {t.untyped_storage().data_ptr() for t in [*block.parameters(), *block.buffers()]}
    return sum(n for ptr, n in storages.items() if ptr not in owned)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_eager_layer_bytes_are_what_autograd_saves(name: str, mode: str) -> None:
    torch.manual_seed(0)
    extra = dict(FAMILIES[name])
    family = extra.pop("family", name)
    model = zoo.build_from_config(dict(family=family, layers=1, hidden=H, heads=8, vocab=1024, max_seq_len=SEQ,
                                       name=name, **extra))
    block, cfg = model.layers[0], model.config
    bf16_params = mode == "bf16 bf16 params"
    if bf16_params:
        block = block.to(torch.bfloat16)
    x = torch.randn(BATCH, SEQ, H, requires_grad=True, dtype=torch.bfloat16 if bf16_params else torch.float32)
    saved = _saved_bytes(block, x, autocast=mode != "float32")
    dims = ir.ModelDims(family=family, layers=1, hidden=H, heads=8, kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden,
                        vocab=1024, experts=cfg.experts, top_k=cfg.top_k)
    predicted = eager_layer_bytes(dims, seq_len=SEQ, micro_batch=BATCH, dtype="float32" if mode == "float32" else "bfloat16",
                                  stream_fp32=mode == "bf16 fp32 params")
    # what is left out: the norms' per-token statistics, top-k indices (under 0.5%)
    assert saved * 0.995 <= predicted <= saved * 1.001, (predicted, saved)


def test_autocast_with_fp32_parameters_keeps_casts_of_inputs_and_weights() -> None:
    """The same Llama layer in bf16 holds more with fp32 parameters (DDP) than with FSDP2's bf16 copies:
    a bf16 cast per projection of the fp32 norm output, and a bf16 copy of every weight."""
    dims = ir.ModelDims(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
    kw = dict(seq_len=4096, micro_batch=1, dtype="bfloat16")
    ddp, fsdp = eager_layer_bytes(dims, stream_fp32=True, **kw), eager_layer_bytes(dims, **kw)
    weights = 2 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    casts = 4096 * 4096 * 2 * (2 + 1)  # q, k, v: 2 more casts; w1, w3: 1 more
    assert ddp - fsdp == pytest.approx(weights + casts)
    assert eager_layer_bytes(dims, recompute="full", **kw) == pytest.approx(4096 * 4096 * 2)
    assert eager_layer_bytes(dims, recompute="full", stream_fp32=True, **kw) == pytest.approx(4096 * 4096 * 4)
