"""The runs a server answers for, loaded once: runs whose adapters share a base share one copy of it.

Each run is loaded as `predict` loads it (`workflows.trained.load_trained`). A LoRA run whose base is already in
memory, with the same head, quantization and processor, has its adapter attached to that model by name (peft's
`load_adapter`); another base is loaded once more. Merged and fully fine-tuned runs are served as they are, each a
model of its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks

# What a run's requests ask of it: text generation (completions; chat too where the formulation reads
# conversations), records of labels, values or tags, or a reward model's scores of answers.
GENERATES, LABELS, SCORES = "text", "labels", "scores"
# Runs serve refuses, and why.
NOT_SERVED = {tasks.IMAGE_CLASSIFICATION: "and serve reads text (an image path in a request would read this "
                                          "machine's files)",
              tasks.MLM: "whose fill-mask answers have no OpenAI endpoint"}


@dataclass
class Base:
    """One model in memory and the processor its runs read their inputs with."""

    model: Any
    processor: Any
    adapters: list[str] = field(default_factory=list)  # attached by name (empty: a merged or full model)
    runs: list[str] = field(default_factory=list)  # the served names of the runs on it
    # The request handlers count tokens with a copy of their own: a fast tokenizer is not to be used from two
    # threads at once (its padding and truncation settings are state), and the worker thread uses `processor`.
    counter: Any = field(init=False)

    def __post_init__(self):
        import copy

        self.counter = copy.deepcopy(self.processor)


@dataclass
class ServedRun:
    name: str
    run: Path
    job: Any
    form: Any
    base: Base
    adapter: str | None  # its adapter's name on the base (None: the model is the run)

    @property
    def task(self) -> str:
        return self.job.recipe.task

    @property
    def kind(self) -> str:
        if self.task == tasks.REWARD:
            return SCORES
        return LABELS if tasks.spec(self.task).labels else GENERATES

    @property
    def chats(self) -> bool:
        """Whether it answers conversations: it was tuned on prompts and answers through the chat template."""
        return self.kind == GENERATES and self.task in (tasks.INSTRUCTION, tasks.PREFERENCE, tasks.GRPO) \
            and self.job.model.family == "decoder"


def run_names(given: list[str]) -> list[tuple[str, Path]]:
    """(served name, run directory) for each RUN_DIR or NAME=RUN_DIR; a name is given once."""
    pairs = []
    for item in given:
        name, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        path = Path(path).expanduser()
        pairs.append((name or path.resolve().name, path))
    names = [name for name, _ in pairs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError(f"serve: the model name {twice[0]!r} is given to two runs: name one NAME=RUN_DIR")
    return pairs


def load_runs(pairs: list[tuple[str, Path]], max_batch: int, progress=print) -> dict[str, ServedRun]:
    """Every run loaded, adapters on a shared base where they can be; `max_batch` requests go through the model at
    once (each run's eval.batch_size is set to it, so that a batch is one forward pass)."""
    from hftoolkit.config.recipe import replaced
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.runs.rundir import open_run
    from hftoolkit.workflows.trained import load_trained

    served, bases = {}, {}
    for name, path in pairs:
        run = open_run(path, merged=True)
        recipe, weights, lora = run.recipe, run.weights, run.adapter
        if recipe.task in NOT_SERVED:
            raise UserError(f"serve: {path} is a {recipe.task} run, {NOT_SERVED[recipe.task]}: use hftoolkit predict")
        key = _base_key(recipe, weights) if lora else None
        if key is not None and key in bases:
            base = bases[key]
            adapter = f"adapter-{len(base.adapters)}"  # (peft's own name for the first is "default")
            base.model.load_adapter(str(weights), adapter_name=adapter, is_trainable=False)
            base.adapters.append(adapter)
            base.runs.append(name)
            job = resolve_job(recipe, data=False, weights=weights)  # (no weights read: they join a loaded base)
            form = formulation(job)
        else:
            job, form, model, processor = load_trained(run)
            model.eval()
            adapter = "default" if lora else None
            base = Base(model, processor, [adapter] if adapter else [], [name])
            if key is not None:
                bases[key] = base
        job = dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.batch_size": max_batch}, "serve"))
        served[name] = ServedRun(name, Path(path), job, form, base, adapter)
        shared = f", sharing its base with {', '.join(base.runs[:-1])}" if len(base.runs) > 1 else ""
        progress(f"model {name}: {job.recipe.task} run {path}{shared}")
    return served


def _base_key(recipe, adapter: Path) -> tuple:
    """What must match for two adapter runs to share one base in memory: the checkpoint and how it was loaded, the
    head (task and labels: recipe.yaml records the label names), and the processor's files (a chat template an
    instruction run added, for one)."""
    import hashlib

    m = recipe.model
    files = sorted(adapter.glob("*token*")) + sorted(adapter.glob("*vocab*"))
    processor = hashlib.sha256(b"".join(_processor_bytes(f) for f in files)).hexdigest()
    return (m.checkpoint, m.revision, m.gguf_file, m.quantization, m.dtype, recipe.task,
            tuple(recipe.data.label_names or ()), processor)


def _processor_bytes(file: Path) -> bytes:
    """A processor file as it bears on answers: tokenizer.json without the truncation and padding settings the
    tokenizer last ran with when it was saved (state of the moment, which two runs of one base save differently)."""
    if file.name != "tokenizer.json":
        return file.read_bytes()
    import json

    saved = json.loads(file.read_text())
    return json.dumps({k: v for k, v in saved.items() if k not in ("truncation", "padding")}, sort_keys=True).encode()


