"""The ``meshplan`` command: plan, emit, run, zoo."""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from . import ir

GB = 1e9
MAX_PG_TIMEOUT_S = 7 * 86400.0  # a week: beyond it a stopped rank is never noticed (and timedelta overflows)


def _model_args(p: argparse.ArgumentParser) -> None:
    from .cli_model import add_model_args

    add_model_args(p)
    p.add_argument("--cluster", required=True,
                   help="NAME:NODESxGPUS, e.g. h100-sxm:16x8 (or a preset name), a cluster file CLUSTER.json (the "
                        "presets' format) or a profile from `meshplan calibrate`")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--dtype", choices=("bfloat16", "float32", "float8", "float4"),
                   help="default: bfloat16 on GPUs, float32 on cpu; float8 (FP8) and float4 (NVFP4, Blackwell) need "
                        "--software of a Transformer Engine program")


def _pin_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pin a choice (the solver searches the rest)")
    for name in ("tp", "dp", "pp", "cp", "ep", "vp", "zero", "micro-batch", "num-microbatches"):
        g.add_argument(f"--{name}", type=int)
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallelism")
    g.add_argument("--fold-ep", action=argparse.BooleanOptionalAction, default=None,
                   help="the ep group over tp ranks too, each expert whole "
                        "(Megatron's --expert-tensor-parallel-size 1)")
    g.add_argument("--recompute", choices=("none", "selective", "full", "offload"))
    g.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"))
    g.add_argument("--zero-group", type=int, metavar="G",
                   help="shard ZeRO-2/3 state over HSDP groups of G data-parallel ranks; 0: over all of them")


def _fixed(args: argparse.Namespace) -> dict:
    """The pins given: every key the search can pin has its flag, named as the key (``_pin_args``)."""
    from .solver import FIXED_KEYS

    return {k: getattr(args, k) for k in FIXED_KEYS if getattr(args, k) is not None}


def cmd_plan(args: argparse.Namespace) -> int:
    from .api import plans
    from .cli_model import model_arg, model_kwargs

    from .cli_progress import status

    start = time.perf_counter()
    with status("planning", quiet=args.quiet or args.json) as progress:  # a TTY only (cli_progress.py)
        found = plans(model_arg(args), args.cluster, global_batch=args.global_batch, seq_len=args.seq_len,
                      fixed=_fixed(args), dtype=args.dtype, time_limit_s=args.time_limit, top=max(args.top, 1),
                      progress=progress, model_kwargs=model_kwargs(args), software=args.software)
    best = found[0]
    if args.output:
        best.save(args.output)
    if args.json:
        print(best.to_json())
    else:
        print(best.report())
        if args.top > 1:
            print("\n" + best.explain())
        print(f"\nplanned in {time.perf_counter() - start:.1f} s" + (f"; saved to {args.output}" if args.output else ""))
    return 0


def cmd_emit(args: argparse.Namespace) -> int:
    from .api import load

    plan = load(args.plan)
    path = plan.emit(args.output, fuse=args.fuse)
    print(f"wrote {path}: run it with  torchrun --nproc-per-node {plan.world_size} {path} --steps 5")
    from .codegen.safe import kernels_module_name

    kernels = path.with_name(f"{kernels_module_name(path.stem)}.py")
    if kernels.exists() and (args.fuse or args.fuse is None and plan.fusions):
        print(f"wrote {kernels}: its fused Triton kernels (without a GPU, run with TRITON_INTERPRET=1)")
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd_run(args: argparse.Namespace) -> int:
    from .api import check_zoo_layouts, load

    plan = load(args.plan)
    check_zoo_layouts(plan)  # as emit does, before torchrun: a zoo name or layout the zoo lacks fails every worker
    if plan.source.get("kind") == "module":  # before torchrun: every worker would fail to build it
        raise ir.InvalidPlanError(f"{args.plan}: the plan's model source is 'module' (a model only its caller held), "
                                  "so meshplan run cannot build it; plan from a zoo name, hf:PATH or "
                                  "pkg.module:function, or use plan.apply(model) in your own loop")
    if plan.world_size != args.nproc:
        raise ir.InvalidPlanError(f"the plan's mesh needs {plan.world_size} processes "
                                  f"({plan.mesh}) but --nproc is {args.nproc}")
    if args.pg_timeout is not None and not 0 < args.pg_timeout <= MAX_PG_TIMEOUT_S:  # NaN and inf too
        raise ir.PlanError(f"--pg-timeout is {args.pg_timeout} but must be a positive number of seconds up to "
                           f"{MAX_PG_TIMEOUT_S:g} (how long a collective waits for a stopped rank); omit it for 20 "
                           "predicted steps")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}",
           *_rendezvous_flags(args.max_restarts), "-m", "meshplan.cli", "_train", str(args.plan),
           "--steps", str(args.steps), "--seed", str(args.seed)]
    temporary = args.checkpoint_every and not args.checkpoint_dir
    checkpoint_dir = tempfile.mkdtemp(prefix="meshplan-ckpt-") if temporary else args.checkpoint_dir
    cmd += _resume_flags(checkpoint_dir, args.checkpoint_every, args.save_final)
    cmd += ["--pg-timeout", str(args.pg_timeout)] if args.pg_timeout is not None else []
    cmd += _option_flags(args, plan)  # checked here, before torchrun starts
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if args.max_restarts:
        # restarted workers must not find the previous attempt's addresses in a store shared with the
        # agent, or they connect to dead peers (pytorch/pytorch#135712): each attempt gets its own store
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        from .cli_progress import call_with_steps

        code = call_with_steps(cmd, env, steps=args.steps, quiet=args.quiet)
    except BaseException:
        if temporary:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        raise
    if code == 0:
        if temporary:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        return 0
    return _run_failed(args, code, checkpoint_dir, temporary)


def _run_failed(args: argparse.Namespace, code: int, checkpoint_dir: str | None, temporary: bool) -> int:
    """One line on stderr for a failed ``meshplan run``: how torchrun ended and, if a checkpoint was
    saved (it is kept, even in a temporary directory), the command that resumes from it."""
    import shlex
    import signal

    from .runtime.resume import latest_checkpoint

    how = (f"torchrun was killed by {signal.Signals(-code).name}; its workers exit with it" if code < 0
           else f"torchrun exited with status {code}; the workers' errors are above")
    latest = latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    if latest is None:
        if temporary:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        hint = "" if args.checkpoint_every else "; add --checkpoint-every C to be able to resume a run"
        print(f"meshplan: error: the run failed ({how}) before any checkpoint was saved{hint}", file=sys.stderr)
    else:
        again = ["meshplan", "run", str(args.plan), "--nproc", str(args.nproc), "--steps", str(args.steps),
                 "--seed", str(args.seed), *_resume_flags(checkpoint_dir, args.checkpoint_every, args.save_final)]
        again += ["--max-restarts", str(args.max_restarts)] if args.max_restarts else []
        again += ["--pg-timeout", str(args.pg_timeout)] if args.pg_timeout is not None else []
        again += _option_flags(args)
        print(f"meshplan: error: the run failed ({how}); its checkpoints are kept in {checkpoint_dir} "
              f"(newest: {latest.name}); resume with: {shlex.join(again)}", file=sys.stderr)
    return 128 - code if code < 0 else code


def _rendezvous_flags(max_restarts: int) -> list[str]:
    """Elastic (c10d) rendezvous when workers may be restarted: torchrun then stops and restarts
    every worker when one dies, up to ``max_restarts`` times."""
    if not max_restarts:
        return [f"--master-port={_free_port()}"]
    return [f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}"]


def _resume_flags(checkpoint_dir: str | None, every: int, save_final: str | None) -> list[str]:
    flags = ["--checkpoint-dir", checkpoint_dir] if checkpoint_dir else []
    flags += ["--checkpoint-every", str(every)] if every else []
    return flags + (["--save-final", save_final] if save_final else [])


def _option_flags(args: argparse.Namespace, plan: "ir.Plan | None" = None) -> list[str]:
    """``runtime.train.Options``' flags for the workers; with ``plan``, checked first (a missing --data
    file, a bad --clip-grad, no safetensors under --init-from: one line, before any process starts)."""
    from .runtime.train import options_of

    if plan is not None:
        options_of(args).check(plan, scan_data=True, model=_meta_model(plan) if args.init_from else None)
    flags = ["--data", args.data] if args.data else []
    flags += ["--data-dtype", args.data_dtype] if args.data_dtype else []
    flags += ["--init-from", args.init_from] if args.init_from else []
    flags += ["--clip-grad", repr(args.clip_grad)] if args.clip_grad is not None else []
    return flags + (["--compile"] if args.compile else [])


def _meta_model(plan: "ir.Plan"):
    """The plan's model built on meta (no memory): its names and shapes, to check --init-from against."""
    import torch

    from . import zoo
    from .runtime.source import build as build_model

    with torch.device("meta"):
        return build_model(plan.source) if plan.source else zoo.build_from_config(plan.model)


def cmd_train(args: argparse.Namespace) -> int:
    """One process of ``meshplan run`` (under torchrun)."""
    from .runtime.materialize import build_on_meta
    from .runtime.memory import return_freed_memory
    from .runtime.train import options_of, run_training

    # first, before the meta build: its constructors allocate each full parameter and free it at once, and
    # with glibc's default that grows the heap by up to the model's size; every later small tensor is then
    # carved from that heap and its pages stay resident (2.5 GB instead of 1.9 GB per rank in the memory demo)
    return_freed_memory()
    plan = ir.Plan.load(args.plan)  # not api.load: a worker has no use for the solver (ortools, 0.1 GB resident)
    # parameters on meta: each rank allocates only its shards, with the weights of a seeded whole build
    model = build_on_meta(plan.source or {"kind": "zoo", "config": plan.model}, args.seed)
    if args.checkpoint_dir or args.checkpoint_every or args.save_final:
        from .runtime.resume import run_resumable

        run_resumable(plan, model, steps=args.steps, seed=args.seed, checkpoint_dir=args.checkpoint_dir,
                      checkpoint_every=args.checkpoint_every, save_final=args.save_final,
                      pg_timeout_s=args.pg_timeout, options=options_of(args))
    else:
        run_training(plan, model, steps=args.steps, seed=args.seed, pg_timeout_s=args.pg_timeout,
                     options=options_of(args))
    # a torchrun worker: leave without the interpreter's teardown, where a gloo group's threads can
    # still abort the process after all the work is done ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _checkpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="C",
                   help="save a sharded checkpoint every C steps; a restarted job resumes from the newest")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="where checkpoints go (default with --checkpoint-every: a temporary directory)")
    p.add_argument("--save-final", metavar="PATH", help="torch.save the full final parameters here (rank 0)")
    p.add_argument("--pg-timeout", type=float, metavar="SECONDS", help="how long a collective waits for a stopped "
                   "rank before the step fails (default: 20 predicted steps, at least 60 s)")
    # runtime.train.Options (its own main has the same flags; here without importing torch)
    p.add_argument("--data", metavar="FILE", help="train on this flat token file (nanoGPT's train.bin, a Megatron "
                   ".bin), memory-mapped, each data-parallel rank reading its own rows; default: synthetic tokens")
    p.add_argument("--data-dtype", choices=("uint16", "uint32", "int32"), help="the token file's integer type "
                   "(default: from a Megatron .idx beside it, else uint16 if the vocabulary fits, else uint32)")
    p.add_argument("--init-from", metavar="DIR", help="start from this Hugging Face safetensors checkpoint "
                   "(save_pretrained's directory); each rank reads only what it holds")
    p.add_argument("--clip-grad", type=float, metavar="NORM",
                   help="clip gradients to this global 2-norm (over every mesh axis) before each optimizer step")
    p.add_argument("--compile", action="store_true", help="torch.compile each block before sharding")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .runtime.calibrate import main as calibrate_main

    from .cli_progress import status

    with status("calibrating (matmuls, memory copies, collectives)", quiet=args.quiet, delay_s=0.0) as update:
        update(f"{args.nproc} processes")
        return calibrate_main(["--nproc", str(args.nproc), "-o", args.output])


def cmd_zoo(args: argparse.Namespace) -> int:
    from . import zoo

    print(f"{'name':<16}{'family':<8}{'layers':>7}{'hidden':>8}{'heads':>7}{'experts':>9}{'params':>12}")
    for name in zoo.names():
        c = zoo.config(name)
        n = zoo.param_count(c)
        size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"
        print(f"{name:<16}{c.family:<8}{c.layers:>7}{c.hidden:>8}{c.heads:>7}{c.experts or '-':>9}{size:>12}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshplan", description="Plan, emit and run parallel training.")
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="choose a parallelization plan and print its report")
    _model_args(pl)
    _pin_args(pl)
    pl.add_argument("-o", "--output", help="save the plan as JSON here")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON instead of the report")
    pl.add_argument("--top", type=int, default=1, help="also show the runners-up and why they lost")
    pl.add_argument("--time-limit", type=float, default=30.0, help="solver time limit in seconds")
    from .cli_flags import software_name
    from .cost_model.software import SOFTWARE

    pl.add_argument("--software", type=software_name, default=None, metavar="NAME[+MODIFIER...]",
                    help="cost every plan as this program runs it (default meshplan, the runtime emit and run "
                         "execute); e.g. megatron-core-2024 for a plan to take to Megatron with `meshplan export`. "
                         f"Presets: {', '.join(sorted(SOFTWARE))}; a framework preset may add +mxfp8, +ep-overlap, "
                         "+fused-mlp, +expandable (PyTorch's expandable segments), +recompute-layernorm-moe_act")
    pl.set_defaults(func=cmd_plan)
    em = sub.add_parser("emit", help="write a torchrun training script for a plan")
    em.add_argument("plan")
    em.add_argument("-o", "--output", required=True)
    em.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None,
                    help="run the plan's fusions as generated Triton kernels (default: if the plan records any)")
    em.set_defaults(func=cmd_emit)
    rn = sub.add_parser("run", help="train a plan on CPU processes with torchrun")
    rn.add_argument("plan")
    rn.add_argument("--nproc", type=int, required=True)
    rn.add_argument("--steps", type=int, default=5)
    rn.add_argument("--seed", type=int, default=0)
    rn.add_argument("--max-restarts", type=int, default=0, metavar="R",
                    help="restart all workers up to R times when one fails (resuming from the last checkpoint)")
    _checkpoint_args(rn)
    rn.set_defaults(func=cmd_run)
    tr = sub.add_parser("_train")
    tr.add_argument("plan")
    tr.add_argument("--steps", type=int, default=5)
    tr.add_argument("--seed", type=int, default=0)
    _checkpoint_args(tr)
    tr.set_defaults(func=cmd_train)
    from .cli_estimate import add_parser as add_estimate

    add_estimate(sub)
    from .cli_report import add_parser as add_report, add_quiet

    add_report(sub)  # report, export, compare
    ca = sub.add_parser("calibrate", help="time this machine into a profile usable as --cluster profile.json")
    ca.add_argument("--nproc", type=int, default=4)
    ca.add_argument("-o", "--output", default="profile.json")
    ca.set_defaults(func=cmd_calibrate)
    zo = sub.add_parser("zoo", help="the model zoo")
    zo.add_argument("action", choices=("list",))
    zo.set_defaults(func=cmd_zoo)
    add_quiet(pl, rn, ca)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on success; 2 with one line on stderr for bad input (a ``PlanError``, or a file that cannot
    be read or written), never a traceback."""
    from .cli_flags import check_flags

    args = parser().parse_args(argv)
    try:
        check_flags(args)  # sizes within ir/limits.py before any work starts
        return args.func(args)
    except ir.PlanError as exc:
        print(f"meshplan: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"meshplan: error: {where}{exc.strerror or exc}; check the path and its permissions", file=sys.stderr)
        return 2


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
