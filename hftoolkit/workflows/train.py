"""Train, evaluate and write the run directory: the one path every recipe takes (docs/architecture.md, "One job,
resolved once"). Only the main process writes (`writes_run`). The weights are written as soon as training ends,
before anything else can fail: a run whose eval pass fails keeps them, says "trained, eval failed", and
`hftoolkit eval` completes it.
"""

from __future__ import annotations

import gc
import shlex
import time
from pathlib import Path

from hftoolkit.base import console
from hftoolkit.base.errors import UserError
from hftoolkit.base.lifecycle import Stopped
from hftoolkit.base.memory import peak_memory_mb
from hftoolkit.base.run_layout import ADAPTER, CARD, CHECKPOINTS, HISTORY, LOG, METRICS, MODEL, PREDICTIONS
from hftoolkit.config.recipe import Recipe, RecipeError, recipe_to_yaml
from hftoolkit.evaluation.evaluate import evaluate
from hftoolkit.job.resolve import resolve_job
from hftoolkit.job.spec import Job
from hftoolkit.models import loading
from hftoolkit.models.families import formulation
from hftoolkit.models.load_report import explain_in_captures
from hftoolkit.models.tokenized import tokenizing
from hftoolkit.planning.plan import planned_job
from hftoolkit.runs.card import model_card
from hftoolkit.runs.record import metrics_record
from hftoolkit.runs.rundir import TRAINED_EVAL_FAILED, RunDirectory, follow_umask
from hftoolkit.sources.data import fingerprint
from hftoolkit.sources.streaming import is_stream
from hftoolkit.training.checkpoints import CHECKPOINT
from hftoolkit.training.strategies import Strategy, strategy_for
from hftoolkit.training.strategies.launch import current_launch
from hftoolkit.training.throughput import TokenCounter, efficiency
from hftoolkit.workflows.rewards import scoring


def train(recipe: Recipe, run_dir: Path, command: list[str], overwrite: bool = False, resume: bool = False,
          verbosity: console.Verbosity | None = None, strategy: Strategy | None = None,
          memory_check: bool = True, recipe_file: str | None = None) -> dict:
    """Run one recipe end to end; returns metrics.json's content.

    What the libraries say goes to the run directory's train.log (and to the console only when verbosity is
    VERBOSE); the console shows the toolkit's phases and one progress bar (console.py, progress.py).

    resume continues the run in `run_dir` from its newest complete checkpoint (checkpoints.py). `strategy` is how
    the run is spread, built once by the CLI (when not given: from the launcher's environment, read back). A run
    planned over this machine's memory is refused before anything loads, unless `memory_check` is False
    (planning/plan.py). `recipe_file` says in manifest.json which file the recipe was read from (config/shipped.py).
    Bad input found before training starts (preflight: every problem at once) removes the run directory
    this call created; a run that fails once training has started keeps its log and says "failed" in
    manifest.json, or "trained, eval failed" once its weights are saved.
    """
    gc.disable()  # until the model is loaded: see _startup_done
    explain_in_captures()
    try:
        with console.capture(verbosity=verbosity) as log:
            strategy = strategy or strategy_for(current_launch())
            return _train(recipe, run_dir, command, overwrite, resume, log, strategy, memory_check, recipe_file)
    finally:
        gc.unfreeze()  # what the run left behind is collectable again (a caller may go on: tests, notebooks)
        gc.enable()


def _startup_done() -> None:
    """The objects of the startup set aside from garbage collection while training, none collected.

    Importing torch, transformers and peft and loading the model leave hundreds of thousands of
    long-lived objects, which every full collection would walk again (benchmarks/classification.py
    shows the cost); frozen, no collection walks them until the run ends.
    """
    gc.freeze()
    gc.enable()


def _train(recipe: Recipe, run_dir: Path, command: list[str], overwrite: bool, resume: bool, log,
           strategy: Strategy, memory_check: bool, recipe_file: str | None) -> dict:
    from hftoolkit.training.multi_machine import check_run_directory, lost_peer

    state = strategy.process_state()
    writer = writes_run(recipe, state)
    run = RunDirectory(run_dir)
    started = time.perf_counter()
    existed = run.path.exists()  # another run's, until claimed: never removed on error
    progress = Progress()
    try:
        with state.main_process_first():  # resolved on the main process first; the others read its caches
            job = planned_job(_resolve(recipe, run.refusal(overwrite, resume) if writer else None, strategy),
                              check=memory_check)
        if writer:
            run.path.mkdir(parents=True, exist_ok=True)
        state.wait_for_everyone()
        check_run_directory(run.path, recipe.training.save_on_each_node, strategy.launch)  # (shared, or one each)
        if writer:
            _say_interrupted(run, run.claim(overwrite=overwrite, resume=resume, command=shlex.join(command)))
        state.wait_for_everyone()
        existed = bool(run.contents())  # kept by --resume: never removed on error
        for line in job.findings.notes:
            console.note(f"preflight: {line}")
        for line in job.findings.warnings:
            console.warn(line)
        _check_benchmarks(job)
        console.phase(console.data_line({split: None if is_stream(ds) else len(ds) for split, ds in job.data.items()}))
        resume_from = _open_run(job, run, writer, command, resume, log, progress, recipe_file)
        return _run(job, run, state, writer, resume_from, started, progress)
    except Stopped as stop:
        _stopped(stop, run, writer, existed, progress, command)
        raise
    except BaseException as err:
        lost = lost_peer(err, strategy.launch)  # another process ended: said in a line, not a gloo traceback
        _fail(lost or err, run, writer, existed, progress)
        if lost is not None:
            raise lost from None
        raise
    finally:
        run.release()


def check_run_folder(run_dir: Path, overwrite: bool, resume: bool, sharding: str | None) -> None:
    """What the run folder alone can refuse (a live run writes there, a non-empty folder, a --resume of a run that
    is complete, not a run, or sharded otherwise than `sharding`: FSDP, DEEPSPEED or None), checked before any
    training process is started, so that a refusal is one line."""
    from hftoolkit.training.checkpoints import resume_refusal

    run = RunDirectory(run_dir)
    refusal = run.refusal(overwrite, resume) or (resume_refusal(run, sharding) if resume else None)
    if refusal:
        raise UserError(refusal)


def _say_interrupted(run: RunDirectory, previous: dict | None) -> None:
    """A note when the run's last writer ended without releasing its lock (killed, its machine lost)."""
    if previous:
        console.note(f"{run.path} was interrupted: its writer (pid {previous.get('pid')} on {previous.get('host')}, "
                     f"since {previous.get('started')}) ended without finishing")


def _stopped(stop: Stopped, run: RunDirectory, writer: bool, existed: bool, progress: Progress,
             command: list[str]) -> None:
    """A stop signal: the run says where it stopped (manifest.json "stopped", with the step), and the main process
    prints one line with the last checkpoint and the command that continues it."""
    from hftoolkit.base.ranks import is_main_process
    from hftoolkit.training.checkpoints import latest_checkpoint

    step = progress.trainer.state.global_step if progress.trainer is not None else 0
    checkpoint = latest_checkpoint(run / CHECKPOINTS)
    said = f"stopped by {stop.name} at step {step}"
    if progress.trained:
        then = f"its weights are saved: `hftoolkit eval {run.path}` evaluates them and completes the run"
    elif checkpoint is not None:
        then = f"the last checkpoint is {checkpoint.name}: continue with `{resume_command(run.path, command)}`"
    else:
        then = "no checkpoint was written yet: the run starts from step 0 again"
    if writer and progress.written:
        if progress.trainer is not None:
            run.write_jsonl(HISTORY, progress.trainer.state.log_history)
        run.finish(TRAINED_EVAL_FAILED if progress.trained else "stopped", error=said)
        run.update_manifest(stopped_at_step=step)
    elif writer and not existed:
        run.discard()  # nothing written yet: leave no run directory behind
    if is_main_process():
        console.error(f"{said}; {then}")
    stop.said = True


def resume_command(run_dir: Path, command: list[str]) -> str:
    """`hftoolkit train --resume RUN_DIR` with the launch options of `command` (how it was spread)."""
    from hftoolkit.training.relaunch import launch_options

    return shlex.join(["hftoolkit", "train", "--resume", str(run_dir), *launch_options(command)])


def _resolve(recipe: Recipe, refusal: str | None, strategy: Strategy) -> Job:
    """The job, or every problem at once: the run folder's refusal (a folder in use) among the recipe's and
    the data's, not before them, so one run tells all that is wrong."""
    try:
        job = resolve_job(recipe, strategy=strategy)
    except UserError as err:
        if refusal is None:
            raise
        raise RecipeError([refusal, *(getattr(err, "problems", None) or [err.message])]) from None
    if refusal is not None:
        raise UserError(refusal)
    return job


class Progress:
    """How far a run got, for what a failure leaves behind."""

    written = trained = False
    trainer = None


def writes_run(recipe: Recipe, state) -> bool:
    """Whether this process writes the run directory: the main process, or with training.save_on_each_node the
    first process of each machine, as the Trainer's `should_save` decides for checkpoints."""
    return state.is_local_main_process if recipe.training.save_on_each_node else state.is_main_process


def _open_run(job: Job, run: RunDirectory, writer: bool, command: list[str], resume: bool, log, progress: Progress,
              recipe_file: str | None):
    """Accept the run: recipe.yaml and manifest.json written (`writer`); the checkpoint --resume continues."""
    from hftoolkit.training import checkpoints

    recorded = recipe_to_yaml(job.recorded_recipe())
    resume_from = checkpoints.resume_point(run, recorded, job.strategy.sharding) if resume else None
    if writer:
        if resume:
            checkpoints.clear_results(run)
        log.attach(run / LOG, writer=True)  # the run is accepted: its log starts with what was said so far
        run.start(recorded, command, job.recipe.training.seed)
        progress.written = True
        run.update_manifest(recipe_file=recipe_file, resumed_from=str(resume_from) if resume_from else None,
                            data_fingerprint=fingerprint(job.data), preflight=job.findings.record,
                            resolved=resolved_record(job), plan=job.plan.record())
    return resume_from


def _run(job: Job, run: RunDirectory, state, writer: bool, resume_from, started: float, progress: Progress) -> dict:
    """Load, train, save the weights, evaluate, and write the results."""
    from hftoolkit.patches.transformers_5 import save_on_each_machine
    from hftoolkit.training.arguments import run_record
    from hftoolkit.training.trainer import build_trainer

    recipe, form, strategy = job.recipe, formulation(job), job.strategy
    set_seed(recipe.training.seed)
    with strategy.loading(state):  # (the main process first, unless every process takes part in the load)
        model, processor = form.load_model(job)
    if recipe.training.save_on_each_node:
        save_on_each_machine(model)
    console.phase(console.model_line(recipe.model.checkpoint, *loading.count_parameters(model),
                                     recipe.model.quantization, recipe.lora.r if recipe.lora.enabled else None))
    with state.main_process_first(), tokenizing(job) as tokenization:  # (the main process fills the cache)
        encoded = {split: form.preprocess(job, processor, ds) for split, ds in job.data.items()}
    counter = TokenCounter(form.collator(job, processor))
    scorer, rewards = scoring(job, form, processor)
    trainer = progress.trainer = build_trainer(job, run, model, processor, encoded, counter, scorer, data=job.data,
                                               rewards=rewards)
    ran = strategy.record(trainer, job.precision)  # (a collective call: every process)
    if writer:
        run.update_manifest(distributed=ran, batch_order=trainer.batch_order_record())
    _startup_done()
    setup_seconds = time.perf_counter() - started
    first_step = 0 if resume_from is None else int(CHECKPOINT.match(Path(resume_from).name).group(1))
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    train_seconds = time.perf_counter() - started - setup_seconds
    train_counts = counter.snapshot()  # before eval batches pass through the same collator
    steps = trainer.state.global_step - first_step
    calibration = job.plan.measured(train_seconds / steps if steps > 0 else None)  # (a collective call)
    if writer:
        run.update_manifest(plan=calibration)
    optimizer_shards = strategy.record_after_training(trainer)  # (a collective call: every process)
    if optimizer_shards and writer:
        run.update_manifest(distributed={**ran, **optimizer_shards})
    save_weights(job, trainer, processor, run)  # every process: sharded weights are gathered first
    progress.trained = True
    metrics = summarize(job, trainer.model, scorer, train_counts, train_seconds, processes=state.num_processes)
    metrics.update(setup_seconds=round(setup_seconds, 3), tokenize_seconds=round(tokenization.seconds, 3),
                   data_seconds=round(job.data_seconds + tokenization.seconds, 3))
    metrics.update(run_record(job, trainer))  # precision used; with eval.keep_best, the best step
    if writer:  # what training measured, kept should the eval pass fail (`hftoolkit eval` adds it)
        run.write_jsonl(HISTORY, trainer.state.log_history)
        run.write_json(METRICS, {k: v for k, v in metrics.items() if k not in ("eval", "eval_seconds")})
    trainer.model.eval()
    evaluation, predictions, eval_seconds = evaluate(job, form, trainer, processor, job.data, encoded, scorer)
    metrics.update(eval=evaluation, eval_seconds=round(eval_seconds, 3))
    if writer:
        run.write_jsonl(HISTORY, trainer.state.log_history)
        run.write_jsonl(PREDICTIONS, predictions)
        run.write_json(METRICS, metrics)
        run.write_text(CARD, model_card(job.recorded_recipe(), metrics, model_type=job.model.model_type))
        if state.is_main_process:  # (once: lm-evaluation-harness on one process)
            _run_benchmarks(job, trainer.model, processor, run)
        metrics = run.metrics()
        run.finish("complete")
    return metrics


def _check_benchmarks(job: Job) -> None:
    """eval.benchmarks checked before training (the harness installed, the model able, the names known)."""
    from hftoolkit.workflows.benchmark import options_from_recipe, prepare

    options = options_from_recipe(job.recipe)
    if options is not None:
        prepare(job.family, job.task, options, "eval.benchmarks")


def _run_benchmarks(job: Job, model, processor, run: RunDirectory) -> None:
    """eval.benchmarks on the trained model, on the main process, after the weights and the eval are written: a
    failure (or a kill) here leaves the run "trained, eval failed", and `eval RUN --benchmark` completes it."""
    from hftoolkit.workflows.benchmark import benchmark_loaded, options_from_recipe, prepare

    options = options_from_recipe(job.recipe)
    if options is not None:
        manager = prepare(job.family, job.task, options, "eval.benchmarks")
        benchmark_loaded(job, model, processor, options, manager, run)


def _fail(err: BaseException, run: RunDirectory, writer: bool, existed: bool, progress: Progress) -> None:
    """What a failed run leaves: nothing for bad input found before training, else its log and status."""
    if not writer:
        return
    if isinstance(err, UserError) and not existed and progress.trainer is None:
        run.discard()  # bad input, found before training: leave nothing
    elif progress.written:  # (a refused --resume has written nothing)
        if progress.trainer is not None:  # a failed run keeps its log
            run.write_jsonl(HISTORY, progress.trainer.state.log_history)
        message = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        run.finish(TRAINED_EVAL_FAILED if progress.trained else "failed", error=message or type(err).__name__)
        if progress.trained:
            console.error(f"the run trained, then failed: its weights are saved in {run.weights_dir()}; once the "
                          f"problem below is fixed, `hftoolkit eval {run.path}` evaluates them and completes the run"
                          + (" (add --benchmark TASKS for eval.benchmarks)" if run.metrics().get("eval") else ""))
    elif run.path.is_dir() and not any(p.name != LOG for p in run.contents()):
        run.discard()  # nothing but the log was written: leave no run directory behind


def resolved_record(job: Job) -> dict:
    """What the run resolved, for manifest.json: where the checkpoint was read from (and, for `installed:<name>`,
    the package that holds it; recipe.yaml keeps the name as the user wrote it), its type and family, the precision
    and the CPU features `auto` read."""
    from hftoolkit.job.hardware import cpu_record
    from hftoolkit.sources.installed import record as installed_record

    installed = installed_record(job.model.checkpoint)
    return {"checkpoint_path": job.model.path, **({"installed": installed} if installed else {}),
            "model_type": job.model.model_type, "family": job.family, "precision": job.precision,
            "cpu": cpu_record(), "label_names": list(job.label_names) if job.label_names is not None else None}


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (on every device), as transformers.set_seed does; accelerate's copy, because
    importing transformers' imports peft, before bitsandbytes_hidden (patches/peft_0_21.py) can act."""
    from accelerate.utils import set_seed as seed_everything

    seed_everything(seed)


def summarize(job: Job, model, scorer, counts, train_seconds, processes: int = 1) -> dict:
    """metrics.json's training figures; `counts` are this process's token counts (see throughput.efficiency)."""
    trainable, total = loading.count_parameters(model)
    return metrics_record(
        job, scorer, train_seconds=round(train_seconds, 3),
        samples_per_second=round(processes * counts["samples"] / train_seconds, 3),
        **efficiency(model, counts, train_seconds, lora=job.recipe.lora.enabled, processes=processes,
                     precision=job.precision),
        peak_memory_mb=peak_memory_mb(), trainable_params=trainable, total_params=total)


def save_weights(job: Job, trainer, processor, run: RunDirectory) -> None:
    """The adapter (LoRA) or the whole model (full fine-tuning), as safetensors, with the processor.

    Called on every process: where each holds only shards of the weights, the strategy gathers them first.
    """
    target = run / (ADAPTER if job.recipe.lora.enabled else MODEL)
    job.strategy.save(trainer, target)
    if trainer.args.should_save:
        processor.save_pretrained(target)
        follow_umask(target)
