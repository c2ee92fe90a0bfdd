"""Copy a Hugging Face state dict into a reference module, through a weight map kept as data.

A weight map is a list of rules `source pattern -> target pattern`, read like a
table: `"attention.self.query.{w}" -> "attn.q_proj.{w}"`. Two placeholders exist:
`{i}` matches a layer index and `{w}` matches `weight` or `bias`. A rule may
also name a transform (GPT-2's Conv1D stores `(in, out)` where `nn.Linear`
stores `(out, in)`; ViT's patch projection is a Conv2d whose kernel becomes a
Linear weight once flattened) and a chunk (GPT-2 fuses Q, K and V into one
`c_attn`; chunk `(1, 3)` takes the second third, the keys).

`load_weights` fails loudly, and all at once, on:
  * an unknown key: a source tensor that no rule maps and no `ignore` entry explains;
  * a missing key: a reference tensor that no source tensor filled;
  * a misshapen key: a source tensor whose shape, after its transform, differs
    from the reference tensor it is meant to fill.
Silently skipping any of these would make a parity test compare the wrong thing.
The self-checking loader follows nanoGPT's `GPT.from_pretrained` (karpathy/nanoGPT, model.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

PLACEHOLDERS = {"i": r"\d+", "w": r"weight|bias"}  # "{i}" a layer index, "{w}" weight or bias


def _conv1d_to_linear(t: torch.Tensor) -> torch.Tensor:
    """GPT-2's Conv1D weight is (in, out); nn.Linear wants (out, in). Biases pass unchanged."""
    return t.t() if t.ndim == 2 else t


def _conv2d_to_linear(t: torch.Tensor) -> torch.Tensor:
    """A (D, C, P, P) patch kernel becomes a (D, C*P*P) Linear weight. Biases pass unchanged."""
    return t.flatten(1) if t.ndim == 4 else t


TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "copy": lambda t: t,
    "conv1d": _conv1d_to_linear,
    "conv2d": _conv2d_to_linear,
}


@dataclass(frozen=True)
class Rule:
    """One row of a weight map: where a source tensor goes and how it is reshaped on the way."""

    source: str
    target: str
    transform: str = "copy"
    chunk: tuple[int, int] | None = None  # (index, count) along dim 0, after the transform

    def __post_init__(self) -> None:
        if self.transform not in TRANSFORMS:
            raise ValueError(
                f"Rule {self.source!r}: unknown transform {self.transform!r}; use one of {sorted(TRANSFORMS)}."
            )


@dataclass(frozen=True)
class WeightMap:
    """A named table of rules, plus source keys deliberately left out (each with its reason)."""

    name: str
    rules: tuple[Rule, ...]
    ignore: tuple[tuple[str, str], ...] = field(default=())  # (source pattern, reason)

    def prefixed(self, source_prefix: str, target_prefix: str, name: str | None = None) -> WeightMap:
        """The same map one level down: used to place a block's map inside a model's map."""
        rules = tuple(
            Rule(source_prefix + r.source, target_prefix + r.target, r.transform, r.chunk) for r in self.rules
        )
        ignore = tuple((source_prefix + p, why) for p, why in self.ignore)
        return WeightMap(name or self.name, rules, ignore)

    def __add__(self, other: WeightMap) -> WeightMap:
        return WeightMap(self.name, self.rules + other.rules, self.ignore + other.ignore)


class WeightMapError(ValueError):
    """Raised with every unknown, missing and misshapen key of one load, one per line."""


def _compile(pattern: str) -> re.Pattern[str]:
    """`"h.{i}.ln_1.{w}"` -> a regex with named groups `i` and `w`."""
    regex = re.escape(pattern)
    for name, group in PLACEHOLDERS.items():
        regex = regex.replace(re.escape("{" + name + "}"), f"(?P<{name}>{group})", 1)
    return re.compile(regex + r"\Z")


def _fill(pattern: str, match: re.Match[str]) -> str:
    """Put the matched layer index and weight/bias into a target pattern."""
    for name, value in match.groupdict().items():
        pattern = pattern.replace("{" + name + "}", value)
    return pattern


def map_state_dict(
    source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], weight_map: WeightMap
) -> dict[str, torch.Tensor]:
    """Translate `source` (an HF state dict) into the keys and shapes of `target`, or raise WeightMapError."""
    rules = [(rule, _compile(rule.source)) for rule in weight_map.rules]
    ignored = [(_compile(p), why) for p, why in weight_map.ignore]
    errors: list[str] = []
    mapped: dict[str, torch.Tensor] = {}
    misshapen: set[str] = set()  # reported once, not again as missing

    for key, tensor in source.items():
        matches = [(rule, m) for rule, regex in rules if (m := regex.match(key))]
        if not matches:
            if not any(regex.match(key) for regex, _ in ignored):
                errors.append(f"unknown key {key!r}: no rule of weight map {weight_map.name!r} maps it")
            continue
        for rule, match in matches:
            dest = _fill(rule.target, match)
            value = TRANSFORMS[rule.transform](tensor)
            if rule.chunk is not None:
                index, count = rule.chunk
                value = value.chunk(count, dim=0)[index]
            if dest not in target:
                errors.append(f"unknown key {key!r}: its rule names {dest!r}, which the reference module lacks")
            elif tuple(value.shape) != tuple(target[dest].shape):
                misshapen.add(dest)
                errors.append(
                    f"misshapen key {key!r}: gives shape {tuple(value.shape)} after {rule.transform!r}, "
                    f"but {dest!r} has shape {tuple(target[dest].shape)}"
                )
            elif dest in mapped:
                errors.append(f"key {dest!r} is written twice; the second time from {key!r}")
            else:
                mapped[dest] = value

    for dest in target:
        if dest not in mapped and dest not in misshapen:
            errors.append(f"missing key {dest!r}: {_expected_source(dest, weight_map)}")

    if errors:
        listing = "\n  ".join(errors)
        raise WeightMapError(f"Weight map {weight_map.name!r} does not fit ({len(errors)} problems):\n  {listing}")
    return mapped


def _expected_source(dest: str, weight_map: WeightMap) -> str:
    """Say which source key would have filled `dest`, so that a missing key names what to look for."""
    for rule in weight_map.rules:
        if match := _compile(rule.target).match(dest):
            return f"it comes from {_fill(rule.source, match)!r}, which the source state dict lacks"
    return f"no rule of weight map {weight_map.name!r} fills it"


def load_weights(module: nn.Module, source: Mapping[str, torch.Tensor], weight_map: WeightMap) -> nn.Module:
    """Copy `source` into `module` through `weight_map`; nothing is copied unless everything fits."""
    target = module.state_dict()
    mapped = map_state_dict(source, target, weight_map)
    with torch.no_grad():
        for key, value in mapped.items():
            target[key].copy_(value)
    return module
