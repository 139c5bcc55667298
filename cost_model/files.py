"""Reading a cluster file or a calibration profile: bounded, regular files only, strict JSON.

A path given on the command line may name anything: a FIFO (opening it for reading blocks until
someone writes), a device that never ends, a directory, a multi-gigabyte file, bytes that are not
text. ``read_json`` refuses each before it costs anything:

* only a regular file is opened (``Path.is_file()``; opened non-blocking and checked again with
  ``fstat``, so a FIFO swapped in between does not block either);
* at most ``MAX_FILE_BYTES`` are read: a preset is ~5 KB, a profile from ``meshplan calibrate``
  a few dozen KB;
* the bytes must be UTF-8 (RFC 8259 sec. 8.1: JSON exchanged between systems is UTF-8);
* the text must be JSON without ``NaN``/``Infinity`` (which Python's ``json`` accepts but RFC 8259
  does not) and without numbers that overflow a float (``1e999`` reads as infinity): the message
  names the field that holds one.

Every refusal is an ``InvalidClusterError`` that names the file, what is wrong and what to do.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from ..ir.errors import InvalidClusterError

MAX_FILE_BYTES = 4 << 20  # 4 MiB: ~100x the largest profile calibrate writes


def _non_finite(node: Any, where: str) -> str | None:
    """The path of the first non-finite number under ``node``, or None."""
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


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), else ``InvalidClusterError``."""
    p = Path(path)
    where = f"{what} {str(path)!r}"
    if not p.exists():
        raise InvalidClusterError(f"cannot read {where}: no such file; give the path of a JSON file")
    if not p.is_file():
        raise InvalidClusterError(f"cannot read {where}: it is not a regular file (a directory, FIFO or device); "
                                  "give the path of a JSON file")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InvalidClusterError(f"cannot read {where}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InvalidClusterError(f"cannot read {where}: it is not a regular file; give the path of a JSON file")
        if info.st_size > max_bytes:
            raise InvalidClusterError(f"{where} is {info.st_size} bytes, above the limit of {max_bytes} bytes for "
                                      "such files; give the cluster or profile JSON, not another file")
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise InvalidClusterError(f"{where} holds more than the limit of {max_bytes} bytes for such files; "
                                  "give the cluster or profile JSON, not another file")
    return raw


def read_json(path: str | os.PathLike, what: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The parsed JSON of the regular file ``path`` (UTF-8, at most ``max_bytes``, finite numbers)."""
    raw = read_bytes(path, what, max_bytes)
    where = f"{what} {str(path)!r}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidClusterError(f"{where} is not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start} "
                                  "(JSON files are UTF-8); save it as UTF-8") from None
    try:
        data = json.loads(text)  # NaN, Infinity and 1e999 become non-finite floats, found below
        bad = _non_finite(data, "")
    except json.JSONDecodeError as exc:
        raise InvalidClusterError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                                  f"{exc.colno})") from None
    except RecursionError:
        raise InvalidClusterError(f"{where} nests deeper than JSON parsing allows; it is not a cluster or "
                                  "profile file") from None
    except ValueError as exc:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise InvalidClusterError(f"{where} is not valid JSON: {exc}") from None
    if bad is not None:
        raise InvalidClusterError(f"{where}: {bad} is not a finite number (NaN, Infinity or beyond the float "
                                  "range); write a finite number")
    return data
