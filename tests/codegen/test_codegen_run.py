"""The real check of emitted scripts: run them with torchrun on 4 gloo processes and compare their
printed losses with one process training the same model on the same data. The runtime's own
trainer (``-m meshplan.runtime.train``) must print the same lines as the script."""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshplan import ir, zoo
from meshplan.codegen import emit_source
from meshplan.runtime.train import synthetic_batch

STEPS = 3
LINE = re.compile(r"^step (\d+) loss (\S+)$", re.M)


def _plan(model: str, **kw) -> ir.Plan:
    cfg = zoo.config(model).to_dict()
    dp = kw.pop("dp", 1)
    nmb, tp = kw.pop("nmb", 1), kw.pop("tp", 1)
    kw.setdefault("dtype", "float32")  # compared with fp32 one-process runs at 1e-5
    return ir.Plan(model=cfg, cluster=f"cpu:1x{dp * tp}", global_batch=8, seq_len=16, mesh=ir.Mesh(dp=dp, tp=tp),
                   micro_batch_size=8 // (dp * nmb), num_microbatches=nmb, **kw)


def _reference(model: str, seed: int = 0) -> list[float]:
    """One process, whole batch, the script's optimizer (AdamW lr 1e-3) and data stream."""
    torch.manual_seed(seed)
    net = zoo.build(model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for step in range(1, STEPS + 1):
        x, y = synthetic_batch(net.config.vocab, 8, 16, seed, step)
        loss = zoo.loss_fn(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _torchrun(args: list[str], cwd: Path, *, nproc: int = 4, env: dict[str, str] | None = None) -> str:
    """Run a script under torchrun on ``nproc`` CPU processes; its stdout (the test fails on a non-zero exit).
    The free port is picked before torchrun binds it, so another test's process can take it in between:
    then torchrun fails with EADDRINUSE before running anything, and the run is retried on a new port."""
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(port), *args, "--steps", str(STEPS)]
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        if "EADDRINUSE" not in done.stderr:
            break
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def _losses(stdout: str) -> list[float]:
    found = LINE.findall(stdout)
    assert [int(n) for n, _ in found] == list(range(1, STEPS + 1)), stdout
    assert "median step time" in stdout
    return [float(x) for _, x in found]


@pytest.mark.slow
def test_emitted_dp_script_matches_one_process(tmp_path) -> None:
    path = tmp_path / "train_dp.py"
    path.write_text(emit_source(_plan("gpt-tiny", dp=4, nmb=2)))
    losses = _losses(_torchrun([str(path)], tmp_path))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("gpt-tiny")), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_emitted_dp_x_tp_script_and_runtime_trainer_agree(tmp_path) -> None:
    plan = _plan("llama-tiny", dp=2, tp=2, zero_stage=3, sequence_parallel=True, nmb=2,
                 recompute=("full", "selective", "none", "full"))
    script = tmp_path / "train_2d.py"
    script.write_text(emit_source(plan))
    plan_file = plan.save(tmp_path / "plan.json")
    from_script = _torchrun([str(script)], tmp_path)
    losses = _losses(from_script)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("llama-tiny")), atol=1e-5, rtol=1e-5)
    from_runtime = _torchrun(["-m", "meshplan.runtime.train", str(plan_file)], tmp_path)
    assert LINE.findall(from_runtime) == LINE.findall(from_script)  # the very same printed lines


@pytest.mark.slow
def test_emitted_script_with_a_replicated_mlp_matches_one_process(tmp_path) -> None:
    """param_layouts keep every block's MLP replicated over tp (the intra-op program's "replicate"):
    the script leaves its linears plain and gathers the S(1) stream around it."""
    from meshplan.solver.layouts import param_layouts

    plan = _plan("llama-tiny", dp=2, tp=2, sequence_parallel=True, nmb=2)
    with torch.device("meta"):
        names = tuple(n for n, _ in zoo.build("llama-tiny").named_parameters())
    layouts = param_layouts(names, tp=2, zero=0, dp=2, tp_layouts={n: "R" for n in names if ".mlp.w" in n})
    source = emit_source(dataclasses.replace(plan, param_layouts=layouts))
    assert '"mlp": PrepareModuleInputOutput(' in source and '"mlp.w1"' not in source
    script = tmp_path / "train_tp_layouts.py"
    script.write_text(source)
    losses = _losses(_torchrun([str(script)], tmp_path))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_reference("llama-tiny")), atol=1e-5, rtol=1e-5)
