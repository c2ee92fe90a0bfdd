"""What a user sees: the toolkit's lines on the console, the libraries' noise in train.log (hftoolkit/base/console.py,
library_output.py, models/load_report.py, training/progress.py)."""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings

import pytest

from hftoolkit.base import console
from hftoolkit.base.console import Verbosity
from hftoolkit.base.errors import UserError
from hftoolkit.training import progress

NOISE = ("a transformers warning", "FutureWarning: an old argument", "{'loss': '0.6982'}")


def make_noise():
    """What the libraries say during a run: a logger record, a warning raised in library code, a print."""
    logging.getLogger("transformers.trainer").warning("a transformers warning")
    warnings.warn_explicit("an old argument", FutureWarning, "transformers/training_args.py", 1541,
                           module="transformers.training_args", registry={})
    print({"loss": "0.6982"})


def process_state():
    handlers = [(h, getattr(h, "stream", None)) for h in logging.getLogger("transformers").handlers]
    return sys.stdout, sys.stderr, warnings.showwarning, handlers


def filters_restored(before: list) -> bool:
    """The filters as they were, give or take those that libraries imported meanwhile installed."""
    ours = ("default", None, DeprecationWarning, None, 0)  # shows library deprecations in the log, while capturing
    after = list(warnings.filters)
    return [f for f in after if f in before] == before and after.count(ours) == before.count(ours)


def test_a_normal_run_shows_our_lines_and_writes_the_libraries_to_the_log(capfd, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from hftoolkit.models.load_report import explain_in_captures
    from hftoolkit.sources.tiny import ensure_tiny

    explain_in_captures()  # (the CLI and the train workflow do this before their captures)
    checkpoint = ensure_tiny("bert")
    log = tmp_path / "train.log"
    capfd.readouterr()
    before, filters = process_state(), list(warnings.filters)
    with console.capture(None, Verbosity.NORMAL) as run:
        console.phase("data loaded: 240 train, 60 eval rows")
        make_noise()
        run.attach(log)  # the run directory is claimed after the capture began: earlier lines are kept
        AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)  # logs a LOAD REPORT
    after = process_state()
    out, err = capfd.readouterr()

    assert out == ""  # stdout stays for results
    assert err.splitlines() == [
        "data loaded: 240 train, 60 eval rows",
        "note: classifier head initialised from scratch (2 tensors): expected when fine-tuning for a new task",
        "note: checkpoint weights unused by this task, left out (7 tensors: cls.predictions, cls.seq_relationship): "
        "expected when the checkpoint was saved with another head"]
    text = log.read_text()
    for said in (*NOISE, "[hftoolkit] data loaded", "BertForSequenceClassification LOAD REPORT", "classifier.weight",
                 "| MISSING", "Loading weights: 100%", "[hftoolkit] note: classifier head"):
        assert said in text
    assert "\x1b[" not in text and "\r" not in text  # no colour codes, a tqdm bar as its final state
    assert after == before and filters_restored(filters)  # streams, transformers' handler, warnings as they were


def test_what_native_code_writes_to_the_descriptor_goes_to_the_log(capfd, tmp_path):
    # torch's C++ warnings (DDP's reducer, NCCL) are written to file descriptor 2, past sys.stderr
    with console.capture(tmp_path / "train.log", Verbosity.NORMAL):
        os.write(2, b"[W reducer.cpp:1529] Warning: find_unused_parameters=True\n")
        console.phase("still on the console")
    os.write(2, b"after the capture\n")
    assert capfd.readouterr().err == "still on the console\nafter the capture\n"
    assert "[W reducer.cpp:1529] Warning" in (tmp_path / "train.log").read_text()


def test_verbose_shows_the_libraries_too(capsys):
    with console.capture(None, Verbosity.VERBOSE):
        console.phase("model loaded")
        make_noise()
    out, err = capsys.readouterr()
    assert out == ""
    assert "model loaded" in err
    for said in NOISE:
        assert said in err


def test_quiet_shows_errors_only(capsys):
    with console.capture(None, Verbosity.QUIET):
        console.phase("data loaded")
        console.note("a note")
        console.warn("a warning")
        make_noise()
        console.error("the eval split is empty")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "error: the eval split is empty\n")


def test_a_failed_run_says_where_the_full_log_is_and_restores_the_process(capsys, tmp_path):
    before, filters = process_state(), list(warnings.filters)
    with pytest.raises(RuntimeError, match="boom"):
        with console.capture(tmp_path / "train.log", Verbosity.NORMAL):
            make_noise()
            raise RuntimeError("boom")
    assert process_state() == before and filters_restored(filters)
    assert capsys.readouterr().err == f"note: the libraries' full log: {tmp_path / 'train.log'}\n"
    assert "a transformers warning" in (tmp_path / "train.log").read_text()


def test_a_process_other_than_the_main_one_prints_nothing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    with console.capture(None, Verbosity.VERBOSE) as run:
        console.phase("data loaded")
        make_noise()
        run.attach(tmp_path / "train.log")
    assert capsys.readouterr() == ("", "")
    assert not (tmp_path / "train.log").exists()  # only the main process writes the run directory


def test_a_nested_capture_still_prints_to_the_console(capsys, tmp_path):
    with console.capture(tmp_path / "outer.log", Verbosity.NORMAL):
        with console.capture(tmp_path / "inner.log"):
            console.phase("inner phase")
            make_noise()
    assert capsys.readouterr().err == "inner phase\n"
    assert "a transformers warning" in (tmp_path / "inner.log").read_text()


def test_load_report_translations_name_what_is_missing_and_where():
    from types import SimpleNamespace

    from transformers.utils.loading_report import LoadStateDictInfo

    from hftoolkit.models.load_report import explain_load_report

    model = SimpleNamespace(base_model_prefix="bert")
    info = LoadStateDictInfo(missing_keys={"bert.pooler.dense.weight", "bert.pooler.dense.bias", "score.weight"},
                             unexpected_keys=set(), error_msgs=[], conversion_errors={}, skipped_pp_keys=set(),
                             mismatched_keys={("classifier.weight", (2, 64), (3, 64))})
    said = [(say.__name__, line) for say, line in explain_load_report(model, info)]
    assert said == [
        ("note", "score head initialised from scratch (1 tensor): expected when fine-tuning for a new task"),
        ("warn", "2 tensors of the base model not in the checkpoint, initialised from scratch (pooler.dense): "
                 "check that model.checkpoint matches the architecture"),
        ("warn", "checkpoint weights of another shape, initialised from scratch (1 tensor: classifier)")]


def test_progress_replaces_the_trainers_printers(capfd, tmp_path):
    import torch

    from hftoolkit.patches.peft_0_21 import bitsandbytes_hidden
    from hftoolkit.sources.tiny import ensure_tiny

    with bitsandbytes_hidden(needed=False):  # as a run does: `import transformers.Trainer` imports peft
        from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"input_ids": torch.tensor([2, 5 + i, 9, 3]), "labels": torch.tensor(i % 2)}

    log = tmp_path / "train.log"
    with console.capture(log, Verbosity.NORMAL):
        model = AutoModelForSequenceClassification.from_pretrained(ensure_tiny("bert"), num_labels=2)
        args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=10, per_device_train_batch_size=4,
                                 logging_steps=5, report_to="none", use_cpu=True, save_strategy="no")
        trainer = Trainer(model=model, args=args, train_dataset=Rows(), eval_dataset=Rows())
        progress.use_progress(trainer)
        trainer.train()
        trainer.evaluate()
    out, err = capfd.readouterr()

    assert not any(isinstance(cb, (ProgressCallback, PrinterCallback)) for cb in trainer.callback_handler.callbacks)
    shown = [line for line in err.splitlines() if line.startswith("train ")]
    # Without a terminal: one line per tenth of the steps, each with the last logged loss and learning rate.
    assert [line.split(" loss ")[0] for line in shown] == [f"train {i}/10 ({10 * i}%)" for i in range(1, 11)]
    assert shown[4].split(" lr ")[0] == f"train 5/10 (50%) loss {trainer.state.log_history[0]['loss']:.4f}"
    assert "{'loss'" not in out + err and "it/s" not in out + err  # no raw dicts, no tqdm bar (train or eval)
    text = log.read_text()
    assert "[trainer] step 5/10: {'loss': " in text and "[trainer] step 10/10: {'eval_loss': " in text


def test_progress_on_a_terminal_is_one_bar_left_at_its_last_state():
    from rich.console import Console

    from hftoolkit.base.library_output import ANSI

    screen = io.StringIO()
    bar = progress.StepProgress(Console(file=screen, force_terminal=True, width=100), total=4)
    for step in range(1, 5):
        bar.advance_to(step)
        bar.show(0.5 / step, 1e-3)
    bar.close()
    last = ANSI.sub("", screen.getvalue()).split("\r")[-1].strip()
    assert last.startswith("train") and "4/4 loss 0.1250 lr 1.00e-03" in last


def test_flags_and_phase_lines():
    assert console.verbosity_from_flags(verbose=False, quiet=False) == Verbosity.NORMAL
    assert console.verbosity_from_flags(verbose=True, quiet=False) == Verbosity.VERBOSE
    with pytest.raises(UserError, match="contradict"):
        console.verbosity_from_flags(verbose=True, quiet=True)
    assert console.data_line({"train": 1200, "eval": 60}) == "data loaded: 1,200 train, 60 eval rows"
    assert console.model_line("init:bert", 4226, 136964, "8bit", 8) == (
        "model loaded: init:bert, 136,964 parameters, 4,226 trainable (3.09%), LoRA r=8, 8-bit weights")
    assert console.model_line("gpt2", 10, 10).endswith("10 trainable (100%), not quantized")


def test_progress_lines_time_the_eta_after_start_up_and_never_repeat_a_loss(monkeypatch):
    from rich.console import Console

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    screen = io.StringIO()
    bar = progress.StepProgress(Console(file=screen, width=200), total=10, logging_steps=5)
    for step in range(1, 11):
        clock[0] = 20.0 + (step - 1)  # a 20 s first step (start-up), then 1 s a step
        bar.advance_to(step, lr=1e-3 * step / 10)  # warmup: the rate the scheduler has now
        if step % 5 == 0:
            bar.show(3.0 / step, None, step)  # the Trainer logs every 5 steps, without a rate of its own
    bar.close()
    lines = screen.getvalue().splitlines()
    assert lines[0].startswith("train 1/10") and "lr 1.00e-04" in lines[0] and lines[0].endswith("eta -")
    assert lines[1].startswith("train 2/10") and lines[1].endswith("eta 0:00:08")  # 8 steps at 1 s, not 84 s
    assert "loss 0.6000 lr 5.00e-04" in lines[4]  # logged at this step
    # the next line has no loss of its own: it says so, and when one comes, instead of repeating step 5's
    assert "loss - (logged every 5 steps) lr 6.00e-04" in lines[5]
    assert [line.split(" lr ")[0].split(" loss ")[1] for line in lines].count("0.6000") == 1


def test_a_line_after_several_logs_shows_the_mean_loss_of_their_steps():
    from rich.console import Console

    screen = io.StringIO()
    bar = progress.StepProgress(Console(file=screen, width=200), total=20, logging_steps=1)
    for step in range(1, 5):  # (a line every second step)
        bar.advance_to(step)
        bar.show(float(step), 1e-3, step)
    bar.close()
    assert [line.split(" loss ")[1].split()[0] for line in screen.getvalue().splitlines()] == ["1.5000", "3.5000"]


def test_bytes_are_shown_in_gib_as_a_line_says_them_or_as_a_gib_columns_number():
    assert console.gib(1.5 * 2**30) == "1.5 GiB"
    assert console.gib(1234.5 * 2**30) == "1234.5 GiB"  # (a line's figure is not grouped: doctor's free disk)
    assert console.gib(0.25 * 2**30, 2) == "0.25 GiB"
    assert console.gib(1234.5 * 2**30, 2, unit=False) == "1,234.50"  # plan's tables, headed GiB
