"""Time of one kernel on one accelerator: a roofline, wave quantization and a fixed cost per kernel.

A matmul ``(m, k) @ (k, n)`` takes::

    t = max(2*m*n*k / (peak[dtype] * matmul_efficiency[dtype] * W/(W + 1/2)),
            (m*k + k*n + m*n) * bytes / (memory_bw * memory_efficiency)) + kernel_overhead

* ``matmul_efficiency`` is the Maximum Achievable Matmul FLOPS over the peak, measured at the best
  shape (MAMF), where every SM is busy to the last wave.
* Wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide", sections on tile and
  wave quantization, with A100's 108 SMs and 256x128 tiles as the example): the output is cut
  into tiles computed one per SM; W = m*n / (tile * SMs) waves, and the last, partial wave leaves
  SMs idle. Averaged over shapes half a wave is lost, hence W/(W + 1/2): a matmul of one wave runs
  at 2/3 of MAMF, one of ten waves at 95%. When the output is too small for one wave, cuBLAS
  splits k (split-K) into chunks of ``SPLIT_K`` to fill the SMs, up to one wave.
* The memory side of the roofline binds when the arithmetic intensity m*n*k/(mk+kn+mn) falls under
  the ridge peak/bandwidth (~300 FLOP/byte on H100): thin matmuls run at memory speed.
* The fixed cost per kernel (launch, ramp-up, tail) matters for small matmuls only.

Together these make smaller matmuls less efficient than larger ones, with no per-model constant.

The backward of a matmul is two matmuls of the same FLOPs with the shapes permuted: the input
gradient ``(m, n) @ (n, k)`` and the weight gradient ``(k, m) @ (m, n)``.

Fused attention (FlashAttention, Dao 2023; PyTorch SDPA) runs at ``attention_efficiency`` of peak
and skips the masked half of a causal score matrix; its backward does 5 matmuls to the forward's 2
(it recomputes the scores), hence 2.5x the forward time. A CPU profile measures both at several head
dims (the CPU kernel's rate depends on it) and the model's head dim is interpolated between them.

Elementwise ops are memory-bound (``memory_time_s``), except on a CPU core those that evaluate tanh
or exp per element: GELU's tanh approximation and the cross-entropy's log-softmax, forward and
backward, run below the memory rate there. A CPU profile measures each over a tensor larger than the
caches (``runtime/calibrate.py``), and ``transcendental_excess_s`` adds what that rate costs beyond
the memory-bound time. A CPU also pays to fault in the pages of each new tensor of 32 MiB or more
(``hardware.FRESH_PAGES_BYTES``: glibc maps those afresh every time), at the per-byte cost a profile
measured (``fresh_pages_s``).

Plain attention (Megatron-LM's ``CoreAttention`` before FlashAttention) writes the scores: per head
``S = Q K^T`` is a batched matmul ``(s, d) @ (d, s)`` whose s^2 output goes to memory, a fused
scale-mask-softmax reads and writes it (4 bytes per score at 2-byte elements), an attention dropout
reads it and writes its output and a 1-byte mask (5), and ``P V`` reads it back. Causal masking
saves nothing: the whole s x s matrix is computed. Every batched matmul is timed with the roofline
above, and with d = 64..128 they sit under the ridge (intensity ~ d FLOP/byte against ~166 on
A100), so the s^2 traffic sets their time. The backward has four batched matmuls (dP = dO V^T,
dV = P^T dO, dQ = dS K, dK = dS^T Q), a dropout backward (5 bytes per score) and a softmax backward
(reads the gradient and the saved output, writes one: 6).
"""
from __future__ import annotations

from .hardware import FRESH_PAGES_BYTES, Accelerator
from .memory import GEMM_OPERAND_BYTES


SPLIT_K = 2048


def wave_efficiency(accel: Accelerator, m: float, n: float, k: float) -> float:
    """W / (W + 1/2), W the waves of output tiles over the compute units (split-K up to one wave)."""
    waves = m * n / (accel.matmul_tile_elems * accel.compute_units)
    if waves < 1.0:
        waves = min(1.0, waves * max(1.0, k / SPLIT_K))
    return waves / (waves + 0.5)


def matmul_time_s(accel: Accelerator, dtype: str, m: float, n: float, k: float, elem_bytes: int) -> float:
    if m * n * k == 0:
        return 0.0  # no work, and no kernel: torch returns an empty (or zero-filled) result without one
    compute_s = 2.0 * m * n * k / (accel.achievable_flops(dtype) * wave_efficiency(accel, m, n, k))
    memory_s = (m * k + k * n + m * n) * elem_bytes / (accel.memory_bw_Bps * accel.memory_efficiency)
    return max(compute_s, memory_s) + accel.kernel_overhead_s


def matmul_fwd_bwd_s(accel: Accelerator, dtype: str, m: float, n: float, k: float,
                     elem_bytes: int) -> tuple[float, float]:
    """(forward, backward) seconds of ``(m, k) @ (k, n)``."""
    fwd = matmul_time_s(accel, dtype, m, n, k, elem_bytes)
    bwd = (matmul_time_s(accel, dtype, m, k, n, elem_bytes)  # dX = dY (m, n) @ W^T (n, k)
           + matmul_time_s(accel, dtype, k, n, m, elem_bytes))  # dW = X^T (k, m) @ dY (m, n)
    # transposed operand layouts run at their own measured rate on CPUs (1.0 on GPU presets)
    return fwd, bwd / accel.matmul_bwd_efficiency


def memory_time_s(accel: Accelerator, moved_bytes: float, kernels: int) -> float:
    """Elementwise/normalization kernels that read and write ``moved_bytes`` in total."""
    return moved_bytes / (accel.memory_bw_Bps * accel.memory_efficiency) + kernels * accel.kernel_overhead_s


def transcendental_excess_s(accel: Accelerator, op: str, elems: float, moved_bytes: float) -> float:
    """Seconds ``op`` (``hardware.TRANSCENDENTAL_OPS``) over ``elems`` elements takes at its measured
    rate beyond the memory-bound time of its ``moved_bytes``; 0 where the accelerator did not measure
    it (GPU presets: memory bounds every elementwise op there)."""
    measured = accel.transcendental_s(op, elems)
    if measured is None:
        return 0.0
    return max(0.0, measured - moved_bytes / (accel.memory_bw_Bps * accel.memory_efficiency))


def fresh_pages_s(accel: Accelerator, tensor_bytes: float, count: int = 1) -> float:
    """Seconds of faulting in ``count`` new tensors of ``tensor_bytes`` each: only those of at least
    ``FRESH_PAGES_BYTES`` get fresh pages (CPU profiles; 0 on GPU presets)."""
    if tensor_bytes < FRESH_PAGES_BYTES:
        return 0.0
    return count * tensor_bytes * accel.first_touch_s_per_byte


def plain_attention_fwd_bwd_s(accel: Accelerator, dtype: str, *, batch_heads: float, q_len: float, kv_len: float,
                              head_dim: float, elem_bytes: int, dropout: bool) -> tuple[float, float]:
    """(forward, backward) seconds of an unfused attention core over ``batch_heads`` = b * a/tp heads
    of ``q_len`` queries against ``kv_len`` keys."""
    m, s, d = batch_heads * q_len, kv_len, head_dim
    scores = m * s  # b * a * s_q * s_k elements
    scores_like = matmul_time_s(accel, dtype, m, s, d, elem_bytes)  # (s, d) @ (d, s) -> s^2: QK^T, dP
    values_like = matmul_time_s(accel, dtype, m, d, s, elem_bytes)  # (s, s) @ (s, d): PV, dV, dQ, dK
    fwd_pass = (4 + (5 if dropout else 0)) * scores / 2 * elem_bytes  # softmax r+w; dropout r+w+mask
    bwd_pass = (6 + (5 if dropout else 0)) * scores / 2 * elem_bytes
    kernels = 2 if dropout else 1
    fwd = scores_like + values_like + memory_time_s(accel, fwd_pass, kernels)
    bwd = scores_like + 3 * values_like + memory_time_s(accel, bwd_pass, kernels)
    return fwd, bwd


def unquantized_dtype(accel: Accelerator, dtype: str) -> str:
    """The dtype of work a plan in ``dtype`` does outside Transformer Engine's quantized GEMMs (fused attention,
    Megatron-Core's output layer and MoE router): bf16 under FP8 and NVFP4 (``memory.GEMM_OPERAND_BYTES``), where
    the accelerator has a bf16 rate; else ``dtype`` itself."""
    return "bfloat16" if dtype in GEMM_OPERAND_BYTES and "bfloat16" in accel.peak_flops else dtype


def attention_fwd_bwd_s(accel: Accelerator, dtype: str, counted_flops: float,
                        causal: bool = True, head_dim: float | None = None, speed: float = 1.0,
                        seq_len: float | None = None, kernel: str = "fa2",
                        pair_dim: float | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of a fused attention core whose forward counts ``counted_flops``
    (4*b*s_q*s_k*h, causal counted as full), with heads ``head_dim`` wide: at the efficiency and
    backward ratio measured at that head dim where the accelerator has them (``Accelerator.attention_at``);
    ``speed``: the program's kernel's rate over the one the accelerator measured (``Software.attention_speed``);
    ``seq_len``: the length one kernel call runs over (its queries), for an accelerator's curve by length;
    ``kernel``: the program's fused-attention kernel, "fa2" or "cudnn" (``Software.attention_kernel``);
    ``pair_dim``: a quarter of the matmul FLOPs a (query, key) pair costs per head, where the softmax's exponentials
    may bound the forward (``Accelerator.softmax_bound``): the head dim, or e.g. (192 + 128) / 2 for MLA's q/k and v
    heads; ``head_dim`` where not given."""
    compute_dtype = unquantized_dtype(accel, dtype)
    executed = counted_flops * (0.5 if causal else 1.0)
    efficiency, bwd_ratio = accel.attention_at(head_dim, seq_len, kernel, pair_dim=pair_dim)
    fwd = executed / (accel.peak(compute_dtype) * efficiency * speed) + accel.kernel_overhead_s
    return fwd, bwd_ratio * fwd
