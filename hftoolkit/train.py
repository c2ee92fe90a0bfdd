"""Train, evaluate and write the run directory: the one path every recipe takes.

recipe -> data.load_data -> family.load_model / preprocess / collator -> HF Trainer
-> evaluate (loss, metrics, predictions) -> run directory. Only the main process writes.
"""

from __future__ import annotations

import gc
import math
import resource
import shutil
import time
from pathlib import Path

from hftoolkit import modeling
from hftoolkit.batching import shortest_first
from hftoolkit.data import LABELLED_TASKS, fingerprint, load_data
from hftoolkit.errors import UserError
from hftoolkit.families import family_module, label_records
from hftoolkit.launch import generate_everywhere
from hftoolkit.recipe import Recipe, load_recipe, recipe_to_yaml
from hftoolkit.rundir import RunDirectory
from hftoolkit.throughput import TokenCounter, efficiency

# Tasks scored by generated text rather than by the Trainer's logits.
GENERATION_TASKS = {"translation", "summarization"}
# Tasks whose main metric is perplexity, exp(eval loss).
PERPLEXITY_TASKS = {"mlm", "clm", "denoise"}
# What a prediction record shows as the input and the reference, by canonical column.
INPUT_COLUMN = {"image-classification": "image"}
# Tasks whose eval texts are whole documents: predictions continue the first fraction of each.
PROMPT_FRACTION = {"clm": 0.25}


def train(recipe: Recipe, run_dir: Path, command: list[str], overwrite: bool = False, resume: bool = False) -> dict:
    """Run one recipe end to end; returns metrics.json's content.

    resume continues the run in `run_dir` from its newest complete checkpoint (checkpoints.py).
    Bad input found before training starts removes the run directory this call created; a run
    that fails once training has started keeps its log and says "failed" in manifest.json.
    """
    gc.disable()  # until the model is loaded: see _startup_done
    try:
        return _train(recipe, run_dir, command, overwrite, resume)
    finally:
        gc.unfreeze()  # what the run left behind is collectable again (a caller may go on: tests, notebooks)
        gc.enable()


def _startup_done() -> None:
    """The objects of the startup set aside from garbage collection while training, none collected.

    Importing torch, transformers and peft and loading the model leave about 500k long-lived objects.
    With the collector on, CPython walked them in 8 full collections, 1.1 s of a 32 s SST-2
    fine-tune (benchmarks/classification.py); frozen, no collection walks them until the run ends.
    """
    gc.freeze()
    gc.enable()


def _train(recipe: Recipe, run_dir: Path, command: list[str], overwrite: bool, resume: bool) -> dict:
    import torch
    from accelerate import PartialState

    from hftoolkit import checkpoints

    # cpu=True on a machine without CUDA: processes that torchrun started without ACCELERATE_USE_CPU=true
    # would otherwise each run alone as rank 0, and all write the run directory.
    state = PartialState(cpu=not torch.cuda.is_available())
    run = RunDirectory(run_dir)
    if state.is_main_process:
        run.claim(overwrite=overwrite, resume=resume)
    state.wait_for_everyone()
    started = time.perf_counter()
    existed = run.path.is_dir() and any(run.path.iterdir())  # kept by --resume: never removed on error
    written, trainer, resume_from = False, None, None
    try:
        family = family_module(resolve_family(recipe))
        with state.main_process_first():  # tokenize once, on the main process; the others read its cache
            data = load_data(recipe)
        if resume:
            resume_from = checkpoints.resume_point(run, recipe_to_yaml(recipe))
        if state.is_main_process:
            if resume:
                checkpoints.clear_results(run)
            run.start(recipe_to_yaml(recipe), command, recipe.training.seed)
            written = True
            run.update_manifest(resumed_from=str(resume_from) if resume_from else None,
                                data_fingerprint=fingerprint(data))
        set_seed(recipe.training.seed)
        with state.main_process_first():  # an init: checkpoint or a hub download is made once, by the main process
            model, processor = family.load_model(recipe)
        with state.main_process_first():
            encoded = {split: family.preprocess(recipe, processor, ds) for split, ds in data.items()}
        counter = TokenCounter(family.collator(recipe, processor))
        scorer = family.metrics(recipe, processor)
        trainer = build_trainer(recipe, run, model, processor, encoded, counter, scorer)
        _startup_done()
        setup_seconds = time.perf_counter() - started
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        train_seconds = time.perf_counter() - started - setup_seconds
        train_counts = counter.snapshot()  # before eval batches pass through the same collator
        trainer.model.eval()
        evaluation, predictions, eval_seconds = evaluate(recipe, family, trainer, processor, data, encoded, scorer)
        metrics = summarize(recipe, trainer.model, scorer, evaluation, train_counts, train_seconds, eval_seconds,
                            processes=state.num_processes)
        metrics["setup_seconds"] = round(setup_seconds, 3)
        save_weights(recipe, trainer, processor, run)  # every process: sharded weights are gathered first
        if state.is_main_process:
            run.write_jsonl("log_history.jsonl", trainer.state.log_history)
            run.write_jsonl("predictions.jsonl", predictions)
            run.write_json("metrics.json", metrics)
            run.write_text("README.md", model_card(recipe, metrics))
            run.finish("complete")
        return metrics
    except BaseException as err:
        if state.is_main_process and isinstance(err, UserError) and not existed and trainer is None:
            shutil.rmtree(run.path, ignore_errors=True)  # bad input, found before training: leave nothing
        elif state.is_main_process and written:  # (a refused --resume has written nothing)
            if trainer is not None:  # a failed run keeps its log
                run.write_jsonl("log_history.jsonl", trainer.state.log_history)
            message = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
            run.finish("failed", error=message or type(err).__name__)
        elif state.is_main_process and run.path.is_dir() and not any(run.path.iterdir()):
            run.path.rmdir()  # nothing was written: leave no empty run directory behind
        raise


def resolve_family(recipe: Recipe) -> str:
    """The recipe's family; for a hub id, read from its config (the recipe validator could not)."""
    if recipe.family:
        return recipe.family
    from transformers import AutoConfig

    from hftoolkit.recipe import MODEL_TYPE_FAMILIES, validate_recipe

    try:
        config = AutoConfig.from_pretrained(modeling.resolve_checkpoint(recipe), revision=recipe.model.revision,
                                            trust_remote_code=recipe.model.trust_remote_code)
    except (OSError, ValueError) as err:  # config.json unreadable, or a model type transformers does not know
        raise UserError(f"model.checkpoint: could not read the config of {recipe.model.checkpoint} "
                        f"({str(err).splitlines()[0][:200]}): check that it is a complete checkpoint") from None
    family = MODEL_TYPE_FAMILIES.get(config.model_type)
    if family is None:
        raise UserError(f"model.checkpoint: model type {config.model_type!r} is not in hftoolkit's family table; "
                        "set model.family to encoder, decoder, seq2seq or vision")
    raw = recipe.model_dump()
    raw["model"]["family"] = family
    validate_recipe(raw, "model.checkpoint")  # the task/family check, now that the family is known
    recipe.model.family = family
    return family


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (on every device), as transformers.set_seed does; accelerate's
    copy, because importing transformers' imports peft, before modeling.bitsandbytes_hidden can act."""
    from accelerate.utils import set_seed as seed_everything

    seed_everything(seed)


def build_trainer(recipe: Recipe, run: RunDirectory, model, processor, encoded, counter, scorer):
    import torch
    from accelerate import PartialState
    from transformers import Trainer, TrainingArguments

    from hftoolkit.launch import per_process_batch

    t = recipe.training
    args = TrainingArguments(
        output_dir=str(run / "checkpoints"),
        num_train_epochs=t.epochs, max_steps=t.max_steps or -1,
        # training.batch_size is the step's batch over all processes; eval.batch_size is per process.
        per_device_train_batch_size=per_process_batch(t.batch_size, PartialState().num_processes),
        per_device_eval_batch_size=recipe.eval.batch_size,
        gradient_accumulation_steps=t.gradient_accumulation, learning_rate=t.learning_rate,
        lr_scheduler_type=t.scheduler, warmup_steps=t.warmup_ratio, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, label_smoothing_factor=t.label_smoothing, seed=t.seed,
        bf16=t.precision == "bf16", fp16=t.precision == "fp16", use_cpu=not torch.cuda.is_available(),
        logging_steps=t.logging_steps, logging_first_step=True, report_to=list(t.report_to) or "none",
        save_strategy="steps" if t.save_steps else "no", save_steps=t.save_steps or 500,
        save_total_limit=t.keep_last, save_only_model=False, eval_strategy="no",
        # Without a "length" column (images: all one size) the sampler would decode every example to measure it.
        train_sampling_strategy="random" if t.sampling == "group_by_length"
        and "length" not in encoded["train"].column_names else t.sampling,
        remove_unused_columns=False,  # our collator drops "length"; the sampler needs it first
        dataloader_num_workers=0, disable_tqdm=False, logging_nan_inf_filter=False,
    )
    trainer = toolkit_trainer(Trainer)(
        model=model, args=args, train_dataset=encoded["train"], eval_dataset=encoded["eval"],
        data_collator=counter, processing_class=processor,
        compute_metrics=scorer.compute if recipe.task not in GENERATION_TASKS else None,
        preprocess_logits_for_metrics=scorer.reduce_logits)
    trainer.nonfinite_policy, trainer.max_nonfinite_skips = t.on_nonfinite, t.max_nonfinite_skips
    if hasattr(counter.collate, "epoch"):  # a collator whose randomness depends on the epoch (MLM masking)
        trainer.add_callback(epoch_to_collator(counter.collate))
    return trainer


def epoch_to_collator(collate):
    """A callback that sets `collate.epoch` to the epoch about to begin, and back to 0 for the eval after
    training. A resumed run's Trainer state holds the fractional epoch it stopped in: its floor is that epoch
    (give or take float rounding of the step fractions, hence the 1e-6)."""
    from transformers import TrainerCallback

    class EpochToCollator(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            collate.epoch = math.floor(state.epoch + 1e-6)

        def on_train_end(self, args, state, control, **kwargs):
            collate.epoch = 0

    return EpochToCollator()


def toolkit_trainer(base):
    """`base` (Trainer or Seq2SeqTrainer) with the non-finite guard, atomic checkpoints, length-bucketed
    batches and a loss scale that holds on any number of processes (launch.ItemNormalizedLoss)."""
    from hftoolkit.batching import LengthBatching
    from hftoolkit.checkpoints import AtomicCheckpoints
    from hftoolkit.guards import NonFiniteGuard
    from hftoolkit.launch import ItemNormalizedLoss

    mixins = (ItemNormalizedLoss, NonFiniteGuard, AtomicCheckpoints, LengthBatching)
    return type(f"Toolkit{base.__name__}", (*mixins, base), {})


def evaluate(recipe: Recipe, family, trainer, processor, data, encoded, scorer):
    """Eval loss and metrics on the eval split, plus up to eval.max_predictions prediction records.

    Eval batches run shortest first, so they pad little; the metrics do not depend on the order, and
    records are mapped back to the data's order. Classification records come from that same pass's
    probabilities; other tasks generate theirs (a text, tags or filled masks the loss pass does not give).
    """
    started = time.perf_counter()
    column = INPUT_COLUMN.get(recipe.task, "text")
    raw = data["eval"]
    count = len(raw) if recipe.task in GENERATION_TASKS else min(len(raw), recipe.eval.max_predictions)
    eval_set, order = shortest_first(encoded["eval"])
    outputs = None
    if recipe.task in LABELLED_TASKS:
        output = trainer.predict(eval_set, metric_key_prefix="eval")
        trainer.log(output.metrics)  # as trainer.evaluate does: the eval lands in the log history
        scored = output.metrics
        probabilities = output.predictions if order is None else output.predictions[order.argsort()]
        outputs = label_records(probabilities[:count], trainer.model.config.id2label)
    else:
        scored = trainer.evaluate(eval_set, metric_key_prefix="eval")
    results = {k.removeprefix("eval_"): v for k, v in scored.items()
               if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second", "_time"))}
    if recipe.task in PERPLEXITY_TASKS and "loss" in results:
        results["perplexity"] = math.exp(min(results["loss"], 50))
    inputs = raw[column][:count]
    if outputs is None:
        prompt = {"prompt_fraction": PROMPT_FRACTION[recipe.task]} if recipe.task in PROMPT_FRACTION else {}
        outputs = generate_everywhere(family, recipe, trainer.model, processor, inputs, **prompt)  # shared by processes
    if recipe.task in GENERATION_TASKS:
        results.update(scorer.compute([o["text"] for o in outputs], raw["target"]))
    references = _references(recipe, raw, count)
    predictions = [{"input": _show(x), **({"reference": r} if r is not None else {}), **o}
                   for x, r, o in zip(inputs, references, outputs)][:recipe.eval.max_predictions]
    return results, predictions, time.perf_counter() - started


def _references(recipe: Recipe, raw, count: int) -> list:
    if "target" in raw.column_names:
        return raw["target"][:count]
    if "label" in raw.column_names and recipe.data.label_names:
        names = recipe.data.label_names
        return [[names[i] for i in v] if isinstance(v, list) else names[v] for v in raw["label"][:count]]
    return [None] * count


def _show(value):
    return value if isinstance(value, (str, list)) else f"<{type(value).__name__}>"


def summarize(recipe, model, scorer, evaluation, counts, train_seconds, eval_seconds, processes: int = 1) -> dict:
    """metrics.json's content; `counts` are this process's token counts (see throughput.efficiency)."""
    trainable, total = modeling.count_parameters(model)
    return {
        "name": recipe.name, "family": recipe.family, "task": recipe.task, "checkpoint": recipe.model.checkpoint,
        "quantization": recipe.model.quantization, "lora_rank": recipe.lora.r if recipe.lora.enabled else None,
        "main_metric": scorer.main, "greater_is_better": scorer.greater_is_better, "eval": evaluation,
        "train_seconds": round(train_seconds, 3), "eval_seconds": round(eval_seconds, 3),
        "samples_per_second": round(processes * counts["samples"] / train_seconds, 3),
        **efficiency(model, counts, train_seconds, lora=recipe.lora.enabled, processes=processes),
        "peak_memory_mb": peak_memory_mb(), "trainable_params": trainable, "total_params": total,
        "hftoolkit_version": __import__("hftoolkit").__version__,
    }


def peak_memory_mb() -> float:
    """Peak GPU memory allocated when on CUDA, else the process's peak resident set size."""
    import torch

    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def save_weights(recipe: Recipe, trainer, processor, run: RunDirectory) -> None:
    """The adapter (LoRA) or the whole model (full fine-tuning), as safetensors, with the processor.

    Called on every process. Under FSDP or DeepSpeed each process holds only shards of the weights:
    the Trainer's save_model gathers them (a collective call) and writes on the main process alone.
    Not exercised on these CPU machines; DDP and single-process runs take the plain path.
    """
    target = run / ("adapter" if recipe.lora.enabled else "model")
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        trainer.save_model(str(target))
        if trainer.accelerator.is_main_process:
            (target / "training_args.bin").unlink(missing_ok=True)  # pickled arguments: not weights, not kept
    elif trainer.accelerator.is_main_process:
        trainer.model.save_pretrained(target, safe_serialization=True)
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(target)


def load_trained(run_dir: Path, full_precision: bool = False):
    """(recipe, family module, model, processor) of a finished run, ready for eval or predict.

    full_precision loads an 8-bit or 4-bit base unquantized (for merging the adapter into it).
    """
    run = RunDirectory(run_dir)
    if not (run / "recipe.yaml").is_file():
        raise UserError(f"{run_dir}: not a run directory (no recipe.yaml): pass a folder written by hftoolkit train")
    weights = run.weights_dir()
    recipe = load_recipe(run / "recipe.yaml")
    if full_precision:
        recipe.model.quantization = "none"
    family = family_module(resolve_family(recipe))
    if weights.name == "model":
        recipe.model.checkpoint = str(weights)
        return recipe, family, *family.load_model(recipe)
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    model, processor = family.load_model(recipe)
    set_peft_model_state_dict(model, load_file(weights / "adapter_model.safetensors"))
    model.eval()
    # The processor the run trained with, saved beside its adapter (a rebuilt init: tokenizer may differ).
    return recipe, family, model, type(processor).from_pretrained(weights)


def model_card(recipe: Recipe, metrics: dict) -> str:
    scores = "\n".join(f"| {k} | {v:.4g} |" for k, v in metrics["eval"].items() if isinstance(v, (int, float)))
    lora = f"LoRA r={recipe.lora.r}, alpha={recipe.lora.alpha}" if recipe.lora.enabled else "full fine-tuning"
    return f"""# {recipe.name}

{recipe.description or f"{recipe.task} fine-tuned with hftoolkit."}

- Base checkpoint: `{recipe.model.checkpoint}` ({metrics['family']}), quantization: {recipe.model.quantization}
- Method: {lora}; trainable parameters {metrics['trainable_params']:,} of {metrics['total_params']:,}
- Data: `{recipe.data.train}`; seed {recipe.training.seed}
- Train time {metrics['train_seconds']:.1f} s; peak memory {metrics['peak_memory_mb']} MB

| metric | value |
|---|---|
{scores}

Reproduce: `hftoolkit train recipe.yaml` (the resolved recipe beside this card).
"""
