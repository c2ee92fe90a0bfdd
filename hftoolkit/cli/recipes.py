"""The commands about recipes: `validate` (check them, every problem at once) and `recipes` (list the shipped
ones). Light: neither loads a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.cli.options import SetOption, VerboseOption

# The shipped recipes sit beside the package in a checkout (editable install), or in the
# working directory (the Docker image copies them to /workspace/recipes).
RECIPES_DIR = next((p for p in (Path(__file__).resolve().parents[2] / "recipes", Path.cwd() / "recipes")
                    if p.is_dir()), Path("recipes"))


def validate(
    recipes: Annotated[list[Path], typer.Argument(metavar="RECIPE", help="Recipe YAML files.")],
    set_: SetOption = None,
    data: Annotated[bool, typer.Option("--data", help="Also load each recipe's data, model config and tokenizer "
                                                      "(no weights) and run the preflight checks training runs.")
                    ] = False,
    verbose: VerboseOption = False,
):
    """Check recipes without loading any model; lists every problem at once."""
    from hftoolkit.base import console
    from hftoolkit.base.errors import UserError
    from hftoolkit.config import tasks
    from hftoolkit.config.families import static_family
    from hftoolkit.config.recipe import RecipeError, load_recipe
    from hftoolkit.evaluation.harness import harness_task_file
    from hftoolkit.sources.installed import entry as installed_entry
    from hftoolkit.training.strategies import launch_strategy
    from hftoolkit.training.strategies.launch import launch_config_file

    problems = []
    for path in recipes:
        try:
            try:
                parsed = load_recipe(path, set_ or [])
            except RecipeError as err:  # a file of another kind is named in one line, not read as a bad recipe
                other = harness_task_file(path) or launch_config_file(path)
                raise RecipeError([other]) if other else err from None
            try:  # an installed:<name> checkpoint's name is known without I/O
                installed_entry(parsed.model.checkpoint)
            except UserError as err:
                raise RecipeError([f"{path}: {err.message}"]) from None
            if parsed.training.accelerate_config:  # the launcher config it names, checked against it
                launch_strategy(parsed, None, None, source=str(path))
            notes, family = [], static_family(parsed.model.checkpoint, parsed.model.family)
            if data:
                from hftoolkit.job.resolve import resolve_job
                from hftoolkit.models.load_report import explain_in_captures

                explain_in_captures()
                try:
                    with console.capture(verbosity=console.verbosity_from_flags(verbose, False)):
                        job = resolve_job(parsed)
                    notes, family = job.findings.notes, job.family
                except RecipeError as err:  # (preflight's lines name recipe keys; say which recipe)
                    raise RecipeError([f"{path}: {line}" for line in err.problems]) from None
            typer.echo(f"ok: {path}")
            advice = tasks.advice(parsed.task, family)
            for line in ([advice] if advice else []) + notes:
                typer.echo(f"note: {line}")
        except RecipeError as err:
            problems += err.problems
    if problems:
        raise RecipeError(problems)


def list_recipes():
    """List the shipped recipes with a one-line description each."""
    import yaml

    from hftoolkit.evaluation.harness import harness_task_file

    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        if harness_task_file(path):  # (not a recipe, and its `!function` tag is no YAML safe_load reads)
            continue
        description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        typer.echo(f"{path.relative_to(RECIPES_DIR.parent)}\t{description.splitlines()[0] if description else ''}")
