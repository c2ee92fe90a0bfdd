"""`export`: a finished run written for the runtimes people deploy on, and checked before it is called done.

    hftoolkit export RUN_DIR --format gguf|ollama|onnx --output DIR [--quantization f16]

- gguf: one .gguf file (llama.cpp, LM Studio), weights as f32, f16, bf16 or q8_0, with the tokenizer and the run's
  chat template in its metadata;
- ollama: the GGUF file and a Modelfile (stop tokens, generation settings, system prompt);
- onnx: model.onnx and the tokenizer files for ONNX Runtime, for encoder runs (classification, regression,
  tagging); `predict` runs the folder.

A LoRA run is merged first, in memory. The written file is then read back (GGUF through transformers' GGUF
loader, ONNX through onnxruntime) and run on a few of the run's eval inputs beside the run's own model; the
difference is printed in one line, and an export beyond its format's tolerance fails. The folder appears whole
or not at all (it is written aside and moved into place), and export.json in it, like the run's manifest.json,
records what was exported, from which run, with which settings, and the measured difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hftoolkit.base import console, extras
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import EXPORT, RECIPE
from hftoolkit.config import tasks
from hftoolkit.runs.rundir import TRAINED_EVAL_FAILED, RunDirectory, open_run, staged_folder, write_text_atomic

FORMATS = ("gguf", "ollama", "onnx")
CHECKED_INPUTS = 4  # eval inputs each export is run on beside the run's model
# An export whose outputs differ from those of the run's model with its weights rounded as the file stores them
# by more than this share of the largest logit is wrong (a tensor misplaced, a setting lost), not rounded.
GGUF_TOLERANCE = 1e-3
ONNX_TOLERANCE = 1e-4  # probabilities (regression: the value), ONNX Runtime against torch, both float32


@dataclass
class Exported:
    folder: Path  # what the folder holds is read from it (the command's summary lists every file)
    record: dict  # export.json's content
    line: str  # the check, in one line


def export_run(run_dir: Path, out: Path, fmt: str, quantization: str | None = None,
               command: str | None = None) -> Exported:
    """Write the run at `run_dir` as `fmt` into the new folder `out`, check it, and record it in both places."""
    fmt, quantization = _options(fmt, quantization)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output: {out} {'is a file' if not out.is_dir() else 'is not empty'}: choose a new folder")
    held = RunDirectory(run_dir).in_use("export")  # (before open_run: a run still training has no weights yet)
    if held:
        raise UserError(held)
    run = open_run(run_dir, merged=True)
    _refuse_unfinished(run)
    _refuse_format(run.recipe, fmt)
    if fmt in ("gguf", "ollama"):  # (after the run's own refusals: a run GGUF can't hold needs no library for it)
        extras.requires("gguf", f"export --format {fmt}")
    directory = RunDirectory(run.path)
    with directory.held("export", command or f"hftoolkit export {run.path}"):
        started = time.perf_counter()
        from hftoolkit.workflows.merge import merged_model

        job, form, model, processor = merged_model(run, data=True)
        inputs = eval_inputs(job, CHECKED_INPUTS)
        with staged_folder(out) as folder:
            if fmt == "onnx":
                written, check = _onnx(job, form, model, processor, folder, inputs)
            else:
                written, check = _gguf(job, form, model, processor, folder, inputs, quantization, fmt == "ollama")
            if not check["passed"]:
                raise UserError(f"export: {check['line']}: beyond the format's tolerance, so nothing was kept; "
                                "please report it with the run's recipe.yaml")
            (folder / RECIPE).write_bytes((run.path / RECIPE).read_bytes())  # predict reads the task and columns
            shown = {k: v for k, v in check.items() if k not in ("passed", "facts")}
            record = {"format": fmt, "quantization": quantization, "files": written, "run": str(run.path.resolve()),
                      "task": job.task, "family": job.family, "checkpoint": job.recipe.model.checkpoint,
                      "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "seconds": round(time.perf_counter() - started, 2), "check": shown,
                      **({"onnx": check["facts"]} if fmt == "onnx" else {})}
            RunDirectory(folder).write_json(EXPORT, record)
        if not run.merged:  # (a folder `merge` wrote has no manifest to record it in)
            path = str(out.resolve())
            kept = [e for e in directory.manifest().get("exports", []) if e.get("path") != path]
            directory.update_manifest(exports=[*kept, {"format": fmt, "quantization": quantization, "path": path,
                                                       "exported": record["exported"], "check": shown}])
    return Exported(out, record, check["line"])


def _options(fmt: str, quantization: str | None) -> tuple[str, str | None]:
    if fmt not in FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}: gguf and ollama for decoder "
                        "runs, onnx for encoder runs")
    if fmt == "onnx":
        if quantization not in (None, "f32"):
            raise UserError(f"--quantization: {quantization} applies to gguf and ollama; an ONNX export keeps the "
                            "run's float32 weights: drop --quantization")
        return fmt, None
    from hftoolkit.exports.gguf import QUANTIZATIONS

    quantization = quantization or "f16"
    if quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization: {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    return fmt, quantization


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


def _refuse_format(recipe, fmt: str) -> None:
    """GGUF holds language models of the decoder family; ONNX here, encoder runs that label or score text."""
    family, task = recipe.model.family, recipe.task
    what = f"a {family} {task} run" if family else f"a {task} run"
    language_model = family == "decoder" and tasks.head(task, family) == tasks.CAUSAL_LM
    labels_text = family == "encoder" and task in _onnx_tasks()
    if fmt in ("gguf", "ollama") and not language_model:
        hint = "export it with --format onnx" if labels_text else "use `hftoolkit merge` for a safetensors checkpoint"
        raise UserError(f"--format {fmt}: GGUF holds a decoder language model (llama.cpp and Ollama run those), "
                        f"and this is {what}: {hint}")
    if fmt == "onnx" and not labels_text:
        hint = ("export it with --format gguf or ollama" if language_model else
                "use `hftoolkit merge` for a safetensors checkpoint")
        raise UserError(f"--format onnx: exports encoder runs of the tasks {', '.join(_onnx_tasks())}, and this is "
                        f"{what}: {hint}")


def _onnx_tasks() -> tuple[str, ...]:
    from hftoolkit.exports.onnx import TASKS

    return TASKS


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


# ---------------------------------------------------------------- GGUF and Ollama


def _gguf(job, form, model, tokenizer, folder: Path, inputs: list, quantization: str, ollama: bool):
    import dataclasses

    import torch

    from hftoolkit.config.recipe import replaced
    from hftoolkit.exports import gguf

    held = gguf.refusal(model.config.model_type)
    if held:
        raise UserError(f"--format {'ollama' if ollama else 'gguf'}: {held}")
    name = f"{_slug(job.recipe.name)}-{quantization}.gguf"
    console.phase(f"writing {name}")
    gguf.write_gguf(model, tokenizer, folder / name, quantization, chat_template=getattr(tokenizer, "chat_template",
                                                                                         None), name=job.recipe.name)
    written = [name]
    if ollama:
        from hftoolkit.exports.ollama import MODELFILE, modelfile
        from hftoolkit.models.families.decoder import CHAT_PROMPT_AND_TARGET

        # Where an answer ends when the model chats (its template's end of turn, and eos), whatever the task was
        stops = [tokenizer.decode([i]) for i in CHAT_PROMPT_AND_TARGET.stops(tokenizer) if i is not None]
        text = modelfile(name, tokenizer, stops, job.recipe.eval.generation.model_dump(), system_prompt(job))
        write_text_atomic(folder / MODELFILE, text)  # (secrets masked, as in every file: a system prompt may hold one)
        written.append(MODELFILE)
    console.phase(f"checking {name}: read back with transformers' GGUF loader, run beside the run's model")
    greedy = dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.generation.strategy": "greedy"}, "export"))
    ids = _prompt_ids(greedy, form, tokenizer, inputs)
    ours = _logits(model, ids)
    answers = form.generate(greedy, model, tokenizer, inputs)
    back, back_tokenizer = gguf.read_back(folder / name)
    theirs = _logits(back, ids)
    back_answers = form.generate(greedy, back, back_tokenizer, inputs)
    same_ids = ids == _prompt_ids(greedy, form, back_tokenizer, inputs)
    del back
    with torch.no_grad():  # the run's model with its weights rounded as the file stores them
        gguf.round_like_file(model, quantization)
    rounded = _logits(model, ids)
    scale = max(float(max(t.abs().max() for t in ours)), 1.0)
    vs_run = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
    vs_rounding = max(float((a - b).abs().max()) for a, b in zip(rounded, theirs))
    rounding = max(float((a - b).abs().max()) for a, b in zip(ours, rounded))
    equal = sum(a == b for a, b in zip(answers, back_answers))
    passed = same_ids and vs_rounding <= GGUF_TOLERANCE * scale
    line = (f"checked {name} on {len(inputs)} eval inputs: largest logit difference from the run {vs_run:.3g} "
            f"({quantization} rounding of the weights alone: {rounding:.3g}); greedy answers identical "
            f"{equal}/{len(inputs)}; tokenizer {'identical' if same_ids else 'DIFFERS'}")
    return written, {"line": line, "passed": passed, "inputs": len(inputs), "max_logit_difference": vs_run,
                     "rounding_difference": rounding, "difference_beyond_rounding": vs_rounding,
                     "greedy_identical": equal, "tokenizer_identical": same_ids}


def _prompt_ids(job, form, tokenizer, inputs: list) -> list[list[int]]:
    """The token ids generation starts from: the formulation's prompts where it has them, else the text's."""
    if hasattr(form, "prompts") and all(isinstance(x, str) for x in inputs):
        return form.prompts(job, tokenizer, inputs)
    if any(isinstance(x, list) for x in inputs):
        from hftoolkit.sources.conversations import prompt

        return [prompt(tokenizer, x) for x in inputs]
    return tokenizer(list(inputs))["input_ids"]


def _logits(model, ids: list[list[int]]):
    import torch

    model.eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([row], device=model.device)).logits[0].float().cpu() for row in ids]


def system_prompt(job) -> str | None:
    """The system turn every training conversation opens with, where they all share one; else None."""
    from itertools import islice

    rows = job.data.get("train") if hasattr(job.data, "get") else None
    if rows is None:
        return None
    seen = set()
    for row in islice(iter(rows), 1000):
        turns = row.get("messages") if isinstance(row, dict) else None
        if not turns or turns[0].get("role") != "system":
            return None
        seen.add(turns[0].get("content"))
        if len(seen) > 1:
            return None
    return next(iter(seen), None)


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


# ---------------------------------------------------------------- ONNX


def _onnx(job, form, model, tokenizer, folder: Path, inputs: list):
    import numpy as np

    from hftoolkit.exports.onnx import OnnxPredictor, write_onnx

    console.phase("writing model.onnx")
    facts = write_onnx(model, tokenizer, folder, job.task, job.max_length, bool(job.recipe.data.text_pair_column))
    console.phase("checking model.onnx: run in ONNX Runtime beside the run's model")
    runtime = OnnxPredictor(folder, facts)
    ours = form.generate(job, model, tokenizer, inputs)
    theirs = runtime.predict(inputs)
    torch_logits = np.concatenate([t.numpy() for t in _head_logits(job, model, tokenizer, inputs)]) \
        if job.task != tasks.TAGGING else None
    if job.task == tasks.TAGGING:
        equal = sum(a == b for a, b in zip(ours, theirs))
        difference = None
        passed = equal == len(inputs)
        what = f"tags identical {equal}/{len(inputs)}"
    else:
        onnx_logits = runtime.logits(inputs)
        if job.task == tasks.REGRESSION:
            difference = float(np.abs(onnx_logits - torch_logits).max())
            what, equal = f"largest value difference from the run {difference:.3g}", None
        else:
            difference = float(np.abs(_softmax(onnx_logits) - _softmax(torch_logits)).max())
            equal = sum(a["label"] == b["label"] for a, b in zip(ours, theirs))
            what = f"labels identical {equal}/{len(inputs)}; largest probability difference {difference:.3g}"
        passed = difference <= ONNX_TOLERANCE and (equal is None or equal == len(inputs))
    line = f"checked model.onnx with ONNX Runtime on {len(inputs)} eval inputs: {what}"
    written = sorted(p.name for p in folder.iterdir())
    return written, {"line": line, "passed": passed, "inputs": len(inputs), "max_difference": difference,
                     "identical": equal, "facts": facts}


def _head_logits(job, model, tokenizer, inputs):
    from hftoolkit.models.families.labels import head_logits

    return head_logits(job, model, tokenizer, inputs)


def _softmax(x):
    import numpy as np

    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
