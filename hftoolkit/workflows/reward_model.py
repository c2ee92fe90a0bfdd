"""A finished reward run (task reward) as a scorer other code calls: GRPO's reward function, a notebook, a filter.

    scorer = load_reward_scorer(Path("runs/encoder-reward"))
    scorer.score(["What is 2 plus 3?"], ["2 plus 3 is 5."])   # -> [1.73]

The run is opened and loaded as eval and predict load it (`runs.rundir.open_run`, `workflows.trained.load_trained`),
and scores go through the formulation's own tokenization and precision (models/families/reward.py), so a pair scores
here what the run's eval pass scored it.
"""

from __future__ import annotations

from pathlib import Path

from hftoolkit.base import console
from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.runs.rundir import open_run
from hftoolkit.workflows.trained import load_trained


class RewardScorer:
    """A loaded reward model: `score(prompts, answers)` gives one float per (prompt, answer).

    Prompts are texts or conversations (lists of {"role", "content"} turns); answers are texts or the assistant turns
    that follow the prompt. Inputs go through the model in batches of `batch_size` (the run's eval.batch_size unless
    given), under torch.no_grad, on the model's device."""

    def __init__(self, run: Path, job, form, model, processor):
        self.run, self.job, self.form, self.model, self.processor = run, job, form, model, processor

    @property
    def device(self):
        return self.model.device

    def score(self, prompts: list, answers: list) -> list[float]:
        prompts, answers = list(prompts), list(answers)
        if len(prompts) != len(answers):
            raise UserError(f"score: {len(prompts)} prompts and {len(answers)} answers: give one prompt per answer "
                            "(repeat a prompt to score several answers to it)")
        if not prompts:
            return []
        return self.form.scores(self.job, self.model, self.processor, prompts, answers)


def load_reward_scorer(run_dir: Path, batch_size: int | None = None) -> RewardScorer:
    """The finished reward run at `run_dir`, loaded for scoring; a run of another task is refused in one line."""
    import dataclasses

    run = open_run(run_dir, merged=True)
    if run.recipe.task != tasks.REWARD:
        raise UserError(f"{run_dir}: a {run.recipe.task} run, and scoring answers needs a reward model: train one with "
                        "task: reward (recipes/encoder-reward.yaml) and pass its run directory")
    with console.capture(explain_loading=False):  # the libraries' loading chatter, as predict keeps it out
        job, form, model, processor = load_trained(run)
    if batch_size is not None:
        from hftoolkit.config.recipe import replaced

        job = dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.batch_size": batch_size}, "the scorer"))
    model.eval()
    return RewardScorer(Path(run_dir), job, form, model, processor)


def reward_columns(recipe, rows: list[dict], table: Path, column: str | None, pair_column: str | None
                   ) -> tuple[str, dict[str, str]]:
    """(the prompt column, {record field: answer column}) of the table `predict_scores` scores; a column it lacks is
    refused in one line (predict asks before the model loads)."""
    d = recipe.data
    found = list(dict.fromkeys(k for row in rows[:100] for k in row))
    answer = pair_column or d.chosen_column
    if answer not in found:
        named = "--pair-column" if pair_column else "the run's data.chosen_column"
        raise UserError(f"--input: {table} has no answer column {answer!r} ({named}); columns found: "
                        f"{', '.join(found)}: name it with --pair-column")
    if column and column not in found:
        raise UserError(f"--column: {table} has no column {column!r}; columns found: {', '.join(found)}")
    if not pair_column and d.rejected_column in found:  # a pairs file: both answers, as the eval's records
        return column or d.text_column, {"chosen": answer, "rejected": d.rejected_column}
    return column or d.text_column, {"answer": answer}


def predict_scores(job, form, model, processor, lines: list[str] | None, rows: list[dict] | None, table: Path | None,
                   column: str | None, pair_column: str | None) -> list[dict]:
    """`hftoolkit predict` on a reward run: a record per input with its score. A text line is an answer, or
    `prompt<TAB>answer`; a table's rows give the prompt (--column, else data.text_column; none: an empty prompt) and
    the answer (--pair-column, else data.chosen_column; a whole conversation there is split at its last user turn),
    and where the table also has data.rejected_column, both answers are scored, as the eval's records show them."""
    from hftoolkit.models.families.reward import split_input
    from hftoolkit.sources.conversations import last_user_text, reference
    from hftoolkit.sources.pairs import is_conversation

    def shown(value):
        return (reference(value) if value and value[-1]["role"] == "assistant" else last_user_text(value)) \
            if is_conversation(value) else value

    if rows is None:
        pairs = [split_input(tuple(line.replace("\\t", "\t").split("\t", 1))) if "\t" in line.replace("\\t", "\t")
                 else ("", line) for line in lines]
        scores = form.generate(job, model, processor, pairs)
        return [{"input": p, "answer": a, **s} for (p, a), s in zip(pairs, scores)]
    prompt, sides = reward_columns(job.recipe, rows, table, column, pair_column)
    records = [{} for _ in rows]
    for name, side in sides.items():
        pairs = [(row[prompt], row[side]) if prompt in row else split_input(row[side]) for row in rows]
        scores = form.generate(job, model, processor, pairs)
        for record, (p, a), s in zip(records, pairs, scores):
            record.update({"input": shown(p), name: shown(a), ("score" if name == "answer" else f"{name}_score"):
                           s["score"]})
    return records
