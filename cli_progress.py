"""Progress for long commands (``plan`` searches, ``calibrate``, ``run``) with rich: a live status line
on a terminal, nothing when stdout is not one (piped output stays plain) or with ``--quiet``."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STEP = re.compile(r"^step (\d+) ")


def enabled(quiet: bool = False) -> bool:
    return not quiet and sys.stdout.isatty()


@contextmanager
def status(text: str, *, quiet: bool = False, delay_s: float = 1.0) -> Iterator[Callable[[str], None]]:
    """A spinner with ``text`` that callers update (``update(msg)``); shown once the work has taken
    ``delay_s`` (a short search shows nothing), never when ``enabled`` is false."""
    if not enabled(quiet):
        yield lambda msg: None
        return
    from rich.console import Console

    console = Console(file=sys.stdout)
    start, shown, last = time.monotonic(), None, [text]

    def update(msg: str) -> None:
        nonlocal shown
        last[0] = f"{text}: {msg}"
        if shown is None and time.monotonic() - start >= delay_s:
            shown = console.status(last[0])
            shown.start()
        elif shown is not None:
            shown.update(last[0])

    try:
        yield update
    finally:
        if shown is not None:
            shown.stop()


def call_with_steps(cmd: list[str], env: dict[str, str], *, steps: int, quiet: bool = False) -> int:
    """Run ``cmd`` (torchrun) and return its exit status; on a terminal, a bar of training steps fed by
    the workers' ``step N loss ...`` lines, which are printed as usual."""
    if not enabled(quiet):
        return subprocess.call(cmd, env=env)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("steps", total=steps)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, bufsize=1)
        for line in proc.stdout:
            bar.console.print(line.rstrip("\n"), markup=False, highlight=False)
            if (m := STEP.match(line)) is not None:
                bar.update(task, completed=min(int(m.group(1)) + 1, steps))
        return proc.wait()
