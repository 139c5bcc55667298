"""``ModelStructure``: what the later stages know about a user's model, found by the frontend.

The traced graph and the module tree say where the repeated blocks live and what each weight does;
codegen and the runtime apply a plan by these module paths (FQNs) of the user's own model, never by
a zoo's names. Paths inside a block are relative to the block (``self_attn.q_proj``); the others
are relative to the model's root (``model.embed_tokens``). An empty path means "the model has none".

    blocks        the container of the repeated blocks ("model.layers", "transformer.h", "layers")
    num_blocks    how many blocks it holds
    embed         the token embedding; ``pos_embed`` a learned position embedding, if any
    final_norm    the norm after the last block; ``head`` the output projection, ``tied_head`` when it
                  reads the embedding's table
    attn          the attention module of a block; ``attn_norm`` the norm before it
    q, k, v, o    the projections (``qkv`` instead of q/k/v when one matmul makes all three; ``qkv_grouped`` when its
                  output is laid out by heads (or kv groups), each one's q, k and v side by side, as GPT-NeoX's
                  ``view(b, s, -1, 3 * head_dim)`` reads it: a row split hands each tp rank whole heads, so tensor
                  parallelism splits it as it splits q, k and v)
    mlp           the MLP (or MoE) module of a block; ``mlp_norm`` the norm before it
    mlp_in        its column-parallel linears (gate and up, or fc1); ``mlp_out`` the row-parallel one
    experts       the routed experts (a MoE), ``router`` the gate that scores them
    shared_experts  the MLP every token passes beside the routed experts (DeepSeek-V2/V3's shared expert):
                  data-parallel, kept whole under tensor parallelism
    dense_blocks  indices of the blocks with a plain MLP where the others have ``experts`` (DeepSeek-V3's
                  ``first_k_dense_replace`` leading dense layers); expert parallelism skips them
    whole_attn_blocks  indices of the blocks whose attention is of another kind than the one the roles name
                  (MiniMax's lightning attention, with its own fused qkv_proj, beside its softmax attention's q, k,
                  v and o): tensor parallelism keeps their attention whole, each tp rank running it on the whole
                  stream
    attn_kwarg    the keyword a block passes attention its input by ("" positional; Hugging Face:
                  "hidden_states"), which sequence parallelism gathers; ``attn_tuple`` when it returns a tuple
                  (Hugging Face's, GPT-2's too), which sequence parallelism cannot cut if attention is kept whole;
                  ``attn_whole`` when its forward reshapes by the model's whole head count (OPT's), so that a
                  head split would fold the sequence: tensor parallelism keeps it whole
    mlp_tuple     the MLP returns a tuple (Llama 4's MoE: (output, router logits)), which sequence parallelism
                  cannot cut back to the sequence slice where the MLP is kept whole (experts, a fused MLP)
    linear_kind   "linear" (weight (out, in)) or "conv1d" (GPT-2's Conv1D, weight (in, out))
    head_dim      the attention head width (not always hidden / heads)
    head_norms    norms inside attention over each head's features, a (head_dim,) weight shared by the heads (Qwen3's,
                  Gemma 3's q_norm / k_norm): under tensor parallelism each rank normalizes its own heads and the
                  weight is replicated, its gradient summed over tp (``SequenceParallel`` on the heads' dim,
                  ``head_norm_dim`` of the norm's input: 2 in (b, s, heads, head_dim), 1 in (b, heads, s, head_dim))
    feature_norms norms inside attention over all heads' features of q or k, a (heads * head_dim,) weight (OLMo 2's
                  q_norm / k_norm): under tensor parallelism the weight is split as the projection's output is and the
                  norm's mean of squares is reduced over tp (``runtime.styles.FeatureShardedNorm``)
    head_params   parameters attention holds itself, one entry per head on their first dim (GPT-OSS's sinks,
                  (heads,)): under tensor parallelism each rank holds its heads' part (``Shard(0)``), which its forward
                  reads (``runtime.styles.HeadShardedParams``)
    notes         what the frontend could not use, and why (the report shows them)
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import InvalidPlanError

PATH = re.compile(r"^$|^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
LINEAR_KINDS = ("linear", "conv1d")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStructure:
    blocks: str = ""
    num_blocks: int = 0
    embed: str = ""
    pos_embed: str = ""
    final_norm: str = ""
    head: str = ""
    tied_head: bool = False
    attn: str = ""
    attn_norm: str = ""
    q: str = ""
    k: str = ""
    v: str = ""
    qkv: str = ""
    qkv_grouped: bool = False  # qkv's output is per head (or kv group) q, k, v side by side (GPT-NeoX's)
    o: str = ""
    mlp: str = ""
    mlp_norm: str = ""
    mlp_in: tuple[str, ...] = ()
    mlp_out: str = ""
    experts: str = ""
    router: str = ""
    shared_experts: str = ""
    dense_blocks: tuple[int, ...] = ()
    whole_attn_blocks: tuple[int, ...] = ()
    linear_kind: str = "linear"
    attn_kwarg: str = ""  # the keyword a block hands attention its input by ("" positional): HF "hidden_states"
    attn_tuple: bool = False  # the attention returns a tuple (Hugging Face's (attn_output, attn_weights))
    attn_whole: bool = False  # splitting its heads would change what it computes (OPT: frontend/head_split.py)
    mlp_tuple: bool = False  # the MLP returns a tuple (Llama 4's MoE: (output, router logits))
    block_tuple: bool = False  # a block returns a tuple the model takes [0] of (Falcon's, BLOOM's (hidden, ...))
    loose: tuple[str, ...] = ()  # modules outside the blocks with parameters of no role above (BLOOM's embedding norm)
    # modules of a block, beside attention, the MLP and the norms before them, that hold parameters (Gemma 2's
    # post-attention and post-feedforward norms): on a sequence-sharded stream their gradients would be partial
    block_loose: tuple[str, ...] = ()
    head_dim: int = 0
    head_norms: tuple[str, ...] = ()  # per-head norms inside attention (Qwen3's q_norm / k_norm): module docstring
    head_norm_dim: int = 0  # the heads' dim of their input (0: none)
    feature_norms: tuple[str, ...] = ()  # norms over a colwise projection's whole output (OLMo 2's q_norm)
    head_params: tuple[str, ...] = ()  # attention's own per-head parameters (GPT-OSS's sinks): module docstring
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp_in", tuple(self.mlp_in))
        object.__setattr__(self, "dense_blocks", tuple(self.dense_blocks))
        object.__setattr__(self, "whole_attn_blocks", tuple(self.whole_attn_blocks))
        object.__setattr__(self, "loose", tuple(self.loose))
        object.__setattr__(self, "block_loose", tuple(self.block_loose))
        object.__setattr__(self, "head_norms", tuple(self.head_norms))
        object.__setattr__(self, "feature_norms", tuple(self.feature_norms))
        object.__setattr__(self, "head_params", tuple(self.head_params))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("notes", "linear_kind", "dense_blocks", "whole_attn_blocks"):
                continue
            paths = value if isinstance(value, tuple) else (value,) if isinstance(value, str) else ()
            for path in paths:
                if not isinstance(path, str) or not PATH.match(path):
                    raise InvalidPlanError(f"structure.{f.name}: {path!r} is not a module path "
                                           "(dotted identifiers or indices, e.g. 'model.layers')")
        if self.linear_kind not in LINEAR_KINDS:
            raise InvalidPlanError(f"structure.linear_kind: {self.linear_kind!r} is not one of {LINEAR_KINDS}")
        for name in ("num_blocks", "head_dim", "head_norm_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidPlanError(f"structure.{name}: expected a non-negative integer, got {value!r}")
        bad = [i for i in self.dense_blocks if not isinstance(i, int) or isinstance(i, bool)
               or not 0 <= i < self.num_blocks]
        if bad or (self.dense_blocks and not self.experts):
            raise InvalidPlanError(f"structure.dense_blocks: {list(self.dense_blocks)} must be block indices below "
                                   f"num_blocks({self.num_blocks}) of a model with experts (experts is "
                                   f"{self.experts!r}); bad entries: {bad}")
        bad = [i for i in self.whole_attn_blocks if not isinstance(i, int) or isinstance(i, bool)
               or not 0 <= i < self.num_blocks]
        if bad:
            raise InvalidPlanError(f"structure.whole_attn_blocks: {list(self.whole_attn_blocks)} must be block "
                                   f"indices below num_blocks({self.num_blocks}); bad entries: {bad}")
        if bool(self.head_norms) != (self.head_norm_dim > 0):
            raise InvalidPlanError(f"structure.head_norms {list(self.head_norms)} and head_norm_dim "
                                   f"{self.head_norm_dim} go together: norms need the heads' dim (> 0), and a dim "
                                   "needs norms")
        if self.num_blocks and not self.blocks:
            raise InvalidPlanError(f"structure: num_blocks is {self.num_blocks} but blocks (the container) is empty")

    @property
    def attn_split(self) -> bool:
        """Attention has separate q, k, v and o projections that tensor parallelism can split by heads."""
        separate = bool(self.q and self.k and self.v)
        return bool(self.o) and (separate or bool(self.qkv and self.qkv_grouped)) and not self.attn_whole

    @property
    def mlp_split(self) -> bool:
        """The MLP has column-parallel inputs and one row-parallel output (no experts)."""
        return bool(self.mlp_in and self.mlp_out and not self.experts)

    def tp_linears(self) -> dict[str, tuple[tuple[str, ...], str] | None]:
        """Per sublayer of a block (``attn``, ``mlp``), its (column-parallel, row-parallel) linears, module
        paths relative to the block; None for a sublayer tensor parallelism keeps whole: a fused q/k/v
        projection (heads would be cut across q, k and v), GPT-2's Conv1D (the torch styles shard nn.Linear
        only), a MoE. What codegen shards (``codegen/tp_plans.py``), the solver writes layouts for and the
        cost model prices whole."""
        if self.linear_kind != "linear":
            return {"attn": None, "mlp": None}
        cols = (self.q, self.k, self.v) if self.q else (self.qkv,)
        return {"attn": (cols, self.o) if self.attn_split else None,
                "mlp": (tuple(self.mlp_in), self.mlp_out) if self.mlp_split else None}

    def expert_blocks(self) -> tuple[int, ...]:
        """Indices of the blocks that hold ``experts`` (every block but ``dense_blocks``)."""
        if not self.experts:
            return ()
        return tuple(i for i in range(self.num_blocks) if i not in self.dense_blocks)

    def block_path(self, index: int | str) -> str:
        return f"{self.blocks}.{index}" if self.blocks else str(index)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mlp_in"] = list(self.mlp_in)
        data["dense_blocks"] = list(self.dense_blocks)
        data["whole_attn_blocks"] = list(self.whole_attn_blocks)
        data["notes"] = list(self.notes)
        return {k: v for k, v in data.items() if v not in ("", (), [], 0, False) or k == "linear_kind"}

    @classmethod
    def from_dict(cls, data: Any) -> "ModelStructure":
        if not isinstance(data, dict):
            raise InvalidPlanError(f"structure: expected an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidPlanError(f"structure: unknown field(s) {unknown}; expected among {sorted(known)}")
        kw = dict(data)
        for key in ("mlp_in", "notes", "dense_blocks", "whole_attn_blocks", "loose", "block_loose", "head_norms",
                    "feature_norms", "head_params"):
            if key in kw:
                if not isinstance(kw[key], (list, tuple)):
                    raise InvalidPlanError(f"structure.{key}: expected a list, got {kw[key]!r}")
                kw[key] = tuple(kw[key])
        for f in fields(cls):
            if f.name in kw and f.type == "str" and not isinstance(kw[f.name], str):
                raise InvalidPlanError(f"structure.{f.name}: expected a string, got {kw[f.name]!r}")
            if f.name in kw and f.type == "bool" and not isinstance(kw[f.name], bool):
                raise InvalidPlanError(f"structure.{f.name}: expected true or false, got {kw[f.name]!r}")
        return cls(**kw)
