"""Kernel fusion as steps: ``FuseKernel(module, kernel)`` lowered from ``plan.fusions``, printed into
the emitted script, and the generated kernels module the script imports.

A fused module keeps its parameters and submodules; only its class changes, to a subclass of the zoo
class whose forward calls the generated kernel (``codegen.kernels.generate_module``) where eager
PyTorch ran a chain of ops. Tensor parallelism and FSDP wrap the submodules (``w1``, ``w3``, ``w2``)
and so see nothing different; under ColwiseParallel the kernel gets the local shards, elementwise.

    FUSED_MODULES[kernel] = (where: module path in a block, zoo class, subclass name, forward body)

Only the SwiGLU MLP of the llama family is applied for now: ``add_rmsnorm`` and the others need the
block's forward restructured (the residual add and the norm are in different modules), and are
recorded in ``plan.fusions`` but not applied.
"""
from __future__ import annotations

from ..ir import Plan
from .kernels import GPU_RULES, BlockRules, generate_module
from .program import FuseKernel, Program, Step

FUSED_MODULES: dict[str, tuple[str, str, str, str]] = {
    "swiglu": ("mlp", "SwiGLU", "FusedSwiGLU", "return self.w2(kernels.swiglu(self.w1(x), self.w3(x)))"),
}
FAMILY_KERNELS = {"llama": ("swiglu",)}  # what the family's blocks can run fused (FUSED_MODULES)


def fuse_steps(plan: Plan, layers: int) -> list[Step]:
    """FuseKernel for each block and each applicable kernel that ``plan.fusions`` records (or, for a plan
    that records none, every kernel the family supports)."""
    family = plan.model.get("family")
    supported = FAMILY_KERNELS.get(family, ())
    wanted = [k for k in (plan.fusions or supported) if k in supported]
    return [FuseKernel(module=f"layers.{i}.{FUSED_MODULES[k][0]}", kernel=k) for k in wanted for i in range(layers)]


def kernels_used(program: Program) -> tuple[str, ...]:
    """The kernel names the program's FuseKernel steps call, first-seen order."""
    return tuple(dict.fromkeys(s.kernel for s in program.steps if isinstance(s, FuseKernel)))


def kernels_source(program: Program, *, rules: BlockRules = GPU_RULES) -> str | None:
    """The generated kernels module for ``program``; None when nothing is fused."""
    used = kernels_used(program)
    return generate_module(used, rules=rules) if used else None


def fuse_kernel_lines(step: FuseKernel, target: str) -> tuple[str, list[str]]:
    return "parallelize", [f"{target}.__class__ = {FUSED_MODULES[step.kernel][2]}"]


def comment(step: Step) -> str | None:
    if isinstance(step, FuseKernel):
        return f"# kernel fusion: run {step.kernel} as one generated Triton kernel (kernels module beside this file)"
    return None


def imports(program: Program, kernels_module: str) -> list[str]:
    """Import the kernels module from the script's own folder."""
    if not kernels_used(program):
        return []
    return ["import meshplan.zoo.models", "", "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))",
            f"import {kernels_module} as kernels  # noqa: E402  generated Triton kernels, written beside this script"]


def definitions(program: Program) -> list[str]:
    """The fused subclasses the program's steps swap in."""
    out = []
    for kernel in kernels_used(program):
        _, base, name, body = FUSED_MODULES[kernel]
        out.append(f"\n\nclass {name}(meshplan.zoo.models.{base}):\n"
                   f'    """{base} with its forward through the generated ``{kernel}`` kernel."""\n\n'
                   f"    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        {body}\n")
    return out
