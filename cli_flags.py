"""The ``meshplan`` command's numeric flags, checked against ``ir/limits.py`` before any work starts.

One table for every subcommand: a flag a subcommand does not have is skipped, an unset one (None)
too. Errors name the flag as typed (``--tp must be a positive integer, got 0``).
"""
from __future__ import annotations

import argparse

from .ir import PlanError, limits

MAX_TOP = 100  # runners-up shown by `meshplan plan --top`
MAX_STEPS = 10**9  # training steps of `meshplan run` (and its --checkpoint-every)
MAX_RESTARTS = 1000  # `meshplan run --max-restarts`

# argparse dest -> the largest value accepted
FLAG_LIMITS = {
    "global_batch": limits.MAX_GLOBAL_BATCH, "seq_len": limits.MAX_SEQ_LEN,
    **limits.PIN_LIMITS,
    "top": MAX_TOP, "nproc": limits.MAX_GPUS, "steps": MAX_STEPS,
}
# argparse dest -> the largest value accepted, where 0 is valid too (off, or a seed)
ZERO_OR_MORE = {"checkpoint_every": MAX_STEPS, "max_restarts": MAX_RESTARTS, "seed": 2**64 - 1}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag ``args`` has, a positive int (seconds: a positive finite number) within its limit."""
    for dest, limit in FLAG_LIMITS.items():
        value = getattr(args, dest, None)
        if value is not None:
            limits.check_positive_int(flag(dest), value, limit)
    for dest, limit in ZERO_OR_MORE.items():
        value = getattr(args, dest, None)
        if value is not None and value != 0:  # argparse gave an int
            if value < 0:
                raise PlanError(f"{flag(dest)} must be 0 or a positive integer, got {value}")
            limits.check_positive_int(flag(dest), value, limit)
    if getattr(args, "time_limit", None) is not None:
        limits.check_time_limit("--time-limit", args.time_limit)


def software_name(text: str) -> str:
    """argparse ``type`` of ``--software``: a preset, with the modifiers its name may add after ``+``
    (``cost_model.software.software_named``); the error lists what is known."""
    from .cost_model import software_named

    try:
        software_named(text)
    except PlanError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
