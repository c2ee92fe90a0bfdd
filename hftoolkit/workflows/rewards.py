"""Task grpo's rewards, loaded: one callable per entry of rl.rewards in the form TRL's GRPO trainer calls, their
weights, and the eval scores of answers to held-out prompts (the mean of each reward, and of their weighted sum).

The built-in rewards and a user's function come from sources/rewards.py; a reward run's model is loaded here and
scores each prompt and answer as it was trained to (workflows/reward_model.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hftoolkit.config.recipe import Recipe
from hftoolkit.metrics import EvalMetrics
from hftoolkit.sources import rewards as library


@dataclass(frozen=True)
class Rewards:
    functions: tuple[Callable, ...]
    weights: tuple[float, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.__name__ for f in self.functions)

    def score(self, prompts: list, completions: list, columns: dict, completion_ids: list) -> dict:
        """{"reward": the mean weighted sum, "rewards/<name>": each reward's mean} over the answers given, as TRL
        reckons them: a reward's None leaves that answer out of the reward's mean and adds nothing to its sum."""
        totals = [0.0] * len(completions)
        out = {}
        for function, weight in zip(self.functions, self.weights):
            values = function(prompts=prompts, completions=completions, completion_ids=completion_ids,
                              trainer_state=None, log_extra=lambda *a: None, log_metric=lambda *a: None, **columns)
            given = [float(v) for v in values if v is not None]
            out[f"rewards/{function.__name__}"] = sum(given) / len(given) if given else None
            totals = [t + (weight * float(v) if v is not None else 0.0) for t, v in zip(totals, values, strict=True)]
        out["reward"] = sum(totals) / len(totals) if totals else None
        return out


def load_rewards(recipe: Recipe) -> Rewards:
    """rl.rewards as callables, each named after its entry (a second of the same name gets _2, and so on)."""
    functions, seen = [], {}
    for i, entry in enumerate(recipe.rl.rewards):
        key = f"rl.rewards.{i}.{entry.kind}"
        function = library.builtin(entry)
        if function is None and entry.function is not None:
            function = library.load_function(entry.function, key)
        elif function is None:
            function = reward_model(entry.run, key)
        seen[entry.name] = seen.get(entry.name, 0) + 1
        functions.append(_named(function, entry.name if seen[entry.name] == 1 else f"{entry.name}_{seen[entry.name]}"))
    return Rewards(tuple(functions), tuple(e.weight for e in recipe.rl.rewards))


def reward_model(run_dir: str, key: str) -> Callable:
    """A reward from the model of a task reward run: its score of each prompt and answer."""
    from pathlib import Path

    from hftoolkit.base.errors import UserError
    from hftoolkit.workflows.reward_model import load_reward_scorer

    problem = library.reward_run_problem(run_dir, key)
    if problem:
        raise UserError(problem)
    scorer = load_reward_scorer(Path(run_dir).expanduser())

    def reward_model(prompts, completions, **_) -> list[float]:
        return scorer.score(list(prompts), list(completions))

    return reward_model


def _named(function: Callable, name: str) -> Callable:
    """`function` under `name` (TRL logs each reward by its __name__), the user's own function left untouched."""
    def named(*args, **kwargs):
        return function(*args, **kwargs)

    named.__name__ = named.__qualname__ = name
    return named


def scoring(job, form, processor) -> tuple[EvalMetrics, Rewards | None]:
    """(how the job's eval is scored, the rewards of task grpo or None): for every command that builds a Trainer."""
    if job.recipe.rl is None:
        return form.metrics(job, processor), None
    rewards = load_rewards(job.recipe)
    return eval_metrics(rewards, processor), rewards


def eval_metrics(rewards: Rewards, tokenizer) -> EvalMetrics:
    """EvalMetrics whose compute(prompts, answers, columns) scores answers to held-out prompts with `rewards`,
    each prompt as TRL's trainer gives it (models/families/grpo.py)."""
    def compute(prompts: list, answers: list[str], columns: dict) -> dict:
        completions = [[{"role": "assistant", "content": a}] if isinstance(p, list) else a
                       for p, a in zip(prompts, answers)]
        ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
        return rewards.score(prompts, completions, columns, ids)

    return EvalMetrics(compute, "reward", greater_is_better=True)
