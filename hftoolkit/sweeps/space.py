"""A search's space: `--param key=float:LOW:HIGH[:log]`, `key=int:LOW:HIGH[:log]` and `key=choice:V1,V2,...`
options (or the `params:` of a search file) parsed, every problem at once, each key checked against the recipe by
loading it with the range's ends and every choice. Light: Optuna is imported only to make its distributions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from hftoolkit.config.recipe import RecipeError, load_recipe
from hftoolkit.sweeps.grid import split_values

KINDS = ("float", "int", "choice")
FORMS = ("KEY=float:LOW:HIGH[:log], KEY=int:LOW:HIGH[:log] or KEY=choice:V1,V2,..., "
         "for example --param training.learning_rate=float:1e-5:1e-3:log")


@dataclass(frozen=True)
class Param:
    """One searched recipe key: a float or integer range (log-scaled or not), or a choice among values, each
    kept as the text `--set` would be given (parsed as YAML by the recipe loader)."""

    key: str
    kind: str  # float, int, choice
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        """The canonical text of the parameter, as stored with the study: `int:4:32`, `choice:[q,v],[q,k,v]`."""
        if self.kind == "choice":
            return "choice:" + ",".join(self.choices)
        return f"{self.kind}:{self.low!r}:{self.high!r}" + (":log" if self.log else "")

    def samples(self) -> list[str]:
        """The values the recipe must accept: a range's ends, or every choice."""
        return list(self.choices) if self.kind == "choice" else [
            yaml_float(v) if self.kind == "float" else str(v) for v in (self.low, self.high)]

    def grid_values(self) -> list | None:
        """The values a grid study goes through, or None for a float range (no finite grid)."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int" and not self.log:
            return list(range(int(self.low), int(self.high) + 1))
        return None

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)

    def override(self, value) -> str:
        """The `--set key=value` item a trial trains with."""
        return f"{self.key}={yaml_float(value)}" if self.kind == "float" else f"{self.key}={value}"


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]

    def specs(self) -> dict[str, str]:
        return {p.key: p.spec for p in self.params}

    def distributions(self) -> dict:
        return {p.key: p.distribution() for p in self.params}

    def overrides(self, values: dict) -> list[str]:
        return [p.override(values[p.key]) for p in self.params if p.key in values]

    def grid(self) -> dict[str, list] | None:
        values = {p.key: p.grid_values() for p in self.params}
        return None if any(v is None for v in values.values()) else values


def yaml_float(value: float) -> str:
    """A float as YAML reads it back as one: `1e-05` is a string to YAML 1.1, `1.0e-05` a float."""
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def parse_param(item: str, source: str = "--param") -> tuple[Param | None, str | None]:
    """`key=kind:...` -> (Param, None), or (None, the problem in one line)."""
    key, sep, text = item.partition("=")
    key, text = key.strip(), text.strip()
    where = f"{source} {item}"
    kind, _, rest = text.partition(":")
    if not key or not sep or kind not in KINDS or not rest.strip():
        return None, f"{where}: expected {FORMS}"
    if key == "name":
        return None, f"{where}: each trial's name comes from its number: search another key"
    if kind == "choice":
        values = split_values(rest)
        if "" in values:
            return None, f"{where}: an empty value: remove the extra comma"
        if len(set(values)) < len(values):
            twice = next(v for v in values if values.count(v) > 1)
            return None, f"{where}: {twice} is listed twice: list each value once"
        if len(values) < 2:
            return None, f"{where}: one value is no choice: list two or more, or fix it with --set {key}={values[0]}"
        return Param(key, "choice", choices=tuple(values)), None
    parts = rest.split(":")
    log = parts[-1].strip() == "log"
    if log:
        parts = parts[:-1]
    if len(parts) != 2:
        return None, f"{where}: expected {kind}:LOW:HIGH or {kind}:LOW:HIGH:log, for example " + (
            "float:1e-5:1e-3:log" if kind == "float" else "int:4:32")
    number = int if kind == "int" else float
    try:
        low, high = (number(p.strip()) for p in parts)
    except ValueError:
        return None, f"{where}: LOW and HIGH must be {'integers' if kind == 'int' else 'numbers'} (got " \
                     f"{parts[0].strip()} and {parts[1].strip()})"
    if kind == "float" and not all(math.isfinite(v) for v in (low, high)):
        return None, f"{where}: LOW and HIGH must be finite numbers"
    if low == high:
        return None, f"{where}: an empty range ({low!r} to {high!r}): give a LOW below HIGH, or fix the value " \
                     f"with --set {key}={low!r}"
    if low > high:
        return None, f"{where}: an inverted range: LOW {low!r} is above HIGH {high!r}: swap them"
    if log and low <= 0:
        return None, f"{where}: a log range must stay above 0, and LOW is {low!r}: raise LOW above 0, or drop :log"
    return Param(key, kind, low, high, log), None


def file_items(path: Path) -> tuple[dict, list[str]]:
    """A search file (YAML): its settings (trials, sampler, pruner, objective) and its params as `--param` items;
    a choice may be written as a YAML list (`lora.r: [4, 8]`)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise RecipeError([f"--space {path}: can't be read ({err.strerror or err}): pass a YAML file"]) from None
    except yaml.YAMLError as err:
        raise RecipeError([f"--space {path}: not valid YAML ({str(err).splitlines()[0]})"]) from None
    known = ("params", "trials", "sampler", "pruner", "objective")
    if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict) or not raw["params"]:
        raise RecipeError([f"--space {path}: expected a mapping with params: {{KEY: float:LOW:HIGH[:log] | "
                           "int:LOW:HIGH[:log] | [V1, V2, ...]}} (and trials, sampler, pruner, objective)"])
    unknown = [k for k in raw if k not in known]
    if unknown:
        raise RecipeError([f"--space {path}: {k}: unknown key: expected one of {', '.join(known)}" for k in unknown])
    items = []
    for key, value in raw["params"].items():
        if isinstance(value, list):
            texts = [yaml.safe_dump(v, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()
                     for v in value]
            value = "choice:" + ",".join(texts)
        items.append(f"{key}={value}")
    return {k: v for k, v in raw.items() if k != "params"}, items


def parse_space(items: list[str], recipe_path: Path, sets: list[str], source: str = "--param") -> Space:
    """The space of `items`, each key checked against the recipe; raises RecipeError listing every problem."""
    params, problems = [], []
    for item in items:
        param, problem = parse_param(item, source)
        if problem:
            problems.append(problem)
        elif any(p.key == param.key for p in params):
            problems.append(f"{source} {param.key}: given twice: search it once")
        elif any(s.partition("=")[0].strip() == param.key for s in sets):
            problems.append(f"{source} {param.key}: also given with --set: drop one of them")
        else:
            params.append(param)
    if not items:
        problems.append(f"{source}: no search space given: name a key and its range, for example "
                        "--param training.learning_rate=float:1e-5:1e-3:log")
    problems += _recipe_problems(params, recipe_path, sets, source)
    if problems:
        raise RecipeError(list(dict.fromkeys(problems)))
    return Space(tuple(params))


def _recipe_problems(params: list[Param], recipe_path: Path, sets: list[str], source: str) -> list[str]:
    """The recipe loaded with each parameter's samples (the others at their first sample): a key that is not a
    recipe key, or a value the recipe refuses, in one line each, named by its option."""
    try:
        load_recipe(recipe_path, sets)
    except RecipeError as err:
        return list(err.problems)
    problems = []
    for param in params:
        for sample in param.samples():
            item = f"{param.key}={sample}"
            try:
                load_recipe(recipe_path, [*sets, item])
            except RecipeError as err:
                for problem in err.problems:
                    problems.append(f"{source} {param.key}={param.spec}: " + problem.removeprefix(f"--set {item}: "))
                break  # (one value's problem says it; the key's other values would repeat it)
    return problems
