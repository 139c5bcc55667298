"""Run torch.export (non-strict) on a meta copy of the model, with untraceable modules as leaves.

The steps: copy the model onto the meta device without touching its weights (a deep copy whose
memo maps every parameter and buffer to an empty meta tensor of the same shape), export it on its
example inputs (``inputs``: token ids, Hugging Face keywords or the user's tensors) whose batch and
sequence sizes are dynamic, and, when tracing fails inside a module
whose class has a leaf rule, make that class a leaf and try again. A failure anywhere else becomes
an ``UnsupportedModelError`` naming the module where it happened.
"""
from __future__ import annotations

import contextlib
import copy
import io
import linecache
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.export import ExportedProgram

from ..ir import UnsupportedModelError
from .inputs import Inputs
from .calls import recording
from .leaves import Leaf, LeafRule, patch_leaves, qualname, rule_of

_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export")


@dataclass(frozen=True, slots=True, kw_only=True)
class Exported:
    program: ExportedProgram
    leaves: Mapping[str, Leaf]  # module path -> the leaf standing for it
    model: nn.Module  # the meta copy that was traced
    sequence: bool = True  # dim 1 of the first input is the sequence
    # (input size torch fixed, e.g. "L['input_ids'].size()[1]") -> the model's line that fixed it
    specialized: Mapping[str, str] = field(default_factory=dict)


# frames that are not the model's: torch, this tracing frontend, the standard library (not its site-packages)
_NOT_MODEL = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep)
_STDLIB = os.path.dirname(os.__file__) + os.sep


class _Specializations(logging.Handler):
    """Where the traced code fixed a dynamic size to a constant. With ``print_specializations`` on, torch's shape
    environment logs "Specializing <size> to <n>" from inside the trace, so the Python stack at that moment holds
    the model's line that did it (Jamba's ``for index in range(seq_len)``): the deepest frame outside torch, this
    frontend and the standard library."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg != "Specializing %s to %s" or not record.args:
            return
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith(_NOT_MODEL)
                  and not (f.filename.startswith(_STDLIB) and "site-packages" not in f.filename)]
        if frames:
            f = frames[-1]
            code = f" `{f.line.strip()[:120]}`" if f.line else ""
            self.found.setdefault(str(record.args[0]), f"{f.filename.rsplit(os.sep, 1)[-1]}:{f.lineno}{code}")


def meta_copy(model: nn.Module) -> nn.Module:
    """A deep copy on the meta device; the weights themselves are never read or copied."""
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for buf in model.buffers():
        memo[id(buf)] = torch.empty_like(buf, device="meta")
    for module in model.modules():  # plain tensor attributes (caches, tables) too
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and id(value) not in memo:
                memo[id(value)] = torch.empty_like(value, device="meta")
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """While export runs: torch logs, and prints to stderr, the partial graph of a failed trace, which
    the frontend handles (a leaf) or explains (UnsupportedModelError). Hold both back; the caller
    passes the held stderr on when the trace succeeds."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield held
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _module_stack(err: BaseException, paths: Mapping[int, str]) -> list[str]:
    """Module paths on the failing call stack, outermost first, from the traceback's frames."""
    stack: list[str] = []
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            path = paths.get(id(owner))
            if path is not None and (not stack or stack[-1] != path):
                stack.append(path)
            tb = tb.tb_next
        err = err.__cause__ or err.__context__
    return stack


def _failing_line(err: BaseException, module: nn.Module) -> str:
    """``file:line `source``` of the deepest frame of ``module``'s own code on the failing stack: the op."""
    found = ""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            if tb.tb_frame.f_locals.get("self") is module:
                code = tb.tb_frame.f_code
                source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
                found = f" at {code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
                found += f" `{source[:120]}`" if source else ""
            tb = tb.tb_next
        err = err.__cause__ or err.__context__
    return found


_INPUT_NAMES = {"tokens": "(batch, seq) token ids", "huggingface": "input_ids=(batch, seq) token ids, use_cache=False",
                "example_inputs": "the example_inputs"}


def _unsupported(err: Exception, path: str, module: nn.Module, inputs: Inputs) -> UnsupportedModelError:
    summary = " ".join(str(err).strip().splitlines()[:1])[:300] or type(err).__name__
    cls = qualname(type(module))
    where = f"module {path!r} ({cls})" if path else f"the model's own forward ({cls})"
    return UnsupportedModelError(
        f"cannot trace {where}{_failing_line(err, module)} on the meta device with {_INPUT_NAMES[inputs.kind]}: "
        f"{type(err).__name__}: "
        f"{summary}. meshplan traces with "
        "torch.export (non-strict) on meta tensors, so a forward must not branch on tensor values or make "
        "shapes from them (e.g. `if x.sum() > 0`, `.item()`, `.tolist()`, `nonzero`). Rewrite that part "
        f"(torch.cond, static shapes), or keep the module whole with a leaf rule: "
        f"trace(model, leaf_rules={{{cls!r}: LeafRule(op=..., cost=...)}}).")


def _export_once(model: nn.Module, inputs: Inputs) -> tuple[ExportedProgram, dict[str, str]]:
    """The exported program, and where the model's code fixed an input size (``_Specializations``)."""
    from torch.fx.experimental import _config as shapes_config

    config = getattr(model, "config", None)
    saved = [(name, getattr(config, name, None)) for name, _ in inputs.config]
    logger, spotted = logging.getLogger(_NOISY_LOGGERS[0]), _Specializations()
    handlers, propagate = logger.handlers, logger.propagate
    try:
        for name, value in inputs.config:
            setattr(config, name, value)
        with _quiet() as held, shapes_config.patch(print_specializations=True):
            # the specializations, to this handler alone (torch's own writes to the stderr it started with)
            logger.handlers, logger.propagate = [spotted], False
            logger.setLevel(logging.WARNING)  # _quiet held back everything; restores the level
            program = torch.export.export(model, inputs.args, dict(inputs.kwargs), dynamic_shapes=inputs.dynamic,
                                          strict=False)
    finally:
        logger.handlers, logger.propagate = handlers, propagate
        for name, value in saved:
            setattr(config, name, value)
    sys.stderr.write(held.getvalue())
    return program, spotted.found


def export_meta(model: nn.Module, *, inputs: Inputs, rules: Mapping[str, LeafRule], probe: str = "",
                calls: dict[str, str] | None = None) -> Exported:
    """Export a meta copy of ``model`` on ``inputs``, making leaves of failing ruled modules. With
    ``calls``, how each module under ``probe`` (the first block) is called goes there (``calls.recording``)."""
    copied = meta_copy(model)
    with recording(copied, probe if calls is not None else "", calls if calls is not None else {}):
        return _export_with_leaves(copied, inputs, rules)


def _export_with_leaves(copied: nn.Module, inputs: Inputs, rules: Mapping[str, LeafRule]) -> Exported:
    paths = {id(m): p for p, m in copied.named_modules()}
    modules = dict(copied.named_modules())
    leaf_classes: frozenset[str] = frozenset()
    while True:
        leaves = patch_leaves(copied, leaf_classes, rules)
        try:
            program, specialized = _export_once(copied, inputs)
            return Exported(program=program, leaves=leaves, model=copied, sequence=inputs.sequence,
                            specialized=specialized)
        except Exception as err:  # noqa: BLE001 - every failure becomes an UnsupportedModelError
            stack = _module_stack(err, paths) or [""]
            ruled = [rule_of(modules[p], rules) for p in reversed(stack) if p]
            new = [found[0] for found in ruled if found is not None and found[0] not in leaf_classes]
            if not new:
                raise _unsupported(err, stack[-1], modules[stack[-1]], inputs) from None
            leaf_classes = leaf_classes | {new[0]}
