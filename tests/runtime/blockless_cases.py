"""What each rank runs in the blockless-model parity test: the caller's own ``nn.Sequential`` (no
repeated blocks, not token ids), built with the same seed on every rank and in the reference, sharded
by ``apply`` as a data-parallel plan says, trained 3 AdamW steps on a class-label batch."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshplan import ir
from meshplan.runtime import apply
from meshplan.runtime.planned import token_cross_entropy
from parity_support import SEED, STEPS, optimizer

GLOBAL_BATCH, IN_FEATURES, CLASSES = 16, 256, 10


def mlp() -> nn.Sequential:
    """The model of issue 11's example: Linear + GELU, no repeated blocks."""
    return nn.Sequential(nn.Linear(IN_FEATURES, 1024), nn.GELU(), nn.Linear(1024, 512), nn.GELU(),
                         nn.Linear(512, CLASSES))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same features and labels on every rank and in the reference."""
    gen = torch.Generator().manual_seed(SEED * 1000 + step)
    return (torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=gen),
            torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=gen))


def seeded_mlp() -> nn.Sequential:
    torch.manual_seed(SEED)
    return mlp()


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole batch at once, the loss ``apply``'s step takes by default."""
    net = seeded_mlp()
    opt = optimizer(net.parameters())
    losses = []
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        loss = token_cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def run_cases(rank: int, world_size: int, payload: dict[str, Any], outdir: Path) -> None:
    results = {}
    for case in payload["cases"]:
        plan = ir.Plan.from_json(case["plan"])
        pm = apply(plan, seeded_mlp(), optimizer=optimizer)
        losses = [pm.step(*batch(step)) for step in range(1, STEPS + 1)]
        params = pm.full_parameters()
        results[case["name"]] = {"losses": losses, "params": params if rank == 0 else None,
                                 "steps": pm.program.describe()}
    torch.save(results, outdir / f"rank{rank}.pt")
