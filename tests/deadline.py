"""A deadline for a test that must fail rather than spin (a loop quadratic in depth, trial division)."""
from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def within(seconds: int):
    """Raise TimeoutError in the block once ``seconds`` have passed (SIGALRM; main thread only)."""
    def _stop(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, _stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
