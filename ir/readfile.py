"""Bounded reading of a JSON file (a plan, a model config): every way a file can hang, exhaust memory or
crash the parser is refused with one clear ``PlanError`` before it happens.

* only a regular file is opened (``os.stat`` + ``S_ISREG``): a FIFO with no writer would block
  ``open`` forever, ``/dev/zero`` would fill memory; the open itself is ``O_NONBLOCK`` and the
  descriptor is checked again (``fstat``), so a file swapped for a FIFO in between cannot block either;
* at most ``max_bytes`` are read (the size is checked before reading and the read stops one byte past);
* the bytes must be UTF-8 (strict), the error names the byte offset;
* the nesting depth is counted by a bracket scan *before* ``json.loads`` (which recurses and would raise
  ``RecursionError`` on ``[[[[...]]]]``);
* integers longer than ``max_int_digits`` are refused by a ``parse_int`` hook, which never converts them
  (CPython refuses more than 4,300 digits with a bare ``ValueError``, and no size in a plan needs 40);
  the error names where the integer sits (``mesh.tp``);
* ``NaN``, ``Infinity`` and numbers that overflow to infinity (``1e999``) are refused: no field of a
  plan or a model config may be non-finite.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from .errors import PlanError

MAX_JSON_BYTES = 64 * 2**20  # a plan of 10^5 layers with per-parameter layouts stays well below
MAX_CONFIG_BYTES = 2**20  # a model config is a few hundred bytes; a transformers config a few KB
MAX_JSON_DEPTH = 64  # a plan nests 4 deep; an hf config under source nests a few more
MAX_INT_DIGITS = 40  # 10^40 is far above any size (ir/limits.py) and below CPython's 4,300-digit limit

# a string, closed or running to the end (linear: never backtracks); what is not a bracket; an innermost pair
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


class _Refused(Exception):
    """Raised inside a json hook; turned into the caller's error with where it happened."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_text(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, what: str = "file",
              error: type[PlanError] = PlanError) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``max_bytes`` long."""
    name = str(path)
    try:
        st = os.stat(name)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise error(f"cannot read {what} {name!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"cannot read {what} {name!r}: it is {_kind(st.st_mode)}, not a regular file; "
                    "pass the path of a JSON file")
    if st.st_size > max_bytes:
        raise error(f"{what} {name!r} is {st.st_size} bytes, more than the limit of {max_bytes}; "
                    "is it the right file?")
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise error(f"cannot read {what} {name!r}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat above
            raise error(f"cannot read {what} {name!r}: it is not a regular file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(2**20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise error(f"cannot read {what} {name!r}: it would block (not a regular file)") from None
        raise error(f"cannot read {what} {name!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise error(f"{what} {name!r} grew past the limit of {max_bytes} bytes while being read")
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name}: not UTF-8 text: byte {data[exc.start]:#04x} at offset {exc.start} "
                    f"({exc.reason}); save the {what} as UTF-8 JSON") from None


def json_depth(text: str, *, stop_after: int | None = None) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped), without parsing it.

    Each round deletes every innermost ``[]`` / ``{}`` pair of the bracket skeleton, which lowers the
    nesting by exactly one, so the rounds are the depth; all in C-speed regex passes. Counting stops at
    ``stop_after + 1`` (enough to know the limit is passed)."""
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text))
    rounds = 0
    while skeleton and (stop_after is None or rounds <= stop_after):
        shorter = _INNERMOST.sub("", skeleton)
        if len(shorter) == len(skeleton):  # unbalanced: json.loads will say where
            break
        skeleton, rounds = shorter, rounds + 1
    return rounds


def parse_json(text: str, *, where: str, max_depth: int = MAX_JSON_DEPTH, max_int_digits: int = MAX_INT_DIGITS,
               error: type[PlanError] = PlanError) -> Any:
    """``json.loads`` with the depth, integer-length and finiteness bounds of the module docstring."""
    if not isinstance(text, str):
        raise error(f"{where}: expected JSON text (str), got {type(text).__name__}")
    depth = json_depth(text, stop_after=max_depth)
    if depth > max_depth:
        raise error(f"{where}: JSON nested {depth} deep, more than the limit of {max_depth}")

    too_long: list[_LongInt] = []

    def parse_int(digits: str) -> int | _LongInt:
        if len(digits.lstrip("-")) > max_int_digits:  # never converted: kept as text to name its place
            too_long.append(_LongInt(digits))
            return too_long[-1]
        return int(digits)

    def parse_float(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise _Refused(f"the number {literal[:40]} overflows to infinity")
        return value

    def parse_constant(name: str) -> float:
        raise _Refused(f"{name} is not allowed (every number must be finite)")

    try:
        data = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except RecursionError:  # only if max_depth is set above the interpreter's limit
        raise error(f"{where}: JSON nested too deep to parse") from None
    if too_long:
        digits = too_long[0].digits.lstrip("-")
        raise error(f"{where}: {_path_of(data, too_long[0]) or 'value'}: an integer of {len(digits)} digits "
                    f"({digits[:12]}...), more than the limit of {max_int_digits}; no size needs that many")
    return data


class _LongInt:
    """An integer literal too long to convert; stands in its place until its path is reported."""
    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits


def _path_of(value: Any, target: _LongInt, path: str = "") -> str | None:
    """The path of ``target`` inside ``value`` (depth already bounded), e.g. ``mesh.tp`` or ``stages[1][0]``."""
    if value is target:
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _path_of(item, target, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def read_json_file(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
                   max_int_digits: int = MAX_INT_DIGITS, what: str = "file",
                   error: type[PlanError] = PlanError) -> Any:
    """The parsed JSON of the regular file ``path``, within every bound above."""
    text = read_text(path, max_bytes=max_bytes, what=what, error=error)
    return parse_json(text, where=str(path), max_depth=max_depth, max_int_digits=max_int_digits, error=error)
