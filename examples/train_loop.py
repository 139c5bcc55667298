"""A plain training loop turned into a planned one by two lines (the README's example).

    meshplan plan --model llama-tiny --cluster cpu:1x2 --global-batch 8 --seq-len 16 --tp 2 -o tiny.json
    torchrun --nproc-per-node 2 examples/train_loop.py tiny.json --steps 5
"""
import argparse

import torch

import meshplan as mp
from meshplan.runtime.train import synthetic_batch

ap = argparse.ArgumentParser()
ap.add_argument("plan")
ap.add_argument("--steps", type=int, default=5)
args = ap.parse_args()
torch.set_num_threads(1)

torch.manual_seed(0)
plan = mp.load(args.plan)
model = mp.zoo.build_from_config(plan.model)
pm = plan.apply(model, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, eps=1e-4))  # added
for step in range(1, args.steps + 1):
    inputs, targets = synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, 0, step)
    loss = pm.step(inputs, targets)  # was: loss_fn(model(inputs), targets); backward; step; zero_grad
    if torch.distributed.get_rank() == 0:
        print(f"step {step} loss {loss:.6f}", flush=True)
