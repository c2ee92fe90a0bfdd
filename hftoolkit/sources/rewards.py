"""The rewards of task grpo (rl.rewards): the built-in verifiable ones, a user's Python function, and the checks
each gets on a dry batch before anything loads.

Every reward is called as TRL's GRPO trainer calls one: `reward(prompts=..., completions=..., completion_ids=...,
**columns)`, each a list with one entry per sampled answer (a completion is a text, or a one-message conversation
where the prompt is a conversation), returning one float per answer. A reward run (`run:`) is a model, loaded when
training starts (workflows/rewards.py); here it is only checked to be one. Light: the standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import ADAPTER, MODEL, RECIPE
from hftoolkit.config.tasks import COLUMN_KEYS

# What an answer's final answer is marked with: tags, GSM8K's "####", else (for a number) its last number.
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


# The names TRL's GRPO trainer gives what it passes reward functions besides the data's columns.
RL_RESERVED = ("prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state", "log_extra",
               "log_metric")


def reward_columns(columns: list[str], taken: set[str]) -> list[str]:
    """The data's columns kept for the reward functions (an exact answer, test cases): all but those `taken` by the
    task's own, those named as a canonical column, and those named as what TRL passes itself."""
    return [c for c in columns if c not in {*taken, *COLUMN_KEYS, *RL_RESERVED}]


def text_of(completion) -> str:
    """A completion's text: itself, or the content of its one assistant message."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def normalise(text: str) -> str:
    """Case, surrounding space and punctuation, inner runs of space, thousands separators and a number's trailing
    zeros are not what makes an answer right."""
    text = " ".join(str(text).strip().lower().split()).strip(" .,;:!?\"'`$")
    number = text.replace(",", "")
    if re.fullmatch(r"-?\d+(?:\.\d+)?", number):
        return number.rstrip("0").rstrip(".") if "." in number else str(int(number))
    return text


def final_answer(text: str, reference: str) -> str:
    """The part of an answer to compare with `reference`: its last <answer>...</answer>, what follows its last
    "####", or where the reference is a number, the last number it writes; else the whole answer."""
    tagged = _TAGGED.findall(text)
    if tagged:
        return tagged[-1]
    if "####" in text:
        return text.rsplit("####", 1)[1]
    if re.fullmatch(r"-?\d+(?:\.\d+)?", normalise(reference)):
        numbers = _NUMBER.findall(text)
        return numbers[-1] if numbers else text
    return text


def reference_answer(value) -> str:
    """A data set's answer as the reference: GSM8K's answers end in "#### <number>", after the reasoning."""
    text = str(value)
    return text.rsplit("####", 1)[1] if "####" in text else text


def exact_answer(column: str) -> Callable:
    def exact_answer(completions, **columns) -> list[float]:
        references = columns[column]
        return [float(normalise(final_answer(text_of(c), reference_answer(r))) == normalise(reference_answer(r)))
                for c, r in zip(completions, references, strict=True)]

    exact_answer.column = column
    return exact_answer


def format_match(pattern: str) -> Callable:
    compiled = re.compile(pattern, re.DOTALL)

    def format(completions, **_) -> list[float]:  # noqa: A001 (the reward's name in TRL's logs)
        return [float(compiled.fullmatch(text_of(c).strip()) is not None) for c in completions]

    return format


def length_penalty(limit: int) -> Callable:
    def length(completion_ids, **_) -> list[float]:
        return [-max(0, len(ids) - limit) / limit for ids in completion_ids]

    return length


def load_function(spec: str, key: str) -> Callable:
    """The reward function `spec` names: module:function (importable from the current folder too) or
    path/to/file.py:function (a relative path read from the current folder)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UserError(f"{key}: {spec!r} names no function: write module:function or path/to/file.py:function")
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise UserError(f"{key}: reward file {where} not found (looked for {path.absolute()}; a relative path is "
                            "read from the current folder): check the path")
        module = _module_from_file(path, key)
    else:
        module = _import(where, key)
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise UserError(f"{key}: {where} has no function {name!r} (its functions: {', '.join(found) or 'none'}): "
                        "check the name")
    return function


def _module_from_file(path: Path, key: str):
    name = f"hftoolkit_reward_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's file: whatever it raises is said in one line
        raise UserError(f"{key}: importing {path} failed: {type(err).__name__}: {err}") from None
    sys.modules[name] = module
    return module


def _import(module_name: str, key: str):
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # (a module beside the recipe, as python -c would find it)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise UserError(f"{key}: no module named {module_name!r} (looked on the Python path and in the current "
                            "folder): check the name, or name the file as path/to/file.py:function") from None
        raise UserError(f"{key}: importing {module_name} failed: {err}") from None
    except Exception as err:
        raise UserError(f"{key}: importing {module_name} failed: {type(err).__name__}: {err}") from None


def reward_run_problem(path: str, key: str) -> str | None:
    """Why the folder `path` can't be a reward, or None: it must be a finished run of task reward."""
    import yaml

    folder = Path(path).expanduser()
    recipe = folder / RECIPE
    if not recipe.is_file():
        return f"{key}: {path} is not a run directory (no {RECIPE}): point it at the run of a task reward recipe"
    try:
        task = (yaml.safe_load(recipe.read_text()) or {}).get("task")
    except yaml.YAMLError:
        task = None
    if task != "reward":
        return (f"{key}: {path} is a task {task} run, and a reward comes from a task reward run: train one "
                "(task: reward) and point this at its run directory")
    if not (folder / ADAPTER).is_dir() and not (folder / MODEL).is_dir():
        return (f"{key}: {path} has no trained weights yet (no {ADAPTER}/ or {MODEL}/): let the reward run finish, "
                f"or `hftoolkit train --resume {path}`")
    return None


def builtin(entry) -> Callable | None:
    """The reward function of a built-in entry (exact, regex, length); None for a function or a run."""
    if entry.exact is not None:
        return exact_answer(entry.exact)
    if entry.regex is not None:
        return format_match(entry.regex)
    if entry.length is not None:
        return length_penalty(entry.length)
    return None


def dry_call(function: Callable, key: str, prompts: list, columns: dict) -> str | None:
    """Why `function` can't be a reward, from one call on a dry batch (the data's first prompts, each with an
    empty answer and a short one), or None: it raised, or returned other than one number per answer."""
    completions = []
    for prompt in prompts:
        for text in ("", "42"):
            completions.append([{"role": "assistant", "content": text}] if isinstance(prompt, list) else text)
    doubled = {name: [v for v in values for _ in range(2)] for name, values in columns.items()}
    prompts = [p for p in prompts for _ in range(2)]
    ids = [[] if not text_of(c) else [52] for c in completions]
    name = getattr(function, "__name__", repr(function))
    try:
        out = function(prompts=prompts, completions=completions, completion_ids=ids, trainer_state=None,
                       log_extra=lambda *a: None, log_metric=lambda *a: None, **doubled)
    except Exception as err:  # the user's code: whatever it raises is said in one line
        return (f"{key}: reward function {name} raised {type(err).__name__}: {err} on a dry batch of "
                f"{len(completions)} answers: fix the function")
    try:
        values = list(out)
    except TypeError:
        values = None
    if values is None or len(values) != len(completions):
        got = f"{len(values)} value{'s' * (len(values) != 1)}" if values is not None else f"a {type(out).__name__}"
        return (f"{key}: reward function {name} returned {got} for a dry batch of {len(completions)} answers: "
                "return one float (or None) per completion")
    bad = next((v for v in values if v is not None and not _is_number(v)), "ok")
    if bad != "ok":
        return (f"{key}: reward function {name} returned {bad!r} for an answer: return one float (or None) per "
                "completion")
    return None


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
