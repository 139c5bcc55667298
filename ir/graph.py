"""The graph IR: what the frontend traces and everyone downstream reads.

Shapes and costs are sympy expressions in two symbols, ``b`` (micro-batch size) and ``s``
(sequence length), so that one trace serves every batch and sequence the solver tries.
Nothing here holds a ``torch.fx.Node``; it is all frozen values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import sympy

from .structure import ModelStructure

BATCH = sympy.Symbol("b", positive=True, integer=True)
SEQ = sympy.Symbol("s", positive=True, integer=True)

# float4: NVFP4 (E2M1), two values to a byte as torch.float4_e2m1fn_x2 stores them; a plan in float8 or float4
# runs its GEMMs on operands quantized to that width and everything else in bfloat16 (cost_model.layer_cost)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "float4": 1, "int64": 8, "int32": 4, "bool": 1}


class OpKind(StrEnum):
    MATMUL = "matmul"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    NORM = "norm"
    REDUCTION = "reduction"
    SOFTMAX = "softmax"
    EMBEDDING = "embedding"
    CROSS_ENTROPY = "softmax-cross-entropy"
    MOE = "moe"  # a routed-expert layer kept whole as a leaf op (data-dependent routing)
    VIEW = "view"
    OTHER = "other"


def as_expr(value: int | sympy.Expr) -> sympy.Expr:
    return sympy.sympify(value)


def evaluate(expr: sympy.Expr | int, *, batch: int, seq: int) -> float:
    """A cost or size expression at a concrete micro-batch and sequence length."""
    return float(sympy.sympify(expr).subs({BATCH: batch, SEQ: seq}))


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorMeta:
    shape: tuple[sympy.Expr, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
        object.__setattr__(self, "shape", tuple(as_expr(d) for d in self.shape))

    @property
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape) if self.shape else sympy.Integer(1)

    @property
    def nbytes(self) -> sympy.Expr:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    name: str  # fully qualified, e.g. "layers.3.attn.wq.weight"
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    op: OpKind
    target: str  # the aten op, or the leaf module's class for leaf ops
    inputs: tuple[str, ...] = ()  # names of producer nodes (placeholders included)
    input_metas: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    flops: sympy.Expr = sympy.Integer(0)  # forward FLOPs, a multiply-add counts 2
    bytes: sympy.Expr = sympy.Integer(0)  # forward bytes read + written
    module_path: str = ""  # the owning module, e.g. "layers.3.mlp"
    params: tuple[str, ...] = ()  # parameter names this node reads
    leaf: bool = False  # kept whole by the frontend with a declared cost

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", OpKind(self.op))
        object.__setattr__(self, "flops", as_expr(self.flops))
        object.__setattr__(self, "bytes", as_expr(self.bytes))


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """A repeated layer. Blocks with equal ``kind`` are structurally the same."""

    name: str  # module path, e.g. "layers.3"
    kind: str  # e.g. "LlamaBlock#0": equal kinds get one decision
    index: int  # position among the blocks
    nodes: tuple[str, ...]
    params: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDims:
    """Transformer dimensions the cost model reads (from the traced graph or the model config)."""

    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    head_dim: int = 0  # attention head width; 0: hidden // heads (not always so: GPT-OSS, 2880 and 64 heads of 64)
    # the traced blocks' FLOPs over the family formula's (cost_model.flops), weight matmuls and attention core
    # apart, where the formula misses them (DeepSeek's latent attention and shared experts); 1 where it holds
    # (cost_model.summary finds them)
    matmul_scale: float = 1.0
    core_scale: float = 1.0
    # sliding-window attention: ``windowed_layers`` of the layers let each query attend to the ``attention_window``
    # positions up to it, not to the whole prefix (Hugging Face ``sliding_window`` and ``layer_types``: GPT-OSS
    # alternates them with full attention, Gemma 3 runs five to one); a window-aware kernel skips the blocks outside
    # the window (cost_model.flops.window_share, Software.window_kernel)
    attention_window: int = 0
    windowed_layers: int = 0
    # what the experts run beyond a plain SwiGLU (cost_model.layer_cost.expert_extra_bytes): biases on their linears
    # (GPT-OSS's gate_up_proj_bias and down_proj_bias, found among the traced experts' parameters), and a limit the
    # GLU's two halves are clamped to before the gate (GPT-OSS's swiglu_limit 7.0; 0: none)
    expert_bias: bool = False
    glu_limit: float = 0.0

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads if self.heads else 0)


@dataclass(frozen=True, kw_only=True)
class Graph:
    nodes: tuple[Node, ...]
    params: tuple[Param, ...]
    blocks: tuple[Block, ...]
    dims: ModelDims
    dtype: str = "float32"
    structure: ModelStructure | None = None  # the roles the frontend found (``frontend.trace`` fills it)
    _by_name: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        self._by_name.update({n.name: n for n in self.nodes})

    def node(self, name: str) -> Node:
        return self._by_name[name]

    @cached_property
    def param_count(self) -> int:
        return sum(p.numel for p in self.params)

    @cached_property
    def block_kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.kind for b in self.blocks))

    def nodes_of(self, block: Block) -> tuple[Node, ...]:
        return tuple(self._by_name[n] for n in block.nodes)

    def block_params(self, block: Block) -> int:
        by_name = {p.name: p for p in self.params}
        return sum(by_name[p].numel for p in block.params)

    @cached_property
    def outside_block_nodes(self) -> tuple[Node, ...]:
        inside = {n for b in self.blocks for n in b.nodes}
        return tuple(n for n in self.nodes if n.name not in inside)

    def total_flops(self) -> sympy.Expr:
        return sympy.Add(*(n.flops for n in self.nodes))
