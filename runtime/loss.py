"""The training loss: mean token cross-entropy in fp32, vocab-parallel where the logits are sharded.

Under tensor parallelism the output head is column-parallel over the vocabulary and returns its
logits as a ``DTensor`` sharded on the last dim (``Shard(-1)``, ``codegen.tp_plans.root_plan``):
each tp rank holds ``V / tp`` logits of every token. ``token_cross_entropy`` computes the loss on
those shards with ``torch.distributed.tensor.parallel.loss_parallel`` (torch's vocab-parallel
cross-entropy: Megatron's ``vocab_parallel_cross_entropy``, Shoeybi et al. 2019 sec. 3, as
torchtitan runs it): all-reduces of one value per token (the max, the sum of exponentials, the
target's logit) instead of an all-gather of every logit, and ``V / tp`` fp32 log-probabilities
kept per rank instead of ``V``. The loss is the same on every tp rank, a plain tensor.

``loss_parallel`` asks that the backward also run inside it. ``VocabParallelCrossEntropy`` is an
autograd function that enters it in its forward and again in its backward, so that a caller
backpropagates the loss as any other (``loss.backward()`` in a hand-written loop, or inside
torch's pipeline schedules) with no context of its own. Under autocast the log-softmax is fp32
whatever the logits' dtype, as ``F.cross_entropy(logits.float(), ...)`` on one process.

A loss of the user's own (``apply(loss_fn=...)``) gets whole logits: ``whole_logits`` gathers them
(``DTensor.full_tensor``, differentiable) in the model's output before the user's function sees it,
so that function runs on plain tensors as it would on one process (at the memory and communication
cost of whole logits on every tp rank, which the cost model's default software does not price).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel


def _vocab_sharded(logits: torch.Tensor) -> bool:
    """A DTensor whose last dim (the vocabulary) is sharded over exactly one mesh dim."""
    if not isinstance(logits, DTensor):
        return False
    last = logits.ndim - 1
    shards = [p for p in logits.placements if isinstance(p, Shard) and p.dim in (-1, last)]
    return len(shards) == 1 and logits.device_mesh.ndim == 1


_MEAN, _IGNORE = 1, -100  # F.cross_entropy's defaults: reduction="mean", ignore_index=-100
aten = torch.ops.aten


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of vocabulary-sharded logits ``(..., V)`` against ``targets`` ``(...)``, in fp32;
    returns a plain scalar tensor (the same value on every rank of the logits' mesh).

    The two ops ``F.cross_entropy`` runs (log-softmax, then NLL) and their backward, called directly
    under ``loss_parallel``, so that its backward runs there too and only what autograd would keep is
    kept: the fp32 log-probabilities (``V / tp`` per token), not the logits."""

    @staticmethod
    def forward(ctx: Any, logits: DTensor, targets: torch.Tensor) -> torch.Tensor:
        x = logits.flatten(0, -2).float()
        flat = targets.flatten()
        with loss_parallel():
            logp = aten._log_softmax(x, 1, False)
            loss, total_weight = aten.nll_loss_forward(logp, flat, None, _MEAN, _IGNORE)
        ctx.save_for_backward(logp, flat, total_weight)
        ctx.shape, ctx.dtype, ctx.placements = logits.shape, logits.dtype, loss.placements
        return loss.to_local()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[DTensor, None]:
        logp, flat, total_weight = ctx.saved_tensors
        grad = DTensor.from_local(grad, logp.device_mesh, ctx.placements, run_check=False)
        with loss_parallel():
            grad_logp = aten.nll_loss_backward(grad, logp, flat, None, _MEAN, _IGNORE, total_weight)
            grad_x = aten._log_softmax_backward_data(grad_logp, logp, 1, torch.float32)
        return grad_x.to(ctx.dtype).view(ctx.shape), None


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in fp32 (the formula of ``meshplan.zoo.loss_fn``): vocab-parallel on
    vocabulary-sharded logits, on whole logits otherwise (a DTensor of another layout is gathered)."""
    if _vocab_sharded(logits):
        return VocabParallelCrossEntropy.apply(logits, targets)
    if isinstance(logits, DTensor):
        logits = logits.full_tensor()
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def whole_logits(output: object) -> object:
    """``output`` with its logits (a tensor, ``.logits``, a dict's "logits" or a tuple's first item) made
    whole where they are a DTensor, for a loss function written for plain tensors."""
    if isinstance(output, DTensor):
        return output.full_tensor()
    logits = getattr(output, "logits", None)
    if isinstance(logits, DTensor):
        output.logits = logits.full_tensor()  # Hugging Face's ModelOutput keeps its dict entry in step
        return output
    if isinstance(output, dict) and isinstance(output.get("logits"), DTensor):
        return {**output, "logits": output["logits"].full_tensor()}
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], DTensor):
        return type(output)([output[0].full_tensor(), *output[1:]])
    return output


def on_whole_logits(loss_fn: Callable[[object, torch.Tensor], torch.Tensor]) -> Callable:
    """``loss_fn`` called on ``whole_logits(output)``: a user's loss sees plain, whole logits."""
    def loss(output: object, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(whole_logits(output), targets)

    loss.__wrapped__ = loss_fn
    return loss
