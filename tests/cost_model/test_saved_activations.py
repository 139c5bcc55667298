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


def test_torchtitans_selective_policy_keeps_what_eager_layer_bytes_prices() -> None:
    """torchtitan's op-level policy (``Software.selective_alternate_matmuls``), run by PyTorch's own selective
    checkpointing on a zoo Llama block (GQA) in bf16: the op outputs it caches for the backward, and the block
    input the checkpoint keeps, against ``eager_layer_bytes(..., alternate_matmuls=True)``. The policy is
    torchtitan's (parallelize_llama.py @0413364 ``_custom_policy``: save the outputs of aten.mm and the SDPA
    kernels, except every second mm), with the CPU's SDPA kernel added to its list."""
    from torch.utils._pytree import tree_leaves
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default}
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            count[mode] += 1
        keep = func in save and not (func == aten.mm.default and count[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    torch.manual_seed(0)
    model = zoo.build_from_config(dict(family="llama", layers=1, hidden=H, heads=8, kv_heads=2, vocab=1024,
                                       max_seq_len=SEQ, name="titan"))
    block, cfg = model.layers[0].to(torch.bfloat16), model.config
    x = torch.randn(BATCH, SEQ, H, dtype=torch.bfloat16, requires_grad=True)
    caching, cached = create_selective_checkpoint_contexts(policy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = checkpoint(block, x, use_reentrant=False, context_fn=lambda: (caching, cached))
    cached_outputs = [getattr(leaf, "val", leaf) for entries in caching.storage.values() for value in entries.values()
                      for leaf in tree_leaves(value)]  # each output as SAC keeps it (in a version-checking wrapper)
    kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in cached_outputs if isinstance(t, torch.Tensor)}
    assert count["forward"] == 7  # wq, wk, wv, wo, w1, w3, w2: wk, wo and w3 are left to recompute
    saved = sum(kept.values()) + x.untyped_storage().nbytes()
    dims = ir.ModelDims(family="llama", layers=1, hidden=H, heads=8, kv_heads=cfg.kv_heads, ffn_hidden=cfg.ffn_hidden,
                        vocab=1024)
    predicted = eager_layer_bytes(dims, seq_len=SEQ, micro_batch=BATCH, dtype="bfloat16", recompute="selective",
                                  alternate_matmuls=True)
    assert predicted == pytest.approx(saved, rel=0.001), (predicted, saved)
    out.float().sum().backward()  # the cached outputs and the recomputed ones give the gradient
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
