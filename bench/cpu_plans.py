"""The small GPT and the 14 plans that bench/cpu_accuracy.py and bench/cpu_memory.py run on 4 gloo
processes, and the launcher both use: spawn the ranks, collect rank 0's JSON, or every rank's error."""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

MODEL = dict(family="gpt", layers=4, hidden=256, heads=8, vocab=4096, max_seq_len=128, name="gpt-bench")
GLOBAL_BATCH, SEQ_LEN = 16, 128
# (label, tp, pp, dp, zero, sp, micro-batch, recompute, schedule)
PLANS = (
    ("DDP", 1, 1, 4, 0, False, 4, "none", "1f1b"),
    ("DDP, 2 micro-batches", 1, 1, 4, 0, False, 2, "none", "1f1b"),
    ("DDP + full recompute", 1, 1, 4, 0, False, 4, "full", "1f1b"),
    ("ZeRO-1", 1, 1, 4, 1, False, 4, "none", "1f1b"),
    ("ZeRO-2", 1, 1, 4, 2, False, 4, "none", "1f1b"),
    ("ZeRO-3", 1, 1, 4, 3, False, 4, "none", "1f1b"),
    ("ZeRO-3 + selective", 1, 1, 4, 3, False, 4, "selective", "1f1b"),
    ("TP4 + SP", 4, 1, 1, 0, True, 16, "none", "1f1b"),
    ("TP4", 4, 1, 1, 0, False, 16, "none", "1f1b"),
    ("TP2 + SP x DP2", 2, 1, 2, 0, True, 8, "none", "1f1b"),
    ("TP2 x ZeRO-3 2", 2, 1, 2, 3, True, 8, "none", "1f1b"),
    ("PP2 x DP2, 1F1B", 1, 2, 2, 0, False, 2, "none", "1f1b"),
    ("PP2 x DP2, GPipe", 1, 2, 2, 0, False, 2, "none", "gpipe"),
    ("PP4, 1F1B", 1, 4, 1, 0, False, 4, "none", "1f1b"),
)


def build_plans(cluster_spec: str) -> list[tuple[str, object]]:
    """(label, plan) for every row of ``PLANS``, fp32, even pipeline stages."""
    from meshplan import ir
    from meshplan.cli_estimate import _stages  # even stage split, as ``meshplan estimate`` makes it

    out = []
    for label, tp, pp, dp, zero, sp, mb, recompute, schedule in PLANS:
        args = argparse.Namespace(pp=pp, vp=1, stages=None, first_stage_layers=None, last_stage_layers=None,
                                  account_embedding=False, account_loss=False)  # meshplan estimate's defaults
        plan = ir.Plan(model=MODEL, cluster=cluster_spec, global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN,
                       mesh=ir.Mesh(pp=pp, dp=dp, tp=tp), zero_stage=zero, sequence_parallel=sp,
                       micro_batch_size=mb, num_microbatches=GLOBAL_BATCH // (mb * dp), schedule=schedule,
                       recompute=(recompute,) * MODEL["layers"], stages=_stages(args, MODEL["layers"]),
                       dtype="float32")
        out.append((label, plan))
    return out


def run_workers(worker: Callable, nproc: int, plans: list[tuple[str, object]], *extra: Any) -> Any:
    """``worker(rank, world, port, plans_json, *extra, output, errors_dir)`` on ``nproc`` spawned
    processes; returns the JSON rank 0 wrote to ``output``, or exits with every failed rank's traceback
    (each writes it to ``errors_dir/rank{r}.txt``)."""
    import torch.multiprocessing as mp

    payload = json.dumps([(label, plan.to_dict()) for label, plan in plans])
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        output = str(Path(tmp, "measured.json"))
        try:
            mp.spawn(worker, args=(nproc, port, payload, *extra, output, tmp), nprocs=nproc)
        except Exception as exc:
            reports = sorted(Path(tmp).glob("rank*.txt"))
            raise SystemExit("measuring failed:\n" + ("\n".join(p.read_text() for p in reports) or str(exc)))
        return json.loads(Path(output).read_text())
