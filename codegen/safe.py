"""Plan values in emitted programs stay data (issue 15).

A plan file is data: ``ir.plan_json`` reads it without executing anything, and the script emitted
from it must not turn it into code either, since that script then runs under torchrun. So every
value a plan (or a hand-built ``Program``) contributes to emitted text passes through one of these:

    name, module_path, op_name, layout   names printed as code: checked against a strict pattern
    integer, boolean                     numbers and flags printed as code: checked for their type
    literal                              everything else: a Python literal (ASCII, round-trips exactly)
    doc_text                             text inside the script's docstring: backslashes and quotes
                                         escaped, control and non-ASCII characters shown as escapes,
                                         so that neither ``\"\"\"`` nor a newline can end it
    shown                                a plan string in a human line: as is when it is a plain token,
                                         else quoted and escaped (``ascii``)

and the finished source is compiled (``checked_source``) before anyone writes it: a bug that let a
value break the syntax fails emit instead of the run. ``kernels_module_name`` turns an output file
name into an importable module name for the generated kernels (``train-70b.py`` ->
``train_70b_kernels``).
"""
from __future__ import annotations

import keyword
import math
import re
from typing import Any

from ..ir import InvalidPlanError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|\{i\}")  # a submodule, a list index, the loop's index
_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # aten.mm.default
_LAYOUT = re.compile(r"R|S\(-?[0-9]+\)")
_PLAIN = re.compile(r"[A-Za-z0-9_.:+\-/@]+")  # shown without quotes: "h100-sxm:8x8", "gpt-tiny", "bfloat16"


def _refuse(what: str, value: Any, rule: str) -> InvalidPlanError:
    return InvalidPlanError(f"{what} is {value!r}, but {rule}; the emitted script prints it as code, so fix the "
                            "plan (or the Program) to use such a name")


def name(value: Any, what: str) -> str:
    """``value`` if it is a Python identifier (ASCII, not a keyword): a mesh axis, a class, a module."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value) or keyword.iskeyword(value):
        raise _refuse(what, value, "it must be an identifier (ASCII letters, digits and _, not starting with a "
                                   "digit, not a Python keyword)")
    return value


def module_path(value: Any, what: str) -> str:
    """``value`` if it is a dotted module path of identifiers, indices and ``{i}`` (``""`` is the root)."""
    if not isinstance(value, str) or value and not all(
            _PATH_PART.fullmatch(p) and not keyword.iskeyword(p) for p in value.split(".")):
        raise _refuse(what, value, "it must be a dotted module path such as 'layers.3.attn' (identifiers and "
                                   "layer indices), or '' for the whole model")
    return value


def op_name(value: Any, what: str) -> str:
    """``value`` if it names an op as ``torch.ops`` does: ``namespace.op.overload``."""
    if not isinstance(value, str) or not _OP.fullmatch(value):
        raise _refuse(what, value, "it must be a dotted op name such as 'aten.mm.default'")
    return value


def layout(value: Any, what: str) -> str:
    """``value`` if it is a module-boundary layout: ``R`` or ``S(dim)``."""
    if not isinstance(value, str) or not _LAYOUT.fullmatch(value):
        raise _refuse(what, value, "it must be a layout 'R' or 'S(dim)'")
    return value


def integer(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidPlanError(f"{what} is {value!r}, but it must be an integer; fix the plan (or the Program)")
    return int(value)  # an int subclass could print as anything


def boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidPlanError(f"{what} is {value!r}, but it must be true or false; fix the plan (or the Program)")
    return value


def string_literal(value: str) -> str:
    """A Python string literal for ``value``, ASCII only; double-quoted when that needs no escape."""
    text = ascii(str(value))
    if text[0] == "'" and '"' not in value:
        text = '"' + text[1:-1] + '"'
    return text


def literal(value: Any, what: str) -> str:
    """Python source that evaluates to ``value``, a JSON-like value (dict, list, tuple, str, int, float,
    bool, None); refuses anything else. Non-finite floats print as ``float("nan")`` and the like."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return string_literal(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value)) if math.isfinite(value) else f'float("{float(value)!r}")'
    if isinstance(value, dict):
        items = ", ".join(f"{literal(k, f'a key of {what}')}: {literal(v, f'{what}[{k!r}]')}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, (list, tuple)):
        items = [literal(v, f"{what}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    raise InvalidPlanError(f"{what} is a {type(value).__name__} ({value!r}); the emitted script takes only JSON "
                           "values (objects, lists, strings, numbers, true/false, null): fix the plan's model config")


def doc_text(text: Any) -> str:
    """``text`` as it may stand inside a ``\"\"\"`` docstring: ``__doc__`` then shows printable ASCII as is,
    and every other character (newlines, control characters, non-ASCII) as its escape."""
    out = []
    for ch in str(text):
        if ch in '\\"':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1].replace("\\", "\\\\"))  # "\n" shows as the two characters \n
    return "".join(out)


def shown(value: Any) -> str:
    """A plan string for a human line: plain tokens as they are, anything else quoted and escaped."""
    text = str(value)
    return text if _PLAIN.fullmatch(text) else ascii(text)


def kernels_module_name(stem: str) -> str:
    """The importable name of the kernels module beside a script named ``stem``: ``train-70b`` ->
    ``train_70b_kernels``, ``70b`` -> ``m_70b_kernels`` (a module name cannot start with a digit)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", stem) or "m"
    if base[0].isdigit():
        base = "m_" + base
    return f"{base}_kernels"


def checked_source(source: str, filename: str, what: str) -> str:
    """``source`` if it compiles as a module; else InvalidPlanError, before anything is written."""
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL character
        where = f" (line {exc.lineno}: {(exc.text or '').strip()!r})" if getattr(exc, "lineno", None) else ""
        raise InvalidPlanError(f"{what} does not compile: {exc.__class__.__name__}: "
                               f"{getattr(exc, 'msg', exc)}{where}; nothing was written. This is a meshplan bug or "
                               "a Program meshplan cannot print: report it with the plan file") from None
    return source
