"""How long planning takes on this machine: the issue's four cases, then growth with layers and
GPU count. Prints tables; not a test (these machines are shared and noisy).

    python bench/solver_speed.py            # everything
    python bench/solver_speed.py --quick    # the four cases only
    python bench/solver_speed.py --all-parallelisms   # search pp/cp/ep too, as if the runtime had them
"""
from __future__ import annotations

import argparse
import time

import torch

from meshplan import solver, zoo
from meshplan.cost_model import parse_cluster
from meshplan.frontend import trace
from meshplan.solver.space import RUNTIME

ALL = frozenset({"tp", "sp", "zero1", "zero2", "zero3", "pp", "cp", "ep"})
CASES = (  # model, cluster, global batch, sequence, target seconds (issue "solver")
    ("llama3-8b", "h100-sxm:8x8", 16, 8192, 5),
    ("llama3-405b", "h100-sxm:2048x8", 2048, 8192, 60),
    ("gpt3-175b", "a100-80gb:128x8", 1536, 2048, 20),
    ("mixtral-8x7b", "h100-sxm:8x8", 256, 4096, 20),
)


def plan_once(name: str, spec: str, batch: int, seq: int, runtime: frozenset, **overrides) -> tuple[float, float, object]:
    start = time.perf_counter()
    with torch.device("meta"):
        model = zoo.build(name, **overrides)
    graph = trace(model, batch=1, seq_len=64)
    traced = time.perf_counter()
    req = solver.Request(graph=graph, cluster=parse_cluster(spec), model=model.config.to_dict(), global_batch=batch,
                         seq_len=seq, runtime=runtime, top=1)
    plan = solver.solve(req)[0]
    return traced - start, time.perf_counter() - traced, plan


def cases(runtime: frozenset) -> None:
    print(f"{'model':<14}{'cluster':<18}{'trace s':>8}{'solve s':>8}{'total s':>8}{'target':>7}  "
          f"{'candidates':>10}  plan")
    for name, spec, batch, seq, target in CASES:
        t_trace, t_solve, plan = plan_once(name, spec, batch, seq, runtime)
        total = t_trace + t_solve
        print(f"{name:<14}{spec:<18}{t_trace:>8.2f}{t_solve:>8.2f}{total:>8.2f}{target:>6}s  "
              f"{plan.solver.candidates:>10}  {plan.summary()} [{plan.solver.status}]")


def growth(runtime: frozenset) -> None:
    print("\ngrowth with layers (llama3-70b dims, h100-sxm:64x8, batch 1024, seq 4096)")
    print(f"{'layers':>7}{'trace s':>9}{'solve s':>9}{'candidates':>12}")
    for layers in (20, 40, 80, 160):
        t_trace, t_solve, plan = plan_once("llama3-70b", "h100-sxm:64x8", 1024, 4096, runtime, layers=layers)
        print(f"{layers:>7}{t_trace:>9.2f}{t_solve:>9.2f}{plan.solver.candidates:>12}")
    print("\ngrowth with GPUs (llama3-70b, batch 2048, seq 4096)")
    print(f"{'GPUs':>7}{'trace s':>9}{'solve s':>9}{'candidates':>12}")
    for nodes in (8, 64, 512, 2048):
        t_trace, t_solve, plan = plan_once("llama3-70b", f"h100-sxm:{nodes}x8", 2048, 4096, runtime)
        print(f"{nodes * 8:>7}{t_trace:>9.2f}{t_solve:>9.2f}{plan.solver.candidates:>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--all-parallelisms", action="store_true")
    args = ap.parse_args()
    runtime = ALL if args.all_parallelisms else RUNTIME
    print(f"search space: {sorted(runtime)}")
    cases(runtime)
    if not args.quick:
        growth(runtime)


if __name__ == "__main__":
    main()
