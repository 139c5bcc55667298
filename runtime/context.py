"""Context parallelism: each cp rank holds ``seq_len / cp`` tokens of every sequence and runs every layer
on them; attention, the one place tokens meet, all-gathers K and V over the cp group and attends its
local queries to them (Llama 3's all-gather CP, Dubey et al. 2024, sec. 3.3.2).

Layout. With ``load_balance`` the sequence is cut into ``2 cp`` chunks of ``c = seq_len / (2 cp)``
tokens and rank ``r`` holds chunks ``r`` and ``2cp - 1 - r`` (in that order): under a causal mask
chunk ``i`` attends ``(i + 1) c`` keys, so every rank attends ``(2cp + 1) c`` keys in all. Without
it rank ``r`` holds chunk ``r`` of ``cp`` and does ``r + 1`` times rank 0's work.
``sequence_share`` cuts inputs and targets this way; positions stay global: the rotary rows and
GPT's learned positions are those of the tokens' places in the whole sequence.

Attention. K and V (before GQA's head repetition: ``kv_heads``, not ``heads``, cross the wire)
are all-gathered over cp with ``_functional_collectives.all_gather_single``, whose backward is a
reduce-scatter that sums each chunk's key/value gradients from every rank that attended to it;
then put in sequence order. Each run of contiguous local queries at global positions
``[start, stop)`` attends keys ``[0, stop)`` with the causal mask shifted by ``start``. Selective
recompute keeps the gathered K/V (``_c10d_functional.all_gather_into_tensor`` is in
``codegen.SELECTIVE_SAVE_OPS``), so backward does not gather again.

Gradients. Rank (d, c) computes ``L_dc``, the mean loss over its own tokens; these are equal shares,
so the global loss is ``L = (1 / (dp cp)) sum_dc L_dc``. Backward on rank (d, c) yields every path
from its parameters to any ``L_dc'`` of its cp group once: its own tokens' paths locally, and the
paths through its K/V into the other ranks' attention via the reduce-scatter. Summed over all ranks
that is ``sum_dc dL_dc / dw``, so averaging gradients over the dp x cp ranks (DDP or FSDP over the
flattened ``dp_cp`` axis, ``FlattenMesh``) gives exactly ``dL / dw``, and the loss reported is the
average of the ``L_dc`` over the same ranks.

Any model's attention (``ContextParallelSDPA``). Where attention is not meshplan's own module, the
one op every attention implementation here calls, ``F.scaled_dot_product_attention`` (Hugging Face's
"sdpa" attention, torchtitan's, nanoGPT's), is taken over while the attention module runs (a
``TorchFunctionMode`` entered in its forward): K and V are gathered over cp as above, and the local
queries attend them under the causal mask of their global positions, which replaces the mask the
model passed (a causal LM's, built for the local tokens). The model is called with ``position_ids``
= the global positions of the rank's tokens, so that its rotary tables are those of their places in
the whole sequence (``SequenceSplit.positions``; Hugging Face models take them). A forward that
calls no SDPA (HF "eager" attention), a call that is neither causal nor masked, or a sliding window
shorter than the sequence is refused where it happens.

Why not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it replaces only
the CUDA attention kernels (flash, efficient, cudnn); on CPU, SDPA runs
``aten._scaled_dot_product_flash_attention_for_cpu``, which it has no rule for (seen on gloo:
"does not have a sharding strategy registered"), and the module swap here keeps zoo's parameters
and names untouched, as ``runtime.expert`` does for MoE.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.overrides import TorchFunctionMode

from ..codegen import ContextParallel, FlattenMesh, Program
from ..codegen.expert import on_expert_mesh
from ..ir import InvalidPlanError

if TYPE_CHECKING:
    from .interpret import State

Runs = tuple[tuple[int, int], ...]


@lru_cache(maxsize=64)
def sequence_runs(seq_len: int, cp_size: int, cp_rank: int, load_balance: bool = True) -> Runs:
    """The ``[start, stop)`` ranges of global positions that rank ``cp_rank`` holds, in local order."""
    parts = 2 * cp_size if load_balance else cp_size
    if seq_len % parts:
        how = f"2 * cp({cp_size})" if load_balance else f"cp({cp_size})"
        raise InvalidPlanError(f"context parallelism cuts each sequence into {how} = {parts} chunks, but a "
                               f"sequence of {seq_len} tokens leaves {seq_len % parts}; use a multiple of {parts}")
    chunk = seq_len // parts
    chunks = (cp_rank, parts - 1 - cp_rank) if load_balance else (cp_rank,)
    return tuple((i * chunk, (i + 1) * chunk) for i in chunks)


def sequence_positions(seq_len: int, cp_size: int, cp_rank: int, load_balance: bool = True,
                       device: torch.device | None = None) -> torch.Tensor:
    """Global positions of rank ``cp_rank``'s tokens, in local order: (seq_len / cp,)."""
    runs = sequence_runs(seq_len, cp_size, cp_rank, load_balance)
    return torch.cat([torch.arange(a, b, device=device) for a, b in runs])


def sequence_share(tokens: torch.Tensor, cp_size: int, cp_rank: int, *, load_balance: bool = True) -> torch.Tensor:
    """Rank ``cp_rank``'s part of every sequence: (b, s) -> (b, s / cp). Cut targets the same way."""
    runs = sequence_runs(tokens.shape[1], cp_size, cp_rank, load_balance)
    return torch.cat([tokens[:, a:b] for a, b in runs], dim=1)


@lru_cache(maxsize=64)
def _gathered_order(seq_len: int, cp_size: int, load_balance: bool) -> tuple[int, ...] | None:
    """Where each global position sits among the all-gathered rows (rank 0's, rank 1's, ...);
    None when that is already sequence order (no load balance)."""
    if not load_balance:
        return None
    held = torch.cat([sequence_positions(seq_len, cp_size, r, True) for r in range(cp_size)])
    return tuple(held.argsort().tolist())


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, kv_groups: int) -> torch.Tensor:
    """Queries at global positions ``[start, start + n)`` against keys ``[0, m)`` (``m >= start + n``):
    q (b, n, heads, hd), k and v (b, m, kv_heads, hd) -> (b, n, heads, hd)."""
    if kv_groups > 1:
        k = k.repeat_interleave(kv_groups, dim=2)
        v = v.repeat_interleave(kv_groups, dim=2)
    n, m = q.shape[1], k.shape[1]
    keys = torch.arange(m, device=q.device)
    mask = keys[None, :] <= torch.arange(start, start + n, device=q.device)[:, None]  # (n, m): key <= query
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, heads, s, hd)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


class _ContextParallelModule:
    """What the swapped classes share: the cp group, this rank's place in it, and the K/V gather."""

    cp_group: dist.ProcessGroup
    cp_size: int
    cp_rank: int
    load_balance: bool

    def cp_runs(self, local_len: int) -> Runs:
        return sequence_runs(local_len * self.cp_size, self.cp_size, self.cp_rank, self.load_balance)

    def _gather(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """``t`` with this rank's tokens along ``dim`` (s / cp) from every cp rank -> all s tokens in
        sequence order (the zoo's (b, s, kv_heads, hd); SDPA's (b, kv_heads, s, hd) with ``dim=2``)."""
        dim %= t.dim()
        gathered = funcol.all_gather_single(t.contiguous(), gather_dim=dim, group=self.cp_group)
        order = _gathered_order(t.shape[dim] * self.cp_size, self.cp_size, self.load_balance)
        if order is None:
            return gathered
        return gathered.index_select(dim, torch.tensor(order, device=t.device))


class ContextParallelAttention(_ContextParallelModule):
    """Mixed into the zoo's ``Attention``: rotary rows at global positions, K/V gathered over cp."""

    def rope_rows(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = sequence_positions(s * self.cp_size, self.cp_size, self.cp_rank, self.load_balance,
                                       self.rope_cos.device)  # type: ignore[attr-defined]
        return self.rope_cos[positions], self.rope_sin[positions]  # type: ignore[attr-defined]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        local_len = q.shape[1]
        k_all, v_all = (self._gather(t) for t in (k, v))  # (b, seq_len, kv_heads, hd), sequence order
        out, first = [], 0
        for start, stop in self.cp_runs(local_len):
            rows = slice(first, first + stop - start)
            out.append(causal_attention(q[:, rows], k_all[:, :stop], v_all[:, :stop], start,
                                        self.kv_groups))  # type: ignore[attr-defined]
            first = rows.stop
        return torch.cat(out, dim=1)  # (b, local_len, heads, hd)


def sliding_window(module: nn.Module) -> int | None:
    """The sliding window ``module`` (a model or its attention) attends in, or None: its own
    ``sliding_window``, else its config's unless the config turns it off (``use_sliding_window``, Qwen3)."""
    config = getattr(module, "config", None)
    window = getattr(module, "sliding_window", None) or (
        getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None)
    return window if isinstance(window, int) and window > 0 else None


class _SDPAOverCP(TorchFunctionMode):
    """While an attention module runs: its ``F.scaled_dot_product_attention`` calls go to the module's
    ``sdpa_over_cp``; every other function runs as it would."""

    def __init__(self, module: "ContextParallelSDPA") -> None:
        super().__init__()
        self.module, self.calls = module, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            return self.module.sdpa_over_cp(*args, **kwargs)  # the mode is off inside: SDPA runs as itself
        return func(*args, **kwargs)


class ContextParallelSDPA(_ContextParallelModule):
    """Mixed into any other attention module: its SDPA attends this rank's queries to K and V gathered
    over cp, causally by global position (module docstring)."""

    def forward(self, *args, **kwargs):
        mode = _SDPAOverCP(self)
        with mode:
            out = super().forward(*args, **kwargs)  # type: ignore[misc]
        if not mode.calls:
            raise InvalidPlanError(
                f"context parallelism: {type(self).__name__.removeprefix('ContextParallel')} ran no "
                "torch.nn.functional.scaled_dot_product_attention, which is where the runtime gathers K and V "
                "over cp; build the model with SDPA attention (Hugging Face: attn_implementation=\"sdpa\") "
                "or plan with cp=1")
        return out

    def sdpa_over_cp(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        """SDPA of this rank's queries (b, heads, s / cp, hd) against every rank's keys and values."""
        local_len = query.shape[-2]
        if attn_mask is None and not is_causal:
            raise InvalidPlanError(
                f"context parallelism: {type(self).__name__.removeprefix('ContextParallel')} calls "
                "scaled_dot_product_attention with neither is_causal nor a mask (attention over the whole "
                "sequence); the runtime runs causal attention over cp only: plan with cp=1")
        window = sliding_window(self)
        if window is not None and window < local_len * self.cp_size:
            raise InvalidPlanError(
                f"context parallelism: sliding-window attention ({window} tokens) over sequences of "
                f"{local_len * self.cp_size}; the runtime masks causally only: plan with cp=1 or seq_len <= {window}")
        groups = getattr(self, "num_key_value_groups", 1)  # Hugging Face's heads per K/V head
        if not enable_gqa and isinstance(groups, int) and groups > 1 and key.shape[-3] == query.shape[-3]:
            # K and V came repeated to every query head (HF's repeat_kv, done when a mask is passed, which
            # HF decides per rank from the positions): gather the kv_heads alone, so that every rank sends
            # the same shape, and let SDPA repeat them
            key, value, enable_gqa = key[..., ::groups, :, :], value[..., ::groups, :, :], True
        k_all, v_all = self._gather(key, dim=-2), self._gather(value, dim=-2)  # (b, kv_heads, s, hd)
        out, first = [], 0
        for start, stop in self.cp_runs(local_len):
            rows = slice(first, first + stop - start)
            mask = torch.arange(stop, device=query.device)[None, :] <= torch.arange(
                start, stop, device=query.device)[:, None]  # key <= query, by global position
            out.append(F.scaled_dot_product_attention(
                query[..., rows, :], k_all[..., :stop, :], v_all[..., :stop, :], attn_mask=mask,
                dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa))
            first = rows.stop
        return torch.cat(out, dim=-2)


class ContextParallelPositions(_ContextParallelModule):
    """Mixed into the zoo's ``Embedding``: the learned positions of this rank's tokens are global."""

    def positions(self, s: int, device: torch.device) -> torch.Tensor:
        return sequence_positions(s * self.cp_size, self.cp_size, self.cp_rank, self.load_balance, device)


_CLASSES: dict[tuple[type, type], type] = {}


def _cp_class(cls: type, mixin: type) -> type:
    """``ContextParallel<cls>``, one per class (as FSDP2 makes ``FSDP<cls>``)."""
    if (cls, mixin) not in _CLASSES:
        _CLASSES[cls, mixin] = type(f"ContextParallel{cls.__name__}", (mixin, cls), {})
    return _CLASSES[cls, mixin]


def context_parallel(module: nn.Module, cp_mesh: DeviceMesh, *, load_balance: bool = True) -> nn.Module:
    """Make ``module`` run on this cp rank's tokens of every sequence (``sequence_share``), in place:
    an attention module (with ``attend`` and ``rope_rows``, as the zoo's) gathers K and V over the 1-D
    ``cp_mesh``; an embedding (with ``positions``) gives its tokens their global positions; any other
    module is an attention module whose SDPA calls gather K and V (``ContextParallelSDPA``; its model
    must be called with ``position_ids``). Parameters and their names stay as they are."""
    if isinstance(module, _ContextParallelModule):
        raise InvalidPlanError(f"{type(module).__name__} already runs context-parallel; apply it once")
    if hasattr(module, "attend") and hasattr(module, "rope_rows"):
        mixin: type = ContextParallelAttention
    elif hasattr(module, "positions"):
        mixin = ContextParallelPositions
    else:  # any other attention module: its SDPA calls are taken over (the model gets position_ids)
        mixin = ContextParallelSDPA
    module.__class__ = _cp_class(type(module), mixin)
    module.cp_group, module.cp_size = cp_mesh.get_group(), cp_mesh.size()
    module.cp_rank, module.load_balance = cp_mesh.get_local_rank(), load_balance
    return module


# ---- the runtime's executors (interpret.EXECUTORS) and what PlannedModule.step needs ------------

def flatten_mesh(step: FlattenMesh, state: State) -> None:
    """``mesh[axes]._flatten(name)``: afterwards ``mesh[name]`` is the axes' ranks as one axis (on the expert
    mesh where the axes are its own: an expert shard's edp x cp replicas, ``codegen.expert``)."""
    state.mesh_for(step.axes)[step.axes]._flatten(step.name)


def context_parallel_step(step: ContextParallel, state: State) -> None:
    cp_mesh = state.mesh[step.mesh_axis]
    if cp_mesh.size() != step.cp_size:
        raise InvalidPlanError(f"ContextParallel({step.module}) expects cp_size({step.cp_size}) but mesh axis "
                               f"{step.mesh_axis!r} has {cp_mesh.size()} ranks; build both from the same plan")
    context_parallel(state.get(step.module), cp_mesh, load_balance=step.load_balance)


@dataclass(frozen=True, slots=True)
class SequenceSplit:
    """Which tokens of every sequence this rank holds (all of them without context parallelism)."""

    cp_size: int = 1
    cp_rank: int = 0
    load_balance: bool = False

    def take(self, tokens: torch.Tensor) -> torch.Tensor:
        """(b, s) -> (b, s / cp): this rank's tokens of each sequence."""
        if self.cp_size == 1:
            return tokens
        return sequence_share(tokens, self.cp_size, self.cp_rank, load_balance=self.load_balance)

    def positions(self, tokens: torch.Tensor) -> torch.Tensor:
        """The global positions of ``tokens`` (this rank's share, (b, s / cp)): ``position_ids`` (b, s / cp)."""
        local = tokens.shape[1]
        return sequence_positions(local * self.cp_size, self.cp_size, self.cp_rank, self.load_balance,
                                  tokens.device).expand(tokens.shape[0], local)


def sequence_split(program: Program, mesh: DeviceMesh) -> SequenceSplit:
    step = next((s for s in program.steps if isinstance(s, ContextParallel)), None)
    if step is None:
        return SequenceSplit()
    return SequenceSplit(step.cp_size, mesh.get_local_rank(step.mesh_axis), step.load_balance)


def data_group(program: Program, mesh: DeviceMesh) -> tuple[Any, int]:
    """The ranks that see different tokens, over which a loss is averaged: (group, size). dp, or the
    flattened dp x cp axis under context parallelism."""
    flat = next((s for s in program.steps if isinstance(s, FlattenMesh) and not on_expert_mesh(s.axes)), None)
    sub = mesh[flat.name if flat is not None else program.dp_axis]
    return sub.get_group(), sub.size()
