"""``meshplan calibrate``: time this machine the way the cost model prices it, and write a profile.

    python -m meshplan.runtime.calibrate --nproc 4 -o profile.json

``nproc`` ranks start at once (gloo on CPU, one thread each; NCCL on GPUs) and measure together, so
every number includes the contention of ranks that share the cores, as a training run of ``nproc``
ranks has. Each rank times, median of a few repetitions, the wall time and (for compute) the CPU
time of its thread:

* matmuls ``(m, k) @ (k, n)`` over sizes (float32 on CPU, bfloat16 on GPUs), and the two gradient
  matmuls of the same shapes in nn.Linear's layout (``dY @ W``, ``dY^T @ X``), each call on the next
  of a pool of operands larger than the caches (``COLD_POOL_BYTES``): in a training step every
  weight and most activations come from memory, since the whole step's tensors pass through the
  caches between two uses of one (as Triton's ``do_bench`` flushes the L2 between timings); operands
  that stay hot in the caches ran 5-8% faster per FLOP here (2-core EPYC, fp32);
* a copy of a large tensor (bytes read + written), and one tiny elementwise op (the cost per op);
* a causal scaled-dot-product attention forward, and forward plus backward, at head dims 32, 64, 128;
* one tiny autograd op, forward and backward, plain and as a DTensor op (the framework's cost per op),
  and the aten ops that op dispatches (counted once with a ``TorchDispatchMode``, untimed), so that
  the cost model prices each dispatch (``cost_model/dispatch.py``);
* GELU (tanh) and log-softmax, forward and backward, and a square root, over 2M elements
  (compute-bound on a CPU core: tanh, exp, sqrt per element), as seconds per element;
* on a CPU, a new 64 MiB tensor filled once against the same fill into mapped memory: the cost of
  faulting in fresh pages, which every tensor of 32 MiB or more pays (glibc maps those anew);
* on a CPU, the same matmul loop on every rank at once: the wall time until the last rank is done over
  the CPU time of one (how much slower than its CPU time a rank's work runs when all ranks work, as
  in a data-parallel step: about ranks per core, more when other work shares the machine);
* all-reduce, all-gather, reduce-scatter, broadcast and all-to-all over every group size that
  divides ``nproc`` (groups of consecutive ranks, all groups of a size at once), over message sizes;
  a collective's time is its slowest rank's;
* a matmul followed by a small all-reduce over the world as DTensor issues it, alone and together
  (what a collective call costs after compute, beyond its time among ranks that enter it at once:
  on shared cores, the wait for the rank the scheduler ran last);
* on the main thread, a tiny MLP split over the world with DTensor's ColwiseParallel and
  RowwiseParallel, forward alone and with its backward, against the same local matmuls with the same
  all-reduces by hand, and the ops each makes: a parallel style's cost per Linear beyond its ops;
* on the main thread, a forward and backward through tiny units each sharded by FSDP2 over the
  world, against the same units unsharded with the same collective calls issued bare: FSDP2's own
  cost per unit and pass (its hooks and buffer bookkeeping), which on a CPU is milliseconds, as much
  as a small layer's compute.

Rank 0 writes the raw timings (schema ``meshplan.profile/1``) with the kind of machine they come
from; ``cost_model.profile`` fits the cluster from them and refuses a profile of another kind.
About 30-45 s with 4 ranks on 2 cores.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from .distributed import device_for_rank, init_distributed

SCHEMA = "meshplan.profile/1"  # cost_model/profile.py reads the same string
MATMULS = ((128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 768, 256), (2048, 256, 768))
COPY_BYTES = (16 << 20, 64 << 20)
COLLECTIVE_BYTES = (16 << 10, 256 << 10, 4 << 20)
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "all-to-all")
REPEATS = 5
COLD_POOL_BYTES = 64 << 20  # operands of the matmul timings, cycled: past a CPU's L2 and L3 and a GPU's L2
MIN_TIMING_S = 0.03  # each timing lasts at least this long, so that ranks sharing cores overlap


def machine_kind() -> str:
    """What kind of machine this is (not which one): profiles of another kind are refused."""
    if torch.cuda.is_available():
        return f"cuda/{torch.cuda.get_device_name(0)}"
    model = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu/{platform.machine()}/{model}/{os.cpu_count()} cores"


def machine_memory_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory * torch.cuda.device_count()
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_both(fn: Callable[[], Any], device: torch.device, calls: int,
              clock: Callable[[], float] = time.thread_time) -> tuple[float, float]:
    """(wall, CPU) seconds of ``calls`` calls of ``fn``: CPU by ``clock``, this thread's by default."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, start_cpu = time.perf_counter(), clock()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, clock() - start_cpu


def _run(fn: Callable[[], Any], device: torch.device, calls: int) -> float:
    return _run_both(fn, device, calls)[0]


def _timed_both(fn: Callable[[], Any], device: torch.device, *, collective: bool = False,
                min_s: float = MIN_TIMING_S, main_thread: bool = False) -> tuple[float, float]:
    """(wall, CPU) median seconds of one call of ``fn`` over ``REPEATS`` timings of at least ``min_s``
    each. The wall time counts the time slices other processes took from this one; the CPU time
    (user and system) does not: this thread's, or for a collective the whole process's (gloo copies
    and reduces in its own threads) unless ``main_thread``. For a collective every rank of the world
    runs the same number of calls (rank 0's choice)."""
    once = _run(fn, device, 1)  # warm-up: allocation, kernel selection, connections
    calls = torch.tensor([max(1, min(10_000, round(min_s / max(once, 1e-7))))])
    if collective:
        dist.broadcast(calls, src=0)
    clock = time.process_time if collective and not main_thread else time.thread_time
    runs = [_run_both(fn, device, int(calls), clock) for _ in range(REPEATS)]
    return (statistics.median(w for w, _ in runs) / int(calls), statistics.median(c for _, c in runs) / int(calls))


def _timed(fn: Callable[[], Any], device: torch.device, *, collective: bool = False,
           min_s: float = MIN_TIMING_S) -> float:
    """Median wall seconds of one call of ``fn`` (``_timed_both``)."""
    return _timed_both(fn, device, collective=collective, min_s=min_s)[0]


def _row(fn: Callable[[], Any], device: torch.device, **fields: Any) -> dict[str, Any]:
    """A profile row: ``fields``, the median wall ``seconds`` of one call and its ``cpu_seconds``."""
    wall, cpu = _timed_both(fn, device)
    return {**fields, "seconds": wall, "cpu_seconds": cpu}


def _cold_pool(shapes: tuple[tuple[int, int], ...], device: torch.device,
               dtype: torch.dtype) -> Iterator[tuple[torch.Tensor, ...]]:
    """Operand tuples of ``shapes``, enough of them to fill ``COLD_POOL_BYTES``, endlessly in turn: a
    timed call reads operands that the calls since their last use have pushed out of the caches."""
    size = sum(r * c for r, c in shapes) * torch.tensor([], dtype=dtype).element_size()
    count = max(2, -(-COLD_POOL_BYTES // size))
    return itertools.cycle([tuple(torch.randn(*s, device=device, dtype=dtype) for s in shapes)
                            for _ in range(count)])


def _compute(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """This rank's compute timings; every rank runs them at the same time."""
    out: dict[str, Any] = {"matmul": [], "memory_copy": [], "matmul_backward": []}
    for m, n, k in MATMULS:
        pairs = _cold_pool(((m, k), (k, n)), device, dtype)
        dist.barrier()
        out["matmul"].append(_row(lambda: (lambda a, b: a @ b)(*next(pairs)), device, m=m, n=n, k=k))
    for size in COPY_BYTES:
        src = torch.empty(size // 4, device=device, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src)
        dist.barrier()
        out["memory_copy"].append(_row(lambda: dst.copy_(src), device, bytes=2 * size))
    for m, n, k in MATMULS:  # the backward of x (m, k) @ W^T as nn.Linear stores W (n, k)
        triples = _cold_pool(((m, k), (n, k), (m, n)), device, dtype)
        dist.barrier()
        out["matmul_backward"].append(_row(lambda: (lambda x, w, dy: (dy @ w, dy.t() @ x))(*next(triples)), device,
                                           m=m, n=n, k=k))
    tiny = torch.ones(8, device=device)
    dist.barrier()
    out["small_op_s"], out["small_op_cpu_s"] = _timed_both(lambda: tiny.add(1.0), device)
    out["op_overhead"] = _op_overhead(device)
    out["transcendental"] = _transcendental(device, dtype)
    if device.type == "cpu":
        out["first_touch"] = _first_touch(device)
    out["attention_by_head_dim"] = _attention(device, dtype)
    out["attention"] = {"batch_heads": 4, "seq_len": 256, **next(
        {"head_dim": r["head_dim"], "seconds": r["fwd_s"], "cpu_seconds": r["fwd_cpu_s"]}
        for r in out["attention_by_head_dim"] if r["head_dim"] == 64)}
    if device.type == "cpu":
        out["contention"] = contention(device, dtype)
    return out


OP_CHAIN = 32


def _op_overhead(device: torch.device) -> dict[str, float]:
    """Seconds of one tiny autograd op (a (2, 8) @ (8, 8) matmul), forward and backward, per op of a
    chain of ``OP_CHAIN``: plain, and as a DTensor op on a 1-D mesh over the world (replicated: no
    communication, only DTensor's dispatch and sharding propagation)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    def chain(x: torch.Tensor, w: torch.Tensor, local: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], Any]:
        def run() -> None:
            y = x
            for _ in range(OP_CHAIN):
                y = y @ w
            local(y).sum().backward()
        return run

    x = torch.ones(2, 8, device=device, requires_grad=True)
    w = torch.full((8, 8), 0.1, device=device, requires_grad=True)
    dist.barrier()
    plain, plain_cpu = (t / OP_CHAIN for t in _timed_both(chain(x, w, lambda y: y), device))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    dx = distribute_tensor(x.detach(), mesh, [Replicate()]).requires_grad_()
    dw = distribute_tensor(w.detach(), mesh, [Replicate()]).requires_grad_()
    dist.barrier()
    dtensor, dtensor_cpu = (t / OP_CHAIN for t in _timed_both(chain(dx, dw, lambda y: y.to_local()), device))
    plain_ops, _ = count_dispatches(chain(x, w, lambda y: y))
    _, dtensor_ops = count_dispatches(chain(dx, dw, lambda y: y.to_local()))
    return {"plain_s": plain, "dtensor_s": dtensor, "plain_cpu_s": plain_cpu, "dtensor_cpu_s": dtensor_cpu,
            "plain_dispatches": plain_ops / OP_CHAIN,
            "dtensor_dispatches": dtensor_ops / OP_CHAIN}


def count_dispatches(fn: Callable[[], Any]) -> tuple[int, int]:
    """(plain, DTensor) aten ops that one call of ``fn`` dispatches, forward and backward: what a
    ``TorchDispatchMode`` sees (an op on DTensors counts once, not its local op; a collective is plain)."""
    ops = count_ops(fn)
    return ops["plain"] + ops["collectives"], ops["dtensor"]


TRANSCENDENTAL_SHAPE = (2048, 1024)  # 8 MiB in fp32: past the caches, as a layer's FFN activation is


FIRST_TOUCH_BYTES = 64 << 20  # above glibc's 32 MiB mmap threshold ceiling: fresh pages every time


def _first_touch(device: torch.device) -> dict[str, Any]:
    """A new tensor of ``FIRST_TOUCH_BYTES`` filled once (its pages fault in: glibc maps tensors of
    32 MiB or more afresh each time) and the same fill into a tensor already mapped."""
    elems = FIRST_TOUCH_BYTES // 4
    mapped = torch.empty(elems, device=device)
    dist.barrier()
    fresh, fresh_cpu = _timed_both(lambda: torch.empty(elems, device=device).fill_(1.0), device)
    dist.barrier()
    reuse, reuse_cpu = _timed_both(lambda: mapped.fill_(1.0), device)
    return {"bytes": FIRST_TOUCH_BYTES, "fresh_s": fresh, "reuse_s": reuse, "fresh_cpu_s": fresh_cpu,
            "reuse_cpu_s": reuse_cpu}


ATTENTION_HEAD_DIMS = (32, 64, 128)  # the cost model interpolates between them (cost_model/profile.py)


def _attention(device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Causal SDPA over (1, 4 heads, 256, head_dim) at each of ``ATTENTION_HEAD_DIMS``: the forward
    alone, and forward plus backward (``bwd_s`` is their difference), wall and CPU seconds."""
    rows = []
    for head_dim in ATTENTION_HEAD_DIMS:
        q, k, v = (torch.randn(1, 4, 256, head_dim, device=device, dtype=dtype) for _ in range(3))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grad = torch.randn_like(q)

        def both() -> None:
            F.scaled_dot_product_attention(*leaves, is_causal=True).backward(grad)

        dist.barrier()
        fwd, fwd_cpu = _timed_both(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
        dist.barrier()
        total, total_cpu = _timed_both(both, device)
        rows.append({"batch_heads": 4, "seq_len": 256, "head_dim": head_dim, "fwd_s": fwd, "fwd_cpu_s": fwd_cpu,
                     "bwd_s": max(total - fwd, 1e-9), "bwd_cpu_s": max(total_cpu - fwd_cpu, 1e-9)})
    return rows


CONTENTION_CPU_S = 0.1  # CPU seconds of each rank per timing


def contention(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Every rank runs the same matmul loop at once, as data-parallel ranks run a step: the wall time
    until the slowest rank is done over this rank's CPU time. Its ratio is how much slower than its
    CPU time a rank's work runs here: ranks per core when they oversubscribe the cores, more when
    other work on the machine takes its share (``cost_model/profile.py`` scales CPU times by it)."""
    a = torch.randn(256, 256, device=device, dtype=dtype)
    _, cpu = _run_both(lambda: a @ a, device, 10)
    calls = torch.tensor([max(1, min(100_000, round(CONTENTION_CPU_S / max(cpu / 10, 1e-7))))])
    dist.broadcast(calls, src=0)
    walls, cpus = [], []
    for _ in range(REPEATS):
        dist.barrier()
        wall, cpu = _run_both(lambda: a @ a, device, int(calls))
        slowest = torch.tensor([wall])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        walls.append(float(slowest))
        cpus.append(cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def _transcendental(device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Seconds of the elementwise ops that evaluate tanh, exp or sqrt per element (compute-bound on a
    CPU core, unlike a copy): GELU's tanh approximation and log-softmax (the cross-entropy's), forward
    and backward, and the square root of AdamW's update, over ``TRANSCENDENTAL_SHAPE``."""
    x = torch.randn(*TRANSCENDENTAL_SHAPE, device=device, dtype=dtype)
    grad = torch.randn_like(x)
    out = torch.log_softmax(x, -1)
    positive = x.abs()  # as Adam's second moment
    ops = {"gelu": lambda: F.gelu(x, approximate="tanh"),
           "gelu_backward": lambda: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"),
           "log_softmax": lambda: torch.log_softmax(x, -1),
           "log_softmax_backward": lambda: torch.ops.aten._log_softmax_backward_data(grad, out, -1, x.dtype),
           "sqrt": lambda: positive.sqrt()}
    rows = []
    for op, call in ops.items():
        dist.barrier()
        rows.append(_row(call, device, op=op, elements=x.numel()))
    return rows


def _collective(kind: str, nbytes: int, group: Any, size: int, device: torch.device) -> Callable[[], Any]:
    """One collective on ``nbytes`` (nccl-tests' S) over ``group``, as a call."""
    elems = max(nbytes // 4 // size * size, size)
    full = torch.ones(elems, device=device)
    part = torch.ones(elems // size, device=device)
    if kind == "all-reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all-gather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    if kind == "reduce-scatter":
        return lambda: dist.reduce_scatter_tensor(part, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=dist.get_global_rank(group, 0), group=group)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full, group=group)


def _collectives(world: int, device: torch.device) -> list[dict[str, Any]]:
    """(kind, group size, bytes, this rank's seconds) for every group size dividing the world."""
    rank, out = dist.get_rank(), []
    for size in (s for s in range(2, world + 1) if world % s == 0):
        groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
        group = groups[rank // size]
        for kind in COLLECTIVES:
            for nbytes in COLLECTIVE_BYTES:
                call = _collective(kind, nbytes, group, size, device)
                dist.barrier()
                wall, cpu = _timed_both(call, device, collective=True)
                out.append({"kind": kind, "group_size": size, "bytes": nbytes, "seconds": wall, "cpu_seconds": cpu})
    return out


SYNC_BYTES = 16 << 10  # small: the call's wait, not its bandwidth, is what this measures
SYNC_TIMING_S = 0.5  # each timing spans ~50 calls: the wait varies from call to call (0.2 s: 0.9-2.1 ms between runs)


def _sync_after_compute(world: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """A matmul and then an all-reduce of ``SYNC_BYTES`` over the world as tensor parallelism issues it
    (a functional collective: a fresh output, waited on), timed alone and together: what a collective
    costs in training beyond its time among ranks that enter it at once (their skew when they share
    cores, the fresh buffers)."""
    import torch.distributed._functional_collectives as funcol

    a = torch.randn(512, 512, device=device, dtype=dtype)
    x = torch.ones(SYNC_BYTES // 4, device=device)
    group = dist.group.WORLD
    dist.barrier()
    compute, compute_cpu = _timed_both(lambda: a @ a, device, collective=True, min_s=SYNC_TIMING_S)
    dist.barrier()
    both, both_cpu = _timed_both(lambda: (a @ a, funcol.wait_tensor(funcol.all_reduce(x, "sum", group))), device,
                                 collective=True, min_s=SYNC_TIMING_S)
    return {"group_size": world, "bytes": SYNC_BYTES, "compute_s": compute, "seconds": both,
            "compute_cpu_s": compute_cpu, "cpu_seconds": both_cpu}


FSDP_UNITS = 4  # tiny layers, each its own FSDP2 unit
FSDP_WIDTH = 16
FSDP_LINEARS = 4
FRAMEWORK_TIMING_S = 0.3  # each timing spans many calls: a rank's share of the cores varies from call to call


def _fsdp_overhead(world: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """FSDP2's own cost per unit, on the main thread: a forward and backward through ``FSDP_UNITS``
    tiny units (``FSDP_LINEARS`` Linears with biases each, as many parameter tensors as a block has)
    each sharded over the world (resharded after forward: per unit an all-gather
    forward, one backward and a reduce-scatter), against the same layers unsharded plus the same
    collective calls issued bare. The difference is the hooks, the gathered parameters' bookkeeping
    and the copies in and out of the buffers (``cost_model.profile``: ``fsdp_unit_s``); the calls
    themselves are priced as collectives. Main-thread CPU: the calls' work in gloo's threads is the
    collectives' own, in both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def layers() -> nn.Module:  # a unit of FSDP_LINEARS Linears with biases: a block's ~8-12 parameter tensors
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Sequential(*(nn.Linear(FSDP_WIDTH, FSDP_WIDTH) for _ in range(FSDP_LINEARS)))
                               for _ in range(FSDP_UNITS))).to(device=device, dtype=dtype)

    x = torch.ones(2, FSDP_WIDTH, device=device, dtype=dtype)
    plain = layers()
    elems = FSDP_LINEARS * (FSDP_WIDTH + 1) * FSDP_WIDTH
    shard = torch.ones(-(-elems // world), device=device, dtype=dtype)
    whole = torch.ones(shard.numel() * world, device=device, dtype=dtype)

    def bare() -> None:
        plain(x).sum().backward()
        for _ in range(FSDP_UNITS):
            dist.all_gather_into_tensor(whole, shard)
            dist.all_gather_into_tensor(whole, shard)
            dist.reduce_scatter_tensor(shard, whole)

    dist.barrier()
    bare_s, bare_cpu = _timed_both(bare, device, collective=True, min_s=FRAMEWORK_TIMING_S, main_thread=True)
    sharded = layers()
    mesh = init_device_mesh(device.type, (world,))
    for layer in sharded:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(sharded, mesh=mesh)
    dist.barrier()
    fsdp_s, fsdp_cpu = _timed_both(lambda: sharded(x).sum().backward(), device, collective=True,
                                   min_s=FRAMEWORK_TIMING_S, main_thread=True)
    return {"units": FSDP_UNITS, "bare_s": bare_s, "bare_cpu_s": bare_cpu, "seconds": fsdp_s, "cpu_seconds": fsdp_cpu}


TP_WIDTH = 8  # per rank: the tiny MLP's hidden width is TP_WIDTH * world


def count_ops(fn: Callable[[], Any]) -> dict[str, int]:
    """Aten ops one call of ``fn`` dispatches: ``plain`` (besides collectives), ``dtensor`` (an op on
    DTensors counts once) and ``collectives`` (functional collective calls)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = dict.fromkeys(("plain", "dtensor", "collectives"), 0)
    calls = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if any(issubclass(t, DTensor) for t in types):
                counts["dtensor"] += 1
            elif func.namespace == "_c10d_functional" and func.__name__.split(".")[0] in calls:
                counts["collectives"] += 1
            else:
                counts["plain"] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return counts


class _AllReduce(torch.autograd.Function):
    """``y = all_reduce(x)`` forward, or the identity forward and ``all_reduce`` of the gradient
    backward: Megatron's g and f, by hand."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward: bool) -> torch.Tensor:  # noqa: ANN401
        ctx.forward = forward
        if forward:
            x = x.clone()
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN401
        if not ctx.forward:
            grad = grad.clone()
            dist.all_reduce(grad)
        return grad, None


def _tp_overhead(world: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """DTensor's parallel styles' own cost, on the main thread: a tiny MLP split over the world as the
    runtime splits a block's (``ColwiseParallel`` then ``RowwiseParallel``), forward alone and with
    its backward, against the same local matmuls with the same all-reduces issued by hand (output
    forward, input gradient backward), and the aten ops each makes. What remains beyond the ops'
    dispatch is the styles' (``from_local``/``to_local``, redistributing, wrapping the collectives'
    results for autograd): ``cost_model.profile``'s ``tp_style_fwd_s``/``tp_style_bwd_s``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    width = TP_WIDTH * world
    mlp = nn.Sequential(nn.Linear(16, width, bias=False), nn.Linear(width, 16, bias=False)).to(device=device,
                                                                                                dtype=dtype)
    w1 = mlp[0].weight.detach()[:TP_WIDTH].clone().requires_grad_()  # this rank's shards, by hand
    w2 = mlp[1].weight.detach()[:, :TP_WIDTH].clone().requires_grad_()
    mesh = init_device_mesh(device.type, (world,))
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    x = torch.ones(2, 16, device=device, dtype=dtype, requires_grad=True)  # an activation: its gradient is reduced

    def by_hand() -> torch.Tensor:
        h = _AllReduce.apply(x, False) @ w1.t()
        return _AllReduce.apply(h @ w2.t(), True).sum()

    def styled() -> torch.Tensor:
        return mlp(x).sum()  # using the output waits for RowwiseParallel's all-reduce, as the next layer does

    out: dict[str, Any] = {"linears": 2}
    for name, fn in (("by_hand", by_hand), ("styled", styled)):
        for part, call in (("fwd", fn), ("both", lambda fn=fn: fn().backward())):
            out[f"{name}_{part}_ops"] = count_ops(call)
            dist.barrier()
            wall, cpu = _timed_both(call, device, collective=True, min_s=FRAMEWORK_TIMING_S, main_thread=True)
            out[f"{name}_{part}_s"], out[f"{name}_{part}_cpu_s"] = wall, cpu
    return out


def measure(world: int) -> dict[str, Any] | None:
    """Every rank of an initialized process group measures; rank 0 gets the profile, the others None."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's rename
    device = device_for_rank()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    mine = {"compute": _compute(device, dtype), "collectives": _collectives(world, device), "rss": _rss_bytes()}
    if world > 1:
        mine["sync"] = _sync_after_compute(world, device, dtype)
        mine["fsdp"] = _fsdp_overhead(world, device, dtype)
        mine["tp"] = _tp_overhead(world, device, dtype)
    rank = dist.get_rank()
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
    return profile_from_ranks(gathered, world, dtype) if rank == 0 else None


MEASURED_KEYS = ("seconds", "_s", "_dispatches")  # fields of a row that are measured, not sizes


def _median_fields(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The first item with each measured field (``MEASURED_KEYS``) the median over the items."""
    return {**items[0], **{k: statistics.median(item[k] for item in items)
                           for k in items[0] if k.endswith(MEASURED_KEYS)}}


def _median_rows(tables: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Tables of the same rows as one: each row's measured fields the median over the tables."""
    return [_median_fields([table[i] for table in tables]) for i in range(len(tables[0]))]


OPTIONAL_ROWS = ("matmul_backward", "transcendental", "attention_by_head_dim")
OPTIONAL_FIELDS = ("op_overhead", "first_touch", "contention")


def median_profile(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """Profiles measured in rounds as one: each timing the median over the rounds (the rounds share
    their sizes), so that a burst of other work on the machine during one round does not count."""
    first = profiles[0]
    scalars = {k: statistics.median(p[k] for p in profiles) for k in ("small_op_s", "small_op_cpu_s")
               if all(k in p for p in profiles)}
    return {**first, **scalars,
            "matmul": _median_rows([p["matmul"] for p in profiles]),
            "memory_copy": _median_rows([p["memory_copy"] for p in profiles]),
            **{k: _median_rows([p[k] for p in profiles]) for k in OPTIONAL_ROWS if all(k in p for p in profiles)},
            **{k: _median_fields([p[k] for p in profiles]) for k in OPTIONAL_FIELDS if all(k in p for p in profiles)},
            "attention": _median_fields([p["attention"] for p in profiles]),
            "process_rss_bytes": max(p["process_rss_bytes"] for p in profiles),
            "collectives": {kind: _median_rows([p["collectives"][kind] for p in profiles])
                            for kind in first["collectives"]},
            **{k: _median_fields([p[k] for p in profiles]) for k in ("sync_after_compute", "fsdp", "tp_linear")
               if all(k in p for p in profiles)},
            "rounds": len(profiles)}


def _worker(rank: int, world: int, port: int, output: str, errors: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    try:
        init_distributed()
        profile = measure(world)
        if rank == 0:
            Path(output).write_text(json.dumps(profile, indent=1) + "\n")
        dist.destroy_process_group()
    except Exception:
        Path(errors, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise


def profile_from_ranks(ranks: list[dict[str, Any]], world: int, dtype: torch.dtype) -> dict[str, Any]:
    """The profile file: compute timings as the median over ranks, collectives as the slowest rank."""
    computes = [r["compute"] for r in ranks]
    first = computes[0]
    collectives: dict[str, list[dict[str, Any]]] = {}
    for i, row in enumerate(ranks[0]["collectives"]):
        slowest = {k: max(r["collectives"][i][k] for r in ranks) for k in ("seconds", "cpu_seconds")}
        collectives.setdefault(row["kind"], []).append(
            {"group_size": row["group_size"], "bytes": row["bytes"], **slowest})
    sync = {}
    if world > 1:  # compute as the median rank's, the pair as the slowest rank's (as a collective)
        sync = {"sync_after_compute": {**ranks[0]["sync"], **{
            k: statistics.median(r["sync"][k] for r in ranks) for k in ("compute_s", "compute_cpu_s")}, **{
            k: max(r["sync"][k] for r in ranks) for k in ("seconds", "cpu_seconds")}},
            # each rank's own framework costs: the median rank's
            "fsdp": _median_fields([r["fsdp"] for r in ranks]), "tp_linear": _median_fields([r["tp"] for r in ranks])}
    return {
        **sync,
        "schema": SCHEMA,
        "machine": {"kind": machine_kind(), "cores": os.cpu_count(), "memory_bytes": machine_memory_bytes(),
                    "torch": torch.__version__, "backend": dist.get_backend()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "processes": world,
        "threads_per_process": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "matmul": _median_rows([c["matmul"] for c in computes]),
        "memory_copy": _median_rows([c["memory_copy"] for c in computes]),
        **{k: statistics.median(c[k] for c in computes) for k in ("small_op_s", "small_op_cpu_s")},
        **{k: _median_rows([c[k] for c in computes]) for k in OPTIONAL_ROWS if k in first},
        **{k: _median_fields([c[k] for c in computes]) for k in OPTIONAL_FIELDS if k in first},
        "attention": _median_fields([c["attention"] for c in computes]),
        "process_rss_bytes": max(r["rss"] for r in ranks),
        "collectives": collectives,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def calibrate(nproc: int, output: str | Path) -> dict[str, Any]:
    """Start ``nproc`` ranks on this machine, measure, write the profile to ``output``; return it."""
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc} exceeds the {torch.cuda.device_count()} GPUs here")
    output = Path(output)
    with tempfile.TemporaryDirectory() as errors:
        try:
            mp.spawn(_worker, args=(nproc, _free_port(), str(output), errors), nprocs=nproc)
        except Exception as exc:
            reports = sorted(Path(errors).glob("rank*.txt"))
            detail = "\n".join(f"{p.stem}: {p.read_text().strip().splitlines()[-1]}" for p in reports)
            raise RuntimeError(f"calibration failed:\n{detail or exc}") from None
    return json.loads(output.read_text())


def summary(profile: dict[str, Any]) -> str:
    """A few lines of what was measured (the fitted cluster is cost_model.profile's business)."""
    best = max(2 * r["m"] * r["n"] * r["k"] / r["seconds"] for r in profile["matmul"])
    copy = max(r["bytes"] / r["seconds"] for r in profile["memory_copy"])
    lines = [f"machine: {profile['machine']['kind']}, {profile['processes']} processes",
             f"matmul: best {best / 1e9:.1f} GFLOP/s per process ({profile['dtype']})",
             f"memory copy: {copy / 1e9:.1f} GB/s per process; one small op {profile['small_op_s'] * 1e6:.1f} us"]
    for kind, rows in profile["collectives"].items():
        top = max(rows, key=lambda r: (r["bytes"], r["group_size"]))
        lines.append(f"{kind}: {top['bytes'] / 2**20:.2f} MiB over {top['group_size']} ranks in "
                     f"{top['seconds'] * 1e3:.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshplan calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="ranks that run at once (as in training)")
    parser.add_argument("-o", "--output", default="profile.json", help="where to write the profile")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        profile = calibrate(args.nproc, args.output)
    except (ValueError, RuntimeError) as exc:
        print(f"meshplan: error: {exc}", file=sys.stderr)
        return 2
    print(summary(profile))
    print(f"wrote {args.output} in {time.perf_counter() - start:.1f} s; use it with --cluster {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
