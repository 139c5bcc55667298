"""``generate_module``: the source of a Python module of fused Triton kernels, for chosen patterns.

Codegen builds text only (it imports no torch and writes no file: the caller does, as DESIGN.md
keeps side effects out of codegen); the module imports torch and triton when it is loaded. For each pattern it holds the forward and backward kernels, their launchers
(``<name>_fwd``, ``<name>_bwd``), a ``torch.autograd.Function`` and a plain function
(``swiglu(a, b)``, ``add_rmsnorm(x, residual, weight, eps)``, ...).

Block sizes are chosen by rule when a launcher runs, from constants a ``BlockRules`` value fixes:

* elementwise: ``min(elementwise_block, next_pow2(n))`` elements per program, one warp per 256
  of them up to ``elementwise_warps`` (Triton tutorial 01 uses 1024 elements and 4 warps);
* row-wise: a whole row per program, ``BLOCK_N = next_pow2(n_cols)``, refused beyond
  ``row_max_bytes`` of fp32 (tutorial 05's 64 KB); ``BLOCK_M`` rows per program so that a tile
  holds up to ``row_tile_elements``; one warp per 256 tile elements, 1 to 8 (tutorial 05);
  backward programs: ``row_programs_per_sm`` per SM on a GPU, ``cpu_row_programs`` elsewhere.

The Triton interpreter (``TRITON_INTERPRET=1``) runs each program as Python over numpy arrays,
so a fixed cost per program dominates: ``INTERPRETER_RULES`` takes fewer, larger programs.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from .elementwise import elementwise_source
from .norms import FILLS, add_norm_source
from .patterns import BY_NAME, PATTERNS, Kind, Pattern, pattern
from .softmax import softmax_source


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockRules:
    elementwise_block: int = 1024
    elementwise_warps: int = 4
    row_tile_elements: int = 4096
    row_max_bytes: int = 65536
    row_programs_per_sm: int = 4
    cpu_row_programs: int = 4

    def __post_init__(self) -> None:
        for f in ("elementwise_block", "row_tile_elements", "row_max_bytes"):
            v = getattr(self, f)
            if v < 1 or v & (v - 1):
                raise ValueError(f"BlockRules.{f} must be a power of two, got {v}")
        if min(self.elementwise_warps, self.row_programs_per_sm, self.cpu_row_programs) < 1:
            raise ValueError("BlockRules: warps and program counts must be at least 1")


GPU_RULES = BlockRules()
INTERPRETER_RULES = BlockRules(elementwise_block=65536, row_tile_elements=65536, cpu_row_programs=2)

_HELPERS = '''
def _prepare(op, specs):
    """Tensors of ``specs`` ((name, tensor, is_vector), ...) made contiguous, after checking that the
    full ones share one shape and each vector spans its last dim; with that shape and last dim. A kernel
    reads memory directly, so a collective's output not yet waited for (torch's AsyncCollectiveTensor,
    what RowwiseParallel's reduction returns) is waited for first."""
    specs = [(name, t.trigger_wait() if hasattr(t, "trigger_wait") else t, vector) for name, t, vector in specs]
    full = [(name, t) for name, t, vector in specs if not vector]
    first, ref = full[0]
    for name, t in full[1:]:
        if t.shape != ref.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} but {first} has {tuple(ref.shape)}; "
                             "pass tensors of one shape (expand and copy a broadcast one first)")
    n_cols = ref.shape[-1] if ref.dim() else 1
    for name, t, vector in specs:
        if vector and tuple(t.shape) != (n_cols,):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected ({n_cols},), the last dim of {first}")
        if t.device != ref.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first} is on {ref.device}; move them to one device")
    return [t.contiguous() for _, t, _ in specs], ref.shape, n_cols


def _elementwise_launch(n):
    """(BLOCK, num_warps) for n elements, by the module's rule."""
    block = min(ELEMENTWISE_BLOCK, triton.next_power_of_2(n))
    return block, min(ELEMENTWISE_WARPS, max(1, block // 256))


def _row_launch(n_rows, n_cols):
    """(BLOCK_M, BLOCK_N, num_warps) for rows of n_cols elements held whole, by the module's rule."""
    block_n = triton.next_power_of_2(n_cols)
    if block_n * 4 > ROW_MAX_BYTES:
        raise ValueError(f"rows of {n_cols} elements take {block_n * 4} bytes of fp32 padded, over the "
                         f"{ROW_MAX_BYTES} one program holds; use the eager op for rows this long")
    block_m = max(1, min(ROW_TILE_ELEMENTS // block_n, triton.next_power_of_2(n_rows)))
    return block_m, block_n, min(max(block_m * block_n // 256, 1), 8)


def _row_programs(t):
    """Backward programs of a row-wise kernel: each loops over row tiles and writes one partial weight gradient."""
    if t.is_cuda:
        return ROW_PROGRAMS_PER_SM * torch.cuda.get_device_properties(t.device).multi_processor_count
    return CPU_ROW_PROGRAMS


def _sum_rows(t, n_cols):
    """A broadcast vector's gradient: the per-element gradient summed over rows, accumulated in fp32."""
    return t.reshape(-1, n_cols).sum(0, dtype=torch.float32).to(t.dtype)


def _new_seed():
    """A dropout seed from torch's generator, so that torch.manual_seed makes runs repeat."""
    return int(torch.randint(0, 2**31 - 1, (1,)).item())
'''

_KEEP_MASK = '''
@triton.jit
def _keep_mask_kernel(out_ptr, n_elements, p, seed, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_bounds = offs < n_elements
    tl.store(out_ptr + offs, (tl.rand(seed, offs) >= p).to(tl.float32), mask=in_bounds)


def keep_mask(shape, p, seed, device="cpu"):
    """The 0/1 keep mask (fp32) every dropout kernel here draws for ``seed``, element by flat offset."""
    out = torch.empty(shape, dtype=torch.float32, device=device)
    n = out.numel()
    if n:
        block, warps = _elementwise_launch(n)
        _keep_mask_kernel[(triton.cdiv(n, block),)](out, n, float(p), int(seed), BLOCK=block, num_warps=warps)
    return out
'''


def _as_pattern(item: object) -> Pattern:
    """A Pattern, a pattern's name, or a fusion (anything with a ``pattern`` name) -> the Pattern."""
    if isinstance(item, Pattern):
        return item
    if isinstance(item, str):
        return pattern(item)
    name = getattr(item, "pattern", None)
    if isinstance(name, str):
        return pattern(name)
    raise TypeError(f"generate_module takes patterns, pattern names or fusions, got {type(item).__name__}")


def pattern_source(p: Pattern) -> str:
    """The section of the module for one pattern."""
    banner = f"# ---- {p.name}: {p.formula} ({p.source}) ----\n\n"
    if p.kind is Kind.ELEMENTWISE:
        return banner + elementwise_source(p)
    if p.name in FILLS:
        return banner + add_norm_source(p, p.forward_traffic())
    if p.name == "softmax":
        return banner + softmax_source(p, p.forward_traffic())
    raise ValueError(f"row-wise pattern {p.name!r} has no kernel template; templates exist for "
                     f"{', '.join([*FILLS, 'softmax'])}")


def _exports(p: Pattern) -> list[str]:
    return [p.name, f"{p.name}_fwd", f"{p.name}_bwd", p.class_name]


def generate_module(items: Iterable[object] = PATTERNS, *, rules: BlockRules = GPU_RULES) -> str:
    """Source of a module with the fused kernels of ``items`` (patterns, their names, or fusions;
    each pattern once, in first-seen order), block sizes by ``rules``."""
    chosen = list({p.name: p for p in map(_as_pattern, items)}.values())
    if not chosen:
        raise ValueError(f"generate_module needs at least one pattern; known: {', '.join(BY_NAME)}")
    constants = "\n".join(f"{f.name.upper()} = {getattr(rules, f.name)!r}" for f in fields(rules))
    exports = [e for p in chosen for e in _exports(p)] + (["keep_mask"] if any(p.randoms for p in chosen) else [])
    doc = "\n".join(f"    {p.name}: {p.formula}" for p in chosen)
    parts = [f'"""Fused Triton kernels generated by meshplan.codegen.kernels; regenerate rather than edit.\n\n{doc}\n"""',
             "import torch\nimport triton\nimport triton.language as tl",
             f"# block-size rules (meshplan.codegen.kernels.BlockRules)\n{constants}",
             _HELPERS.strip("\n")]
    if "keep_mask" in exports:
        parts.append(_KEEP_MASK.strip("\n"))
    parts += [pattern_source(p).rstrip("\n") for p in chosen]
    parts.append(f"__all__ = {exports!r}")
    return "\n\n\n".join(parts) + "\n"

