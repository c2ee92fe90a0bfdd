"""The course's momentum against torch's: equal under the stated rescaling, and only under it."""

from __future__ import annotations

import torch

from hftoolkit.reference import optim
from hftoolkit.reference.parity_training import train


def test_course_momentum_is_torch_sgd_with_lr_times_one_minus_beta_and_no_dampening():
    ours = train(lambda ps: optim.Momentum(ps, lr=0.5, beta=0.9))
    torch_form = train(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.0))
    assert torch.allclose(ours, torch_form, atol=1e-5)


def test_dampening_equal_to_beta_is_not_the_same_algorithm():
    """torch's first momentum step skips the dampening, so dampening=beta starts 1/(1-beta) times too fast."""
    ours = train(lambda ps: optim.Momentum(ps, lr=0.5, beta=0.9))
    dampened = train(lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9, dampening=0.9))
    assert not torch.allclose(ours, dampened, atol=1e-3)


def test_momentum_keeps_moving_where_the_gradient_is_zero():
    w, v = optim.momentum_step(torch.tensor(0.0), torch.tensor(0.0), torch.tensor(-2.0), lr=0.01, beta=0.9)
    assert torch.isclose(v, torch.tensor(-1.8)) and torch.isclose(w, torch.tensor(0.018))


def test_adam_bias_correction_makes_the_first_step_lr_sized():
    """With m and v started at 0, the corrected first step is lr * g / (|g| + eps), i.e. about lr per weight."""
    w = torch.nn.Parameter(torch.tensor([1.0, -3.0]))
    w.grad = torch.tensor([0.2, -50.0])
    optim.Adam([w], lr=0.1).step()
    assert torch.allclose(w.detach(), torch.tensor([0.9, -2.9]), atol=1e-6)
