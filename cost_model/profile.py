"""A cluster from a measured profile: what ``meshplan calibrate`` (``runtime/calibrate.py``) timed on
one machine, turned into an ``Accelerator`` and one interconnect tier.

The file (schema ``meshplan.profile/1``) keeps the raw timings, never fitted numbers, so that a
better fit needs no re-measurement::

    machine          {kind, cores, memory_bytes}: kind names the kind of machine
                     ("cpu/x86_64/AMD EPYC" or "cuda/NVIDIA H100 80GB HBM3"), not the host
    processes        ranks that ran at once, sharing the machine (the cluster's gpus_per_node)
    dtype            the dtype of the matmuls (float32 on CPU)
    matmul           [{m, n, k, seconds}]: (m, k) @ (k, n), median over the ranks running together
    memory_copy      [{bytes, seconds}]: bytes read + written by a copy
    matmul_backward  optional [{m, n, k, seconds}]: both gradient matmuls of (m, k) @ (k, n) in
                     nn.Linear's layout (dY @ W and dY^T @ X), median over the ranks
    small_op_s       one tiny elementwise op: the fixed cost per kernel (dispatch)
    op_overhead      optional {plain_s, dtensor_s, plain_dispatches, dtensor_dispatches}: one tiny
                     autograd op of a chain, forward and backward, plain and as a DTensor op, and the
                     aten ops it dispatches (counted; the counts are absent in older profiles)
    transcendental   optional [{op, elements, seconds}]: GELU (tanh) and log-softmax, forward and
                     backward (``hardware.TRANSCENDENTAL_OPS``), over a tensor past the caches
    first_touch      optional {bytes, fresh_s, reuse_s}: a new tensor of ``bytes`` (above glibc's
                     mmap threshold) filled once, and the same fill into a tensor already mapped
    attention        {batch_heads, seq_len, head_dim, seconds}: causal SDPA forward
    attention_by_head_dim  optional [{batch_heads, seq_len, head_dim, fwd_s, bwd_s}]: causal SDPA forward,
                     and its backward, at several head dims
    contention       optional {wall_s, cpu_s}: every rank ran the same matmul loop at once; the wall time
                     until the slowest was done, and this rank's CPU time (median over the ranks)
    process_rss_bytes  resident memory of a rank after start-up: never usable by tensors
    collectives      {kind: [{group_size, bytes, seconds}]}: groups of consecutive ranks, all
                     groups of a size at once; bytes is nccl-tests' S (collectives.py)

On a CPU every compute timing also has its CPU time (``cpu_seconds`` beside ``seconds``, ``X_cpu_s``
beside ``X_s``): the calling thread's, which the time slices other processes take do not count. Where
the profile has ``contention`` each timing becomes its CPU time times wall_s / cpu_s (``contended``):
the same work of every rank at once, until the last rank is done, as ranks run a training step. A
timing's own wall time does not measure that: ranks that finish a timing early wait at the next
barrier and leave their cores to the others, so single timings ran ~1.8x slower than their CPU time
with 4 ranks on 2 cores, where a training step runs 2x slower or more. A step is CPU-bound: its wall
time is the contention times the CPU time of one rank's process (DDP: 416 ms wall, 175 ms CPU on the
main thread and 190 ms in all; TP4 1.57-1.63 s against 0.38-0.45 s at a contention of 4.0 measured
beside it; TP2 x ZeRO-3 1.28-1.33 s against 0.31-0.36 s at 3.6-4.1). Collectives (and
``sync_after_compute``) are timed in the CPU time of the whole process: gloo copies and reduces in
its own threads, and waits for the ranks that run late with CPU too.

Fits (least squares on relative error, so small and large sizes weigh alike):

* matmul: t = 2mnk / peak + small_op_s -> ``peak_flops[dtype]``, with ``matmul_efficiency`` 1 (the
  peak is what was achieved) and one compute unit (no wave quantization on a CPU core);
* memory: the rate of the largest copy is ``memory_bw_Bps`` (efficiency 1): smaller ones may sit
  in a cache that the activations of a training step do not fit;
* matmul_backward: the same fit at twice the FLOPs and two per-op costs -> ``matmul_bwd_efficiency``
  = its peak over the forward's (1 when absent);
* op_overhead -> ``dispatch_s`` and ``dtensor_dispatch_s`` = the op's time over the ops it dispatches
  (``CHAIN_DISPATCHES``, 6, where the profile lacks the count; 0 when absent), charged per op the
  runtime dispatches (``dispatch.py``: counted from the program's structure);
* transcendental -> ``transcendental_s_per_elem`` = seconds / elements per op (none when absent: all
  elementwise ops memory-bound), used for GELU and the loss's log-softmax (``kernels.py``);
* first_touch -> ``first_touch_s_per_byte`` = (fresh_s - reuse_s) / bytes (>= 0; 0 when absent),
  charged for tensors of at least ``hardware.FRESH_PAGES_BYTES`` (``kernels.fresh_pages_s``);
* sync_after_compute (optional {group_size, bytes, compute_s, seconds}: a matmul, then an all-reduce
  as DTensor issues it) -> ``sync_overhead_s`` = seconds - compute_s - the fitted all-reduce time
  (>= 0; 0 when absent), charged per tensor-parallel collective call (``layer_cost``);
* fsdp (optional {units, bare_s, seconds}: on the main thread, a forward and backward through tiny
  layers each sharded by FSDP2 over the world, and the same layers unsharded with the same
  collective calls issued bare) -> ``fsdp_unit_s`` = (seconds - bare_s) / (2 * units) (>= 0; 0
  when absent): FSDP2's own cost per unit and pass, charged per unit, micro-batch and pass where
  the program runs FSDP2 (``data_parallel.py``);
* tp_linear (optional {linears, {styled, by_hand}_{fwd, both}_{s, ops}}: on the main thread, a tiny
  MLP split with ColwiseParallel and RowwiseParallel over the world, and the same local matmuls
  with the same all-reduces by hand, forward alone and with backward, and the aten ops each made)
  -> ``tp_style_fwd_s``, ``tp_style_bwd_s`` = the styled time less the by-hand one, each less its
  ops at ``dispatch_s``/``dtensor_dispatch_s``, over the Linears (>= 0; 0 when absent): a parallel
  style's own cost, charged per module the runtime gives a style (``dispatch.py``);
* attention: the causal SDPA's executed FLOPs (half of 4*b*a*s^2*d) over its time and the peak;
  with ``attention_by_head_dim`` the same per head dim, and the backward's time over the forward's
  (``Accelerator.attention_by_head_dim``; ``kernels.attention_fwd_bwd_s`` interpolates by the model's
  head dim: a CPU's SDPA runs 32-wide heads at a lower rate than 64-wide ones);
* ``shared_by`` = processes / cores when the ranks oversubscribe the cores (``hardware.py``);
* each collective and group size n: t = latency + bus_bytes(kind, S, n) / B over the message sizes
  -> (latency, B) per kind and group size on the tier (``Tier.collectives``); other group sizes take
  the nearest measured one, the latency scaled by the tree depth ceil(log2 n).

A profile that is malformed, from another schema, or (given ``expect_kind``) measured on another
kind of machine is refused with the reason.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from ..ir.errors import InvalidClusterError
from .collectives import Collective, bus_bytes, collective_time
from .files import read_json
from .hardware import DTYPES, TRANSCENDENTAL_OPS, Accelerator, Cluster, Tier, TierKind

SCHEMA = "meshplan.profile/1"  # runtime/calibrate.py writes the same string
# aten ops calibrate's chain op dispatches, forward and backward: mm; mm, mm, t, t and the add that
# accumulates W's gradient (runtime/calibrate.py counts them since; profiles written before lack the count)
CHAIN_DISPATCHES = 6


def load_profile(path: str | Path) -> dict[str, Any]:
    """The parsed profile file, schema checked; read as ``files.read_json`` reads (a regular file of
    bounded size, UTF-8, finite numbers)."""
    data = read_json(path, "profile")
    _check_schema(data, f"profile {str(path)!r}")
    return data


def _check_schema(data: Any, where: str) -> None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise InvalidClusterError(f"{where} has schema {found!r}, expected {SCHEMA!r}; write one with "
                                  "`meshplan calibrate --nproc N -o PROFILE.json`")


def cluster_from_profile(path: str | Path | dict[str, Any], *, expect_kind: str | None = None) -> Cluster:
    """The one-machine cluster a profile measured (``processes`` ranks on one node)."""
    data = path if isinstance(path, dict) else load_profile(path)
    where = "profile" if isinstance(path, dict) else f"profile {str(path)!r}"
    _check_schema(data, where)
    data = contended(data, where)
    machine = _field(data, "machine", dict, where)
    kind = _field(machine, "kind", str, f"{where}: machine")
    if not kind.strip():
        raise InvalidClusterError(f"{where}: machine.kind is empty; it names the kind of machine measured")
    if expect_kind is not None and kind != expect_kind:
        raise InvalidClusterError(f"{where} was measured on {kind!r}, but this machine is {expect_kind!r}; "
                                  "run `meshplan calibrate --nproc N -o PROFILE.json` here")
    processes = _count(data, "processes", where)
    accel = accelerator_from_profile(data, where)
    tier = tier_from_profile(data, where, processes)
    spec = data.get("spec") or (str(path) if not isinstance(path, dict) else f"profile:1x{processes}")
    cluster = Cluster(accelerator=accel, nodes=1, gpus_per_node=processes, tiers=(tier,), name="profile", spec=spec)
    if "sync_after_compute" in data:  # optional: profiles written before it lack it
        sync = _field(data, "sync_after_compute", dict, where)
        at = f"{where}: sync_after_compute"
        size, nbytes, compute_s, both_s = (_positive(sync, k, at)
                                           for k in ("group_size", "bytes", "compute_s", "seconds"))
        _group_size(size, processes, at)
        alone = collective_time(Collective.ALL_REDUCE, nbytes, int(size), 1, cluster)
        extra = max(0.0, both_s - compute_s - alone)
        cluster = dataclasses.replace(cluster, accelerator=dataclasses.replace(accel, sync_overhead_s=extra))
    if "fsdp" in data:  # optional: profiles written before them lack these
        cluster = dataclasses.replace(cluster, accelerator=dataclasses.replace(
            cluster.accelerator, fsdp_unit_s=_fsdp_unit_s(data, where)))
    if "tp_linear" in data:
        fwd, bwd = _tp_style_s(data, where, cluster)
        cluster = dataclasses.replace(cluster, accelerator=dataclasses.replace(
            cluster.accelerator, tp_style_fwd_s=fwd, tp_style_bwd_s=bwd))
    return cluster


def _group_size(size: float, processes: int, at: str) -> None:
    if int(size) != size or not 2 <= size <= processes:
        raise InvalidClusterError(f"{at}: group_size must be 2 to processes({processes}) ranks, got {size!r}")


def _tp_style_s(data: dict[str, Any], where: str, cluster: Cluster) -> tuple[float, float]:
    """(forward, backward) cost of one module's DTensor parallel style: the styled tiny MLP's main-thread
    time less the same matmuls with the same all-reduces by hand, less the difference of their ops'
    dispatch as the model charges it (``dispatch_s``, ``dtensor_dispatch_s``), over its Linears (>= 0)."""
    row = _field(data, "tp_linear", dict, where)
    at = f"{where}: tp_linear"
    accel = cluster.accelerator
    linears = _positive(row, "linears", at)

    def part(name: str, kind: str) -> tuple[float, float]:
        ops = _field(row, f"{name}_{kind}_ops", dict, at)
        charged = (_count_field(ops, "plain", at) * accel.dispatch_s
                   + _count_field(ops, "dtensor", at) * accel.dtensor_dispatch_s)
        return _positive(row, f"{name}_{kind}_s", at), charged

    (styled_f, styled_f_ops), (hand_f, hand_f_ops) = part("styled", "fwd"), part("by_hand", "fwd")
    (styled_b, styled_b_ops), (hand_b, hand_b_ops) = part("styled", "both"), part("by_hand", "both")
    fwd = (styled_f - styled_f_ops) - (hand_f - hand_f_ops)
    both = (styled_b - styled_b_ops) - (hand_b - hand_b_ops)
    return max(0.0, fwd) / linears, max(0.0, both - max(0.0, fwd)) / linears


def _count_field(row: dict[str, Any], key: str, at: str) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidClusterError(f"{at}: {key} must be a count >= 0, got {value!r}")
    return value


def _fsdp_unit_s(data: dict[str, Any], where: str) -> float:
    """FSDP2's cost per unit and pass on the main thread: the sharded layers' forward and backward less
    the unsharded ones' with the same collective calls issued bare, over 2 passes per unit (>= 0)."""
    row = _field(data, "fsdp", dict, where)
    at = f"{where}: fsdp"
    units, bare_s, fsdp_s = (_positive(row, k, at) for k in ("units", "bare_s", "seconds"))
    return max(0.0, fsdp_s - bare_s) / (2 * units)


# compute timings that a CPU profile measured with their CPU time too; collectives are not among them
COMPUTE_ROWS = ("matmul", "memory_copy", "matmul_backward", "transcendental", "attention_by_head_dim")
COMPUTE_FIELDS = ("op_overhead", "first_touch", "attention", "fsdp", "tp_linear")


def _cpu_twin(key: str) -> str:
    return "cpu_seconds" if key == "seconds" else key.removesuffix("_s") + "_cpu_s"


def _contended_item(item: Any, factor: float) -> Any:
    """``item`` with each timing that has a CPU twin replaced by the twin times ``factor``."""
    if not isinstance(item, dict):
        return item
    return {**item, **{k: item[_cpu_twin(k)] * factor for k in item
                       if (k == "seconds" or k.endswith("_s")) and "_cpu_" not in k and k != "cpu_seconds"
                       and isinstance(item.get(_cpu_twin(k)), (int, float)) and item[_cpu_twin(k)] > 0}}


def contention_factor(data: dict[str, Any], where: str = "profile") -> float:
    """wall_s / cpu_s of the profile's ``contention`` (>= 1), or 1 where it has none."""
    if "contention" not in data:
        return 1.0
    row = _field(data, "contention", dict, where)
    return max(1.0, _positive(row, "wall_s", f"{where}: contention") / _positive(row, "cpu_s", f"{where}: contention"))


def contended(data: dict[str, Any], where: str = "profile") -> dict[str, Any]:
    """The profile with each compute timing that has a CPU time replaced by that CPU time times the
    contention factor (see the module docstring); unchanged where the profile has no ``contention``."""
    if "contention" not in data:
        return data
    factor = contention_factor(data, where)
    out = dict(data)
    for key in COMPUTE_ROWS:
        if isinstance(data.get(key), list):
            out[key] = [_contended_item(row, factor) for row in data[key]]
    for key in COMPUTE_FIELDS:
        if key in data:
            out[key] = _contended_item(data[key], factor)
    if isinstance(data.get("collectives"), dict):
        out["collectives"] = {kind: [_contended_item(r, factor) for r in rows] if isinstance(rows, list) else rows
                              for kind, rows in data["collectives"].items()}
    if "sync_after_compute" in data:
        out["sync_after_compute"] = _contended_item(data["sync_after_compute"], factor)
    if isinstance(data.get("small_op_cpu_s"), (int, float)) and data["small_op_cpu_s"] > 0:
        out["small_op_s"] = data["small_op_cpu_s"] * factor
    return out


def accelerator_from_profile(data: dict[str, Any], where: str) -> Accelerator:
    data = contended(data, where)
    machine = data["machine"]
    dtype = _field(data, "dtype", str, where)
    if dtype not in DTYPES:
        raise InvalidClusterError(f"{where}: dtype {dtype!r} is not one of {DTYPES}")
    overhead = _positive(data, "small_op_s", where)
    peak = _matmul_peak(_points(data, "matmul", ("m", "n", "k", "seconds"), where), overhead, where)
    copies = _points(data, "memory_copy", ("bytes", "seconds"), where)
    largest = max(copies, key=lambda p: p["bytes"])
    bandwidth = largest["bytes"] / largest["seconds"]
    att = _field(data, "attention", dict, where)
    heads, seq, head_dim, att_s = (_positive(att, k, f"{where}: attention")
                                   for k in ("batch_heads", "seq_len", "head_dim", "seconds"))
    executed = 0.5 * 4.0 * heads * seq * seq * head_dim  # causal half of 4*b*s^2*h (kernels.py)
    attention_eff = min(1.0, max(0.01, executed / (max(att_s - overhead, att_s / 2) * peak)))
    processes = _count(data, "processes", where)
    memory = _positive(machine, "memory_bytes", f"{where}: machine") / processes
    reserved = _positive(data, "process_rss_bytes", where)
    if reserved >= memory:
        raise InvalidClusterError(f"{where}: process_rss_bytes ({reserved:.3g}) is not below the memory per "
                                  f"process ({memory:.3g} = machine.memory_bytes / processes)")
    bwd_eff = 1.0
    if "matmul_backward" in data:  # optional: profiles written before it lack it
        grads = [{**r, "m": 2 * r["m"]} for r in _points(data, "matmul_backward", ("m", "n", "k", "seconds"), where)]
        bwd_eff = min(4.0, max(0.05, _matmul_peak(grads, 2 * overhead, where) / peak))
    dispatch_s, dtensor_s = _dispatch_costs(data, where)
    return Accelerator(name=f"{machine['kind']} ({processes} processes)", peak_flops={dtype: peak},
                       matmul_efficiency={dtype: 1.0}, memory_bytes=memory, reserved_bytes=reserved,
                       memory_bw_Bps=bandwidth, memory_efficiency=1.0, attention_efficiency=attention_eff,
                       kernel_overhead_s=overhead, compute_units=1, matmul_tile_elems=1,
                       shared_by=max(1.0, processes / _count(machine, "cores", f"{where}: machine")),
                       matmul_bwd_efficiency=bwd_eff, dispatch_s=dispatch_s, dtensor_dispatch_s=dtensor_s,
                       transcendental_s_per_elem=_transcendental(data, where),
                       attention_by_head_dim=_attention_curve(data, where, peak, overhead),
                       first_touch_s_per_byte=_first_touch(data, where))


def _attention_curve(data: dict[str, Any], where: str, peak: float,
                     overhead: float) -> tuple[tuple[float, float, float], ...]:
    """(head dim, forward efficiency, backward over forward) per measured head dim; () where absent."""
    if "attention_by_head_dim" not in data:
        return ()
    rows = _points(data, "attention_by_head_dim", ("batch_heads", "seq_len", "head_dim", "fwd_s", "bwd_s"), where)
    out = []
    for r in sorted(rows, key=lambda r: r["head_dim"]):
        executed = 0.5 * 4.0 * r["batch_heads"] * r["seq_len"] ** 2 * r["head_dim"]
        eff = min(1.0, max(0.01, executed / (max(r["fwd_s"] - overhead, r["fwd_s"] / 2) * peak)))
        out.append((r["head_dim"], eff, r["bwd_s"] / r["fwd_s"]))
    return tuple(out)


def _first_touch(data: dict[str, Any], where: str) -> float:
    """Seconds per byte of faulting in fresh pages: a new tensor written once, less the same write
    into one already mapped; 0 for profiles written before it."""
    if "first_touch" not in data:
        return 0.0
    row = _field(data, "first_touch", dict, where)
    at = f"{where}: first_touch"
    nbytes, fresh_s, reuse_s = (_positive(row, k, at) for k in ("bytes", "fresh_s", "reuse_s"))
    return max(0.0, fresh_s - reuse_s) / nbytes


def _dispatch_costs(data: dict[str, Any], where: str) -> tuple[float, float]:
    """(plain, DTensor) seconds per dispatched op: the chain op's time over the ops it dispatches."""
    if "op_overhead" not in data:
        return 0.0, 0.0
    ops = _field(data, "op_overhead", dict, where)
    at = f"{where}: op_overhead"
    plain_s, dtensor_s = (_positive(ops, k, at) for k in ("plain_s", "dtensor_s"))
    per_op = [_positive(ops, k, at) if k in ops else CHAIN_DISPATCHES for k in ("plain_dispatches", "dtensor_dispatches")]
    return plain_s / per_op[0], dtensor_s / per_op[1]


def _transcendental(data: dict[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    """(op, seconds per element) of each op measured; () for profiles written before them."""
    if "transcendental" not in data:
        return ()
    rows = data["transcendental"]
    if not isinstance(rows, list) or not rows:
        raise InvalidClusterError(f"{where}: transcendental must be a non-empty list of {{op, elements, seconds}}, "
                                  f"got {rows!r}")
    out = []
    for i, row in enumerate(rows):
        at = f"{where}: transcendental[{i}]"
        op = row.get("op") if isinstance(row, dict) else None
        if op not in TRANSCENDENTAL_OPS:
            raise InvalidClusterError(f"{at}: op must be one of {TRANSCENDENTAL_OPS}, got {op!r}")
        out.append((op, _positive(row, "seconds", at) / _positive(row, "elements", at)))
    return tuple(out)


def tier_from_profile(data: dict[str, Any], where: str, processes: int) -> Tier:
    table = _field(data, "collectives", dict, where)
    if Collective.ALL_REDUCE not in table:
        raise InvalidClusterError(f"{where}: collectives lacks 'all-reduce'; it has {sorted(table)}")
    fitted = []
    for kind, points in sorted(table.items()):
        try:
            Collective(kind)
        except ValueError:
            raise InvalidClusterError(f"{where}: collectives has unknown kind {kind!r}; expected among "
                                      f"{[str(c) for c in Collective]}") from None
        rows = _points(table, kind, ("group_size", "bytes", "seconds"), f"{where}: collectives")
        for size in sorted({int(r["group_size"]) for r in rows}):
            at = f"{where}: collectives[{kind!r}] over {size} ranks"
            if size < 2 or size > processes:
                raise InvalidClusterError(f"{at}: a group must have 2 to processes({processes}) ranks")
            fitted.append((kind, size, *_fit_collective(kind, size, [r for r in rows if r["group_size"] == size], at)))
    widest = max((f for f in fitted if f[0] == Collective.ALL_REDUCE), key=lambda f: f[1])
    depth = 2 * math.ceil(math.log2(widest[1]))
    return Tier(name="measured", kind=TierKind.SHARED_MEMORY, domain_size=processes, bandwidth_Bps=widest[3],
                latency_s=widest[2] / depth, measured=True, collectives=tuple(fitted))


def _fit_collective(kind: str, size: int, rows: list[dict[str, float]], where: str) -> tuple[float, float]:
    """(latency of a call, bus bandwidth) of t = latency + bus_bytes(kind, S, n) / B, least squares on
    relative error over the message sizes."""
    if len({r["bytes"] for r in rows}) < 2:
        raise InvalidClusterError(f"{where}: needs at least 2 message sizes, got {[r['bytes'] for r in rows]}")
    ones = [1.0 / r["seconds"] for r in rows]
    volume = [bus_bytes(kind, r["bytes"], size) / r["seconds"] for r in rows]
    inverse_bw, latency = _least_squares(volume, ones)
    if latency < 0 or inverse_bw <= 0:  # noise: keep the term that explains the times
        latency = max(latency, 0.0)
        inverse_bw = sum(v * (1 - latency * o) for v, o in zip(volume, ones)) / sum(v * v for v in volume)
    if inverse_bw <= 0:
        raise InvalidClusterError(f"{where}: times do not grow with the bytes moved; re-run `meshplan calibrate`")
    return latency, 1.0 / inverse_bw


def _matmul_peak(rows: list[dict[str, float]], overhead: float, where: str) -> float:
    """peak of t = flops / peak + overhead, least squares on relative error."""
    num = den = 0.0
    for r in rows:
        flops, t = 2.0 * r["m"] * r["n"] * r["k"], r["seconds"]
        num += flops / t * (1 - overhead / t)
        den += (flops / t) ** 2
    if num <= 0:
        raise InvalidClusterError(f"{where}: matmul times are not above the per-op cost {overhead:.3g} s; "
                                  "re-run `meshplan calibrate`")
    return den / num


def _least_squares(x: list[float], y: list[float]) -> tuple[float, float]:
    """(a, b) minimizing sum (a * x_i + b * y_i - 1)^2."""
    sxx, syy, sxy = sum(v * v for v in x), sum(v * v for v in y), sum(a * b for a, b in zip(x, y))
    sx, sy = sum(x), sum(y)
    det = sxx * syy - sxy * sxy
    if abs(det) <= 1e-12 * sxx * syy:
        return sx / sxx, 0.0
    return (sx * syy - sy * sxy) / det, (sy * sxx - sx * sxy) / det


def _field(data: Any, key: str, kind: type, where: str) -> Any:
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidClusterError(f"{where}: {key} must be {_NAMES[kind]}, got {value!r}")
    return value


def _positive(data: dict[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidClusterError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def _count(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidClusterError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _points(data: dict[str, Any], key: str, fields: tuple[str, ...], where: str) -> list[dict[str, float]]:
    rows = data.get(key)
    least = 1 if key == "memory_copy" else 2
    if not isinstance(rows, list) or len(rows) < least:
        raise InvalidClusterError(f"{where}: {key} must be a list of at least {least} measurements, got {rows!r}")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InvalidClusterError(f"{where}: {key}[{i}] must be an object with {list(fields)}")
        out.append({f: _positive(row, f, f"{where}: {key}[{i}]") for f in fields})
    return out


_NAMES = {dict: "an object", str: "a string", list: "a list"}
