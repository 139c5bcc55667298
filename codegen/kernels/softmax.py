"""Kernel template for scale + additive mask + softmax along the last dim, forward and backward.

    y  = softmax(scale * x + mask)            the max subtracted first, for range (Milakov and
                                              Gimelshein 2018); a row held whole in one program
    dx = scale * y * (dout - sum(dout * y))   the softmax Jacobian-vector product; only y is saved

The mask is additive (0 to keep, -inf to drop) and may cover the trailing dims of x only, e.g. an
(s, s) causal mask for (b, heads, s, s) scores: row r of x reads row ``r % mask_rows`` of the mask,
so the mask is never expanded in memory. It gets no gradient. As Megatron-LM's
FusedScaleMaskSoftmax and Triton tutorial 02 (fused softmax), which this follows.

Backward traffic, full-size tensors per element: eager's softmax backward reads dout and y and
writes a gradient (3), the add passes it through, the scale's backward reads and writes it (2): 5;
fused reads dout and y and writes dx: 3.
"""
from __future__ import annotations

from string import Template

from .patterns import Pattern, Traffic

_SOURCE = Template('''
@triton.jit
def _softmax_fwd_kernel(x_ptr, mask_ptr, out_ptr, n_rows, n_cols, mask_rows, scale,
        HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    ${traffic}
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    z = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32) * scale
    if HAS_MASK:
        mask_offs = (rows % mask_rows)[:, None].to(tl.int64) * n_cols + cols[None, :]
        z += tl.load(mask_ptr + mask_offs, mask=ok, other=0.0).to(tl.float32)
    z = tl.where(col_ok[None, :], z, float("-inf"))  # padding columns weigh nothing
    e = tl.exp(z - tl.max(z, axis=1)[:, None])
    tl.store(out_ptr + offs, e / tl.sum(e, axis=1)[:, None], mask=ok)


@triton.jit
def _softmax_bwd_kernel(dout_ptr, y_ptr, dx_ptr, n_rows, n_cols, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # memory traffic (backward), full-size tensors read + written per element: eager 5, fused 3; saves 2 (40%)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    dy = tl.load(dout_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dz = y * (dy - tl.sum(dy * y, axis=1)[:, None])
    tl.store(dx_ptr + offs, dz * scale, mask=ok)


def _softmax_mask(x, mask):
    """The mask made contiguous and its row count, after checking it covers x's trailing dims."""
    if mask is None:
        return x, 1
    if not mask.is_floating_point():
        raise ValueError(f"softmax: the mask is {mask.dtype}; pass an additive float mask (0 keeps, -inf drops)")
    if mask.requires_grad:
        raise ValueError("softmax: the mask gets no gradient here; detach it, or use eager softmax for a learned mask")
    if mask.dim() > x.dim() or tuple(x.shape[x.dim() - mask.dim():]) != tuple(mask.shape):
        raise ValueError(f"softmax: mask shape {tuple(mask.shape)} must equal the trailing dims of x's {tuple(x.shape)}")
    return mask.contiguous(), mask.numel() // max(x.shape[-1], 1)


def softmax_fwd(x, mask, scale):
    """${formula}, one pass over memory (the forward of ``softmax``)."""
    (x,), shape, n_cols = _prepare("softmax", (("x", x, False),))
    mask, mask_rows = _softmax_mask(x, mask)
    n_rows = x.numel() // max(n_cols, 1)
    out = torch.empty_like(x)
    if n_rows:
        block_m, block_n, warps = _row_launch(n_rows, n_cols)
        _softmax_fwd_kernel[(triton.cdiv(n_rows, block_m),)](x, mask, out, n_rows, n_cols, mask_rows, scale,
            HAS_MASK=mask is not x, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return out


def softmax_bwd(dout, y, scale):
    """The gradient of ``softmax`` w.r.t. x, from its output y."""
    (dout, y), shape, n_cols = _prepare("softmax backward", (("dout", dout, False), ("y", y, False)))
    n_rows = y.numel() // max(n_cols, 1)
    dx = torch.empty_like(y)
    if n_rows:
        block_m, block_n, warps = _row_launch(n_rows, n_cols)
        _softmax_bwd_kernel[(triton.cdiv(n_rows, block_m),)](dout, y, dx, n_rows, n_cols, scale,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return dx


class SoftmaxFunction(torch.autograd.Function):
    """``softmax`` with its templated backward; saves its output only."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        y = softmax_fwd(x, mask, scale)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, dout):
        (y,) = ctx.saved_tensors
        return softmax_bwd(dout, y, ctx.scale), None, None


def softmax(x, mask=None, scale=${scale}):
    """${formula}, fused, differentiable in x (${source})."""
    return SoftmaxFunction.apply(x, mask, float(scale))
''')


def softmax_source(p: Pattern, traffic: Traffic) -> str:
    """Kernels, launchers, autograd.Function and function of the ``softmax`` pattern."""
    return _SOURCE.substitute(formula=p.formula, source=p.source, scale=repr(dict(p.scalars)["scale"]),
                              traffic=traffic.comment("forward")).strip("\n") + "\n"
