"""A pydantic ``ValidationError`` as one line a person can act on: where (the file), the field path
(``mesh.tp``, ``param_layouts['w'][0]``), the rule in words and the value, cut short; then how many other
fields are wrong. Used by ``ir/schema.py``.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError


def join_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


_DICT_FIELDS = {"param_layouts", "memory_bytes", "time_s", "comm_bytes", "phases", "config", "kwargs"}


def _is_step(part: Any) -> bool:
    """A step pydantic adds to a location: a union member (``tagged-union[...]``, ``int``) or ``[key]``."""
    return isinstance(part, str) and ("[" in part or part in ("bool", "int", "str", "float"))


def _path(loc: tuple) -> str:
    path, skip_tag, key_next = "", False, False
    for part in loc:
        if skip_tag:  # the discriminator value after a tagged union
            skip_tag = False
            continue
        if _is_step(part):
            skip_tag = part.startswith("tagged-union")
            continue
        path = f"{path}[{part!r}]" if key_next else join_path(path, part)
        key_next = part in _DICT_FIELDS and not key_next
    return path


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters, safe for any JSON value (an int of 5,000 digits included)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, (dict, list)) and len(value) > 20:
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_RULES = {
    "missing": "required field is missing",
    "extra_forbidden": "unknown field",
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "finite_number": "expected a finite number, not NaN or infinity",
}


def _rule(err: dict, patterns: dict[str, str]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _RULES:
        return _RULES[kind]
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}, the limit meshplan plans for (ir/limits.py); check it for a typo"
    if kind == "too_long":
        return f"may hold at most {ctx['max_length']} items"
    if kind == "too_short":
        return f"must hold at least {ctx['min_length']} items"
    if kind == "string_pattern_mismatch":
        return f"must be {patterns.get(ctx['pattern'], 'a string matching ' + ctx['pattern'])}"
    if kind == "literal_error":
        return f"expected {ctx['expected']}"
    if kind == "union_tag_invalid":
        return f"kind must be one of {ctx['expected_tags']}"
    if kind == "plan_invariant":
        return ctx["rule"]
    return err["msg"][0].lower() + err["msg"][1:]


def describe(exc: ValidationError, *, where: str, patterns: dict[str, str] | None = None) -> str:
    """One line: where, the field path, the rule and the value (cut short); the count of other problems."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    if any(_is_step(part) for part in first["loc"]):
        # a union reports once per member: keep the member that got furthest (the longest location)
        first = max((e for e in errors if e["loc"][:1] == first["loc"][:1]), key=lambda e: len(e["loc"]))
    ctx = first.get("ctx") or {}
    path = ctx.get("path") or _path(first["loc"]) or "plan"
    rule = _rule(first, patterns or {})
    if "[key]" in first["loc"]:
        rule = f"the key {rule}"
    text = f"{where}: {path}: {rule}"
    if first["type"] not in ("missing", "plan_invariant", "union_tag_invalid"):
        text += f", got {short_repr(first['input'])}"
    more = len({_path(e["loc"]) for e in errors if not any(_is_step(p) for p in e["loc"])} - {_path(first["loc"])})
    return text + (f" (and {more} more problem{'s' if more > 1 else ''})" if more > 0 else "")
