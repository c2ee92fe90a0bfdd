"""Standard benchmarks through lm-evaluation-harness, on a model as hftoolkit loaded it.

The harness builds the prompts and computes the scores, so the numbers are the harness's. This module adds
which models can be scored (a language-model head), the one-line refusals, the shipped task folder
(harness_tasks/, package data), telling a task file from a recipe, and the record metrics.json keeps per task.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.base import extras
from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks

# The shipped tasks: package data, so a wheel install has them, and apart from the recipes, which they are not.
SHIPPED_TASKS = Path(__file__).resolve().with_name("harness_tasks")
# Keys of an lm-evaluation-harness task or group file (its TaskConfig fields) that no recipe has.
HARNESS_KEYS = frozenset({
    "dataset_path", "dataset_name", "dataset_kwargs", "custom_dataset", "output_type", "test_split",
    "validation_split", "training_split", "fewshot_split", "doc_to_text", "doc_to_target", "doc_to_choice",
    "process_docs", "metric_list", "generation_kwargs", "filter_list", "fewshot_config", "num_fewshot", "include",
    "group", "tag", "task_alias", "aggregate_metric_list"})
# The families whose language-model head the harness can score, with the harness's name for each.
BACKENDS = {"decoder": "causal", "seq2seq": "seq2seq"}


@dataclass(frozen=True)
class BenchmarkOptions:
    """What `--benchmark` and the recipe's eval.benchmarks ask for."""

    tasks: tuple[str, ...]
    num_fewshot: int | None = None
    limit: int | None = None
    batch_size: int = 8
    path: str | None = None


def parse_tasks(text: str) -> tuple[str, ...]:
    """`--benchmark a,b` as task names, in order, each once."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not names:
        raise UserError("--benchmark: no task named: pass comma-separated task names, e.g. hftoolkit_everyday_mc")
    return names


def harness_version() -> str:
    """The installed lm-evaluation-harness's version; a one-line refusal when it is missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:
        raise UserError(extras.missing_line("benchmarks", "--benchmark")) from None


def check_benchmarkable(family: str | None, task: str, where: str) -> None:
    """Refuse, before any weights load, a model the harness can't score: an encoder, a vision model, or a
    recipe whose task puts a classification head on the model (it generates nothing and scores no text)."""
    if family not in BACKENDS:
        raise UserError(f"{where}: benchmarks score a language model's text, and this is a {family or 'model'} "
                        "checkpoint: benchmark a decoder (GPT-2, SmolLM2) or an encoder-decoder (T5, BART)")
    if task not in tasks.language_model_tasks(family):
        raise UserError(f"{where}: task {task} puts a {task} head on the {family}, which can't generate or score "
                        f"text: benchmark a run of task {' or '.join(tasks.language_model_tasks(family))}")


def harness_task_file(path: Path) -> str | None:
    """One line saying that `path` is an lm-evaluation-harness task file, not a recipe, and where it goes; None
    for any other file. A task file uses the harness's `!function` tag, or has a `task:` that is no toolkit task
    beside the harness's own keys. Light: for `validate` and `recipes`, which import no harness."""
    import yaml

    tags: list[str] = []

    class Loader(yaml.SafeLoader):
        """Reads any `!tag` (a harness file's `!function module.name`) as null, noting the tag."""

    Loader.add_multi_constructor("!", lambda loader, suffix, node: tags.append(node.tag))
    try:
        raw = Loader(Path(path).read_text(encoding="utf-8")).get_single_data()  # (yaml.safe_load, tags kept)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return None  # (not a YAML mapping: the recipe loader says what is wrong with it)
    if not isinstance(raw, dict):
        return None
    task = raw.get("task")
    if "!function" not in tags and (task in tasks.names() or not HARNESS_KEYS & set(raw)):
        return None
    name = raw.get("group") or task
    named = f" ({'group' if 'group' in raw else 'task'} {name})" if isinstance(name, str) else ""
    return (f"{path}: an lm-evaluation-harness task file{named}, not a recipe: keep it in a folder of task files "
            "apart from the recipes, and pass that folder to `hftoolkit eval --benchmark-path` (or a recipe's "
            "eval.benchmarks.path)")


@functools.lru_cache(maxsize=8)
def _index(path: str | None, defaults: bool):
    from lm_eval.tasks import TaskManager

    from hftoolkit.patches.lm_eval_0_4 import cached_default_index
    from hftoolkit.sources.locations import cache_root

    if path and not Path(path).is_dir():
        raise UserError(f"--benchmark-path: {path} is not a folder: name a folder of lm-evaluation-harness task "
                        "YAML files")
    include = [str(p) for p in (SHIPPED_TASKS, path) if p]
    with cached_default_index(cache_root() / "lm-eval"):  # (the harness's own tasks: indexed once per version)
        return TaskManager(include_path=include, include_defaults=defaults)


def task_manager(path: str | None, tasks: tuple[str, ...] = ()):
    """The harness's task index for `tasks`: the shipped tasks and the folder `path` names, and the harness's own
    thousands of tasks only where a name is not among them (indexing those takes seconds). Built once each."""
    local = _index(path, False)
    if tasks and all(t in local.all_tasks for t in tasks):
        return local
    return _index(path, True)


def check_tasks(manager, tasks: tuple[str, ...]) -> None:
    """Every task or group name known, before the model loads."""
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise UserError(f"--benchmark: no task named {', '.join(unknown)} in lm-evaluation-harness or the shipped "
                        "tasks: run `lm-eval ls tasks` for the names, or add task YAML files with --benchmark-path")


def run_benchmarks(model, tokenizer, family: str, options: BenchmarkOptions, manager) -> tuple[dict, list[dict]]:
    """({task: record}, samples) of the harness run on `model`; each record holds the task's metrics
    with their stderr, the n-shot, the limit, the rows scored and the harness's version.

    The harness's own Hugging Face model class (`HFLM`) is handed the model as loaded (its LoRA adapter
    attached, its quantization applied) and its tokenizer, so prompts, log-likelihoods or generations, metrics
    and stderr are computed by the harness unchanged."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend=BACKENDS[family], batch_size=options.batch_size)
    started = time.perf_counter()
    out = simple_evaluate(model=lm, tasks=list(options.tasks), num_fewshot=options.num_fewshot,
                          limit=options.limit, task_manager=manager, log_samples=True, bootstrap_iters=1000)
    seconds = time.perf_counter() - started
    version = harness_version()
    records = {name: _record(name, metrics, out, options, version, seconds)
               for name, metrics in {**out["results"], **out.get("groups", {})}.items()}
    samples = [{"task": name, **_plain(sample)} for name, rows in out.get("samples", {}).items() for sample in rows]
    return records, samples


def _record(name: str, metrics: dict, out: dict, options: BenchmarkOptions, version: str, seconds: float) -> dict:
    """One task's entry in metrics.json's `benchmarks`: {metric: value} and {metric: stderr} by the harness's
    keys ("acc,none" -> acc), the filter kept where a metric has several ("exact_match,strict-match")."""
    values, errors = {}, {}
    scored = [k for k in metrics if "," in k and not k.split(",")[0].endswith("_stderr")]
    filters = {k.split(",")[0]: sum(s.split(",")[0] == k.split(",")[0] for s in scored) for k in scored}
    for key, value in metrics.items():
        if "," not in key or not isinstance(value, (int, float)):
            continue
        metric, flt = key.split(",", 1)
        base = metric.removesuffix("_stderr")
        label = base if filters.get(base, 1) == 1 else f"{base},{flt}"  # the filter named only where several
        (errors if metric.endswith("_stderr") else values)[label] = value
    higher = out.get("higher_is_better", {}).get(name, {})
    main = next(iter(values), None)
    counts = out.get("n-samples", {}).get(name, {})
    return {"metric": main, "value": values.get(main), "stderr": errors.get(main), "metrics": values,
            "stderrs": errors, "higher_is_better": higher.get(main.split(",")[0]) if main else None,
            "num_fewshot": out.get("n-shot", {}).get(name, options.num_fewshot), "limit": options.limit,
            "rows": counts.get("effective"), "harness_version": version, "seconds": round(seconds, 3)}


def _plain(sample: dict) -> dict:
    """A harness sample made JSON-safe (its numpy values and tuples as plain values)."""
    return json.loads(json.dumps(sample, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
