"""Hardware values: an accelerator, the tiers of the interconnect, and a cluster of them.

A cluster is ``nodes x gpus_per_node`` accelerators. Its interconnect is a tuple of tiers from the
inside out; a tier connects ``domain_size`` consecutive ranks (8 for an NVLink node, 72 for an NVL72
rack, every rank for the network) at ``bandwidth_Bps`` per GPU and per direction, the nominal link
rate that bounds NCCL's bus bandwidth (``busbw``, nccl-tests ``doc/PERFORMANCE.md``: "should reflect
the speed of the hardware bottleneck").

Nominal is not achievable. One factor per kind of tier turns one into the other
(``BUS_EFFICIENCY``), never a factor per benchmark:

* scale-up (NVLink/NVSwitch, xGMI, ICI): 0.80. NCCL's maintainer: "450GB/s is the line rate. With
  the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s"
  (NVIDIA/nccl-tests issue #212, S. Jeaugey, 2024) -> 370/450 = 0.82, rounded down.
* scale-out (InfiniBand, RoCE, DCN): 0.90. "you should get ... 24GB/s inter-node" on 200 Gb/s HDR
  = 25 GB/s (NVIDIA/nccl issue #412) and "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards
  and we measure 192GB/s AllReduce BusBW" (NVIDIA/nccl issue #812, quoted in #1576) -> 0.96,
  rounded down to 0.90 for congestion at scale.
* shared-memory (gloo between CPU processes): 1.0; the cpu preset's numbers are already effective
  placeholders, to be replaced by ``meshplan calibrate``.

A tier measured by ``meshplan calibrate`` (``profile.py``) is already achievable (``measured``: no
factor) and carries, per collective kind and group size, the latency of one call and the bus
bandwidth fitted to the timings.

Everything here is a frozen value; nothing queries the machine.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ..ir.errors import InvalidClusterError
from ..ir.limits import MAX_GPUS

DTYPES = ("float32", "bfloat16", "float16", "float8", "float4")
# elementwise ops whose time a CPU profile measures (tanh, exp, sqrt bound them, not memory): the
# forward and backward of GELU (tanh approximation) and of log-softmax (the cross-entropy's), and the
# square root of Adam's second moment
TRANSCENDENTAL_OPS = ("gelu", "gelu_backward", "log_softmax", "log_softmax_backward", "sqrt")
# glibc malloc serves a request at or above M_MMAP_THRESHOLD with fresh pages from mmap and unmaps
# them on free; the threshold adapts to freed chunks but never beyond DEFAULT_MMAP_THRESHOLD_MAX,
# 4 * 1024 * 1024 * sizeof(long) = 32 MiB on 64-bit (glibc malloc/malloc.c). So on a CPU every tensor
# of 32 MiB or more is new memory whose pages fault on first write; smaller ones reuse the heap.
FRESH_PAGES_BYTES = 32 << 20


class TierKind(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_OUT = "scale-out"
    SHARED_MEMORY = "shared-memory"


BUS_EFFICIENCY = {TierKind.SCALE_UP: 0.80, TierKind.SCALE_OUT: 0.90, TierKind.SHARED_MEMORY: 1.0}


def _positive(owner: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidClusterError(f"{owner}: {name} must be a positive number, got {value!r}")


def _fraction(owner: str, name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise InvalidClusterError(f"{owner}: {name} must be a fraction in (0, 1], got {value!r}")


def _set_curve(accel: "Accelerator", who: str, name: str, point_ok: Callable[..., bool], rule: str) -> None:
    """Store ``accel.name`` (points ``(sequence length, value, ...)``) as tuples, refusing it unless the lengths
    increase and every point passes ``point_ok``; ``rule`` says what is needed."""
    curve = tuple(tuple(r) for r in getattr(accel, name))
    object.__setattr__(accel, name, curve)
    lengths = [r[0] for r in curve]
    if lengths != sorted(set(lengths)) or not all(point_ok(*r) for r in curve):
        raise InvalidClusterError(f"{who}: {name} needs {rule}, got {curve!r}")


def _on_log2_curve(curve: tuple[tuple[float, ...], ...], x: float) -> tuple[float, ...]:
    """The values of ``curve`` (points ``(x, value, ...)``, x increasing) at ``x``: linear in log2(x)
    between the points, the nearest end's beyond them."""
    if x <= curve[0][0]:
        return curve[0][1:]
    for p0, p1 in zip(curve, curve[1:]):
        if x <= p1[0]:
            w = math.log2(x / p0[0]) / math.log2(p1[0] / p0[0])
            return tuple(v0 + w * (v1 - v0) for v0, v1 in zip(p0[1:], p1[1:]))
    return curve[-1][1:]


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One GPU (or TPU chip, or CPU process): peaks, memory, and how close kernels get to them.

    ``matmul_efficiency[dtype]`` is the Maximum Achievable Matmul FLOPS over the dense peak (MAMF,
    S. Bekman, ml-engineering ``compute/accelerator``); ``attention_efficiency`` the same for the
    fused attention kernel; ``memory_efficiency`` the achievable fraction of HBM bandwidth for
    elementwise kernels; ``kernel_overhead_s`` a fixed cost per kernel (launch, ramp and tail), which
    is what makes small matmuls less efficient than large ones (see ``kernels.py``).
    """

    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    matmul_efficiency: dict[str, float]  # dtype -> achievable fraction of peak_flops[dtype]
    memory_bytes: float
    reserved_bytes: float  # CUDA context, NCCL communicators, library workspaces: never usable
    memory_bw_Bps: float
    memory_efficiency: float
    attention_efficiency: float
    kernel_overhead_s: float
    compute_units: int  # SMs (NVIDIA), CUs (AMD), matrix units (TPU): tiles of one wave
    matmul_tile_elems: int  # output elements of one matmul tile (256 x 128 on NVIDIA)
    shared_by: float = 1.0  # ranks per core when CPU processes oversubscribe the cores (a profile's P / C)
    # measured on CPU profiles only (cost_model/profile.py); the defaults leave GPU presets as they are:
    matmul_bwd_efficiency: float = 1.0  # the gradient GEMMs' (transposed layouts) rate over the forward's
    dispatch_s: float = 0.0  # framework cost of one aten op dispatched eagerly, with its autograd share
    dtensor_dispatch_s: float = 0.0  # the same for an op on DTensors (sharding propagation, wrapping)
    sync_overhead_s: float = 0.0  # a TP collective's cost after compute beyond its time among ranks in step
    fsdp_unit_s: float = 0.0  # FSDP2's framework cost per unit per forward or backward pass (hooks, buffers)
    # a DTensor parallel style's cost per module beyond its ops and collectives (from_local, to_local,
    # redistributing), forward and backward
    tp_style_fwd_s: float = 0.0
    tp_style_bwd_s: float = 0.0
    # measured seconds per element of the elementwise ops that are compute-bound on a CPU core (tanh,
    # exp): (op, s) with op in TRANSCENDENTAL_OPS; empty: every elementwise op is memory-bound
    transcendental_s_per_elem: tuple[tuple[str, float], ...] = ()
    # seconds per byte of faulting in fresh pages: what a tensor of at least FRESH_PAGES_BYTES costs
    # beyond its writes on a CPU (glibc serves it with a new mmap each time); 0 on GPUs (cached allocator)
    first_touch_s_per_byte: float = 0.0
    # measured (head dim, forward efficiency, backward time over forward) of the fused attention, by
    # head dim (CPU profiles); empty: attention_efficiency and a backward of 2.5 forwards at every head dim
    attention_by_head_dim: tuple[tuple[float, float, float], ...] = ()
    # published (sequence length, efficiency) of the fused attention, forward + backward, causal (GPU presets:
    # the kernel's tiles fill the SMs better as the sequence grows); empty: attention_efficiency at every length
    attention_by_seq_len: tuple[tuple[float, float], ...] = ()
    # published (sequence length, forward efficiency, backward time over forward) of cuDNN's fused attention
    # (what Transformer Engine runs: ``Software.attention_kernel == "cudnn"``), causal, bf16, head dim 128;
    # empty: the program's attention is costed as the default kernel's above
    cudnn_attention_by_seq_len: tuple[tuple[float, float, float], ...] = ()
    # measured (window, head dim, forward efficiency, backward time over forward) of cuDNN's fused attention over a
    # sliding window (its executed, windowed FLOPs over the peak): a short window runs a few key tiles per query
    # tile, far below the full-sequence rate; empty: a windowed layer at the full kernel's rate
    cudnn_window_attention: tuple[tuple[float, float, float, float], ...] = ()
    # dense 16-bit tensor-core FLOPs an SM issues per exponential of its special function units (MUFU.EX2), at
    # their peak rates: above 4 x head dim the attention forward's softmax, one exponential per (query, key) pair
    # against 4 x head dim FLOPs, outlasts its matmuls (``attention_at``); 0: not known, no such bound
    flops_per_exp: float = 0.0
    # bytes per second, each direction, between one GPU and host memory (PCIe, NVLink-C2C): what offloaded
    # activations cross; 0: none (a CPU rank's activations are already in host memory)
    host_link_Bps: float = 0.0
    # bytes of host memory per GPU (the node's DRAM over its GPUs): what offloaded activations may fill; 0: not
    # known, not checked
    host_memory_bytes: float = 0.0
    # a communication kernel overlaps a persistent GEMM only where the host's launch order is the GPU's order
    # (CUDA_DEVICE_MAX_CONNECTIONS=1): NVIDIA GPUs before Blackwell. A program that needs more hardware queues for
    # another overlap (Megatron's 1F1B A2A overlap) then loses its TP comm-GEMM overlap (``layer_cost._comm``)
    ordered_comm_overlap: bool = False
    # c: the rate at which published runs on this accelerator's family ran the compute the model prices outside the
    # attention core, against that price (``bench/reference_runs.py --write-calibration``, ``fit_factor``): what
    # the model does not price (launches waiting on the host, kernel tails, clocks under load) is (1/c - 1) of that
    # compute, the step's ``unpriced`` time (``estimate.calibrated``). 1: none (the default, CPU profiles,
    # accelerators without published runs)
    calibration: float = 1.0
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        who = f"accelerator {self.name!r}"
        object.__setattr__(self, "peak_flops", dict(self.peak_flops))
        object.__setattr__(self, "matmul_efficiency", dict(self.matmul_efficiency))
        if not self.peak_flops:
            raise InvalidClusterError(f"{who}: peak_flops is empty; give at least one of {DTYPES}")
        for dtype, flops in self.peak_flops.items():
            if dtype not in DTYPES:
                raise InvalidClusterError(f"{who}: peak_flops has unknown dtype {dtype!r}; expected among {DTYPES}")
            _positive(who, f"peak_flops[{dtype!r}]", flops)
        if set(self.matmul_efficiency) != set(self.peak_flops):
            raise InvalidClusterError(f"{who}: matmul_efficiency covers {sorted(self.matmul_efficiency)} but "
                                      f"peak_flops covers {sorted(self.peak_flops)}; give one per dtype")
        for dtype, eff in self.matmul_efficiency.items():
            _fraction(who, f"matmul_efficiency[{dtype!r}]", eff)
        for name in ("memory_bytes", "memory_bw_Bps", "compute_units", "matmul_tile_elems"):
            _positive(who, name, getattr(self, name))
        for name in ("memory_efficiency", "attention_efficiency"):
            _fraction(who, name, getattr(self, name))
        if not 0 <= self.reserved_bytes < self.memory_bytes:
            raise InvalidClusterError(f"{who}: reserved_bytes({self.reserved_bytes:.3g}) must be in "
                                      f"[0, memory_bytes({self.memory_bytes:.3g}))")
        if not self.kernel_overhead_s >= 0:
            raise InvalidClusterError(f"{who}: kernel_overhead_s must be >= 0, got {self.kernel_overhead_s!r}")
        if not 0 < self.matmul_bwd_efficiency <= 4:
            raise InvalidClusterError(f"{who}: matmul_bwd_efficiency must be in (0, 4], got {self.matmul_bwd_efficiency!r}")
        for name in ("dispatch_s", "dtensor_dispatch_s", "sync_overhead_s", "fsdp_unit_s", "tp_style_fwd_s",
                     "tp_style_bwd_s", "first_touch_s_per_byte"):
            if not getattr(self, name) >= 0:
                raise InvalidClusterError(f"{who}: {name} must be >= 0, got {getattr(self, name)!r}")
        object.__setattr__(self, "transcendental_s_per_elem", tuple(tuple(r) for r in self.transcendental_s_per_elem))
        for op, per_elem_s in self.transcendental_s_per_elem:
            if op not in TRANSCENDENTAL_OPS or not per_elem_s > 0:
                raise InvalidClusterError(f"{who}: transcendental_s_per_elem needs ops among {TRANSCENDENTAL_OPS} "
                                          f"with positive seconds, got ({op!r}, {per_elem_s!r})")
        object.__setattr__(self, "attention_by_head_dim", tuple(tuple(r) for r in self.attention_by_head_dim))
        for head_dim, eff, bwd_ratio in self.attention_by_head_dim:
            if not (head_dim > 0 and 0 < eff <= 1 and bwd_ratio > 0):
                raise InvalidClusterError(f"{who}: attention_by_head_dim needs (head_dim > 0, efficiency in (0, 1], "
                                          f"backward ratio > 0), got ({head_dim!r}, {eff!r}, {bwd_ratio!r})")
        if not (math.isfinite(self.host_link_Bps) and self.host_link_Bps >= 0):
            raise InvalidClusterError(f"{who}: host_link_Bps must be a finite number >= 0 (0: no host link), "
                                      f"got {self.host_link_Bps!r}")
        if not (math.isfinite(self.host_memory_bytes) and self.host_memory_bytes >= 0):
            raise InvalidClusterError(f"{who}: host_memory_bytes must be a finite number >= 0 (0: not known), "
                                      f"got {self.host_memory_bytes!r}")
        _set_curve(self, who, "attention_by_seq_len", lambda n, e: n > 0 and 0 < e <= 1,
                   "(sequence length > 0, increasing; efficiency in (0, 1]) pairs")
        _set_curve(self, who, "cudnn_attention_by_seq_len", lambda n, e, ratio: n > 0 and 0 < e <= 1 and ratio > 0,
                   "(sequence length > 0, increasing; forward efficiency in (0, 1]; backward ratio > 0) triples")
        object.__setattr__(self, "cudnn_window_attention", tuple(tuple(r) for r in self.cudnn_window_attention))
        for point in self.cudnn_window_attention:
            if len(point) != 4 or not (point[0] > 0 and point[1] > 0 and 0 < point[2] <= 1 and point[3] > 0):
                raise InvalidClusterError(f"{who}: cudnn_window_attention needs (window > 0, head dim > 0, efficiency "
                                          f"in (0, 1], backward ratio > 0) points, got {point!r}")
        if not (math.isfinite(self.flops_per_exp) and self.flops_per_exp >= 0):
            raise InvalidClusterError(f"{who}: flops_per_exp must be a finite number >= 0 (0: not known), "
                                      f"got {self.flops_per_exp!r}")
        if not isinstance(self.ordered_comm_overlap, bool):
            raise InvalidClusterError(f"{who}: ordered_comm_overlap must be true or false, "
                                      f"got {self.ordered_comm_overlap!r}")
        if isinstance(self.calibration, bool) or not (isinstance(self.calibration, (int, float))
                                                       and 0 < self.calibration <= 1):
            raise InvalidClusterError(f"{who}: calibration must be a number in (0, 1] (the share of the modelled "
                                      f"throughput runs reach; 1: none), got {self.calibration!r}")
        if isinstance(self.shared_by, bool) or not isinstance(self.shared_by, (int, float)) or not self.shared_by >= 1:
            raise InvalidClusterError(f"{who}: shared_by must be a number >= 1, got {self.shared_by!r}")
        # hashed once: the cost model's caches key on the cluster thousands of times per solve
        object.__setattr__(self, "_hash", hash((
            self.name, tuple(sorted(self.peak_flops.items())), tuple(sorted(self.matmul_efficiency.items())),
            self.memory_bytes, self.reserved_bytes, self.memory_bw_Bps, self.memory_efficiency,
            self.attention_efficiency, self.kernel_overhead_s, self.compute_units, self.matmul_tile_elems,
            self.shared_by, self.matmul_bwd_efficiency, self.dispatch_s, self.dtensor_dispatch_s,
            self.sync_overhead_s, self.fsdp_unit_s, self.tp_style_fwd_s, self.tp_style_bwd_s,
            self.transcendental_s_per_elem, self.first_touch_s_per_byte,
            self.attention_by_head_dim, self.attention_by_seq_len, self.cudnn_attention_by_seq_len,
            self.cudnn_window_attention, self.flops_per_exp, self.host_link_Bps, self.host_memory_bytes,
            self.ordered_comm_overlap, self.calibration)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_bytes - self.reserved_bytes

    def peak(self, dtype: str) -> float:
        """Dense FLOP/s in ``dtype``; a dtype the accelerator has no peak for is an error."""
        if dtype not in self.peak_flops:
            listed = ", ".join(sorted(self.peak_flops))
            raise InvalidClusterError(f"{self.name} has no {dtype} peak (it lists {listed}); "
                                      f"train in one of those dtypes or pick another cluster")
        return self.peak_flops[dtype]

    def achievable_flops(self, dtype: str) -> float:
        return self.peak(dtype) * self.matmul_efficiency[dtype]

    def attention_at(self, head_dim: float | None, seq_len: float | None = None,
                     kernel: str = "fa2", pair_dim: float | None = None) -> tuple[float, float]:
        """(efficiency, backward time over forward) of the fused attention at ``head_dim``: linear in
        log2(head dim) between the measured ones, the nearest beyond them; else, for ``kernel`` "cudnn" where
        the accelerator has cuDNN's published curve, linear in log2(``seq_len``) on it (the nearest end beyond
        it); else, where the accelerator has a published curve of its default kernel by sequence length, the
        same on that one with a backward of 2.5 forwards; else ``attention_efficiency`` and 2.5
        (``kernels.attention_fwd_bwd_s``); the last three with the forward slowed where the softmax bounds it at
        ``pair_dim`` (``softmax_bound``; ``head_dim`` where not given)."""
        if self.attention_by_head_dim and head_dim:
            return _on_log2_curve(self.attention_by_head_dim, head_dim)
        softmax = self.softmax_bound(pair_dim or head_dim)
        if kernel == "cudnn" and self.cudnn_attention_by_seq_len and seq_len:
            eff, ratio = _on_log2_curve(self.cudnn_attention_by_seq_len, seq_len)
            return eff * softmax, ratio * softmax  # the backward's time unchanged (softmax_bound)
        if self.attention_by_seq_len and seq_len:
            return _on_log2_curve(self.attention_by_seq_len, seq_len)[0] * softmax, 2.5 * softmax
        return self.attention_efficiency * softmax, 2.5 * softmax

    def softmax_bound(self, head_dim: float | None) -> float:
        """The share of the measured (head dim 128) fused-attention forward rate a kernel keeps at ``head_dim`` where
        the softmax's exponentials bound it: a (query, key) pair costs 4 x head dim matmul FLOPs and one exponential,
        so the forward runs at 4d / max(4d, R) of the tensor-core rate, R = ``flops_per_exp``; relative to head dim
        128, at most 1 (what else bounds the kernel is in the measured rate). On Blackwell (R 512: 8192 dense BF16
        FLOPs and 16 exponentials per SM per clock, Zadouri et al. 2026, FlashAttention-4, arXiv:2603.05451) head dim
        64 halves the forward's rate; on Hopper (R 256) and Blackwell Ultra (R 256: its special function units run
        MUFU.EX2 at twice Blackwell's rate, NVIDIA technical blog 'Making Softmax More Efficient with NVIDIA Blackwell
        Ultra', 2026) it does not. The backward, which recomputes the same exponentials under 10 x head dim FLOPs
        (five matmuls), is bound by the matmuls and shared memory, not the exponentials: its time stays."""
        if not self.flops_per_exp or not head_dim:
            return 1.0
        rate = lambda d: 4.0 * d / max(4.0 * d, self.flops_per_exp)  # noqa: E731
        return min(1.0, rate(head_dim) / rate(128.0))

    def window_attention_at(self, window: float, head_dim: float) -> tuple[float, float] | None:
        """(forward efficiency, backward time over forward) of cuDNN's sliding-window attention measured at this
        ``window`` and ``head_dim`` (``cudnn_window_attention``), or None where it was not."""
        for w, d, eff, ratio in self.cudnn_window_attention:
            if w == window and d == head_dim:
                return eff, ratio
        return None

    def transcendental_s(self, op: str, elems: float) -> float | None:
        """Measured seconds of ``op`` over ``elems`` elements, or None where it was not measured."""
        rate = dict(self.transcendental_s_per_elem).get(op)
        return None if rate is None else rate * elems


@dataclass(frozen=True, slots=True, kw_only=True)
class Tier:
    """One level of the interconnect: ``domain_size`` consecutive ranks, per-GPU one-way bandwidth."""

    name: str
    kind: TierKind
    domain_size: int
    bandwidth_Bps: float  # nominal, per GPU, one direction
    latency_s: float  # per algorithm step (alpha)
    measured: bool = False  # numbers from a calibration: already achievable
    # measured (kind, group_size, latency of one call in s, bus bandwidth in B/s)
    collectives: tuple[tuple[str, int, float, float], ...] = ()

    def __post_init__(self) -> None:
        who = f"tier {self.name!r}"
        object.__setattr__(self, "collectives", tuple(tuple(c) for c in self.collectives))
        for kind, size, call_s, bus in self.collectives:
            _positive(who, f"collectives[{kind!r}, {size}] bandwidth_Bps", bus)
            if not call_s >= 0 or not size >= 2:
                raise InvalidClusterError(f"{who}: collectives[{kind!r}, {size!r}] needs a group of at least 2 and "
                                          f"a latency >= 0, got {call_s!r}")
        try:
            object.__setattr__(self, "kind", TierKind(self.kind))
        except ValueError:
            raise InvalidClusterError(f"{who}: kind {self.kind!r} is not one of "
                                      f"{[str(k) for k in TierKind]}") from None
        if isinstance(self.domain_size, bool) or not isinstance(self.domain_size, int) or self.domain_size < 1:
            raise InvalidClusterError(f"{who}: domain_size must be a positive integer, got {self.domain_size!r}")
        _positive(who, "bandwidth_Bps", self.bandwidth_Bps)
        if not self.latency_s >= 0:
            raise InvalidClusterError(f"{who}: latency_s must be >= 0, got {self.latency_s!r}")

    @property
    def achievable_Bps(self) -> float:
        return self.bandwidth_Bps * (1.0 if self.measured else BUS_EFFICIENCY[self.kind])

    def _measured(self, collective: str, group_size: int) -> tuple[int, float, float] | None:
        """(group size, call latency, bus bandwidth) measured for ``collective`` at the group size
        nearest to ``group_size`` (in log2), or None."""
        rows = [(size, call_s, bus) for kind, size, call_s, bus in self.collectives if kind == collective]
        if not rows:
            return None
        return min(rows, key=lambda r: (abs(math.log2(r[0]) - math.log2(max(group_size, 2))), r[0]))

    def bus_Bps(self, collective: str, group_size: int = 2) -> float:
        """Achievable bus bandwidth of ``collective`` over ``group_size`` ranks here."""
        row = self._measured(collective, group_size)
        return self.achievable_Bps if row is None else row[2]

    def latency_of(self, collective: str, group_size: int, steps_factor: float = 1.0,
                   steps: float | None = None) -> float:
        """Seconds of latency of one ``collective`` over ``group_size`` ranks: ``steps`` hops on this tier
        (default the tree depth ceil(log2 n); ``collectives.ring_steps`` for a ring) times ``latency_s``, or
        the measured call latency scaled by those steps from the nearest measured size's."""
        depth = math.ceil(math.log2(max(group_size, 2))) if steps is None else steps
        row = self._measured(collective, group_size)
        if row is None:
            return self.latency_s * steps_factor * depth
        row_steps = math.ceil(math.log2(row[0])) if steps is None else row[0] - 1
        return row[1] * depth / row_steps


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``nodes x gpus_per_node`` accelerators joined by ``tiers`` (inner to outer)."""

    accelerator: Accelerator
    nodes: int
    gpus_per_node: int
    tiers: tuple[Tier, ...]
    name: str = "custom"
    spec: str = field(default="")
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in ("nodes", "gpus_per_node"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidClusterError(f"cluster {self.name!r}: {key} must be a positive integer, got {v!r}")
        if self.world_size > MAX_GPUS:
            raise InvalidClusterError(f"cluster {self.name!r}: nodes({self.nodes}) * gpus_per_node({self.gpus_per_node}) = "
                                      f"{self.world_size} GPUs exceeds the limit of {MAX_GPUS} (10^7, "
                                      "ir/limits.MAX_GPUS) meshplan plans for; check the node count for a typo")
        object.__setattr__(self, "tiers", tuple(self.tiers))
        if not self.tiers:
            raise InvalidClusterError(f"cluster {self.name!r}: needs at least one interconnect tier")
        last = 0
        for tier in self.tiers:
            if tier.domain_size < last:
                raise InvalidClusterError(f"cluster {self.name!r}: tiers must go from inner to outer, but "
                                          f"{tier.name!r} reaches {tier.domain_size} ranks < {last} of the tier inside")
            last = tier.domain_size
        if last < self.world_size:
            raise InvalidClusterError(f"cluster {self.name!r}: the outermost tier {self.tiers[-1].name!r} reaches "
                                      f"{last} ranks but the cluster has {self.nodes} * {self.gpus_per_node} = "
                                      f"{self.world_size}")
        if not self.spec:
            object.__setattr__(self, "spec", f"{self.name}:{self.nodes}x{self.gpus_per_node}")
        object.__setattr__(self, "_hash", hash((self.accelerator, self.nodes, self.gpus_per_node, self.tiers,
                                                self.name, self.spec)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def cpu_ranks(self) -> bool:
        """Ranks are processes sharing a machine's memory and cores (the innermost tier is shared
        memory): a collective is copied by the cores that compute, so nothing runs beside compute."""
        return self.tiers[0].kind == TierKind.SHARED_MEMORY

    @classmethod
    def preset(cls, name: str, nodes: int = 1, gpus_per_node: int | None = None) -> "Cluster":
        """A cluster from a preset data file, e.g. ``Cluster.preset("h100-sxm", nodes=16)``."""
        from .catalog import load_preset

        return load_preset(name, nodes=nodes, gpus_per_node=gpus_per_node)

    @classmethod
    def from_profile(cls, path: str, *, expect_kind: str | None = None) -> "Cluster":
        """The machine ``meshplan calibrate`` measured (``profile.py``); with ``expect_kind``, refuse a
        profile measured on another kind of machine."""
        from .profile import cluster_from_profile

        return cluster_from_profile(path, expect_kind=expect_kind)

    def __str__(self) -> str:
        return self.spec
