"""Optimizers written as their update rules, one small class each.

With g the gradient, eta the learning rate, t the step (from 1):
  SGD:       W -= eta g
  Momentum:  v = beta v + (1 - beta) g;  W -= eta v        (the course's form, an average of gradients)
  Adagrad:   s += g^2;  W -= eta g / (sqrt(s) + eps)                     (Duchi et al., 2011)
  RMSProp:   s = alpha s + (1 - alpha) g^2;  W -= eta g / (sqrt(s) + eps) (Hinton, 2012)
  Adam:      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
             m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t)   (bias correction: m, v start at 0)
             W -= eta m_hat / (sqrt(v_hat) + eps)                        (Kingma & Ba, 2015)
  AdamW:     W -= eta lambda W, then the Adam step: weight decay kept out of m and v
                                                                          (Loshchilov & Hutter, 2019)

Momentum and torch: torch.optim.SGD keeps b = mu b + (1 - dampening) g but sets
b = g on the first step, skipping the dampening. The course's v starts at 0, so
v_t = (1 - beta) sum_s beta^(t-s) g_s, which is (1 - beta) times torch's b_t with
dampening = 0. Hence: course(eta, beta) == torch.optim.SGD(lr=eta * (1 - beta),
momentum=beta, dampening=0). With dampening=beta instead, the first step differs.

Mirrors torch.optim.SGD, Adagrad, RMSprop, Adam and AdamW (default options).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def momentum_step(w: torch.Tensor, g: torch.Tensor, v: torch.Tensor, lr: float, beta: float):
    """The course's momentum update; returns the new (w, v)."""
    v = beta * v + (1 - beta) * g
    return w - lr * v, v


class Optimizer:
    """Holds the parameters and one state dict per parameter; subclasses write `update`."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        self.params = list(params)
        self.lr = lr
        self.state: list[dict[str, torch.Tensor]] = [{} for _ in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        for p, state in zip(self.params, self.state):
            if p.grad is not None:
                p.copy_(self.update(p, p.grad, state))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def update(self, w: torch.Tensor, g: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class SGD(Optimizer):
    def update(self, w, g, state):
        return w - self.lr * g


class Momentum(Optimizer):
    def __init__(self, params, lr: float, beta: float = 0.9):
        super().__init__(params, lr)
        self.beta = beta

    def update(self, w, g, state):
        w, state["v"] = momentum_step(w, g, state.get("v", torch.zeros_like(w)), self.lr, self.beta)
        return w


class Adagrad(Optimizer):
    def __init__(self, params, lr: float = 0.01, eps: float = 1e-10):
        super().__init__(params, lr)
        self.eps = eps

    def update(self, w, g, state):
        state["s"] = state.get("s", torch.zeros_like(w)) + g**2  # the sum of every squared gradient so far
        return w - self.lr * g / (state["s"].sqrt() + self.eps)


class RMSProp(Optimizer):
    def __init__(self, params, lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8):
        super().__init__(params, lr)
        self.alpha, self.eps = alpha, eps

    def update(self, w, g, state):
        s = state.get("s", torch.zeros_like(w))
        state["s"] = self.alpha * s + (1 - self.alpha) * g**2  # a leaky average instead of Adagrad's sum
        return w - self.lr * g / (state["s"].sqrt() + self.eps)


class Adam(Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, lr)
        self.b1, self.b2 = betas
        self.eps = eps

    def update(self, w, g, state):
        m = state["m"] = self.b1 * state.get("m", torch.zeros_like(w)) + (1 - self.b1) * g
        v = state["v"] = self.b2 * state.get("v", torch.zeros_like(w)) + (1 - self.b2) * g**2
        m_hat = m / (1 - self.b1**self.t)
        v_hat = v / (1 - self.b2**self.t)
        return w - self.lr * m_hat / (v_hat.sqrt() + self.eps)


class AdamW(Adam):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps)
        self.weight_decay = weight_decay

    def update(self, w, g, state):
        w = w * (1 - self.lr * self.weight_decay)  # decoupled decay: shrink W, leave m and v alone
        return super().update(w, g, state)
