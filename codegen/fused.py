"""Kernel fusion as steps: ``FuseKernel(module, kernel)`` lowered from ``plan.fusions``, printed into
the emitted script, and the generated kernels module the script imports.

A fused module keeps its parameters and submodules; only its class changes, to a subclass of its
class that overrides one method to call the generated kernel (``codegen.kernels.generate_module``)
where eager PyTorch ran a chain of ops. ``FUSED_MODULES`` holds, per kernel, the zoo module it swaps in
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

A user's model (Hugging Face's LlamaMLP, MistralMLP, Qwen3MLP, torchtitan's FeedForward) runs
``USER_MODULES``: ``swiglu`` on a block MLP whose forward is exactly ``down(silu(gate(x)) * up(x))``,
which ``user_fusions`` checks in every block of the traced graph. Its fused class subclasses the
module's own class (``type(module)``, in the script and the runtime alike) and calls the children by
the names ``FuseKernel.submodules`` carries, printed as a string tuple (``fused_submodules``) and looked
up with ``get_submodule``: plan text is never an identifier in the script. The add + norm kernels stay
zoo-only: a user's block adds its residual inside its own forward, which no method of the block splits.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from ..ir import Graph, InvalidPlanError, ModelStructure, Node, OpKind, Plan
from . import safe
from .fusion import Fusion, find_fusions
from .kernels import GPU_RULES, BlockRules, generate_module
from .program import FuseKernel, Program, Step
from .structure import structure_of, zoo_family


@dataclass(frozen=True, slots=True, kw_only=True)
class FusedModule:
    """How one kernel runs in a block: the module it swaps, and the method that calls the kernel."""

    kernel: str  # the pattern name (codegen.kernels.PATTERNS), what plan.fusions records
    where: str  # the module it swaps, a role of the block: "mlp" (the structure's MLP), or "" for the block itself
    base: str  # the zoo class (meshplan.zoo.models); "" for a user's module, subclassed as it is (type(module))
    name: str  # the fused subclass
    signature: str  # the overridden method, e.g. "forward(self, x)"
    body: tuple[str, ...]  # its lines; ``kernels`` is the generated module, ``torch`` is torch
    families: tuple[str, ...]
    roles: tuple[str, ...] = ()  # a user's module: the children the method calls (FuseKernel.submodules), in order

    def source(self) -> str:
        """The method's source at class level (4 spaces), as the script prints and the runtime executes it."""
        return f"    def {self.signature}:\n" + "".join(f"        {line}\n" for line in self.body)


def _add_norm(kernel: str, extra: str, eps: str, families: tuple[str, ...]) -> FusedModule:
    return FusedModule(kernel=kernel, where="", base="Block",
                       name="Fused" + "".join(p.title() for p in kernel.split("_")) + "Block",
                       signature="residual_norm(self, x, attn_out)", families=families, body=(
                           "norm = self.mlp_norm",
                           f"normed, x = kernels.{kernel}(attn_out, x, norm.weight, {extra}{eps})",
                           "return x, normed"))


FUSED_MODULES: dict[str, FusedModule] = {
    "swiglu": FusedModule(kernel="swiglu", where="mlp", base="SwiGLU", name="FusedSwiGLU",
                          signature="forward(self, x)", families=("llama",),
                          body=("return self.w2(kernels.swiglu(self.w1(x), self.w3(x)))",)),
    "bias_gelu": FusedModule(kernel="bias_gelu", where="mlp", base="GeluMLP", name="FusedGeluMLP",
                             signature="forward(self, x)", families=("gpt",), body=(
                                 "h = torch.nn.functional.linear(x, self.fc1.weight)  # fc1's GEMM, its bias in the kernel",
                                 "return self.fc2(kernels.bias_gelu(h, self.fc1.bias))")),
    # nn.RMSNorm's eps=None means the dtype's machine epsilon (torch.nn.functional.rms_norm)
    "add_rmsnorm": _add_norm("add_rmsnorm", "", "torch.finfo(x.dtype).eps if norm.eps is None else norm.eps",
                             ("llama", "moe")),
    "add_layernorm": _add_norm("add_layernorm", "norm.bias, ", "norm.eps", ("gpt",)),
}

# a user's module: its children by the names the class attribute ``fused_submodules`` holds (plan data)
USER_MODULES: dict[str, FusedModule] = {
    "swiglu": FusedModule(kernel="swiglu", where="mlp", base="", name="FusedSwiGLUMLP",
                          signature="forward(self, x)", roles=("gate", "up", "down"), families=("llama",), body=(
                              "gate, up, down = (self.get_submodule(name) for name in self.fused_submodules)",
                              "return down(kernels.swiglu(gate(x), up(x)))")),
}


# ---- which kernels a user's model runs: from its traced graph, at plan time --------------------------

def user_fusions(graph: Graph, structure: ModelStructure | None) -> tuple[tuple[str, ...], ModelStructure | None]:
    """The fusions a model that is not the zoo's can run on its own modules (``USER_MODULES``: swiglu where
    every block's MLP is exactly ``down(silu(gate(x)) * up(x))``), and ``structure`` with a note saying so
    or why not, the gate listed first in ``mlp_in`` (the order ``FuseKernel.submodules`` takes)."""
    if structure is None or not structure.num_blocks:
        return (), structure
    gate, why = _swiglu_gate(graph, structure)
    if why:
        return (), replace(structure, notes=structure.notes + (f"fusion swiglu is not offered: {why}",))
    mlp_in = (gate, *(p for p in structure.mlp_in if p != gate))
    gate_name, up, down = (p[len(structure.mlp) + 1:] for p in (*mlp_in, structure.mlp_out))
    note = (f"fusion swiglu can run on the model's own MLP ({structure.block_path('N')}.{structure.mlp}: "
            f"{down}(silu({gate_name}(x)) * {up}(x))) as one generated Triton kernel, recorded in the plan's fusions "
            "where it saves time on GPUs; the add + norm kernels run on meshplan's zoo blocks only (this model's "
            "blocks add the residual inside their own forward)")
    return ("swiglu",), replace(structure, mlp_in=mlp_in, notes=structure.notes + (note,))


def _swiglu_gate(graph: Graph, s: ModelStructure) -> tuple[str, str]:
    """The gate's path in the block (the input projection fed to silu), the same in every block; or "" and why
    some block's MLP is not exactly the SwiGLU chain."""
    if why := _gated_mlp(s)[1]:
        return "", why
    mlps = {f"{s.block_path(i)}.{s.mlp}": i for i in range(s.num_blocks)}
    nodes: dict[str, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        path = node.module_path
        while path and path not in mlps:
            path = path.rpartition(".")[0]
        if path:
            nodes[path].append(node)
    chains = {f.nodes[0]: f for f in find_fusions(graph) if f.pattern == "swiglu"}
    gates = set()
    for mlp, i in mlps.items():
        gate, why = _block_gate(nodes[mlp], chains, mlp, s, s.block_path(i))
        if why:
            return "", why
        gates.add(gate)
    if len(gates) > 1:
        return "", f"the blocks feed silu from different projections ({sorted(gates)})"
    return gates.pop(), ""


def _block_gate(nodes: list[Node], chains: dict[str, Fusion], mlp: str, s: ModelStructure,
                block: str) -> tuple[str, str]:
    """The gate of one block's MLP, whose traced ops must be its three projections, silu and the product."""
    chain = [chains[n.name] for n in nodes if n.name in chains]
    if len(chain) != 1:
        ops = sorted({n.target for n in nodes if n.op is not OpKind.MATMUL}) or "no elementwise op"
        return "", f"{mlp} runs no single silu(gate) * up chain (its other ops: {ops})"
    args, product = dict(chain[0].args), chain[0].nodes[-1]
    by_name = {n.name: n for n in nodes}
    gate, up = by_name.get(args["a"]), by_name.get(args["b"])
    down = next((n for n in nodes if product in n.inputs), None)
    linears = (gate, up, down)
    if (None in linears or not set(chain[0].nodes) <= by_name.keys()
            or any(n.op is not OpKind.MATMUL for n in linears)
            or len(gate.inputs) != 1 or up.inputs != gate.inputs or down.inputs != (product,)
            or down.module_path != f"{block}.{s.mlp_out}"
            or {gate.module_path, up.module_path} != {f"{block}.{p}" for p in s.mlp_in}):
        return "", (f"{mlp}'s silu(a) * b does not read its input projections {list(s.mlp_in)} of one input, nor "
                    f"feed its output projection {s.mlp_out}")
    extra = [n.target for n in nodes if n.name not in {*chain[0].nodes, gate.name, up.name, down.name}]
    if extra:
        return "", (f"{mlp} runs {sorted(set(extra))} besides down(silu(gate(x)) * up(x)); the fused forward "
                    "would skip them")
    return gate.module_path[len(block) + 1:], ""


def _gated_mlp(s: ModelStructure) -> tuple[tuple[str, ...], str]:
    """(gate, up, down) as paths inside the MLP module, the gate first as ``user_fusions`` ordered ``mlp_in``;
    or () and why the structure holds no such MLP."""
    if s.experts:
        return (), f"the blocks' MLP holds routed experts ({s.experts}); the kernel runs on a dense MLP"
    if not s.mlp or len(s.mlp_in) != 2 or not s.mlp_out:
        return (), (f"the blocks' MLP ({s.mlp or 'none found'}) is not two input projections (gate and up) feeding "
                    f"one output projection (inputs {list(s.mlp_in)}, output {s.mlp_out or 'none'})")
    paths = (*s.mlp_in, s.mlp_out)
    if not all(p.startswith(s.mlp + ".") for p in paths):
        return (), f"its projections {list(paths)} are not all inside the MLP module {s.mlp!r}"
    return tuple(p[len(s.mlp) + 1:] for p in paths), ""


# ---- which kernels a plan's program runs ----------------------------------------------------------

def _modules(s: ModelStructure) -> dict[str, FusedModule]:
    """The fused modules of the model's kind: the zoo's classes, or a user's own."""
    return FUSED_MODULES if zoo_family(s) is not None else USER_MODULES


def blocked(kernel: str, plan: Plan) -> str | None:
    """Why ``kernel`` cannot run under ``plan`` in the zoo's blocks, or None when it can."""
    if kernel in ("add_rmsnorm", "add_layernorm") and plan.sequence_parallel:
        return ("under sequence parallelism the norms run on S(1) DTensors (SequenceParallel) and their weight "
                "gradients need a reduction over tp; the kernel takes plain tensors")
    if kernel == "bias_gelu" and plan.mesh.tp > 1:
        return "under tensor parallelism fc1 is sharded by ColwiseParallel's hooks, which the fused forward would bypass"
    return None


def _why_not(kernel: str, plan: Plan, s: ModelStructure) -> str | None:
    """Why the plan's program does not run ``kernel``, or None when it does."""
    modules, family = _modules(s), plan.model.get("family")
    spec = modules.get(kernel)
    if modules is FUSED_MODULES:
        if spec is None or family not in spec.families:
            return f"no zoo {safe.shown(family)} block holds it as one module ({', '.join(FUSED_MODULES)} are applied)"
        return blocked(kernel, plan)
    if spec is None:
        return f"it runs on meshplan's zoo blocks only (on this model's own modules: {', '.join(USER_MODULES)})"
    if family not in spec.families:
        return (f"it runs in the MLP of a {', '.join(spec.families)} block, and the plan's model family is "
                f"{safe.shown(family)}")
    return _gated_mlp(s)[1] or None


def applicable(plan: Plan) -> tuple[str, ...]:
    """The kernels of ``plan.fusions`` that run in the plan's program, in ``FUSED_MODULES`` order (a user's
    model: ``USER_MODULES``)."""
    s = structure_of(plan)
    return tuple(k for k in _modules(s) if k in plan.fusions and _why_not(k, plan, s) is None)


def skipped(plan: Plan) -> tuple[str, ...]:
    """One line per fusion ``plan.fusions`` records that its program does not run, and why."""
    if not plan.fusions:
        return ("fusion: the plan records none (meshplan.autoparallelize records those the cost model finds faster)",)
    s = structure_of(plan)
    lines = []
    for kernel in plan.fusions:
        why = _why_not(kernel, plan, s) if isinstance(kernel, str) else "not a kernel name"
        if why is not None:  # the kernel's name is plan text: shown quoted and escaped unless a plain token
            lines.append(f"fusion {safe.shown(kernel)} not applied: {why}")
    return tuple(lines)


def fuse_steps(plan: Plan, structure: ModelStructure) -> list[Step]:
    """FuseKernel for each block and each kernel ``applicable`` to the plan, on the structure's module paths
    (a user's module: with the children its fused method calls)."""
    modules = _modules(structure)
    children = _gated_mlp(structure)[0] if modules is USER_MODULES else ()
    return [FuseKernel(module=".".join(filter(None, (structure.block_path(i), structure.mlp if modules[k].where
                                                     else ""))), kernel=k, submodules=children)
            for k in applicable(plan) for i in range(structure.num_blocks)]


# ---- the emitted script's side --------------------------------------------------------------------

def kernels_used(program: Program) -> tuple[str, ...]:
    """The kernel names the program's FuseKernel steps call, first-seen order (each one of ``FUSED_MODULES``
    or ``USER_MODULES``)."""
    return tuple(dict.fromkeys(spec_of(s).kernel for s in program.steps if isinstance(s, FuseKernel)))


def spec_of(step: FuseKernel) -> FusedModule:
    """How ``step``'s kernel runs (with ``submodules``: on a user's module); InvalidPlanError for a name outside
    the closed set, or children that are not one module path per role of the kernel."""
    modules, whose = (USER_MODULES, "a user's") if step.submodules else (FUSED_MODULES, "a zoo")
    spec = modules.get(step.kernel) if isinstance(step.kernel, str) else None
    if spec is None:
        raise InvalidPlanError(f"FuseKernel.kernel is {step.kernel!r}, but the generated kernels on {whose} module "
                               f"are {', '.join(modules)}; lower the plan with meshplan.codegen.lower")
    if step.submodules and (not isinstance(step.submodules, tuple) or len(step.submodules) != len(spec.roles)
                            or not all(step.submodules)):
        raise InvalidPlanError(f"FuseKernel.submodules is {step.submodules!r}, but {step.kernel} on a user's module "
                               f"calls {len(spec.roles)} children ({', '.join(spec.roles)}), each a module path; "
                               "lower the plan with meshplan.codegen.lower")
    for path in step.submodules:
        safe.module_path(path, "FuseKernel.submodules entry")
    return spec


def _classes(program: Program) -> dict[FusedModule, tuple[str, ...]]:
    """The fused classes the program's steps swap in, with the children a user's one calls (one set per class)."""
    classes: dict[FusedModule, tuple[str, ...]] = {}
    for step in program.steps:
        if isinstance(step, FuseKernel):
            spec = spec_of(step)
            if classes.setdefault(spec, step.submodules) != step.submodules:
                raise InvalidPlanError(f"FuseKernel steps of {step.kernel} name the children {classes[spec]!r} and "
                                       f"{step.submodules!r}; the script's {spec.name} calls one set (blocks are "
                                       "alike): lower the plan with meshplan.codegen.lower")
    return classes


def kernels_source(program: Program, *, rules: BlockRules = GPU_RULES) -> str | None:
    """The generated kernels module for ``program``, checked to compile; None when nothing is fused."""
    used = kernels_used(program)
    if not used:
        return None
    return safe.checked_source(generate_module(used, rules=rules), "<generated kernels module>", "the kernels module")


def fuse_kernel_lines(step: FuseKernel, target: str) -> tuple[str, list[str]]:
    spec = spec_of(step)
    if spec.base:
        return "parallelize", [f"{target}.__class__ = {spec.name}"]
    return "parallelize", [f"{target}.__class__ = fused_class({spec.name}, type({target}))"]


def comment(step: Step) -> str | None:
    if isinstance(step, FuseKernel):
        own = "" if spec_of(step).base else " in a subclass of the model's own module class"
        return (f"# kernel fusion: run {step.kernel} as one generated Triton kernel{own} (kernels module beside "
                "this file)")
    return None


def imports(program: Program, kernels_module: str) -> list[str]:
    """Import the kernels module from the script's own folder (and the zoo, whose classes are subclassed)."""
    classes = _classes(program)
    if not classes:
        return []
    zoo = ["import meshplan.zoo.models", ""] if any(spec.base for spec in classes) else []
    return [*zoo, "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))",
            f"import {safe.name(kernels_module, 'the kernels module')} as kernels  # noqa: E402  generated Triton kernels, written beside this script"]


_FUSED_CLASS = '''

_FUSED_CLASSES = {}


def fused_class(fused, base):
    """``base`` (a module's own class) with the methods of ``fused`` first; one class per pair."""
    if (fused, base) not in _FUSED_CLASSES:
        _FUSED_CLASSES[fused, base] = type(fused.__name__, (fused, base), {"__module__": __name__})
    return _FUSED_CLASSES[fused, base]
'''


def definitions(program: Program) -> list[str]:
    """The fused subclasses the program's steps swap in (a user's module: a class its own is mixed with)."""
    out = []
    classes = _classes(program)
    for spec, children in classes.items():
        method = spec.signature.split("(")[0]
        if spec.base:
            out.append(f"\n\nclass {spec.name}(meshplan.zoo.models.{spec.base}):\n"
                       f'    """{spec.base} with ``{method}`` through the generated ``{spec.kernel}`` kernel."""\n\n'
                       f"{spec.source()}")
            continue
        names = safe.literal(children, "FuseKernel.submodules")  # plan data: a tuple of strings, never identifiers
        out.append(f"\n\nclass {spec.name}:\n"
                   f'    """Mixed into the model\'s own module class (``fused_class``): ``{method}`` through the '
                   f"generated ``{spec.kernel}``\n    kernel, calling the module's {', '.join(spec.roles)} children "
                   f'by the names below (the plan\'s structure)."""\n\n'
                   f"    fused_submodules = {names}  # {', '.join(spec.roles)}\n\n{spec.source()}")
    if any(not spec.base for spec in classes):
        out.append(_FUSED_CLASS)
    return out
