"""The recipe: a strict schema for one training job, loaded from YAML.

Everything past this module sees a validated `Recipe`, never a raw dict. Unknown
keys are errors with a "did you mean" suggestion, and every error of a file is
reported at once as `file: a.b.c: message` (docs/architecture.md, "Recipes").
Imports only pydantic and yaml: `validate` must stay light.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hftoolkit.config import tasks
from hftoolkit.config.families import FAMILIES, model_rules, static_family
from hftoolkit.errors import UserError

FamilyName = Literal[FAMILIES]

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


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # validated once; a run's findings live on its Job


class ModelSection(Section):
    checkpoint: str = Field(min_length=1, description="hub id, local directory, a .gguf file, or init:<arch>")
    gguf_file: str | None = Field(None, description="a GGUF file inside the checkpoint folder or hub repository")
    family: FamilyName | None = Field(None, description="only needed where transformers' tables do not tell the family")
    quantization: Literal["none", "8bit", "4bit"] = "none"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    revision: str | None = None
    trust_remote_code: bool = False
    attention: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="attention kernel (from_pretrained's attn_implementation); flash_attention_2 needs "
                            "CUDA and the flash-attn package")
    double_quant: bool = Field(False, description="4-bit only: quantize the quantization constants too (QLoRA)")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="4-bit only: the dtype 4-bit layers compute in; auto follows training.precision")

    @model_validator(mode="after")
    def _remote_code_needs_pinned_revision(self):
        if self.trust_remote_code and not self.revision:
            raise ValueError("trust_remote_code runs code from the checkpoint: "
                             "set model.revision to a pinned commit too")
        for key, value, default in (("double_quant", self.double_quant, False),
                                    ("compute_dtype", self.compute_dtype, "auto")):
            if value != default and self.quantization != "4bit":
                raise ValueError(f"{key} applies to 4-bit weights only, and quantization is "
                                 f"{self.quantization}: set model.quantization to 4bit or drop model.{key}")
        return self


class LoraSection(Section):
    enabled: bool = True
    r: int = Field(8, gt=0)
    alpha: float = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    targets: Literal["auto", "all-linear"] | list[str] = Field(
        "auto", description="auto (the query and value projections), all-linear, or module names")
    variant: Literal["lora", "dora", "rslora"] = Field(
        "lora", description="lora; dora (weight-decomposed LoRA, Liu et al. 2024: a trained magnitude per output); "
                            "rslora (scale alpha / sqrt(r) instead of alpha / r, Kalajdzievski 2023)")


class DataSection(Section):
    """Where the examples come from. Any *_column may be a dotted path into a nested field (translation.de)."""

    train: str = Field(min_length=1, description="file, folder, hub id or builtin:<name>")
    eval: str | None = Field(None, description="file, folder, hub id or builtin:<name>; unset: data.eval_split "
                                                "of data.train's hub set, else data.eval_fraction of data.train")
    eval_fraction: float = Field(0.1, gt=0, lt=1)
    config: str | None = Field(None, description="hub data sets: the config (subset), e.g. mnli of nyu-mll/glue")
    revision: str | None = Field(None, description="hub data sets: a branch, tag or commit sha")
    train_split: str = "train"
    eval_split: str | None = Field(None, description="hub data sets: the split to score, e.g. validation_matched "
                                                     "(for a hub data.eval: by default validation)")
    text_column: str = "text"
    eval_text_column: str | None = Field(None, description="data.eval's text column, where its name differs")
    text_pair_column: str | None = Field(None, description="the second text of a sentence pair (classification "
                                                           "and regression), e.g. hypothesis or sentence2")
    label_column: str = "label"
    target_column: str = "target"
    messages_column: str = Field("messages", min_length=1, description="instruction: a column of conversations, "
                                 "lists of {role, content} turns; a data set that has it is read as conversations")
    image_column: str = "image"
    train_target: str | None = Field(None, description="aligned targets, one a line, matching data.train's lines")
    eval_target: str | None = Field(None, description="aligned targets for data.eval")
    label_names: list[str] | None = Field(None, description="the classes in id order, written as the data holds "
                                                            "them (numbers included); unset: the values, sorted")
    label_map: dict[str, str | None] | None = Field(
        None, description="raw label value -> class name, many to one; a value mapped to null drops its rows")
    max_length: int = Field(128, gt=0)
    max_target_length: int = Field(64, gt=0)
    source_prefix: str = ""
    packing: bool | Literal["blocks"] | None = Field(
        None, description="clm, instruction, translation, summarization on a decoder: true packs whole examples into "
                          "full rows, attention never crossing from one into the next; blocks (clm only) cuts the "
                          "concatenated texts into blocks of data.max_length; false pads; unset: blocks for clm")
    mask_probability: float = Field(0.15, ge=0.1, le=0.3)
    max_train_samples: int | None = Field(None, gt=0)
    max_eval_samples: int | None = Field(None, gt=0)
    num_workers: int = Field(0, ge=0, description="data loader worker processes (tokenized text needs none; "
                                                  "images decode in them); memory is pinned on CUDA")
    streaming: bool = Field(False, description="read data.train as a stream (hub ids, jsonl, csv, parquet): rows "
                                               "are read and tokenized as training takes them; needs "
                                               "training.max_steps")
    num_proc: int | None = Field(None, gt=0, description="processes that tokenize the data (a split held in "
                                                         "memory; a stream is tokenized as it is read)")

    @field_validator("label_names", mode="before")
    @classmethod
    def _names_as_written(cls, value):
        """Labels are matched by their text, so 1 (a YAML number) names the same class as '1' (a CSV's 1)."""
        return [_label_text(v) for v in value] if isinstance(value, list) else value

    @field_validator("label_map", mode="before")
    @classmethod
    def _map_as_written(cls, value):
        if not isinstance(value, dict):
            return value
        return {_label_text(k): None if v is None else _label_text(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _names_cover_the_map(self):
        if self.label_map is None:
            return self
        mapped = list(dict.fromkeys(v for v in self.label_map.values() if v is not None))
        if not mapped:
            raise ValueError("label_map maps every value to null, which would drop every row: map at least two "
                             "values to class names")
        missing = [n for n in mapped if self.label_names is not None and n not in self.label_names]
        if missing:
            raise ValueError(f"label_names lacks {', '.join(map(repr, missing))}, which label_map maps to: list "
                             "every name of label_map in label_names, or leave label_names unset")
        return self


def _label_text(value):
    """A label value as text: YAML numbers (not booleans) become the digits a CSV cell holds."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


class TrainingSection(Section):
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, gt=0)
    batch_size: int = Field(16, gt=0, description="examples per optimizer step over all processes together "
                                                  "(each of N processes takes batch_size / N)")
    gradient_accumulation: int = Field(1, gt=0)
    learning_rate: float = Field(5e-4, gt=0)
    scheduler: Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                       "inverse_sqrt", "reduce_lr_on_plateau"] = Field(
        "linear", description="the Trainer's learning-rate schedules that need no further settings; "
                              "reduce_lr_on_plateau watches the main metric, so it needs eval.every")
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    warmup_steps: int | None = Field(None, ge=0, description="warmup as a number of steps (instead of warmup_ratio)")
    optimizer: Literal["adamw_fused", "adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"] = Field(
        "adamw_fused", description="adamw_fused (torch's AdamW as one fused kernel per step: the Trainer's own "
                                   "default), adamw (torch's for-each AdamW), adamw_8bit and paged_adamw_8bit "
                                   "(bitsandbytes: 8-bit moments; paging acts on CUDA only), adafactor, sgd")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on a GPU that has it, else fp16 (fp32 for T5), fp32 on a CPU")
    tf32: bool = Field(False, description="TF32 matmuls for fp32 work (NVIDIA Ampere or newer)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: "
                                                            "less memory, about a third more compute")
    compile: bool = Field(False, description="torch.compile the model (GPU-first; see README for CPU figures)")
    sampling: Literal["group_by_length", "random", "sequential"] = Field(
        "group_by_length", description="training batch order: similar lengths together (least padding), shuffled, "
                                       "or the data's own order (the same global batches on any number of processes)")
    accelerate_config: str | None = Field(None, description="accelerate launcher config (recipes/accelerate/*.yaml) "
                                                            "that `hftoolkit train` launches with")
    save_on_each_node: bool = Field(False, description="on several machines, each machine's first process writes "
                                                       "its own copy of the run directory and checkpoints (machines "
                                                       "that share no file system; --resume then runs on each)")
    logging_steps: int = Field(10, gt=0)
    save_steps: int | None = Field(None, gt=0)
    keep_last: int = Field(2, gt=0)
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "trackio"]] = []
    project: str | None = Field(None, min_length=1, description="the trackers' project (W&B project, MLflow "
                                                                "experiment, trackio project); the run is the name")
    on_nonfinite: Literal["stop", "skip"] = "stop"
    max_nonfinite_skips: int = Field(3, gt=0)


class GenerationSection(Section):
    strategy: Literal["greedy", "sample", "beam"] = "greedy"
    max_new_tokens: int = Field(32, gt=0)
    num_beams: int = Field(4, gt=1)
    length_penalty: float = 1.0
    temperature: float = Field(1.0, gt=0)
    top_k: int | None = Field(None, gt=0)
    top_p: float | None = Field(None, gt=0, le=1)


class EarlyStoppingSection(Section):
    patience: int = Field(3, gt=0, description="evals in a row without improvement before training stops")
    threshold: float = Field(0.0, ge=0, description="the least change of the main metric that counts as one")


class BenchmarksSection(Section):
    tasks: list[str] = Field(description="lm-evaluation-harness task or group names, run after training")
    num_fewshot: int | None = Field(None, ge=0, description="examples in each prompt; unset: each task's own")
    limit: int | None = Field(None, gt=0, description="score only the first N rows of each task")
    batch_size: int = Field(8, gt=0)
    path: str | None = Field(None, description="a folder of the harness's task YAML files, added to its tasks")

    @field_validator("tasks")
    @classmethod
    def _some_tasks(cls, value):
        if not [t for t in value if t.strip()]:
            raise ValueError("name at least one task, e.g. [hftoolkit_everyday_mc]")
        return value


class EvalSection(Section):
    batch_size: int = Field(64, gt=0)
    metrics: Literal["auto"] | list[str] = "auto"
    max_predictions: int = Field(100, ge=0)
    generation: GenerationSection = GenerationSection()
    every: Literal["none", "epoch"] | int = Field(
        "none", description="eval during training: none, epoch, or every N optimizer steps")
    early_stopping: EarlyStoppingSection | None = Field(None, description="stop when the main metric stalls")
    keep_best: bool = Field(False, description="keep the best checkpoint; the run's weights are the best ones")
    benchmarks: BenchmarksSection | None = Field(None, description="lm-evaluation-harness tasks after training")

    @field_validator("every", mode="before")
    @classmethod
    def _every_is_a_strategy_or_steps(cls, value):
        if (isinstance(value, bool) or (isinstance(value, int) and value <= 0) or not isinstance(value, (int, str))
                or (isinstance(value, str) and value not in ("none", "epoch") and not value.strip().isdigit())):
            raise ValueError(f"expected none, epoch or a number of steps above 0 (got {json.dumps(value)})")
        return value

    @model_validator(mode="after")
    def _eval_during_training(self):
        if self.every == "none":
            for key, on in (("early_stopping", self.early_stopping is not None), ("keep_best", self.keep_best)):
                if on:
                    raise ValueError(f"{key} judges the evals made during training, and every is none: "
                                     "set eval.every to epoch or a number of steps")
        return self


class OutputSection(Section):
    dir: str = "runs"


class Recipe(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="run name, also the run folder's name")
    task: str
    description: str = ""
    model: ModelSection
    lora: LoraSection = LoraSection()
    data: DataSection
    training: TrainingSection = TrainingSection()
    eval: EvalSection = EvalSection()
    output: OutputSection = OutputSection()

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
        if self.data.packing == "blocks" and self.task != tasks.CLM:
            raise ValueError(f"data.packing blocks cuts concatenated texts, which only task clm trains on, and the "
                             f"task is {self.task}: set data.packing to true (whole examples) or false")
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
    path = Path(path)
    raw = read_yaml_mapping(path, str(path), "recipe file not found: check the path (`hftoolkit recipes` lists the "
                            "shipped ones)", "the recipe", "a recipe is a YAML mapping of sections (name, task, "
                            "model, data, ...)")
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
    """Apply `a.b.c=value` overrides in place (values parsed as YAML); returns {path: original text}."""
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
        node = raw
        for part in dotted[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {'.'.join(dotted[:-1])} is not a section, "
                                f"so it has no key {dotted[-1]!r}")
                break
            node = child
        else:
            node[dotted[-1]] = value
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
    model: Any = Recipe
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


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
