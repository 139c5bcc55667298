"""Reverse-mode differentiation of an elementwise expression, as straight-line code.

Differentiating a whole chain with ``sympy.diff`` repeats the inner derivative at every use (a GeLU
of a GeLU holds its argument in ``x`` and in ``x**3``), so the derivative's tree grows
exponentially with the depth and sympy takes minutes on three nested GeLUs. Instead, the forward
is first written as assignments (shared subexpressions hoisted by ``sympy.cse``, and every
function call and its argument given a symbol), and each symbol's adjoint is accumulated from its
users' local derivatives, last assignment first (Griewank and Walther 2008, "Evaluating
Derivatives", ch. 3). sympy still differentiates, but one small assignment at a time; the code
grows linearly with the expression.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import sympy

from .expr import GRAD, Lines, numeric, symbol

_OUT = symbol("_out")


Program = list[tuple[sympy.Symbol, sympy.Expr]]


def _assign(expr: sympy.Expr, program: Program, names: Iterator[sympy.Symbol]) -> sympy.Symbol:
    program.append((name := next(names), expr))
    return name


def _lift(expr: sympy.Expr, program: Program, names: Iterator[sympy.Symbol],
          calls: dict[sympy.Expr, sympy.Symbol]) -> sympy.Expr:
    """``expr`` with every function call, and its non-atomic argument, assigned to a symbol in ``program``
    (each distinct call once: ``calls`` maps it to its symbol)."""
    if not expr.args:
        return expr
    args = [_lift(a, program, names, calls) for a in expr.args]
    if not isinstance(expr, sympy.Function):
        return expr.func(*args)
    call = expr.func(*(a if a.is_Atom else _assign(a, program, names) for a in args))
    if call not in calls:
        calls[call] = _assign(call, program, names)
    return calls[call]


def forward_program(expr: sympy.Expr) -> tuple[Program, dict[sympy.Expr, sympy.Symbol]]:
    """``expr`` as assignments, the last one to ``_out``; and each function call's symbol."""
    names = sympy.numbered_symbols("_f", real=True)
    assigns, (out,) = sympy.cse([numeric(expr)], symbols=names, optimizations="basic")
    program: Program = []
    calls: dict[sympy.Expr, sympy.Symbol] = {}
    for name, e in assigns:
        program.append((name, _lift(e, program, names, calls)))
    program.append((_OUT, _lift(out, program, names, calls)))
    return program, calls


def _needed(program: Program, uses: set[sympy.Symbol]) -> Program:
    """The assignments ``uses`` depends on, in program order."""
    keep: Program = []
    for name, e in reversed(program):
        if name in uses:
            keep.append((name, e))
            uses |= e.free_symbols
    return keep[::-1]


def reverse_mode(expr: sympy.Expr, args: tuple[str, ...]) -> Lines:
    """Code whose results are ``dout * d expr / d arg`` for each of ``args``, in order."""
    program, calls = forward_program(expr)
    defined = {name for name, _ in program} | {symbol(a) for a in args}
    contributions: dict[sympy.Symbol, list[sympy.Expr]] = defaultdict(list)
    adjoint = {_OUT: GRAD}
    backward: Program = []
    names = sympy.numbered_symbols("_g", real=True)
    for name, e in reversed(program):
        if name is not _OUT:
            if name not in contributions:
                continue  # the output does not depend on it
            total = sympy.Add(*contributions[name])
            adjoint[name] = total if total.is_Atom else next(names)
            if not total.is_Atom:
                backward.append((adjoint[name], total))
        for v in sorted(e.free_symbols & defined, key=str):
            local = sympy.diff(e, v).xreplace(calls)  # tanh(u)' = 1 - tanh(u)**2: reuse tanh(u)'s symbol
            if local != 0:
                contributions[v].append(adjoint[name] * local)
    results = tuple(sympy.Add(*contributions.get(symbol(a), [])) for a in args)
    uses = set().union(*(e.free_symbols for _, e in backward), *(r.free_symbols for r in results))
    forward = _needed(program[:-1], uses)
    return Lines(assigns=tuple((str(n), e) for n, e in (*forward, *backward)), results=results)
