"""Triton source for an elementwise fused chain, forward and backward, from its sympy expression.

The forward kernel evaluates ``out = expr(args)`` over a flat range of elements, ``BLOCK`` per
program. The backward kernel evaluates ``dout * d expr / d arg`` for every arg at once, by reverse
mode over the forward's assignments (``autodiff``), so the derivatives share their work; it recomputes the forward's intermediates
from the saved inputs instead of storing them (as Megatron-LM's fused bias-GeLU does), so the
fused op saves only its inputs for backward. A gradient that is ``dout`` itself is handed back
without a kernel store, and gradients equal to each other are stored once. Vector args (a bias)
broadcast along the last dim; their gradient is the per-element gradient summed over the rows.

Random symbols (a dropout's keep mask) are drawn in-kernel with ``tl.rand(seed, offset)`` from the
element's flat offset, so the backward draws the same mask from the same seed without storing it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .autodiff import reverse_mode
from .expr import GRAD, Lines, straight_line, symbol, to_triton
from .patterns import Broadcast, Kind, Pattern, Traffic

I = "    "


@dataclass(frozen=True, slots=True, kw_only=True)
class Backward:
    """Which tensors the backward kernel reads and writes, and where each arg's gradient comes from."""

    lines: Lines  # the distinct stored gradients' code
    loads: tuple[str, ...]  # args the derivatives use
    sources: tuple[str, ...]  # per arg: "dout" or "d{slot}"


def backward_of(p: Pattern) -> Backward:
    """The backward's code (reverse mode), which args it loads, and where each arg's gradient comes from."""
    code = reverse_mode(p.expression, p.args)
    distinct = tuple(dict.fromkeys(g for g in code.results if g != GRAD))
    sources = tuple("dout" if g == GRAD else f"d{distinct.index(g)}" for g in code.results)
    used = set().union(*(e.free_symbols for _, e in code.assigns), *(g.free_symbols for g in distinct))
    loads = tuple(a for a in p.args if symbol(a) in used)
    return Backward(lines=Lines(assigns=code.assigns if distinct else (), results=distinct), loads=loads,
                    sources=sources)


def backward_traffic(p: Pattern, bwd: Backward) -> Traffic:
    """Fused: read dout and the loaded full args, write each stored gradient, sum each vector's gradient."""
    full_loads = sum(p.broadcast_of(a) is Broadcast.FULL for a in bwd.loads)
    vectors = sum(p.broadcast_of(a) is Broadcast.VECTOR for a in p.args)
    fused = (1 if bwd.lines.results else 0) + full_loads + len(bwd.lines.results) + vectors
    return Traffic(unfused=p.eager_backward_traffic(), fused=fused)


def _scalar_args(p: Pattern) -> list[str]:
    return [s for s, _ in p.scalars] + (["seed"] if p.randoms else [])


def _load(p: Pattern, arg: str) -> str:
    where = "offs % n_cols" if p.broadcast_of(arg) is Broadcast.VECTOR else "offs"
    return f"{I}{arg} = tl.load({arg}_ptr + {where}, mask=in_bounds, other=0.0).to(tl.float32)"


def _prologue(p: Pattern, loads: tuple[str, ...]) -> list[str]:
    lines = [f"{I}pid = tl.program_id(0)",
             f"{I}offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: past 2**31 elements, int32 would wrap",
             f"{I}in_bounds = offs < n_elements"]
    lines += [_load(p, a) for a in loads]
    lines += [f"{I}{sym} = (tl.rand(seed, offs) >= {prob}).to(tl.float32)  # 1 with probability 1 - {prob}"
              for sym, prob in p.randoms]
    return lines


def _scalar_params(p: Pattern) -> str:
    return "".join(f"{n}, " for n in _scalar_args(p))


def _kernel(p: Pattern, suffix: str, ptrs: list[str], lines: Lines, outs: list[str], loads: tuple[str, ...],
            comment: str) -> str:
    head = [f"@triton.jit",
            f"def _{p.name}_{suffix}_kernel({', '.join(ptrs)}, n_elements, n_cols, {_scalar_params(p)}BLOCK: tl.constexpr):",
            f"{I}{comment}"]
    body = _prologue(p, loads)
    body += [f"{I}{name} = {to_triton(e)}" for name, e in lines.assigns]
    body += [f"{I}tl.store({o}_ptr + offs, {to_triton(e)}, mask=in_bounds)" for o, e in zip(outs, lines.results)]
    return "\n".join(head + body) + "\n"


def forward_kernel(p: Pattern) -> str:
    ptrs = [f"{a}_ptr" for a in p.args] + ["out_ptr"]
    comment = p.forward_traffic().comment("forward")
    return _kernel(p, "fwd", ptrs, straight_line((p.expression,)), ["out"], p.args, comment)


def backward_kernel(p: Pattern, bwd: Backward) -> str:
    slots = [f"d{j}" for j in range(len(bwd.lines.results))]
    ptrs = ["dout_ptr"] + [f"{a}_ptr" for a in bwd.loads] + [f"{s}_ptr" for s in slots]
    comment = backward_traffic(p, bwd).comment("backward")
    return _kernel(p, "bwd", ptrs, bwd.lines, slots, ("dout", *bwd.loads), comment)


def _prepare_line(p: Pattern, what: str, tensors: tuple[str, ...]) -> str:
    """The launcher's call of the module's ``_prepare``: shape checks, contiguous copies."""
    specs = ", ".join(f'("{t}", {t}, {p.broadcast_of(t) is Broadcast.VECTOR})' for t in tensors)
    names = ", ".join(tensors) + ("," if len(tensors) == 1 else "")
    return f'{I}({names}), shape, n_cols = _prepare("{what}", ({specs},))'


def _launch(p: Pattern, suffix: str, tensors: list[str], count: str) -> list[str]:
    scalars = "".join(f"{n}, " for n in _scalar_args(p))
    return [f"{I}n = {count}.numel()",
            f"{I}if n:",
            f"{I}{I}block, warps = _elementwise_launch(n)",
            f"{I}{I}_{p.name}_{suffix}_kernel[(triton.cdiv(n, block),)]({', '.join(tensors)}, n, n_cols, {scalars}"
            "BLOCK=block, num_warps=warps)"]


def forward_launcher(p: Pattern) -> str:
    first = p.full_args[0]
    lines = [f"def {p.name}_fwd({', '.join([*p.args, *_scalar_args(p)])}):",
             f'{I}"""{p.formula}, one pass over memory (the forward of ``{p.name}``)."""',
             _prepare_line(p, p.name, p.args),
             f"{I}out = torch.empty(shape, dtype={first}.dtype, device={first}.device)"]
    lines += _launch(p, "fwd", [*p.args, "out"], count="out")
    return "\n".join(lines + [f"{I}return out"]) + "\n"


def backward_launcher(p: Pattern, bwd: Backward) -> str:
    slots = [f"d{j}" for j in range(len(bwd.lines.results))]
    lines = [f"def {p.name}_bwd({', '.join(['dout', *bwd.loads, *_scalar_args(p)])}):",
             f'{I}"""Gradients of ``{p.name}`` w.r.t. ({", ".join(p.args)}), recomputing the forward from its inputs."""',
             _prepare_line(p, f"{p.name} backward", ("dout", *bwd.loads))]
    lines += [f"{I}{s} = torch.empty_like(dout)" for s in slots]
    if slots:
        lines += _launch(p, "bwd", ["dout", *bwd.loads, *slots], count="dout")
    grads = [f"_sum_rows({src}, n_cols)" if p.broadcast_of(a) is Broadcast.VECTOR else src
             for a, src in zip(p.args, bwd.sources)]
    return "\n".join(lines + [f"{I}return {', '.join(grads)}" + ("," if len(grads) == 1 else "")]) + "\n"


def autograd_function(p: Pattern, bwd: Backward) -> str:
    scalars = _scalar_args(p)
    params = ", ".join(["ctx", *p.args, *scalars])
    nones = f" + (None,) * {len(scalars)}" if scalars else ""
    saved = ", ".join(bwd.loads) + ("," if len(bwd.loads) == 1 else "")
    return "\n".join([
        f"class {p.class_name}(torch.autograd.Function):",
        f'{I}"""``{p.name}`` with its generated backward; saves its inputs, not its intermediates."""',
        "",
        f"{I}@staticmethod",
        f"{I}def forward({params}):",
        f"{I}{I}ctx.save_for_backward({saved})",
        f"{I}{I}ctx.scalars = ({', '.join(scalars)}{',' if len(scalars) == 1 else ''})",
        f"{I}{I}return {p.name}_fwd({', '.join([*p.args, *scalars])})",
        "",
        f"{I}@staticmethod",
        f"{I}def backward(ctx, dout):",
        f"{I}{I}return {p.name}_bwd(dout, *ctx.saved_tensors, *ctx.scalars){nones}",
    ]) + "\n"


def api_function(p: Pattern) -> str:
    defaults = [f"{s}={v!r}" for s, v in p.scalars] + (["seed=None"] if p.randoms else [])
    call = [*p.args, *(f"float({s})" for s, _ in p.scalars), *(["int(seed)"] if p.randoms else [])]
    lines = [f"def {p.name}({', '.join([*p.args, *defaults])}):",
             f'{I}"""{p.formula}, fused, differentiable ({p.source}).'
             + (" ``seed`` fixes the keep mask; None draws one from torch's generator." if p.randoms else "") + '"""']
    if p.randoms:
        lines += [f"{I}if seed is None:", f"{I}{I}seed = _new_seed()"]
    return "\n".join(lines + [f"{I}return {p.class_name}.apply({', '.join(call)})"]) + "\n"


def elementwise_source(p: Pattern) -> str:
    """Kernels, launchers, autograd.Function and function of one elementwise pattern."""
    if p.kind is not Kind.ELEMENTWISE:
        raise ValueError(f"pattern {p.name!r} is {p.kind}, not elementwise; its kernels come from a template")
    bwd = backward_of(p)
    parts = [forward_kernel(p), backward_kernel(p, bwd) if bwd.lines.results else "",
             forward_launcher(p), backward_launcher(p, bwd), autograd_function(p, bwd), api_function(p)]
    return "\n\n".join(part for part in parts if part)
