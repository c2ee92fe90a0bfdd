"""The commands about recipes: `validate` (check them, every problem at once) and `recipes` (list the shipped
ones). Light: neither loads a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hftoolkit.base.errors import UserError
from hftoolkit.cli.options import SetOption, VerboseOption


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


def list_recipes(
    names: Annotated[list[str] | None, typer.Argument(metavar="NAME", help=(
        "With --copy: the shipped recipes to copy (a name as listed, or accelerate/NAME); default all of them."))
                     ] = None,
    copy: Annotated[Path | None, typer.Option("--copy", metavar="DIR", help=(
        "Write the shipped recipes (all, or the NAMEs) into DIR for editing; accelerate/ configs keep their "
        "folder. Then `hftoolkit train DIR/NAME.yaml`."))] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="With --copy: replace files that exist.")] = False,
):
    """List the shipped recipes, one line each (name and description); --copy writes them out for editing."""
    from hftoolkit.config import shipped

    if copy is None:
        if names:
            raise UserError(f"{' '.join(names)}: names are what --copy copies: add --copy DIR, or leave them out to "
                            "list every shipped recipe")
        _list(shipped.shipped_recipes())
        return
    for written in _copy(names or [], copy, overwrite):
        typer.echo(str(written))


def _list(paths: list[Path]) -> None:
    import yaml

    from hftoolkit.config.shipped import shipped_name
    from hftoolkit.evaluation.harness import harness_task_file

    rows = []
    for path in paths:
        if path.parent.name == "accelerate" or harness_task_file(path):  # (not recipes: launcher configs, and
            continue  # harness tasks, whose `!function` tag is no YAML safe_load reads)
        description = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("description", "")
        rows.append((shipped_name(path), description.splitlines()[0] if description else ""))
    width = max((len(name) for name, _ in rows), default=0)
    for name, description in rows:
        typer.echo(f"{name:<{width}}  {description}".rstrip())


def _copy(names: list[str], folder: Path, overwrite: bool) -> list[Path]:
    """Copy the shipped recipes named (all where none is) into `folder`; every name and every clash is checked
    before anything is written."""
    from hftoolkit.config import shipped

    available = {shipped.shipped_name(p): p for p in shipped.shipped_recipes()}
    problems, chosen = [], {}
    for name in names or list(available):
        key = Path(name).with_suffix("").as_posix() if Path(name).suffix in (".yaml", ".yml") else name
        if key not in available:
            close = shipped.close_match(name)
            hint = f"did you mean {close!r}?" if close else "`hftoolkit recipes` lists them"
            problems.append(f"{name}: no shipped recipe of that name: {hint}")
            continue
        chosen[key] = folder / available[key].relative_to(shipped.SHIPPED)
    if folder.exists() and not folder.is_dir():
        problems.append(f"--copy: {folder} is a file, not a folder: choose another folder")
    clashes = [str(target) for target in chosen.values() if target.exists() and not overwrite]
    if clashes:
        problems.append(f"--copy: {', '.join(clashes)} already exist{'s' if len(clashes) == 1 else ''}: pass "
                        "--overwrite to replace them, or choose another folder")
    if problems:
        raise UserError("\n".join(problems))
    from hftoolkit.runs.rundir import write_atomic

    return [write_atomic(target, available[key].read_bytes()) for key, target in chosen.items()]
