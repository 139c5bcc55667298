"""The README's two-line loop conversion, run with torchrun, trains like one process."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshplan import zoo
from meshplan.runtime.train import synthetic_batch

from parity_support import free_port, make_plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_example_loop_matches_one_process(tmp_path) -> None:
    plan = make_plan("llama-tiny", tp=2, sp=True)
    path = tmp_path / "tiny.json"
    plan.save(path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
           str(ROOT / "examples" / "train_loop.py"), str(path), "--steps", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"step \d+ loss ([\d.]+)", out.stdout)]
    torch.manual_seed(0)
    net = zoo.build("llama-tiny")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, eps=1e-4)
    expect = []
    for step in range(1, 4):
        x, y = synthetic_batch(net.config.vocab, plan.global_batch, plan.seq_len, 0, step)
        loss = zoo.loss_fn(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        expect.append(loss.item())
    assert losses == pytest.approx(expect, abs=1e-5)
