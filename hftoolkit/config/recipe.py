"""The recipe: a strict schema for one training job (its sections in sections.py), loaded from YAML.

Everything past this module sees a validated `Recipe`, never a raw dict. Unknown
keys are errors with a "did you mean" suggestion, and every error of a file is
reported at once as `file: a.b.c: message` (docs/architecture.md, "Recipes").
Imports only pydantic and yaml: `validate` must stay light.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.families import model_rules, static_family
from hftoolkit.config.sections import (
    DataSection,
    EvalSection,
    LoraSection,
    ModelSection,
    OutputSection,
    PreferenceSection,
    RLSection,
    Section,
    TrainingSection,
)
from hftoolkit.config.shipped import close_match, find_recipe

# Names users bring from TrainingArguments, peft and the HF example scripts -> the recipe key that says the same.
# An unknown key found here is answered with our key, wherever in the recipe it was written.
FOREIGN_NAMES: dict[str, str] = {
    "num_train_epochs": "training.epochs", "per_device_train_batch_size": "training.batch_size",
    "train_batch_size": "training.batch_size", "per_device_eval_batch_size": "eval.batch_size",
    "eval_batch_size": "eval.batch_size", "gradient_accumulation_steps": "training.gradient_accumulation",
    "lr": "training.learning_rate", "lr_scheduler_type": "training.scheduler",
    "warmup_steps": "training.warmup_steps", "warmup_ratio": "training.warmup_ratio",
    "weight_decay": "training.weight_decay", "max_grad_norm": "training.max_grad_norm",
    "label_smoothing_factor": "training.label_smoothing", "fp16": "training.precision",
    "bf16": "training.precision", "mixed_precision": "training.precision", "tf32": "training.tf32",
    "eval_strategy": "eval.every", "evaluation_strategy": "eval.every", "eval_steps": "eval.every",
    "save_strategy": "training.save_steps", "save_total_limit": "training.keep_last",
    "load_best_model_at_end": "eval.keep_best", "metric_for_best_model": "eval.keep_best",
    "early_stopping_patience": "eval.early_stopping.patience",
    "early_stopping_threshold": "eval.early_stopping.threshold", "optim": "training.optimizer",
    "activation_checkpointing": "training.gradient_checkpointing",
    "dataloader_num_workers": "data.num_workers", "torch_compile": "training.compile",
    "run_name": "name", "output_dir": "output.dir", "max_seq_length": "data.max_length",
    "max_source_length": "data.max_length", "max_target_length": "data.max_target_length",
    "model_name_or_path": "model.checkpoint", "torch_dtype": "model.dtype", "attn_implementation": "model.attention",
    "load_in_8bit": "model.quantization", "load_in_4bit": "model.quantization",
    "bnb_4bit_use_double_quant": "model.double_quant", "bnb_4bit_compute_dtype": "model.compute_dtype",
    "lora_r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
    "target_modules": "lora.targets", "lora_target_modules": "lora.targets", "use_dora": "lora.variant",
    "use_rslora": "lora.variant", "train_file": "data.train", "validation_file": "data.eval",
    "dataset_name": "data.train", "max_train_samples": "data.max_train_samples",
    "max_eval_samples": "data.max_eval_samples", "wandb_project": "training.project",
}

class Recipe(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="run name, also the run folder's name")
    task: str
    description: str = ""
    model: ModelSection
    lora: LoraSection = LoraSection()
    data: DataSection
    training: TrainingSection = TrainingSection()
    eval: EvalSection = EvalSection()
    preference: PreferenceSection | None = Field(None, description="task preference: the method and its beta")
    rl: RLSection | None = Field(None, description="task grpo: the rewards, the method and its sampling")
    output: OutputSection = OutputSection()

    @model_validator(mode="before")
    @classmethod
    def _preference_defaults(cls, data):
        """A preference recipe without a preference section gets its defaults (DPO, beta 0.1)."""
        if isinstance(data, dict) and data.get("task") == tasks.PREFERENCE and data.get("preference") is None:
            return {**data, "preference": {}}
        return data

    @field_validator("task", mode="before")
    @classmethod
    def _known_task(cls, value):
        """Read from the task table when a recipe is validated, so a task added there is a recipe's task."""
        if value not in tasks.names():
            *others, last = (repr(name) for name in tasks.names())
            raise ValueError(f"input should be {', '.join(others)} or {last} (got {json.dumps(value)})")
        return value

    @model_validator(mode="after")
    def _settings_fit_together(self):
        family, task = static_family(self.model.checkpoint, self.model.family), tasks.spec(self.task)
        if family is not None and family not in task.families:  # (a checkpoint's own family is checked on resolve)
            raise ValueError(tasks.no_head(self.task, self.model.checkpoint, family))
        if self.model.checkpoint.startswith("init:"):
            rules = model_rules(self.model.checkpoint.removeprefix("init:"), self.task, self.training.precision)
            if rules:
                raise ValueError("; ".join(rules))
        if self.model.quantization != "none" and not self.lora.enabled:
            raise ValueError(f"{self.model.quantization} weights can't be trained directly: "
                             "set lora.enabled to true, or model.quantization to none for full fine-tuning")
        if self.preference is not None and self.task != tasks.PREFERENCE:
            raise ValueError(f"the preference section says how preference pairs are learned, and the task is "
                             f"{self.task}: remove it, or set task to preference")
        problems = _rl_rules(self)
        if problems:
            raise ValueError("; ".join(problems))
        if self.preference is not None and self.preference.unpaired and self.training.batch_size < 2:
            raise ValueError("preference.method kto takes each answer's KL term against the other answers of its "
                             "batch, and training.batch_size is 1: set training.batch_size to 2 or more")
        if self.data.packing == "blocks" and self.task != tasks.CLM:
            raise ValueError(f"data.packing blocks cuts concatenated texts, which only task clm trains on, and the "
                             f"task is {self.task}: set data.packing to padding_free, true (whole examples) or false")
        problems = _training_rules(self)
        if problems:
            raise ValueError("; ".join(problems))
        if self.data.label_map is not None and task.labels != "class":
            raise ValueError(f"data.label_map maps class labels, and task {self.task!r} has none: remove "
                             "data.label_map")
        if task.main_metric == "perplexity" and self.training.label_smoothing:
            raise ValueError(f"task {self.task!r} reports perplexity, which a label-smoothed loss would distort: "
                             "set training.label_smoothing to 0")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output.dir) / self.name


def _rl_rules(recipe: Recipe) -> list[str]:
    """The rl section and task grpo need each other; a step's answers fill whole groups; a checkpoint falls where
    answers are sampled afresh, so a resumed run samples what the uninterrupted one did."""
    rl, t = recipe.rl, recipe.training
    if rl is None:
        return ["task grpo learns from rewards, and the recipe has no rl section: add rl.rewards (for example "
                "[{exact: answer}])"] if recipe.task == tasks.GRPO else []
    if recipe.task != tasks.GRPO:
        return [f"the rl section says how sampled answers are rewarded, and the task is {recipe.task}: remove it, "
                "or set task to grpo"]
    problems = []
    if t.batch_size % rl.num_generations:
        problems.append(f"training.batch_size counts sampled answers, and {t.batch_size} is not a whole number of "
                        f"groups of rl.num_generations {rl.num_generations}: set training.batch_size to a multiple "
                        f"of {rl.num_generations}")
    if t.save_steps and t.save_steps % rl.num_iterations:
        problems.append(f"training.save_steps: answers are sampled every rl.num_iterations ({rl.num_iterations}) "
                        f"steps, and a checkpoint at step {t.save_steps} would fall between: set it to a multiple "
                        f"of {rl.num_iterations}")
    return problems


def _training_rules(recipe: Recipe) -> list[str]:
    """Training and eval keys that contradict each other (the hardware-dependent ones: machine.hardware_problems)."""
    t, e, problems = recipe.training, recipe.eval, []
    if t.warmup_steps is not None and t.warmup_ratio:
        problems.append("training.warmup_steps and training.warmup_ratio both say how long to warm up: set one")
    if t.scheduler == "reduce_lr_on_plateau" and e.every == "none":
        problems.append("training.scheduler reduce_lr_on_plateau lowers the rate when the eval metric stalls, and "
                        "eval.every is none: set eval.every to epoch or a number of steps")
    problems += _streaming_rules(recipe)
    if e.keep_best and t.save_steps is not None and t.save_steps != e.every:
        problems.append(f"eval.keep_best saves a checkpoint at every eval (eval.every {e.every}), and "
                        f"training.save_steps {t.save_steps} asks for others: leave training.save_steps unset")
    return problems


def _streaming_rules(recipe: Recipe) -> list[str]:
    """What a stream can't do: it has no length (so no epochs), and its position is kept by the main process."""
    d, problems = recipe.data, []
    if not d.streaming:
        return problems
    if recipe.training.max_steps is None:
        problems.append("data.streaming reads rows without knowing how many there are, so epochs can't be counted: "
                        "set training.max_steps")
    if d.num_workers:
        problems.append("data.streaming reads the stream in the main process, where its position is saved with "
                        "each checkpoint: set data.num_workers to 0")
    if not d.eval and not d.eval_split and d.max_eval_samples is None:
        problems.append("data.streaming holds out the first data.max_eval_samples rows of the stream for eval: "
                        "set data.max_eval_samples, or point data.eval (or data.eval_split) at an eval split")
    if recipe.task == tasks.IMAGE_CLASSIFICATION:
        problems.append("data.streaming reads text rows, and image classification reads its images through a "
                        "transform of a data set held whole: set data.streaming to false")
    if d.train_target or d.eval_target:
        problems.append("data.streaming reads one file of rows, and data.train_target aligns two: "
                        "put the targets in a column of data.train, or set data.streaming to false")
    if d.packing is True:
        problems.append("data.packing true sorts a split's examples by length to fill rows, which a stream can't: "
                        "use data.packing blocks (clm) or false with data.streaming, or load the data whole")
    return problems


# ---------------------------------------------------------------- loading


class RecipeError(UserError):
    """One or more recipe problems, each a `source: a.b.c: message` line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def load_recipe(path: str | Path, overrides: list[str] = ()) -> Recipe:
    """Read, override and validate a recipe file; raises RecipeError listing every problem."""
    typed, path = path, find_recipe(path)  # a shipped recipe by name where no such file is here (config/shipped.py)
    close = close_match(typed) if not path.exists() else None
    hint = f"did you mean {close!r}? " if close else ""
    raw = read_yaml_mapping(path, str(path), f"recipe file not found: {hint}check the path, or name a shipped "
                            "recipe (`hftoolkit recipes` lists them)", "the recipe",
                            "a recipe is a YAML mapping of sections (name, task, model, data, ...)")
    overridden = apply_overrides(raw, overrides, path)
    return validate_recipe(raw, str(path), overridden)


def read_yaml_mapping(path: Path, where: str, missing: str, kind: str, shape: str) -> dict:
    """A YAML file that holds a mapping, read safely; each way it can fail is one line that starts with `where`:
    `missing` when there is no file, `kind` names the file in the advice, `shape` says what it should hold."""
    if not path.is_file():
        raise RecipeError([f"{where}: {missing}"])
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RecipeError([f"{where}: not UTF-8 text: save {kind} as UTF-8"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise RecipeError([f"{where}: {at}YAML syntax error ({problem}): fix the YAML"]) from None
    except RecursionError:  # PyYAML parses nesting recursively
        raise RecipeError([f"{where}: the YAML is nested too deeply to read: {shape}"]) from None
    if not isinstance(raw, dict):
        raise RecipeError([f"{where}: {shape}, got {type(raw).__name__}"])
    return raw


def apply_overrides(raw: dict, overrides: list[str], source: Path | str = "--set") -> dict[tuple, str]:
    """Apply `a.b.c=value` overrides in place (values parsed as YAML); returns {path: the override's text} for
    every key an override set and every section it created (a key the file lacks), so that a problem there is
    blamed on the override, not on the file."""
    applied: dict[tuple, str] = {}
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {item}: expected key=value, for example --set training.epochs=3")
            continue
        dotted = tuple(key.strip().split("."))
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except (yaml.YAMLError, RecursionError):
            value = text
        if isinstance(value, dict) and not text.lstrip().startswith("{"):
            value = text  # "translate English to German: " is a string, not a one-key mapping
        node, created = raw, []
        for depth, part in enumerate(dotted[:-1], 1):
            if part not in node:
                created.append(dotted[:depth])
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {'.'.join(dotted[:-1])} is not a section, "
                                f"so it has no key {dotted[-1]!r}")
                break
            node = child
        else:
            node[dotted[-1]] = value
            applied.update({path: item for path in created if path not in applied})
            applied[dotted] = item
    if problems:
        raise RecipeError(problems)
    return applied


def validate_recipe(raw: dict, source: str = "recipe", overridden: dict[tuple, str] | None = None) -> Recipe:
    """Validate a raw mapping; every error reported at once with its dotted path."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = tuple(str(p) for p in e["loc"])
            origin = next((f"--set {overridden[loc[:i]]}" for i in range(len(loc), 0, -1)
                           if overridden and loc[:i] in overridden), source)
            shown = ".".join(p if p.isprintable() else repr(p) for p in loc)  # a key may hold a line break
            problems.append(f"{origin}: {shown or '(top level)'}: {_describe(e, loc)}")
        raise RecipeError(problems) from None


def _describe(error: dict, loc: tuple[str, ...]) -> str:
    kind, msg = error["type"], error["msg"]
    if kind == "extra_forbidden":
        ours = FOREIGN_NAMES.get(loc[-1]) or FOREIGN_NAMES.get(str(loc[-1]).lower().replace("-", "_"))
        if ours is not None and ours != ".".join(loc):
            return f"unknown key: the recipe's name for {loc[-1]!r} is {ours!r}"
        known = _fields_at(loc[:-1])
        close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        return f"unknown key: {hint}"
    if kind == "missing":
        return "required key missing: add it"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    got = error.get("input")
    shown = json.dumps(got, default=str) if not isinstance(got, dict) else "a mapping"
    return f"{msg[0].lower()}{msg[1:]} (got {shown})"


def _fields_at(loc: tuple[str, ...]) -> list[str]:
    """The keys of the section at `loc`, however deep (an optional section, an item of a list of them)."""
    model: Any = Recipe
    for part in loc:
        if part.isdigit():  # (an item of a list of sections: rl.rewards.0)
            continue
        field = model.model_fields.get(part)
        model = _section(field.annotation) if field is not None else None
        if model is None:
            return []
    return list(model.model_fields)


def _section(annotation) -> type[Section] | None:
    """The section class an annotation holds: itself, or inside `X | None` or `list[X]`; None for a plain value."""
    if isinstance(annotation, type) and not get_args(annotation) and issubclass(annotation, Section):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _section(arg)) is not None), None)


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def replaced(recipe: Recipe, values: dict[str, Any], source: str = "recipe") -> Recipe:
    """A new recipe with the dotted keys in `values` set, validated again (a recipe is never changed in place)."""
    raw = recipe.model_dump()
    for key, value in values.items():
        *path, last = key.split(".")
        node = raw
        for part in path:
            node = node[part]
        node[last] = value
    return validate_recipe(raw, source)
