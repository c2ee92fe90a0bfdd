"""LoRA: freeze W, learn a low-rank update B A beside it.

    h = W x + (alpha / r) B A x,    A: (r, d_in) small random,  B: (d_out, r) zeros
B starts at zero, so training starts exactly at the pretrained model. Only A and
B train: r (d_in + d_out) parameters instead of d_in d_out, i.e. 2 d r against
d^2 for a square matrix. After training, W + (alpha / r) B A can be merged into
one matrix, so inference costs nothing extra.

Course figures: d = 4096, r = 16 -> 131,072 LoRA parameters against 16,777,216
(a 128x reduction). LoRA paper (Hu et al., 2021, Table 2): RoBERTa-base with
r = 8 on W_q and W_v of all 12 layers -> 12 * 2 * 8 * (768 + 768) = 294,912 ("0.3M").

Mirrors peft's `lora.Linear` (peft/tuners/lora/layer.py): same scaling, same init
of B, same merge. `apply_lora` swaps modules by name, the way peft's
`target_modules` does, so a model class needs no change to take adapters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hftoolkit.reference.weight_map import Rule, WeightMap


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, r: int, alpha: float):
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)  # W and its bias stay frozen
        self.scaling = alpha / r
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))  # zero: no change at step 0
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # peft's default init of A

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * (x @ self.lora_A.T @ self.lora_B.T)  # (.., d_in) -> (.., d_out)

    def merged(self) -> nn.Linear:
        """One nn.Linear with weight W + (alpha / r) B A: the same function, no extra cost."""
        out = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias)
        return out


def apply_lora(model: nn.Module, targets: tuple[str, ...], r: int, alpha: float) -> nn.Module:
    """Freeze `model` and wrap every nn.Linear whose attribute name is in `targets` with LoRA."""
    model.requires_grad_(False)
    matches = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
               if name in targets and isinstance(child, nn.Linear)]
    if not matches:
        raise ValueError(f"No nn.Linear named any of {targets} in {type(model).__name__}; check the target names.")
    for parent, name in matches:
        setattr(parent, name, LoRALinear(getattr(parent, name), r, alpha))
    return model


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_parameter_count(d_in: int, d_out: int, r: int) -> int:
    """A is r x d_in, B is d_out x r: 2 d r for a square d x d matrix."""
    return r * d_in + d_out * r


def full_update_parameter_count(d_in: int, d_out: int) -> int:
    """Fine-tuning W itself updates all d_in x d_out entries: d^2 for a square matrix."""
    return d_in * d_out


PEFT_LORA_LINEAR_WEIGHT_MAP = WeightMap(
    "peft lora.Linear (adapter 'default')",
    (
        Rule("base_layer.{w}", "base.{w}"),
        Rule("lora_A.default.weight", "lora_A"),
        Rule("lora_B.default.weight", "lora_B"),
    ),
)
