"""Elementwise math as sympy expressions, and their printing as Triton.

A fused elementwise chain is one sympy expression of its inputs, written with a small vocabulary
(``sigmoid``, ``silu``, ``gelu_tanh``, ``tanh``, ``exp``, ``log``, powers). Its backward is the
derivative per input times the incoming gradient: ``autodiff.reverse_mode`` writes it as
straight-line code, ``gradients`` here is the plain ``sympy.diff`` it is checked against. Shared
subexpressions are hoisted (``sympy.cse``), so that a kernel computes ``sigmoid(a)`` once even when
three terms use it.

``sigmoid`` is its own function rather than ``1/(1 + exp(-a))`` so that its derivative stays
``sigmoid(a) * (1 - sigmoid(a))``, which cannot overflow, where the quotient rule on the exponential
form gives ``exp(-a)/(1 + exp(-a))**2``, which is inf/inf = NaN for a < -88 in fp32.

The tanh-GeLU is PyTorch's ``gelu(approximate="tanh")`` term for term (Hendrycks and Gimpel 2016,
eq. 2; aten/src/ATen/native/cpu/Activation.cpp): ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import sympy


def symbol(name: str) -> sympy.Symbol:
    """A kernel variable: real, which spares sympy the complex-plane case analysis that makes
    ``tanh(u)**3`` of a large ``u`` take it tens of seconds to build."""
    return sympy.Symbol(name, real=True)


GRAD = symbol("dout")  # the incoming gradient, in every backward expression


class sigmoid(sympy.Function):  # noqa: N801 - spelled as the math is
    """1 / (1 + exp(-x)), printed as ``tl.sigmoid``; its derivative in terms of itself."""

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        s = sigmoid(self.args[0])
        return s * (1 - s)


def silu(x: sympy.Expr) -> sympy.Expr:
    """x * sigmoid(x) (Elfwing et al. 2018; the gate of SwiGLU, Shazeer 2020)."""
    return x * sigmoid(x)


def gelu_tanh(x: sympy.Expr) -> sympy.Expr:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as PyTorch's approximate="tanh"."""
    return sympy.Rational(1, 2) * x * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + sympy.Float("0.044715") * x**3)))


VOCABULARY = {"sigmoid": sigmoid, "silu": silu, "gelu_tanh": gelu_tanh, "tanh": sympy.tanh, "exp": sympy.exp,
              "log": sympy.log, "sqrt": sympy.sqrt}


@lru_cache(maxsize=None)
def parse(text: str) -> sympy.Expr:
    """An expression written with ``VOCABULARY`` (e.g. ``"silu(a) * b"``) as sympy; every other name
    is a variable (constants are written as numbers)."""
    names = {n: symbol(n) for n in re.findall(r"[A-Za-z_]\w*", text) if n not in VOCABULARY}
    return sympy.sympify(text, locals={**VOCABULARY, **names})


@dataclass(frozen=True, slots=True, kw_only=True)
class Lines:
    """Straight-line code: ``(name, expression)`` assignments, then the results' expressions."""

    assigns: tuple[tuple[str, sympy.Expr], ...]
    results: tuple[sympy.Expr, ...]


def straight_line(exprs: tuple[sympy.Expr, ...]) -> Lines:
    """``exprs`` with numbers evaluated to floats and shared subexpressions hoisted (sympy.cse)."""
    floats = [numeric(sympy.sympify(e)) for e in exprs]
    assigns, results = sympy.cse(floats, symbols=sympy.numbered_symbols("_t", real=True), optimizations="basic")
    return Lines(assigns=tuple((str(s), e) for s, e in assigns), results=tuple(results))


def numeric(expr: sympy.Expr) -> sympy.Expr:
    """Every irrational constant (sqrt(2/pi)) as a float; evalf alone stops at function calls.
    Rationals stay exact: ``x**3.0`` of a real x would become ``Abs(x)**3.0``-like forms."""
    if expr.is_number:
        return expr if expr.is_Rational else sympy.Float(expr.evalf())
    if not expr.args:
        return expr
    return expr.func(*(numeric(a) for a in expr.args))


def gradients(expr: sympy.Expr, args: tuple[str, ...]) -> tuple[sympy.Expr, ...]:
    """d(expr)/d(arg) * dout for each arg, by ``sympy.diff`` on the whole expression: the reference
    that ``autodiff.reverse_mode``, which the kernels use, must agree with."""
    return tuple(GRAD * sympy.diff(expr, symbol(a)) for a in args)


def to_triton(expr: sympy.Expr) -> str:
    """Triton source for ``expr``: symbols are local variables, numbers fp32 literals."""
    if expr.is_Symbol:
        return expr.name
    if expr.is_Number:
        return repr(float(expr))
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(to_triton(t) for t in expr.args) + ")"
    if isinstance(expr, sympy.Mul):
        return _mul(expr)
    if isinstance(expr, sympy.Pow):
        return _pow(expr)
    if isinstance(expr, sympy.Function) and type(expr) in _CALLS:
        return _CALLS[type(expr)].format(to_triton(expr.args[0]))
    raise ValueError(f"no Triton spelling for {type(expr).__name__} in {expr}; write the expression with "
                     f"{sorted(VOCABULARY)}, + - * / and powers")


_CALLS = {
    sympy.exp: "tl.exp({0})",
    sympy.log: "tl.log({0})",
    sigmoid: "tl.sigmoid({0})",
    # tanh(y) = 2 sigmoid(2y) - 1: tl has no tanh that also runs in the interpreter; the absolute
    # error, ~1e-7, is that of sigmoid near 1/2.
    sympy.tanh: "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    sympy.Abs: "tl.abs({0})",  # sympy writes sqrt(x**2) of a real x so
    sympy.sign: "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",  # Abs's derivative
}


def _mul(expr: sympy.Mul) -> str:
    """A product as ``num / den`` so that ``x**-2`` prints as a division, not a power."""
    num, den = [], []
    for factor in expr.args:
        base, exp = factor.as_base_exp()
        if exp.is_Number and exp < 0:
            den.append(to_triton(base**-exp))
        elif factor == -1:
            num.insert(0, "-1.0")
        else:
            num.append(to_triton(factor))
    top = " * ".join(num) if num else "1.0"
    return f"({top} / ({' * '.join(den)}))" if den else f"({top})"


def _pow(expr: sympy.Pow) -> str:
    base, exp = expr.args
    b = to_triton(base)
    if exp.is_Integer or (exp.is_Float and float(exp).is_integer()):
        n = int(exp)
        if n == 0:
            return "1.0"
        product = "(" + " * ".join([b] * abs(n)) + ")"
        return product if n > 0 else f"(1.0 / {product})"
    if exp == sympy.Rational(1, 2) or (exp.is_Float and float(exp) == 0.5):
        return f"tl.sqrt({b})"
    if exp == sympy.Rational(-1, 2) or (exp.is_Float and float(exp) == -0.5):
        return f"tl.rsqrt({b})"
    return f"tl.exp({to_triton(exp)} * tl.log({b}))"  # a real power of a positive base
