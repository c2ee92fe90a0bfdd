"""The commands that use a model without training it: `eval` (a run, a recipe's base checkpoint, or benchmarks)
and `predict` (a trained run on new inputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import LOG, RECIPE
from hftoolkit.cli import stdout
from hftoolkit.cli.options import JsonOption, QuietOption, SetOption, VerboseOption


def eval_(
    target: Annotated[Path, typer.Argument(metavar="RUN_DIR|RECIPE", help="A run directory written by train, or a "
                                           "recipe file: its base checkpoint, untrained (the baseline).")],
    split: Annotated[str | None, typer.Option("--split", metavar="NAME", help="Score this split of the hub data "
                                              "set instead of the eval split, e.g. test.")] = None,
    set_: SetOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", "--out", metavar="DIR", help=(
        "With a recipe: keep the scores as a run directory (no weights) that runs and compare read."))] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="With --output: replace a non-empty directory.")
                         ] = False,
    benchmark: Annotated[str | None, typer.Option("--benchmark", metavar="TASKS", help=(
        "Run lm-evaluation-harness tasks or groups (comma-separated, e.g. arc_easy or the shipped "
        "hftoolkit_everyday_mc,hftoolkit_sums_gen) on the model instead; needs hftoolkit[benchmarks]."))] = None,
    num_fewshot: Annotated[int | None, typer.Option("--num-fewshot", min=0, metavar="N", help=(
        "With --benchmark: examples in each prompt (default: each task's own)."))] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N", help=(
        "With --benchmark: score only the first N rows of each task."))] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N", help=(
        "With --benchmark: rows per forward pass."))] = 8,
    benchmark_path: Annotated[Path | None, typer.Option("--benchmark-path", metavar="DIR", help=(
        "With --benchmark: a folder of the harness's task YAML files to add to its tasks."))] = None,
    as_json: JsonOption = False,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Score a trained run again (metrics.json updated), or a recipe's base checkpoint with no training and no
    adapter; --split scores another split (a run directory keeps it under metrics.json's "splits");
    --benchmark runs lm-evaluation-harness tasks (metrics.json's "benchmarks")."""
    from hftoolkit.base import console
    from hftoolkit.runs.rundir import meant_run_folder, run_folder_problem

    verbosity = console.verbosity_from_flags(verbose, quiet)
    options = _benchmark_options(benchmark, num_fewshot, limit, batch_size, benchmark_path, split)
    problem = run_folder_problem(target) if target.is_dir() else meant_run_folder(target)
    if problem:  # (a run folder misspelt gets the run folder's refusal, a recipe misspelt the recipe's)
        raise UserError(problem)
    if target.is_dir():
        if set_ or output:
            raise UserError(f"{'--set' if set_ else '--output'}: applies to a recipe, and {target} is a run "
                            "directory: its recipe is the one it trained with")
        metrics, shown = _eval_run(target, split, options, verbosity)
        stdout.show_result(metrics, target, as_json, verbosity, shown, from_training=True)
        return
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.models.load_report import explain_in_captures
    from hftoolkit.training.relaunch import command_line
    from hftoolkit.workflows import evaluate as evaluation

    parsed = load_recipe(target, set_ or [])
    explain_in_captures()
    with console.capture(verbosity=verbosity):  # (evaluate_recipe attaches --output's train.log)
        if options is not None:
            from hftoolkit.workflows.benchmark import benchmark_recipe

            metrics = benchmark_recipe(parsed, options, output, overwrite, command_line())
        else:
            metrics = evaluation.evaluate_recipe(parsed, split, output, overwrite, command_line())
    shown = ({**metrics, "eval": None} if options is not None else
             {**metrics, "name": metrics["name"] + (f" on {metrics['split']}" if metrics["split"] else "")})
    stdout.show_result(metrics, output, as_json, verbosity, shown)


def _eval_run(target: Path, split: str | None, options, verbosity) -> tuple[dict, dict]:
    """`eval RUN_DIR`: (metrics.json, what the results table shows) once its eval split is scored again, another
    split, or benchmarks."""
    from hftoolkit.base import console
    from hftoolkit.runs.rundir import RunDirectory
    from hftoolkit.workflows import evaluate as evaluation

    if options is None:  # (an optional library the eval pass needs: refused before the run's log goes on)
        from hftoolkit.config.recipe import load_recipe

        evaluation.refuse_missing_libraries(load_recipe(target / RECIPE))
    # (the run's log goes on; the run's head comes with its weights)
    with RunDirectory(target).held("eval", f"hftoolkit eval {target}"), \
            console.capture(target / LOG, verbosity, explain_loading=False):
        if options is not None:
            from hftoolkit.workflows.benchmark import benchmark_run

            metrics = benchmark_run(target, options)
            return metrics, {**metrics, "eval": None}
        if split is None:
            metrics = evaluation.reevaluate(target)
            return metrics, metrics
        metrics, seconds = evaluation.reevaluate_split(target, split)
    # (metrics.json's eval_seconds is the eval split's; the table shows this split's)
    return metrics, {**metrics, "name": f"{metrics['name']} on {split}", "eval": metrics["splits"][split],
                     "eval_seconds": round(seconds, 3)}


def _benchmark_options(benchmark: str | None, num_fewshot, limit, batch_size: int, path: Path | None, split):
    """`eval`'s benchmark options, or None without --benchmark (whose companions then make no sense alone)."""
    if benchmark is None:
        if num_fewshot is not None or limit is not None or path is not None:
            raise UserError("--num-fewshot, --limit and --benchmark-path apply to --benchmark: name the tasks with "
                            "--benchmark TASKS")
        return None
    from hftoolkit.evaluation.harness import BenchmarkOptions, parse_tasks

    if split is not None:
        raise UserError("--split and --benchmark: a benchmark scores its own data, not a split of the run's: "
                        "pass one of them")
    return BenchmarkOptions(parse_tasks(benchmark), num_fewshot, limit, batch_size, str(path) if path else None)


def predict(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory written by train.")],
    input_: Annotated[str | None, typer.Option("--input", "-i", metavar="TEXT|FILE|-", help=(
        "A text; a file: csv, tsv, jsonl, json or parquet (the run's text column, or --column; an id, idx or "
        "index column is kept), .txt (one input a line), or an image; or - to read standard input, one input "
        "(or image path) a line. A run trained on sentence pairs takes each input as two texts with a tab "
        "between them. An input that looks like a path is read as a file or refused, never predicted on."))] = None,
    split: Annotated[str | None, typer.Option("--split", metavar="NAME", help=(
        "Predict on a split of the run's hub data set, labels hidden or not (GLUE's test): one row per "
        "example, its index and predicted label, as a leaderboard submission wants (TSV with a header)."))] = None,
    column: Annotated[str | None, typer.Option("--column", metavar="NAME", help=(
        "The input table's text column (default: the run's data.text_column)."))] = None,
    pair_column: Annotated[str | None, typer.Option("--pair-column", metavar="NAME", help=(
        "The input table's second text, for a run trained on sentence pairs (default: its "
        "data.text_pair_column)."))] = None,
    format_: Annotated[Literal["tsv", "jsonl", "csv"], typer.Option("--format", metavar="FORMAT", help=(
        "tsv: the input and the prediction's fields, tab-separated, one row an input; jsonl: one JSON "
        "object a line; csv: RFC 4180 CSV with a header row."))] = "tsv",
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help=(
        "Write the rows to FILE (atomically) instead of standard output."))] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, metavar="N", help=(
        "Inputs per forward pass (default: the run's eval.batch_size)."))] = None,
    strategy: Annotated[str | None, typer.Option(metavar="NAME", help="Decoding: greedy, sample or beam.")] = None,
    num_beams: Annotated[int | None, typer.Option(metavar="N", help="Beams for beam search.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(metavar="N", help="Tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(metavar="T", help="Sampling temperature.")] = None,
    top_k: Annotated[int | None, typer.Option(metavar="K", help="Sample from the k most likely tokens.")] = None,
    top_p: Annotated[float | None, typer.Option(metavar="P", help="Sample from the nucleus of mass p.")] = None,
    verbose: VerboseOption = False,
    quiet: QuietOption = False,
):
    """Predict with a trained run: label and probability, or generated text, per input."""
    from hftoolkit.base import console
    from hftoolkit.workflows.predict import predict as run_predict

    verbosity = console.verbosity_from_flags(verbose, quiet)
    overrides = dict(strategy=strategy, num_beams=num_beams, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p)
    if (input_ is None) == (split is None):
        raise UserError("predict: pass --input (a text, a file or -) or --split NAME (a split of the run's hub "
                        "data set), one of the two")
    if split is not None and (column or pair_column):
        raise UserError("--column: --split reads the run's own columns: drop --column and --pair-column")
    with console.capture(verbosity=verbosity, explain_loading=False):  # the run's head comes with its weights
        records = run_predict(run_dir, input_, {k: v for k, v in overrides.items() if v is not None}, batch_size,
                              column=column, pair_column=pair_column, split=split)
    text = stdout.predict_text(records, format_, submission=split is not None)
    if output is None:
        typer.echo(text, nl=False)
        return
    from hftoolkit.runs.rundir import write_text_atomic

    write_text_atomic(output, text)  # (secrets masked, as in every file hftoolkit writes)
    if verbosity == console.Verbosity.QUIET:
        typer.echo(str(output))
    else:
        console.phase(f"{len(records):,} predictions written to {output}")
