"""What one run resolved, once: the `Job` every stage after the recipe takes.

The `Recipe` stays as the user wrote it (frozen); what the toolkit learned about it lives here: where
the checkpoint is and its loaded config, family and processor, the label names found in the data, the
lengths preflight clamped, and the precision this machine trains in. `resolve.resolve_job` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe


@dataclass(frozen=True)
class ResolvedModel:
    """A checkpoint located once: `path` is what from_pretrained reads (a folder, or a hub id as the libraries
    take it), with its config and its tokenizer (a pad token set) or image processor, each loaded once."""

    checkpoint: str  # as the recipe names it
    path: str
    revision: str | None
    config: Any
    family: str
    processor: Any
    weights: tuple[str, ...] = ()  # the weight files of a local folder (empty for a hub id: the hub's to serve)
    adapters: tuple[str, ...] = ()  # an earlier run's adapters, merged into the base as it loads (the earliest first)

    @property
    def model_type(self) -> str:
        return self.config.model_type


@dataclass
class Findings:
    """What preflight found: problems (raised together), and what it settled (said and recorded)."""

    problems: list[str] = field(default_factory=list)  # `where: what: what to do`, all raised together
    notes: list[str] = field(default_factory=list)  # what preflight changed, one printed line each
    warnings: list[str] = field(default_factory=list)  # what trains, but not as well as it could here (a warning each)
    record: dict = field(default_factory=dict)  # the same, for manifest.json's "preflight"
    lengths: dict[str, int] = field(default_factory=dict)  # data.max_length & co. as clamped
    # The data's longest prompt and answer in tokens (max_length, max_target_length), where preflight or the plan
    # tokenized the whole train split: batches pad to their longest row, so no step is longer (the memory check plans
    # at these).
    longest: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One run's recipe with everything resolved for it; `data` is None where no data set is read (predict)."""

    recipe: Recipe
    model: ResolvedModel
    precision: str
    data: Any = None
    label_names: tuple[str, ...] | None = None
    findings: Findings = field(default_factory=Findings)
    data_seconds: float = 0.0  # reading the data (a stream: opening it and reading the eval rows)
    # How training spreads the run over its processes (training/strategies), made once from the launch by the train
    # workflow; None for a job that only loads a model in this one process (eval, predict, merge).
    strategy: Any = None
    plan: Any = None  # its strategy's memory and time plan (planning/plan.StrategyPlan); None until planned

    @property
    def shards_parameters(self) -> bool:
        """Each process holds a slice of every weight (FSDP, ZeRO-3): a forward pass needs every process."""
        return self.strategy is not None and self.strategy.shards_parameters

    @property
    def family(self) -> str:
        return self.model.family

    @property
    def task(self) -> str:
        return self.recipe.task

    @property
    def max_length(self) -> int:
        return self._clamped("max_length", self.recipe.data.max_length)

    @property
    def max_target_length(self) -> int:
        return self._clamped("max_target_length", self.recipe.data.max_target_length)

    @property
    def max_new_tokens(self) -> int:
        return self._clamped("max_new_tokens", self.recipe.eval.generation.max_new_tokens)

    def _clamped(self, name: str, asked: int) -> int:
        return min(asked, self.findings.lengths.get(name, asked))

    def recorded_recipe(self) -> Recipe:
        """The recipe as the run directory records it (recipe.yaml): the user's, with the family, the label
        names and the lengths this job resolved filled in, so that eval, predict and --resume read them back."""
        from hftoolkit.config.recipe import validate_recipe

        raw = self.recipe.model_dump()
        raw["model"]["family"] = self.family
        if self.label_names is not None:
            raw["data"]["label_names"] = list(self.label_names)
        raw["data"].update(max_length=self.max_length, max_target_length=self.max_target_length)
        raw["eval"]["generation"]["max_new_tokens"] = self.max_new_tokens
        return validate_recipe(raw, "recipe")
