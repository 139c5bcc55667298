"""Kernel templates for a residual add fused with RMSNorm or LayerNorm, forward and backward.

One template serves both norms; the generator fills in the centering (LayerNorm subtracts the
row mean, RMSNorm does not) and the bias. With ``s = x + residual``, ``c = s - mean(s)`` for
LayerNorm (``c = s`` for RMSNorm), ``rstd = 1 / sqrt(mean(c^2) + eps)``, ``s_hat = c * rstd``:

    out = s_hat * w (+ b)                                   forward; s is also written: the new residual
    ds  = rstd * (g - mean(g) - s_hat * mean(g * s_hat))    g = dout * w; the mean(g) term for LayerNorm only
          + dresidual                                       the new residual's own gradient
    dw  = sum over rows of dout * s_hat,  db = sum over rows of dout

(Ba et al. 2016, LayerNorm; Zhang and Sennrich 2019, RMSNorm; the backward as in Triton tutorial
05.) A program holds BLOCK_M whole rows; the backward's programs each loop over row tiles and
sum their weight gradient into one partial row, which the launcher adds up (deterministic, unlike
the tutorial's locks).

Backward traffic, full-size tensors per element: eager reads dout and s and writes ds in the norm's
backward, then autograd adds the residual's gradient (reads 2, writes 1): 6; fused reads dout,
dresidual and s and writes ds: 4.
"""
from __future__ import annotations

import re
from string import Template

from .patterns import Pattern, Traffic

_FORWARD = Template('''
@triton.jit
def _${name}_fwd_kernel(x_ptr, residual_ptr, weight_ptr, ${bias_ptr}out_ptr, res_out_ptr, mean_ptr, rstd_ptr,
        n_rows, n_cols, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    ${traffic}
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    ok = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    s = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    s += tl.load(residual_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + offs, s, mask=ok)
    ${center}
    rstd = tl.rsqrt(tl.sum(c * c, axis=1) / n_cols + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    w = tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = c * rstd[:, None] * w[None, :]
    ${add_bias}
    tl.store(out_ptr + offs, y, mask=ok)
''')

_BACKWARD = Template('''
@triton.jit
def _${name}_bwd_kernel(dout_ptr, dres_ptr, s_ptr, weight_ptr, mean_ptr, rstd_ptr, ds_ptr, dw_ptr, db_ptr,
        n_rows, n_cols, HAS_DRES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # memory traffic (backward), full-size tensors read + written per element: eager 6, fused 4; saves 2 (33%)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    w = tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for tile in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        ok = row_ok[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        dy = tl.load(dout_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        s = tl.load(s_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        ${s_hat}
        g = dy * w[None, :]
        ds = g - s_hat * (tl.sum(g * s_hat, axis=1) / n_cols)[:, None]
        ${center_grad}
        ds = ds * rstd[:, None]
        if HAS_DRES:
            ds += tl.load(dres_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(ds_ptr + offs, ds, mask=ok)
        dw += tl.sum(dy * s_hat, axis=0)
        ${db_update}
    tl.store(dw_ptr + pid * n_cols + cols, dw, mask=col_ok)
    tl.store(db_ptr + pid * n_cols + cols, db, mask=col_ok)
''')

_LAUNCHERS = Template('''
def ${name}_fwd(x, residual, weight, ${bias_arg}eps):
    """${formula}: (out, new residual, mean, rstd); mean and rstd per row, fp32."""
    (x, residual, weight${bias_tuple}), shape, n_cols = _prepare("${name}", (("x", x, False), ("residual", residual, False), ("weight", weight, True)${bias_spec}))
    n_rows = x.numel() // max(n_cols, 1)
    out, res = torch.empty_like(x), torch.empty_like(x)
    mean = torch.zeros(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows:
        block_m, block_n, warps = _row_launch(n_rows, n_cols)
        _${name}_fwd_kernel[(triton.cdiv(n_rows, block_m),)](x, residual, weight, ${bias_arg}out, res, mean, rstd,
            n_rows, n_cols, eps, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return out, res, mean, rstd


def ${name}_bwd(dout, dres, s, weight, mean, rstd):
    """Gradients of ``${name}`` w.r.t. (x, residual, weight${bias_doc}); ``dres`` (the new residual's) may be None."""
    dout = torch.zeros_like(s) if dout is None else dout
    dres_spec = () if dres is None else (("dres", dres, False),)
    (dout, s, weight, *rest), shape, n_cols = _prepare(
        "${name} backward", (("dout", dout, False), ("s", s, False), ("weight", weight, True)) + dres_spec)
    dres = rest[0] if rest else None
    n_rows = s.numel() // max(n_cols, 1)
    ds = torch.empty_like(s)
    block_m, block_n, warps = _row_launch(max(n_rows, 1), n_cols)
    programs = max(1, min(triton.cdiv(n_rows, block_m), _row_programs(s)))
    dw = torch.zeros((programs, n_cols), dtype=torch.float32, device=s.device)
    db = torch.zeros((programs, n_cols), dtype=torch.float32, device=s.device)
    if n_rows:
        _${name}_bwd_kernel[(programs,)](dout, dout if dres is None else dres, s, weight, mean, rstd, ds, dw, db,
            n_rows, n_cols, HAS_DRES=dres is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return ds, ds, dw.sum(0).to(weight.dtype)${bias_grad}


class ${cls}(torch.autograd.Function):
    """``${name}`` with its templated backward; saves the new residual, weight, and per-row statistics."""

    @staticmethod
    def forward(ctx, x, residual, weight, ${bias_arg}eps):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros to read
        out, res, mean, rstd = ${name}_fwd(x, residual, weight, ${bias_arg}eps)
        ctx.save_for_backward(res, weight, mean, rstd)
        return out, res

    @staticmethod
    def backward(ctx, dout, dres):
        s, weight, mean, rstd = ctx.saved_tensors
        return ${name}_bwd(dout, dres, s, weight, mean, rstd) + (None,)


def ${name}(x, residual, weight, ${bias_arg}eps=${eps}):
    """${formula}, fused, differentiable (${source}). Returns (out, new residual)."""
    return ${cls}.apply(x, residual, weight, ${bias_arg}float(eps))
''')

_RMS = dict(bias_ptr="", center="c = s", add_bias="", s_hat="s_hat = s * rstd[:, None]", center_grad="", db_update="",
            bias_arg="", bias_tuple="", bias_spec="", bias_doc="", bias_grad="")
_LAYER = dict(
    bias_ptr="bias_ptr, ",
    center="mean = tl.sum(s, axis=1) / n_cols\n    tl.store(mean_ptr + rows, mean, mask=row_ok)\n"
           "    c = tl.where(ok, s - mean[:, None], 0.0)",
    add_bias="y += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]",
    s_hat="mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)\n"
          "        s_hat = tl.where(ok, (s - mean[:, None]) * rstd[:, None], 0.0)",
    center_grad="ds -= (tl.sum(g, axis=1) / n_cols)[:, None]",
    db_update="db += tl.sum(dy, axis=0)",
    bias_arg="bias, ", bias_tuple=", bias", bias_spec=', ("bias", bias, True)', bias_doc=", bias",
    bias_grad=", db.sum(0).to(weight.dtype)")
FILLS = {"add_rmsnorm": _RMS, "add_layernorm": _LAYER}


def add_norm_source(p: Pattern, traffic: Traffic) -> str:
    """Kernels, launchers, autograd.Function and function of ``add_rmsnorm`` or ``add_layernorm``."""
    fill = FILLS[p.name]
    common = dict(name=p.name, cls=p.class_name, formula=p.formula, source=p.source,
                  eps=repr(dict(p.scalars)["eps"]), traffic=traffic.comment("forward"))
    parts = (_FORWARD.substitute(common, **fill), _BACKWARD.substitute(common, **fill),
             _LAUNCHERS.substitute(common, **fill))
    text = "\n".join(part.strip("\n") + "\n\n" for part in parts)
    return re.sub(r"(?m)^[ \t]+\n", "", text)  # the lines an empty fill (RMSNorm's bias) leaves
