"""metrics.json: the one shape a run's results take, whether it trained, was evaluated again, or is a recipe's
untrained baseline. `summary.py` reads it back and notes a field that is missing (an older version wrote it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hftoolkit.job.spec import Job

# Every field a finished run's metrics.json holds, in the order written; others (padding, precision, splits,
# the best step of eval.keep_best) follow them where the run has them.
FIELDS = (
    "name", "family", "task", "checkpoint", "quantization", "lora_rank", "main_metric",
    "greater_is_better", "eval", "train_seconds", "eval_seconds", "samples_per_second",
    "tokens_per_second", "peak_memory_mb", "trainable_params", "total_params",
)


def metrics_record(job: Job, scorer, **figures) -> dict:
    """metrics.json's content: what the run is (from the job and how it is scored), then `figures`; a field
    not given is None."""
    from hftoolkit import __version__

    r = job.recipe
    record = dict.fromkeys(FIELDS)
    record.update(name=r.name, family=job.family, task=job.task, checkpoint=r.model.checkpoint,
                  quantization=r.model.quantization, lora_rank=r.lora.r if r.lora.enabled else None,
                  main_metric=scorer.main, greater_is_better=scorer.greater_is_better)
    return {**record, **figures, "hftoolkit_version": __version__}
