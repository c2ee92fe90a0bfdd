"""`export`: a finished run written for the runtimes people deploy on, and checked before it is called done.

    hftoolkit export RUN_DIR --format gguf|ollama|onnx --output DIR [--quantization f16]

Each format is one module of exports/ behind exports/format.py's `ExportFormat`, registered in exports.FORMATS: it
says which runs it takes and which quantizations it writes, writes its files, and reads them back. This workflow
does the rest once, whatever the format: the format and quantization asked, the output folder, the run (finished,
not in use, one the format takes, the format's library installed), the run's model loaded with any LoRA adapter
merged in memory, the eval inputs the check runs on, the staging folder, export.json and the run's manifest.

The written files are run on a few of the run's eval inputs beside the run's own model; the difference is printed
in one line, and an export beyond its format's tolerance fails. The folder appears whole or not at all (it is
written aside and moved into place), and export.json in it, like the run's manifest.json, records what was
exported, from which run, with which settings, and the measured difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.base import extras
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import EXPORT, RECIPE
from hftoolkit.config import tasks
from hftoolkit.exports import FORMATS
from hftoolkit.exports.format import ExportFormat, Exporting
from hftoolkit.runs.rundir import TRAINED_EVAL_FAILED, RunDirectory, open_run, staged_folder, write_text_atomic

CHECKED_INPUTS = 4  # eval inputs each export is run on beside the run's model


@dataclass
class Exported:
    folder: Path  # what the folder holds is read from it (the command's summary lists every file)
    record: dict  # export.json's content
    line: str  # the check, in one line


def export_run(run_dir: Path, out: Path, fmt: str, quantization: str | None = None,
               command: str | None = None) -> Exported:
    """Write the run at `run_dir` as `fmt` into the new folder `out`, check it, and record it in both places."""
    export_format, quantization = _options(fmt, quantization)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output: {out} {'is a file' if not out.is_dir() else 'is not empty'}: choose a new folder")
    held = RunDirectory(run_dir).in_use("export")  # (before open_run: a run still training has no weights yet)
    if held:
        raise UserError(held)
    run = open_run(run_dir, merged=True)
    _refuse_unfinished(run)
    _refuse_format(run.recipe, export_format)
    if export_format.extra:  # (after the run's own refusals: a run the format can't hold needs no library for it)
        extras.requires(export_format.extra, f"export --format {export_format.name}")
    directory = RunDirectory(run.path)
    with directory.held("export", command or f"hftoolkit export {run.path}"):
        started = time.perf_counter()
        from hftoolkit.workflows.merge import merged_model

        job, form, model, processor = merged_model(run, data=True)
        inputs = eval_inputs(job, CHECKED_INPUTS)
        with staged_folder(out) as folder:
            exporting = Exporting(job, form, model, processor, folder, inputs, quantization, write_text_atomic)
            written = export_format.write(exporting)
            check = export_format.check(exporting, written)
            if not check.passed:
                raise UserError(f"export: {check.line}: beyond the format's tolerance, so nothing was kept; "
                                "please report it with the run's recipe.yaml")
            (folder / RECIPE).write_bytes((run.path / RECIPE).read_bytes())  # predict reads the task and columns
            shown = {"line": check.line, **check.measured}
            record = {"format": export_format.name, "quantization": quantization, "files": written.files,
                      "run": str(run.path.resolve()), "task": job.task, "family": job.family,
                      "checkpoint": job.recipe.model.checkpoint, "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "seconds": round(time.perf_counter() - started, 2), "check": shown, **written.recorded}
            RunDirectory(folder).write_json(EXPORT, record)
        if not run.merged:  # (a folder `merge` wrote has no manifest to record it in)
            path = str(out.resolve())
            kept = [e for e in directory.manifest().get("exports", []) if e.get("path") != path]
            directory.update_manifest(exports=[*kept, {"format": export_format.name, "quantization": quantization,
                                                       "path": path, "exported": record["exported"],
                                                       "check": shown}])
    return Exported(out, record, check.line)


def _options(fmt: str, quantization: str | None) -> tuple[ExportFormat, str | None]:
    """The format --format names (exports.FORMATS) and the quantization it writes."""
    export_format = FORMATS.get(fmt)
    if export_format is None:
        runs: dict[str, list[str]] = {}
        for each in FORMATS.values():
            runs.setdefault(each.runs, []).append(each.name)
        which = ", ".join(f"{_listed(names, 'and')} for {what}" for what, names in runs.items())
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}: {which}")
    if not export_format.quantizations:
        if quantization not in (None, "f32"):
            quantizing = _listed([name for name, each in FORMATS.items() if each.quantizations], "and")
            raise UserError(f"--quantization: {quantization} applies to {quantizing}; an {export_format.title} "
                            "export keeps the run's float32 weights: drop --quantization")
        return export_format, None
    quantization = quantization or export_format.default_quantization
    if quantization not in export_format.quantizations:
        raise UserError(f"--quantization: {quantization!r} is not one of {', '.join(export_format.quantizations)}")
    return export_format, quantization


def _refuse_unfinished(run) -> None:
    """A run whose eval failed, or that did not finish, is not exported: its weights are not what it reports."""
    status = run.directory.manifest().get("status")
    if status == TRAINED_EVAL_FAILED:
        raise UserError(f"{run.path}: its eval failed after training ({status}), so the run is not known to work: "
                        f"finish it with `hftoolkit eval {run.path}`, then export")
    if status not in (None, "complete"):
        status = "interrupted" if status == "running" else status  # (its lock is free: checked before)
        raise UserError(f"{run.path}: the run is {status}, not complete: resume it with `hftoolkit train --resume "
                        f"{run.path}`, then export")


def _refuse_format(recipe, export_format: ExportFormat) -> None:
    """A run the format doesn't take is refused in one line naming the formats that do take it."""
    family, task = recipe.model.family, recipe.task
    if export_format.takes(family, task):
        return
    what = f"a {family} {task} run" if family else f"a {task} run"
    others = [name for name, each in FORMATS.items() if each.takes(family, task)]
    hint = (f"export it with --format {_listed(others, 'or')}" if others else
            "use `hftoolkit merge` for a safetensors checkpoint")
    raise UserError(f"--format {export_format.name}: {export_format.holds}, and this is {what}: {hint}")


def _listed(names: list[str], last: str) -> str:
    """'a', 'a and b', 'a, b and c' (`last`: and, or)."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def eval_inputs(job, count: int) -> list:
    """The first `count` inputs of the run's eval split, as its formulation's generate takes them: a text, a
    (text, pair), a word list, or a conversation up to its last user turn."""
    from itertools import islice

    eval_rows = job.data["eval"]
    rows = list(islice(iter(eval_rows), count))
    if not rows:
        raise UserError(f"{job.recipe.name}: the run's eval split has no rows to check the export on")
    if "messages" in rows[0]:
        from hftoolkit.sources.conversations import question

        return [question(row["messages"]) for row in rows]
    if job.task == tasks.TAGGING:
        return [list(row["text"]) for row in rows]
    if "text_pair" in rows[0]:
        return [(row["text"], row["text_pair"]) for row in rows]
    key = "prompt" if "prompt" in rows[0] else "text"
    return [row[key] for row in rows]
