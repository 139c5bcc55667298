"""The cost model against this machine: predicted and measured step times of a small GPT under many
plans on 4 gloo processes.

    python bench/cpu_accuracy.py [--nproc 4] [--profile profile.json] [--steps 4]

1. In rounds, each in process groups of its own: calibrate (``runtime.calibrate``), then run every
   plan alone (``runtime.apply``, two warm-up steps, a few timed ``PlannedModule.step``, freed before
   the next plan), each followed by a sample of the
   machine's contention (``runtime.calibrate.contention``; the profile keeps the median of all samples,
   so that it describes the machine over the same minutes as the plans' steps). A step's time is its slowest
   rank's, after a barrier; a plan's time is the median of its steps over the rounds, and the
   profile is the median of the rounds' profiles, so that work elsewhere on the machine (this one is
   shared) weighs on the profile and on the plans alike. ``--profile`` skips the calibration and
   uses one measured earlier; a profile of another kind of machine is refused.
2. Predict every plan with ``cost_model.estimate`` on the profile's cluster (the meshplan runtime's
   software: SDPA attention, DDP/FSDP overlap, ZeRO-1 as DDP + ZeroRedundancyOptimizer, TP through
   DTensor's per-Linear styles with the vocab-parallel loss). Besides FLOPs and bytes the CPU
   model charges what the profile measured per unit of the program's structure: each eager op
   dispatched, plain or on DTensors (``cost_model/dispatch.py``), GELU, log-softmax and Adam's square
   root per element, fresh pages of tensors of 32 MiB or more, the wait of each collective call,
   FSDP2's cost per unit and pass, and a DTensor parallel style's per module (``runtime/calibrate.py``
   times each against a twin that makes the same collective calls by hand).
3. Print predicted against measured per plan, the mean absolute percentage error (target < 15%) and
   Kendall's tau between the two rankings (target >= 0.8); and the same in CPU time: the prediction
   over the profile's contention (``cost_model/profile.py``: a CPU profile's compute and collectives are
   CPU times scaled by it) against the CPU time of the busiest rank's process in the step. Load from
   other work on the machine stretches wall times between the calibration and the plans' steps; it
   stretches CPU times much less, so the second comparison shows the model's error without that noise.
   The ``main`` column is the busiest rank's main thread alone (the rest of its process CPU is gloo's
   threads copying and reducing).

Plans the runtime refuses (``codegen.lower.check_supported``) are listed as skipped. A benchmark,
not a test: it prints and asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from itertools import combinations
from pathlib import Path

from cpu_plans import GLOBAL_BATCH, MODEL, PLANS, SEQ_LEN, build_plans, run_workers

# untimed steps of each plan after it is built: the first timed step after a single one still ran 10-15%
# slower in CPU time than the steps after it (DDP: 215 ms, then 186-188), and a training run's steps
# are the steady state's
WARMUP_STEPS = 2
SAVED_PROFILE = os.path.join(tempfile.gettempdir(), "meshplan-cpu-accuracy-profile.json")


def _worker(rank: int, world: int, port: int, plans_json: str, steps: int, first_step: int, sample_contention: bool,
            output: str, errors: str) -> None:
    """One round over the plans, in a process group of its own: each plan built afresh, warmed up,
    timed for ``steps`` steps and freed before the next, as a user runs one plan; with
    ``sample_contention`` the machine's contention is sampled after every plan."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from meshplan import ir, zoo
    from meshplan.codegen.lower import lower
    from meshplan.runtime import apply, calibrate, init_distributed
    from meshplan.runtime.train import synthetic_batch

    def timed_step(pm, plan, step: int) -> tuple[float, float, float]:
        """(wall, CPU, main thread's CPU) seconds of a step: its slowest rank's, the most CPU time one
        rank's process (all its threads: gloo's too) spent in it, and the most its main thread did."""
        inputs, targets = synthetic_batch(plan.model["vocab"], plan.global_batch, plan.seq_len, 0, step)
        dist.barrier()
        start, start_cpu, start_main = time.perf_counter(), time.process_time(), time.thread_time()
        pm.step(inputs, targets)
        elapsed = torch.tensor([time.perf_counter() - start, time.process_time() - start_cpu,
                                time.thread_time() - start_main])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        return float(elapsed[0]), float(elapsed[1]), float(elapsed[2])

    try:
        init_distributed()
        results, contention = {}, []
        for label, data in json.loads(plans_json):
            plan = ir.Plan.from_dict(data)
            try:
                lower(plan)  # the same answer on every rank, before any collective
            except ir.PlanError as exc:
                results[label] = {"skipped": str(exc)}
                continue
            torch.manual_seed(0)
            pm = apply(plan, zoo.build_from_config(plan.model))
            for _ in range(WARMUP_STEPS):  # lazy initialization, first allocations, the allocator's thresholds
                timed_step(pm, plan, 0)
            times = [timed_step(pm, plan, first_step + i) for i in range(steps)]
            results[label] = {"all": [t[0] for t in times], "all_cpu": [t[1] for t in times],
                              "all_main": [t[2] for t in times]}
            del pm
            gc.collect()
            if sample_contention:  # the machine's contention sampled beside every plan, not only at calibration
                contention.append(calibrate.contention(torch.device("cpu"), torch.float32))
        if rank == 0:
            Path(output).write_text(json.dumps({"plans": results, "contention": contention}))
        dist.destroy_process_group()
    except Exception:
        Path(errors, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise


def measure(plans: list[tuple[str, object]], nproc: int, steps: int, rounds: int, calibrate: bool) -> dict:
    """{"plans": label -> {"seconds", "cpu_seconds", "main_seconds", "all", "all_cpu", "all_main"} or
    {"skipped"}, "profile": this machine's (the median over the rounds' calibrations), or None without
    ``calibrate``}.

    In rounds, each in process groups of its own: a calibration (``runtime.calibrate``), then every
    plan. The calibration and the plans do not share processes: run in the same ones, what the
    calibration left behind made the plans' steps up to 10% slower in CPU time (DDP 205 ms against
    187 ms, one machine, one session), which a user's training run does not have."""
    from meshplan.runtime import calibrate as calibration

    profiles, samples, results = [], [], {}
    for round_ in range(rounds):
        if calibrate:
            with tempfile.TemporaryDirectory() as tmp:
                profiles.append(calibration.calibrate(nproc, Path(tmp, "profile.json")))
        got = run_workers(_worker, nproc, plans, steps, 1 + round_ * steps, calibrate)
        samples += got["contention"]
        for label, row in got["plans"].items():
            if "skipped" in row:
                results[label] = row
                continue
            into = results.setdefault(label, {"all": [], "all_cpu": [], "all_main": []})
            for key in into:
                into[key] += row[key]
    for row in results.values():
        if "all" in row:
            row["seconds"], row["cpu_seconds"], row["main_seconds"] = (
                statistics.median(row[k]) for k in ("all", "all_cpu", "all_main"))
    profile = None
    if calibrate:
        profile = calibration.median_profile(profiles)
        if samples:
            profile["contention"] = {k: statistics.median(c[k] for c in samples) for k in ("wall_s", "cpu_s")}
            profile["contention_samples"] = len(samples)
    return {"plans": results, "profile": profile}


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b of two rankings (ties count for neither side)."""
    concordant = discordant = ties_x = ties_y = 0
    for (x1, y1), (x2, y2) in combinations(zip(xs, ys), 2):
        dx, dy = x1 - x2, y1 - y2
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif dx * dy > 0:
            concordant += 1
        else:
            discordant += 1
    denom = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return (concordant - discordant) / denom if denom else 0.0


def measured_costs(cluster) -> str:
    """The calibrated costs beyond FLOPs and bytes that the CPU model charges, on one line."""
    accel = cluster.accelerator
    rates = ", ".join(f"{op} {s * 1e9:.2f}" for op, s in accel.transcendental_s_per_elem)
    return (f"per dispatched op: plain {accel.dispatch_s * 1e6:.1f} us, DTensor {accel.dtensor_dispatch_s * 1e6:.1f} us; "
            f"wait per TP collective {accel.sync_overhead_s * 1e3:.2f} ms; per FSDP unit and pass "
            f"{accel.fsdp_unit_s * 1e3:.2f} ms; per TP style {accel.tp_style_fwd_s * 1e3:.2f} ms forward, "
            f"{accel.tp_style_bwd_s * 1e3:.2f} ms backward; fresh pages "
            f"{accel.first_touch_s_per_byte * 2**20 * 1e6:.0f} us/MiB; ns per element: {rates or 'not measured'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--profile", help="a profile measured on this machine (default: calibrate now)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per plan and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of a calibration and all plans (each plan built afresh, after two warm-up steps)")
    args = ap.parse_args(argv)
    if args.nproc != 4:
        raise SystemExit("the plans here are for 4 processes; run with --nproc 4")
    if args.profile:
        print(f"using {args.profile} (measured earlier: if the machine's load has changed since, expect errors)")

    from meshplan import zoo
    from meshplan.cost_model import cluster_from_profile, estimate
    from meshplan.cost_model.profile import contention_factor
    from meshplan.frontend import trace
    from meshplan.runtime.calibrate import machine_kind

    start = time.perf_counter()
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores" + ("  (other work is running: times will be noisy)"
                                                                  if load > 1.0 else ""))
    import torch

    with torch.device("meta"):
        graph = trace(zoo.build_from_config(MODEL), batch=1, seq_len=64)
    spec = args.profile or "profile-measured-in-this-run.json"
    plans = build_plans(spec)
    done = measure(plans, args.nproc, args.steps, args.rounds, calibrate=args.profile is None)
    measured = done["plans"]
    profile = json.loads(Path(args.profile).read_text()) if args.profile else done["profile"]
    if args.profile is None:
        Path(SAVED_PROFILE).write_text(json.dumps(profile, indent=1) + "\n")
        print(f"calibrated in {profile['rounds']} rounds between the plans' rounds; saved to {SAVED_PROFILE}")
    cluster = cluster_from_profile({**profile, "spec": spec}, expect_kind=machine_kind())
    print(measured_costs(cluster))
    rows, skipped = [], []
    factor = contention_factor(profile)
    print(f"\n{'plan':<24} {'predicted':>10} {'measured':>10} {'error':>8}   {'CPU: pred':>9} {'meas':>6} {'error':>7} {'main':>6}"
          f"   predicted compute / exposed comm / bubble; model {MODEL['name']}: {MODEL['layers']} layers, "
          f"h {MODEL['hidden']}, batch {GLOBAL_BATCH} x {SEQ_LEN}")
    for label, plan in plans:
        got = measured[label]
        if "skipped" in got:
            skipped.append(f"{label}: {got['skipped']}")
            continue
        prediction = estimate(graph, cluster, plan)
        pred = prediction.step_time_s
        err = pred / got["seconds"] - 1
        cpu = got.get("cpu_seconds", float("nan"))
        rows.append((label, pred, got["seconds"], err, pred / factor, cpu, pred / factor / cpu - 1))
        parts = " / ".join(f"{prediction.time_s[k] * 1e3:.0f}" for k in ("compute", "exposed_comm", "bubble"))
        print(f"{label:<24} {pred * 1e3:8.1f} ms {got['seconds'] * 1e3:8.1f} ms {err:+8.1%}   {pred / factor * 1e3:9.1f} "
              f"{cpu * 1e3:6.1f} {rows[-1][6]:+7.1%} {got.get('main_seconds', float('nan')) * 1e3:6.1f}   {parts} ms")
    mape = sum(abs(r[3]) for r in rows) / len(rows)
    tau = kendall_tau([r[1] for r in rows], [r[2] for r in rows])
    print(f"\n{len(rows)} plans: MAPE {mape:.1%} (target < 15%), Kendall's tau {tau:.2f} (target >= 0.8)")
    # the same in CPU time, which load elsewhere on the machine does not stretch: the prediction over the
    # profile's contention against the CPU time of the busiest rank's process (pipelines: their ranks idle
    # in the bubble, so there a step's wall time is less than the contention times its CPU time)
    flat = [r for r in rows if r[0] in {p[0] for p in PLANS if p[2] == 1}]
    cpu_mape = sum(abs(r[6]) for r in flat) / max(len(flat), 1)
    print(f"CPU time, {len(flat)} plans without a pipeline: MAPE {cpu_mape:.1%}, Kendall's tau "
          f"{kendall_tau([r[4] for r in flat], [r[5] for r in flat]):.2f} (contention {factor:.2f}: predicted "
          f"seconds / contention against the busiest rank's process CPU seconds)")
    for line in skipped:
        print(f"skipped {line}")
    print(f"total {time.perf_counter() - start:.0f} s; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
