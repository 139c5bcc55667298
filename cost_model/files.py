"""Reading a cluster file or a calibration profile: ``ir.readfile``'s bounded reading, then JSON whose
every number is finite, the field holding a bad one named.

``ir.readfile.read_text`` refuses what could hang or exhaust memory before it happens: only a regular
file is opened (a FIFO would block ``open``), non-blocking and checked again with ``fstat``; at most
``MAX_FILE_BYTES`` are read (a preset is ~5 KB, a profile from ``meshplan calibrate`` a few dozen KB);
the bytes must be UTF-8. Then the nesting depth is bounded before parsing (``ir.readfile.json_depth``),
and ``NaN``, ``Infinity`` and numbers beyond the float range (``1e999``), which Python's ``json``
accepts and RFC 8259 does not, are refused with the path of the field that holds one
(``tiers[1].latency_s.value``). Every refusal is an ``InvalidClusterError``.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from ..ir.errors import InvalidClusterError
from ..ir.readfile import MAX_JSON_DEPTH, json_depth, read_text

MAX_FILE_BYTES = 4 << 20  # 4 MiB: ~100x the largest profile calibrate writes


def _non_finite(node: Any, where: str) -> str | None:
    """The path of the first non-finite number under ``node``, or None (depth already bounded)."""
    if isinstance(node, float) and not math.isfinite(node):
        return where or "(top level)"
    if isinstance(node, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in node.items())
    elif isinstance(node, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(node))
    else:
        return None
    for at, value in items:
        found = _non_finite(value, at)
        if found is not None:
            return found
    return None


def read_json(path: str | os.PathLike, what: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The parsed JSON of the regular file ``path`` (UTF-8, at most ``max_bytes``, finite numbers)."""
    text = read_text(os.fspath(path), max_bytes=max_bytes, what=what, error=InvalidClusterError)
    where = f"{what} {os.fspath(path)!r}"
    depth = json_depth(text, stop_after=MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise InvalidClusterError(f"{where}: JSON nested {depth} deep, more than the limit of {MAX_JSON_DEPTH}; "
                                  "a cluster file or profile nests 5 deep")
    try:
        data = json.loads(text)  # NaN, Infinity and 1e999 become non-finite floats, found below
    except json.JSONDecodeError as exc:
        raise InvalidClusterError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                                  f"{exc.colno})") from None
    except ValueError as exc:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise InvalidClusterError(f"{where} is not valid JSON: {exc}") from None
    bad = _non_finite(data, "")
    if bad is not None:
        raise InvalidClusterError(f"{where}: {bad} is not a finite number (NaN, Infinity or beyond the float "
                                  "range); write a finite number")
    return data
