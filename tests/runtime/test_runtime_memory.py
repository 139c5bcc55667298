"""runtime.memory: the measurement that checks the cost model's memory prediction (bench/cpu_memory.py)."""
from __future__ import annotations

import torch

from meshplan import zoo
from meshplan.runtime.memory import resident_bytes, step_allocated_peak


def test_in_step_peak_is_the_most_held_at_once() -> None:
    def work() -> None:
        a = torch.empty(2**18)  # 1 MiB of float32
        b = torch.empty(2**19)  # 2 MiB: 3 MiB held
        del a
        c = torch.empty(2**17)  # 0.5 MiB: 2.5 MiB held
        del b, c

    peak = step_allocated_peak(work)
    assert 3 * 2**20 <= peak < 3 * 2**20 + 64 * 2**10


def test_resident_bytes_are_parameters_and_adam_state_counted_once() -> None:
    model = zoo.build("gpt-tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    assert resident_bytes(model, opt) == 4 * n  # float32 weights, no state before the first step
    model(torch.randint(0, 64, (2, 8))).float().mean().backward()
    opt.step()
    # + the gradients, + exp_avg and exp_avg_sq (4 bytes each per element), + one step counter per tensor
    step_bytes = sum(opt.state[p]["step"].untyped_storage().nbytes() for p in params)
    assert resident_bytes(model, opt) == 4 * n + 4 * n + 8 * n + step_bytes
    opt.zero_grad()
    assert resident_bytes(model, opt) == 4 * n + 8 * n + step_bytes
