"""The ``meshplan`` command's numeric flags, checked against ``ir/limits.py`` before any work starts.

One table for every subcommand: a flag a subcommand does not have is skipped, an unset one (None)
too. Errors name the flag as typed (``--tp must be a positive integer, got 0``).
"""
from __future__ import annotations

import argparse

from .ir import limits

MAX_TOP = 100  # runners-up shown by `meshplan plan --top`

# argparse dest -> the largest value accepted
FLAG_LIMITS = {
    "global_batch": limits.MAX_GLOBAL_BATCH, "seq_len": limits.MAX_SEQ_LEN,
    **limits.PIN_LIMITS,
    "top": MAX_TOP, "nproc": limits.MAX_GPUS,
}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag ``args`` has, a positive int (seconds: a positive finite number) within its limit."""
    for dest, limit in FLAG_LIMITS.items():
        value = getattr(args, dest, None)
        if value is not None:
            limits.check_positive_int(flag(dest), value, limit)
    if getattr(args, "time_limit", None) is not None:
        limits.check_time_limit("--time-limit", args.time_limit)
