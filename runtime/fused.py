"""The runtime side of ``FuseKernel``: generate the kernels module, import it, swap the module's class.

The generated source goes to a cache folder (``$MESHPLAN_KERNEL_CACHE`` or ``~/.cache/meshplan/kernels``)
named by its hash, and is imported from there with importlib, once per process. Kernels run in the
Triton interpreter when ``TRITON_INTERPRET=1`` was set before triton was first imported (CPU tensors),
with the interpreter's block sizes then. The fused class subclasses the module's own class, the
zoo's or a user's (``codegen.fused``: ``FUSED_MODULES``, ``USER_MODULES``).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from ..codegen.fused import FUSED_MODULES, USER_MODULES, spec_of
from ..codegen.kernels import GPU_RULES, INTERPRETER_RULES, generate_module
from ..codegen.program import FuseKernel
from ..ir import InvalidPlanError


def _cache_dir() -> Path:
    return Path(os.environ.get("MESHPLAN_KERNEL_CACHE") or Path.home() / ".cache" / "meshplan" / "kernels")


@functools.cache
def load_kernels(kernels: tuple[str, ...]) -> ModuleType:
    """The generated module with ``kernels``, imported from the cache (written there if new)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    source = generate_module(kernels, rules=INTERPRETER_RULES if interpret else GPU_RULES)
    name = "meshplan_kernels_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    folder = _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # several ranks may write at once
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


@functools.cache
def fused_class(kernel: str, base: type, submodules: tuple[str, ...] = ()) -> type:
    """The subclass of ``base`` whose method runs ``kernel``, as the emitted script defines it: ``base`` is
    the model's own class (the zoo class ``FUSED_MODULES`` names, or with ``submodules`` a user's module,
    whose children the method calls by those names, ``USER_MODULES``)."""
    spec = (USER_MODULES if submodules else FUSED_MODULES)[kernel]
    namespace: dict = {"kernels": load_kernels((kernel,)), "torch": torch}
    exec(textwrap.dedent(spec.source()), namespace)  # the emitted script's method, verbatim
    method = spec.signature.split("(")[0]
    attrs = {"fused_submodules": submodules} if submodules else {}
    return type(spec.name, (base,), {method: namespace[method], **attrs, "__module__": __name__,
                                     "__doc__": f"{spec.base or base.__name__} with {method} through the generated "
                                                f"{kernel} kernel."})


def fuse_kernel(step: FuseKernel, state) -> None:
    """Swap the class of ``step.module`` for its fused subclass (parameters and submodules stay)."""
    module: nn.Module = state.get(step.module)
    spec = spec_of(step)
    if spec.base and type(module).__name__ != spec.base:
        raise InvalidPlanError(f"FuseKernel({step.module}, {step.kernel}) needs a {spec.base}, "
                               f"found {type(module).__name__}")
    for role, name in zip(spec.roles, step.submodules):
        try:
            module.get_submodule(name)
        except AttributeError:
            raise InvalidPlanError(f"FuseKernel({step.module}, {step.kernel}) calls the module's {role} "
                                   f"{name!r}, which {type(module).__name__} does not have; re-plan this model "
                                   "(meshplan plan)") from None
    module.__class__ = fused_class(step.kernel, type(module), step.submodules)
