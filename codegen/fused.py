"""Kernel fusion as steps: ``FuseKernel(module, kernel)`` lowered from ``plan.fusions``, printed into
the emitted script, and the generated kernels module the script imports.

A fused module keeps its parameters and submodules; only its class changes, to a subclass of the zoo
class that overrides one method to call the generated kernel (``codegen.kernels.generate_module``)
where eager PyTorch ran a chain of ops. ``FUSED_MODULES`` holds, per kernel, the module it swaps in
each block and the method's source, which the emitted script prints and the runtime executes verbatim:

    swiglu         layers.N.mlp   SwiGLU.forward          silu(w1 x) * w3 x                  (llama)
    bias_gelu      layers.N.mlp   GeluMLP.forward         gelu_tanh(x W1^T + b1), the GEMM without its bias (gpt)
    add_rmsnorm    layers.N       Block.residual_norm     x + attn_out and mlp_norm of it     (llama, moe)
    add_layernorm  layers.N       Block.residual_norm     the same with a LayerNorm           (gpt)

The add + norm fused is the one inside a block (after attention, before the MLP). The other one the
fusion pass finds, the MLP's residual add with the next block's ``attn_norm`` (or the final norm),
crosses the block boundary, where pipeline stages, activation checkpointing and FSDP cut the model:
it stays eager.

Tensor parallelism and FSDP see nothing different where the fused method reads plain tensors:
under ColwiseParallel ``swiglu`` gets the local shards from ``w1`` and ``w3``; without sequence
parallelism the residual stream and the norms are plain replicated tensors, and FSDP hands a block
its gathered parameters. Where a kernel would get DTensors or bypass a parallel style's hooks,
``blocked`` says why, and lowering skips the kernel for that plan (the program's header says so):

    add_rmsnorm, add_layernorm  not with sequence parallelism: SequenceParallel runs the norms on
                                S(1) DTensors, and the weight gradient needs its reduction over tp
    bias_gelu                   not with tensor parallelism: the fused forward calls fc1's GEMM
                                itself, past ColwiseParallel's input and output redistributions
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import InvalidPlanError, Plan
from . import safe
from .kernels import GPU_RULES, BlockRules, generate_module
from .program import FuseKernel, Program, Step


@dataclass(frozen=True, slots=True, kw_only=True)
class FusedModule:
    """How one kernel runs in a zoo block: the module it swaps, and the method that calls the kernel."""

    where: str  # path inside a block: "mlp", or "" for the block itself
    base: str  # the zoo class (meshplan.zoo.models)
    name: str  # the fused subclass
    signature: str  # the overridden method, e.g. "forward(self, x)"
    body: tuple[str, ...]  # its lines; ``kernels`` is the generated module, ``torch`` is torch
    families: tuple[str, ...]

    def source(self) -> str:
        """The method's source at class level (4 spaces), as the script prints and the runtime executes it."""
        return f"    def {self.signature}:\n" + "".join(f"        {line}\n" for line in self.body)


def _add_norm(kernel: str, extra: str, eps: str, families: tuple[str, ...]) -> FusedModule:
    return FusedModule(where="", base="Block", name="Fused" + "".join(p.title() for p in kernel.split("_")) + "Block",
                       signature="residual_norm(self, x, attn_out)", families=families, body=(
                           "norm = self.mlp_norm",
                           f"normed, x = kernels.{kernel}(attn_out, x, norm.weight, {extra}{eps})",
                           "return x, normed"))


FUSED_MODULES: dict[str, FusedModule] = {
    "swiglu": FusedModule(where="mlp", base="SwiGLU", name="FusedSwiGLU", signature="forward(self, x)",
                          body=("return self.w2(kernels.swiglu(self.w1(x), self.w3(x)))",), families=("llama",)),
    "bias_gelu": FusedModule(where="mlp", base="GeluMLP", name="FusedGeluMLP", signature="forward(self, x)",
                             body=("h = torch.nn.functional.linear(x, self.fc1.weight)  # fc1's GEMM, its bias in the kernel",
                                   "return self.fc2(kernels.bias_gelu(h, self.fc1.bias))"), families=("gpt",)),
    # nn.RMSNorm's eps=None means the dtype's machine epsilon (torch.nn.functional.rms_norm)
    "add_rmsnorm": _add_norm("add_rmsnorm", "", "torch.finfo(x.dtype).eps if norm.eps is None else norm.eps",
                             ("llama", "moe")),
    "add_layernorm": _add_norm("add_layernorm", "norm.bias, ", "norm.eps", ("gpt",)),
}


def blocked(kernel: str, plan: Plan) -> str | None:
    """Why ``kernel`` cannot run under ``plan`` in the zoo's blocks, or None when it can."""
    if kernel in ("add_rmsnorm", "add_layernorm") and plan.sequence_parallel:
        return ("under sequence parallelism the norms run on S(1) DTensors (SequenceParallel) and their weight "
                "gradients need a reduction over tp; the kernel takes plain tensors")
    if kernel == "bias_gelu" and plan.mesh.tp > 1:
        return "under tensor parallelism fc1 is sharded by ColwiseParallel's hooks, which the fused forward would bypass"
    return None


def applicable(plan: Plan) -> tuple[str, ...]:
    """The kernels of ``plan.fusions`` that run in the plan's program, in ``FUSED_MODULES`` order."""
    family = plan.model.get("family")
    return tuple(k for k, f in FUSED_MODULES.items()
                 if k in plan.fusions and family in f.families and blocked(k, plan) is None)


def skipped(plan: Plan) -> tuple[str, ...]:
    """One line per fusion ``plan.fusions`` records that its program does not run, and why."""
    family = plan.model.get("family")
    if not plan.fusions:
        return ("fusion: the plan records none (meshplan.autoparallelize records those the cost model finds faster)",)
    lines = []
    for kernel in plan.fusions:
        spec = FUSED_MODULES.get(kernel)
        if spec is None or family not in spec.families:
            why = f"no zoo {safe.shown(family)} block holds it as one module ({', '.join(FUSED_MODULES)} are applied)"
        else:
            why = blocked(kernel, plan)
        if why is not None:  # the kernel's name is plan text: shown quoted and escaped unless a plain token
            lines.append(f"fusion {safe.shown(kernel)} not applied: {why}")
    return tuple(lines)


def fuse_steps(plan: Plan, layers: int) -> list[Step]:
    """FuseKernel for each block and each kernel ``applicable`` to the plan."""
    return [FuseKernel(module=".".join(filter(None, (f"layers.{i}", FUSED_MODULES[k].where))), kernel=k)
            for k in applicable(plan) for i in range(layers)]


def kernels_used(program: Program) -> tuple[str, ...]:
    """The kernel names the program's FuseKernel steps call, first-seen order (each one of ``FUSED_MODULES``)."""
    return tuple(dict.fromkeys(_spec(s)[0] for s in program.steps if isinstance(s, FuseKernel)))


def _spec(step: FuseKernel) -> tuple[str, FusedModule]:
    """The kernel of ``step`` and how it runs; InvalidPlanError for a name outside the closed set."""
    spec = FUSED_MODULES.get(step.kernel) if isinstance(step.kernel, str) else None
    if spec is None:
        raise InvalidPlanError(f"FuseKernel.kernel is {step.kernel!r}, but the generated kernels are "
                               f"{', '.join(FUSED_MODULES)}; lower the plan with meshplan.codegen.lower")
    return step.kernel, spec


def kernels_source(program: Program, *, rules: BlockRules = GPU_RULES) -> str | None:
    """The generated kernels module for ``program``, checked to compile; None when nothing is fused."""
    used = kernels_used(program)
    if not used:
        return None
    return safe.checked_source(generate_module(used, rules=rules), "<generated kernels module>", "the kernels module")


def fuse_kernel_lines(step: FuseKernel, target: str) -> tuple[str, list[str]]:
    return "parallelize", [f"{target}.__class__ = {_spec(step)[1].name}"]


def comment(step: Step) -> str | None:
    if isinstance(step, FuseKernel):
        return (f"# kernel fusion: run {_spec(step)[0]} as one generated Triton kernel (kernels module beside "
                "this file)")
    return None


def imports(program: Program, kernels_module: str) -> list[str]:
    """Import the kernels module from the script's own folder."""
    if not kernels_used(program):
        return []
    return ["import meshplan.zoo.models", "", "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))",
            f"import {safe.name(kernels_module, 'the kernels module')} as kernels  # noqa: E402  generated Triton kernels, written beside this script"]


def definitions(program: Program) -> list[str]:
    """The fused subclasses the program's steps swap in."""
    out = []
    for kernel in kernels_used(program):
        spec = FUSED_MODULES[kernel]
        out.append(f"\n\nclass {spec.name}(meshplan.zoo.models.{spec.base}):\n"
                   f'    """{spec.base} with ``{spec.signature.split("(")[0]}`` through the generated ``{kernel}`` '
                   f'kernel."""\n\n{spec.source()}')
    return out
