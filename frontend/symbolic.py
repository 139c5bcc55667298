"""From torch's symbolic shapes to the IR's: sympy in ``ir.BATCH`` (b) and ``ir.SEQ`` (s).

torch.export names the batch and sequence sizes of the token input with its own symbols
(``s52``, ``s27``, ...) and writes every other size as a sympy expression in them, sometimes
with torch's integer functions (``FloorDiv``, ``CleanDiv``, ``PythonMod``). This module swaps
those symbols for ``b`` and ``s``, rewrites torch's functions as plain sympy, and turns torch
dtypes into the names of ``ir.DTYPE_BYTES``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy
import torch

from ..ir import BATCH, DTYPE_BYTES, SEQ, TensorMeta, UnsupportedModelError

_DTYPE_NAMES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8", torch.float8_e5m2: "float8", torch.int64: "int64",
    torch.int32: "int32", torch.bool: "bool",
}
# dtypes the IR does not name (float64, complex64, int8, ...) keep their size through a stand-in
# of the same width, so that bytes stay right; see the frontend's report on the IR.
_SAME_WIDTH = {1: "float8", 2: "bfloat16", 4: "float32", 8: "int64"}


def dtype_name(dtype: torch.dtype) -> str:
    """The ``ir.DTYPE_BYTES`` key of a torch dtype (a same-width stand-in for unnamed ones)."""
    name = _DTYPE_NAMES.get(dtype) or _SAME_WIDTH.get(dtype.itemsize)
    if name is None:
        raise UnsupportedModelError(f"tensors of dtype {dtype} ({dtype.itemsize} bytes an element) have no "
                                    f"IR dtype; the IR knows {sorted(DTYPE_BYTES)}")
    return name


def _plain_sympy(expr: sympy.Expr) -> sympy.Expr:
    """Rewrite torch's integer functions (torch.utils._sympy.functions) as plain sympy."""
    from torch.utils._sympy import functions as tf

    rewrites = {
        tf.FloorDiv: lambda a, b: sympy.floor(a / b),
        tf.CleanDiv: lambda a, b: a / b,
        tf.IntTrueDiv: lambda a, b: a / b,
        tf.CeilDiv: lambda a, b: sympy.ceiling(a / b),
        tf.PythonMod: sympy.Mod,
        tf.Mod: sympy.Mod,
        tf.Min: sympy.Min,
        tf.Max: sympy.Max,
        tf.PowByNatural: sympy.Pow,
    }
    for fn, plain in rewrites.items():
        if expr.has(fn):
            expr = expr.replace(fn, plain)
    return expr


@dataclass(slots=True)
class SymbolMap:
    """torch's symbols for the token input's two sizes, and a cache of converted sizes."""

    torch_to_ir: dict[sympy.Symbol, sympy.Symbol]
    _cache: dict = field(default_factory=dict)

    @classmethod
    def from_tokens(cls, tokens: torch.Tensor, sequence: bool = True,
                    specialized: Mapping[str, str] | None = None) -> "SymbolMap":
        """tokens: the first fake input export saw, (b, s, ...) token ids or (b, ...) for a model whose
        input has no sequence (``sequence=False``). ``specialized``: (input size, e.g. "L['input_ids'].size()[1]")
        -> the model's line that fixed it (``export.Exported.specialized``), named in the error."""
        symbols = {}
        named = (BATCH, SEQ) if sequence else (BATCH,)
        for dim, (size, ir_symbol, what) in enumerate(zip(tokens.shape, named, ("batch", "sequence"))):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if not isinstance(expr, sympy.Symbol):
                line = next((at for name, at in (specialized or {}).items() if name.endswith(f".size()[{dim}]")), None)
                where = (f" at {line}" if line else " (e.g. a hard-coded view, a check on the input's shape or a "
                         "Python loop over it)")
                raise UnsupportedModelError(
                    f"the model's forward fixes the {what} size to {size}{where}; meshplan needs shapes that hold "
                    f"for every {what} size: rewrite that code without the fixed size, or keep the module that holds "
                    "it whole with a leaf rule (trace(model, leaf_rules={...}))")
            symbols[expr] = ir_symbol
        return cls(torch_to_ir=symbols)

    def expr(self, size: int | torch.SymInt, where: str) -> sympy.Expr:
        """One size as a sympy expression in b and s; ``where`` names the node for errors."""
        if not isinstance(size, torch.SymInt):
            return sympy.Integer(int(size))
        raw = size.node.expr
        if raw not in self._cache:
            expr = _plain_sympy(sympy.sympify(raw).xreplace(self.torch_to_ir))
            unknown = expr.free_symbols - {BATCH, SEQ}
            if unknown:
                raise UnsupportedModelError(
                    f"node {where!r} has a size {raw} that depends on the data, not only on batch and "
                    f"sequence; keep the module that computes it whole with a leaf rule")
            self._cache[raw] = expr
        return self._cache[raw]

    def meta(self, tensor: torch.Tensor, where: str) -> TensorMeta:
        return TensorMeta(shape=tuple(self.expr(d, where) for d in tensor.shape), dtype=dtype_name(tensor.dtype))
