"""runtime.offload: a block offloaded keeps its name and state-dict keys (hooks, not a wrapper), trains as
before, and offloading it again adds no second pair of hooks. The hooks leave the saved-tensor context
also when the forward raises, so a later forward elsewhere is not offloaded."""
from __future__ import annotations

import pytest
import torch

from meshplan.runtime.offload import _HANDLES, _pack, offload_activations


class Boom(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")


def test_offloaded_block_keeps_its_keys_and_gradients() -> None:
    torch.manual_seed(0)
    plain, offloaded = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()), None
    offloaded = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    offloaded.load_state_dict(plain.state_dict())
    offload_activations(offloaded[0])
    offload_activations(offloaded[0])  # twice: one pair of hooks
    assert len(getattr(offloaded[0], _HANDLES)) == 2 and len(offloaded[0]._forward_pre_hooks) == 1
    assert list(offloaded.state_dict()) == list(plain.state_dict())
    x = torch.randn(4, 8)
    for model in (plain, offloaded):
        model(x).square().sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), offloaded.parameters()))


def test_the_context_is_left_when_the_forward_raises() -> None:
    packed = []

    def spy(t: torch.Tensor):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(spy, lambda t: t):
        with pytest.raises(ValueError, match="boom"):
            offload_activations(Boom())(torch.randn(2, requires_grad=True))
        x = torch.randn(3, requires_grad=True)
        (x * x).sum()  # saved under the spy again, not under a hook left entered by the failed forward
    assert len(packed) == 2


def test_host_tensors_and_parameters_stay_where_they_are() -> None:
    p = torch.nn.Parameter(torch.randn(3))
    t = torch.randn(3)
    assert _pack(p) is p and _pack(t) is t
