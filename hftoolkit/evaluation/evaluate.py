"""The eval pass: a model scored on the eval split (loss, the task's metrics, prediction records).

workflows/train.py calls `evaluate` once training ends; workflows/evaluate.py on a finished run, another
split, or a recipe's untrained base checkpoint.
"""

from __future__ import annotations

import math
import time

from hftoolkit.base import console
from hftoolkit.config import tasks
from hftoolkit.evaluation.generation import generate_everywhere
from hftoolkit.job.spec import Job
from hftoolkit.models.families import label_records


def evaluate(job: Job, form, trainer, processor, data, encoded, scorer):
    """Eval loss and metrics on the eval split, plus up to eval.max_predictions prediction records.

    Eval batches run shortest first, so they pad little; the metrics do not depend on the order, and
    records are mapped back to the data's order. Classification and regression records come from that same
    pass's probabilities or values; other tasks generate theirs (a text, tags or filled masks the loss pass
    does not give).
    """
    console.phase(f"eval: {len(data['eval']):,} examples")
    started = time.perf_counter()
    task = tasks.spec(job.recipe.task)
    raw = data["eval"]
    if task.scoring == "preference" and "label" in raw.column_names:  # kto: records answer its good answers' prompts
        raw = raw.filter(lambda row: row["label"])
    count = len(raw) if task.scoring in ("generation", "rl") else min(len(raw), job.recipe.eval.max_predictions)
    eval_set, order = shortest_first(encoded["eval"])
    outputs = None
    if task.labels in ("class", "value"):
        output = trainer.predict(eval_set, metric_key_prefix="eval")
        trainer.log(output.metrics)  # as trainer.evaluate does: the eval lands in the log history
        scored = output.metrics
        predicted = output.predictions if order is None else output.predictions[order.argsort()]
        outputs = _pass_records(task, predicted[:count], trainer.model.config.id2label)
    elif task.scoring == "rl":
        scored = {}  # (no loss pass: TRL's eval loop would sample and score answers again)
    elif task.scoring == "reward":  # both answers' scores, from the same pass that scored every pair
        output = trainer.predict(eval_set, metric_key_prefix="eval")
        trainer.log(output.metrics)
        scored = output.metrics
        predicted = output.predictions if order is None else output.predictions[order.argsort()]
        outputs = form.pair_records(raw[:count], predicted[:count])
    else:
        scored = trainer.evaluate(eval_set, metric_key_prefix="eval")
    results = {k.removeprefix("eval_"): v for k, v in scored.items()
               if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second", "_time"))}
    if task.main_metric == "perplexity" and "loss" in results:
        results["perplexity"] = math.exp(min(results["loss"], 50))
    inputs = eval_inputs(raw, count, task.columns[0])
    if outputs is None:
        prompt = {"prompt_fraction": task.prompt_fraction} if task.prompt_fraction < 1 else {}
        outputs = generate_everywhere(form, job, trainer.model, processor, inputs, **prompt)  # shared
    if task.scoring == "generation":
        results.update(scorer.compute([o["text"] for o in outputs], references(job, raw, count)))
    if task.scoring == "rl":  # the rewards of the answers, each prompt as training gave it
        columns = {c: raw[c][:count] for c in raw.column_names if c != "text"}
        prompts = [form.prompt(job, processor, x) for x in raw["text"][:count]]
        results.update(scorer.compute(prompts, [o["text"] for o in outputs], columns))
    refs = references(job, raw, count) if task.scoring != "reward" else [None] * count  # (its records show both)
    pairs = raw["text_pair"][:count] if "text_pair" in raw.column_names else [None] * len(inputs)
    predictions = [{"input": _show(x), **({"input_pair": p} if p is not None else {}),
                    **({"reference": r} if r is not None else {}), **o}
                   for x, p, r, o in zip(inputs, pairs, refs, outputs)][:job.recipe.eval.max_predictions]
    return results, predictions, time.perf_counter() - started


def _pass_records(task, predicted, id2label: dict) -> list[dict]:
    """Records from the eval pass's own outputs: label and probability (classes), or the predicted value."""
    if task.labels == "value":
        from hftoolkit.models.families.labels import value_records

        return value_records(predicted)
    return label_records(predicted, id2label)


def references(job: Job, raw, count: int) -> list:
    """What the first `count` predictions are compared with: targets, a conversation's final answer, the preferred
    answer of a pair, or labels."""
    if "target" in raw.column_names:
        return raw["target"][:count]
    if "messages" in raw.column_names or "chosen" in raw.column_names:
        from hftoolkit.sources.conversations import reference

        answers = raw["messages" if "messages" in raw.column_names else "chosen"][:count]
        return [a if isinstance(a, str) else reference(a) for a in answers]
    if tasks.spec(job.recipe.task).labels == "value":
        return [round(float(v), 4) for v in raw["label"][:count]]
    if "label" in raw.column_names and job.label_names:
        names = job.label_names
        return [[names[i] for i in v] if isinstance(v, list) else names[v] for v in raw["label"][:count]]
    return [None] * count


def eval_inputs(raw, count: int, column: str) -> list:
    """The first `count` inputs of the eval split as the model takes them: the task's input `column`, or each
    conversation up to its last user turn."""
    if "messages" not in raw.column_names:
        return raw[column][:count]
    from hftoolkit.sources.conversations import question

    return [question(turns) for turns in raw["messages"][:count]]


def _show(value):
    if isinstance(value, list) and value and isinstance(value[0], dict):  # a conversation: its last user turn
        from hftoolkit.sources.conversations import last_user_text

        return last_user_text(value)
    return value if isinstance(value, (str, list)) else f"<{type(value).__name__}>"


def shortest_first(dataset):
    """(dataset sorted by its "length" column, the order taken), or (dataset, None) without one."""
    if "length" not in dataset.column_names:
        return dataset, None
    import numpy as np

    order = np.argsort(np.asarray(dataset["length"]), kind="stable")
    return dataset.select(order), order
