"""The largest sizes meshplan accepts, and the one checker that enforces them.

Every size that drives a loop in the solver (GPUs, layers, batch, sequence, pinned degrees) is checked
here before any search starts, so a typo such as ``h100-sxm:99999999999999999999x8`` or
``--global-batch 2^63`` is refused at once with the limit named instead of spinning. The CLI, the API
(``api.plans``), the cluster parser (``cost_model/hardware.py``) and the solver import the same numbers.

The limits sit above any real run (most by a few orders of magnitude), so they only ever catch mistakes:

* ``MAX_GPUS = 10**7``: the largest clusters built so far join about 10^5 accelerators.
* ``MAX_LAYERS = 1024``: the deepest trained transformer, DeepNet (Wang et al. 2022, "Scaling Transformers
  to 1,000 Layers"), has 1,000; production models have at most a few hundred (Llama 3 405B: 126).
  This one is not orders of magnitude above: the frontend builds the model on meta, one module per
  layer, and lowers, groups and fuses every layer's nodes, which costs about 10 ms per layer, so 10^5
  layers took minutes where 1024 take seconds. A plan's stages and recompute lists obey the same bound.
* ``MAX_GLOBAL_BATCH = 2**40``: sequences per optimizer step; real runs use at most a few 10^4.
* ``MAX_SEQ_LEN = 2**24``: 16 M tokens per sequence; long-context runs reach about 10^6.
* ``MAX_TIME_LIMIT_S = 86400``: a solver time limit of at most one day.

Pure: imports only ``errors``.
"""
from __future__ import annotations

import math
import numbers

from .errors import PlanError

MAX_GPUS = 10**7
MAX_LAYERS = 1024
MAX_GLOBAL_BATCH = 2**40
MAX_SEQ_LEN = 2**24
MAX_TIME_LIMIT_S = 86400.0

# the model config's sizes: (least, most). One source for zoo.ModelConfig, the plan's "model" object
# (ir/schema.py) and Hugging Face configs (runtime/source.py)
MODEL_LIMITS: dict[str, tuple[int, int]] = {
    "layers": (1, MAX_LAYERS), "hidden": (1, 2**20), "heads": (1, 2**14), "kv_heads": (0, 2**14),
    "ffn_hidden": (0, 2**22), "vocab": (1, 2**24), "max_seq_len": (1, MAX_SEQ_LEN), "experts": (0, 2**14),
    "top_k": (0, 2**14), "head_dim": (0, 2**14)}

# why a bound sits where it does, for the messages of the bounds that are not far above every real size
REASONS = {"layers": "the deepest transformer trained so far, DeepNet (2022), has 1,000 layers"}

# pinned choices: a degree never exceeds the GPUs, a micro-batch never exceeds the global batch, and
# the virtual stages per pipeline rank never exceed the layers
PIN_LIMITS = {"tp": MAX_GPUS, "dp": MAX_GPUS, "pp": MAX_GPUS, "cp": MAX_GPUS, "ep": MAX_GPUS, "vp": MAX_LAYERS,
              "micro_batch": MAX_GLOBAL_BATCH, "num_microbatches": MAX_GLOBAL_BATCH}


def _limit_text(limit: int | float) -> str:
    """2**40 reads better than 1099511627776; 10**7 better than 10000000."""
    if isinstance(limit, int) and limit >= 1024:
        if limit & (limit - 1) == 0:
            return f"{limit} (2^{limit.bit_length() - 1})"
        exp = round(math.log10(limit))
        if 10**exp == limit:
            return f"{limit} (10^{exp})"
    return f"{limit:g}" if isinstance(limit, float) else str(limit)


def check_positive_int(name: str, value, limit: int, *, error: type[PlanError] = PlanError,
                       what: str = "", why: str = "") -> int:
    """``value`` as an int in 1..limit, else ``error`` naming ``name``, the value and the rule.

    ``what`` says what the limit guards ("GPUs", "layers"); the message then reads
    ``--tp must be a positive integer, got 0`` or ``--global-batch 2^63 exceeds the limit ...``; ``why``
    (from ``REASONS``) says why the limit sits there.
    Booleans and floats are refused (``True`` is not a degree; 2.0 hides a computation gone wrong).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be a positive integer, got {value!r} ({type(value).__name__}); "
                    f"pass a whole number from 1 to {_limit_text(limit)}")
    value = int(value)
    if value < 1:
        raise error(f"{name} must be a positive integer, got {value}; pass a whole number from 1 to "
                    f"{_limit_text(limit)}")
    if value > limit:
        raise error(f"{name} {value} exceeds the limit of {_limit_text(limit)}"
                    + (f" {what}" if what else "") + " meshplan plans for (ir/limits.py"
                    + (f": {why}" if why else "") + "); check it for a typo")
    return value


def check_time_limit(name: str, value, limit: float = MAX_TIME_LIMIT_S, *,
                     error: type[PlanError] = PlanError) -> float:
    """A solver time limit in seconds: a finite number in (0, limit]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value) or value <= 0 or value > limit:
        raise error(f"{name} must be a positive, finite number of seconds up to {limit:g}, got {value!r}; "
                    "pass e.g. 30")
    return value


def check_pins(fixed: dict, *, prefix: str = "fixed: ", error: type[PlanError] = PlanError) -> None:
    """Every pinned integer choice that has a limit (``PIN_LIMITS``) is a positive int within it.

    ``zero`` (0..3) and the non-numeric pins are checked by the solver (``solver/space.check_fixed``).
    """
    for key, limit in PIN_LIMITS.items():
        if key in fixed:
            check_positive_int(f"{prefix}{key}", fixed[key], limit, error=error)


def check_sizes(*, global_batch, seq_len, world: int | None = None, layers: int | None = None,
                error: type[PlanError] = PlanError) -> None:
    """The sizes of one planning request, each against its limit (``world`` and ``layers`` where known)."""
    check_positive_int("global_batch", global_batch, MAX_GLOBAL_BATCH, error=error, what="sequences")
    check_positive_int("seq_len", seq_len, MAX_SEQ_LEN, error=error, what="tokens")
    if world is not None:
        check_positive_int("world size", world, MAX_GPUS, error=error, what="GPUs")
    if layers is not None:
        check_positive_int("layers", layers, MAX_LAYERS, error=error, what="layers", why=REASONS["layers"])
