"""Helpers for the gloo parity tests: plans, a single-process reference, and a launcher whose ranks
each write their own traceback (so a failure shows its cause, not another rank's "connection reset").

One launch runs many cases in the same processes: a 4-process gloo start costs seconds on 2 cores.
The ranks are forked from a forkserver that imported torch and meshplan once for the whole session
(each spawned rank would import them again: seconds of CPU per rank); each rank is still a fresh
process with its own process group.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from meshplan import ir

GLOBAL_BATCH, SEQ_LEN, STEPS, SEED = 8, 16, 3, 0


def make_plan(model: str, *, dp: int = 1, tp: int = 1, zero: int = 0, sp: bool = False, nmb: int = 1,
              recompute: tuple[str, ...] = (), **mesh: int) -> ir.Plan:
    from meshplan import zoo

    cfg = zoo.config(model).to_dict()
    world = dp * tp * mesh.get("pp", 1) * mesh.get("cp", 1)  # a plan's mesh fills its cluster (ir/schema.py)
    return ir.Plan(model=cfg, cluster=f"cpu:1x{world}", global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN,
                   mesh=ir.Mesh(dp=dp, tp=tp, **mesh), zero_stage=zero, sequence_parallel=sp,
                   micro_batch_size=GLOBAL_BATCH // (dp * nmb), num_microbatches=nmb,
                   recompute=recompute or ("none",) * cfg["layers"], dtype="float32")


def optimizer(params):
    """AdamW with eps 1e-4: Adam divides each gradient by its own magnitude, so with the default eps
    (1e-8) an element whose gradient is ~1e-8 turns float rounding into a 1e-5 parameter difference
    between any two summation orders (seen even with plain DDP). A larger eps keeps the comparison
    about the parallelism, not about rounding."""
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-4)


def reference(model: str | dict, steps: int = STEPS, seed: int = SEED) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole global batch at once: losses per step and the final parameters of a zoo
    model given by name or config. Cached: every parity file compares against the same runs."""
    key = (model if isinstance(model, str) else tuple(sorted(model.items())), steps, seed)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(model, steps, seed)
    return _REFERENCES[key]


_REFERENCES: dict[tuple, tuple[list[float], dict[str, torch.Tensor]]] = {}


def _reference(model: str | dict, steps: int, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    from meshplan import zoo
    from meshplan.runtime.train import synthetic_batch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls; more threads only spin on a shared 2-core machine
    torch.manual_seed(seed)
    net = zoo.build(model) if isinstance(model, str) else zoo.build_from_config(model)
    opt = optimizer(net.parameters())
    losses = []
    for step in range(1, steps + 1):
        x, y = synthetic_batch(net.config.vocab, GLOBAL_BATCH, SEQ_LEN, seed, step)
        loss = zoo.loss_fn(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    torch.set_num_threads(threads)
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


def launch(tmp_path_factory, world_size: int, entry: str, payload: Any) -> list[dict]:
    """Run ``entry`` on ``world_size`` ranks; each rank's results (rank{r}.pt)."""
    tmp = tmp_path_factory.mktemp(f"{entry.partition(':')[0]}{world_size}")
    run_ranks(world_size, entry, payload, tmp)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def assert_matches_reference(ranks: list[dict], name: str, model: str | dict) -> None:
    """Case ``name``: the same global mean loss on every rank, and losses and final (full) parameters
    equal to one process within 1e-5."""
    assert_ranks_match(ranks, name, *reference(model))


def assert_ranks_match(ranks: list[dict], name: str, ref_losses: list[float], ref_params: dict[str, torch.Tensor],
                       param_atol: float = 1e-5) -> None:
    """Case ``name`` of ``ranks``' results: the same global mean loss on every rank, and losses and final (full)
    parameters, under the whole model's names, equal to one process's within 1e-5 (``param_atol`` for the
    parameters of a model whose gradients fp32 itself leaves further from exact: the caller says why)."""
    got = [r[name] for r in ranks]
    for rank, result in enumerate(got):
        assert result["losses"] == got[0]["losses"], f"rank {rank} reports other losses than rank 0"
    torch.testing.assert_close(torch.tensor(got[0]["losses"]), torch.tensor(ref_losses), atol=1e-5, rtol=1e-5)
    params = got[0]["params"]
    assert sorted(params) == sorted(ref_params)  # the whole model's names: checkpoints stay plan-independent
    for pname, ref in ref_params.items():
        torch.testing.assert_close(params[pname], ref, atol=param_atol, rtol=1e-5, msg=lambda m: f"{pname}: {m}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# imported once, by the forkserver that every rank of the session is forked from
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "meshplan.runtime", "meshplan.zoo", "parity_support"]


def run_ranks(world_size: int, entry: str, payload: Any, tmp: Path, timeout_s: float = 240) -> None:
    """Run ``entry(rank, world_size, payload, outdir)`` (a "module:function" importable from this
    folder) on ``world_size`` gloo processes; raise with every rank's own traceback on failure.

    The ranks start from a forkserver (see the module's docstring): it is started, with the
    environment and ``sys.path`` of this moment, by the session's first launch and serves them all."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the server runs
    port = free_port()
    ctx = mp.start_processes(_rank_main, args=(world_size, port, entry, payload, str(tmp)), nprocs=world_size,
                             join=False, start_method="forkserver")
    try:
        while not ctx.join(timeout=timeout_s):
            pass
    except Exception as exc:  # the first rank to die; its peers may only say "connection reset"
        errors = [p.read_text() for p in sorted(tmp.glob("rank*.err"))]
        raise AssertionError("a rank failed:\n" + ("\n".join(errors) or str(exc))) from None


def _rank_main(rank: int, world_size: int, port: int, entry: str, payload: Any, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # full_tensor() of FSDP x TP parameters warns about two sequential all-gathers; not our concern here
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        module, _, name = entry.partition(":")
        sys.path.insert(0, str(Path(__file__).parent))
        getattr(__import__(module), name)(rank, world_size, payload, Path(outdir))
        dist.barrier()  # no rank tears its gloo pairs down while a peer still talks to it
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)  # skip the interpreter's teardown, where gloo's threads can abort a finished process
    except BaseException:
        Path(outdir, f"rank{rank}.err").write_text(f"--- rank {rank} ---\n{traceback.format_exc()}")
        raise


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))
