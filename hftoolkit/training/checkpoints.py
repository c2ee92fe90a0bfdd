"""Checkpoints you can resume from: written atomically, kept by number, found and checked on --resume.

The Trainer writes straight into `checkpoint-N`, so a kill during a save leaves a folder that looks like a
checkpoint and is not one; here a checkpoint folder is complete or absent (docs/architecture.md, "The run
directory"). The Trainer mixin that calls this while saving is `AtomicCheckpoints`, at its end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path

from hftoolkit.base import console
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import CHECKPOINTS, RECIPE, RESULTS
from hftoolkit.base.secrets import redact

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STAGING_PREFIX = ".tmp-"
PAUSED = "test hook: paused at"
# Written by Trainer._save as a pickle (TrainingArguments); nothing reads it on resume, and a
# pickle is code, so it is not kept.
PICKLED_ARGS = "training_args.bin"
# Recipe keys a resumed run may change: they decide what happens around the steps, not the steps.
RESUMABLE_CHANGES = ("description", "training.on_nonfinite", "training.max_nonfinite_skips", "training.keep_last",
                     "training.save_steps", "training.logging_steps", "training.report_to", "training.project",
                     "data.num_workers", "eval.")


# ---------------------------------------------------------------- atomic commit and retention


def commit(staged: Path, final: Path) -> None:
    """fsync every file and folder under `staged`, then rename it to `final` and fsync the parent."""
    from hftoolkit.runs.rundir import follow_umask

    follow_umask(staged)
    for folder, _, files in os.walk(staged):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))
    if final.exists():  # the same step saved again (a resume from an earlier checkpoint): swap, then drop
        retired = final.parent / f"{STAGING_PREFIX}delete-{final.name}"
        shutil.rmtree(retired, ignore_errors=True)
        os.rename(final, retired)
        os.rename(staged, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(staged, final)
    _fsync(final.parent)


def rotate(checkpoints_dir: Path, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints (by step) and `keep` (the best one, under
    eval.keep_best); returns the deleted ones.

    A folder is renamed away before it is deleted, so a kill mid-delete leaves a hidden
    folder, never a partial `checkpoint-N`; the newest checkpoint is always kept.
    """
    complete = complete_checkpoints(checkpoints_dir)
    kept = Path(keep).name if keep is not None else None
    doomed = [p for p in complete[:-max(keep_last, 1)] if p.name != kept]
    for path in doomed:
        retired = path.parent / f"{STAGING_PREFIX}delete-{path.name}"
        os.rename(path, retired)
        shutil.rmtree(retired, ignore_errors=True)
    return doomed


def complete_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """The `checkpoint-N` folders that hold a trainer state, oldest step first."""
    if not Path(checkpoints_dir).is_dir():
        return []
    found = [(int(m.group(1)), p) for p in Path(checkpoints_dir).iterdir()
             if (m := CHECKPOINT.match(p.name)) and (p / "trainer_state.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = complete_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def remove_staging(checkpoints_dir: Path) -> None:
    """Drop the hidden folders a killed save or delete left behind."""
    if Path(checkpoints_dir).is_dir():
        for path in Path(checkpoints_dir).iterdir():
            if path.name.startswith(STAGING_PREFIX):
                shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- resume


def resume_point(run, recipe_yaml: str, sharding: str | None = None) -> Path | None:
    """The checkpoint a --resume continues from, after checking that resuming makes sense.

    None when the folder holds no run yet or the run never reached its first checkpoint (the
    run then starts from step 0). Raises UserError for a finished run, a recipe that differs
    from the run's recipe.yaml (but for RESUMABLE_CHANGES), or a damaged checkpoint.
    """
    refusal = resume_refusal(run, sharding)
    if refusal:
        raise UserError(refusal)
    if not run.manifest():
        return None
    saved = run / RECIPE
    if saved.is_file():
        changed = [k for k in changed_keys(saved.read_text(encoding="utf-8"), recipe_yaml)
                   if not k.startswith(RESUMABLE_CHANGES)]
        if changed:
            raise UserError(f"--resume: the recipe differs from the one {run.path} was started with "
                            f"({', '.join(changed[:5])}): resume with the same recipe and --set overrides, "
                            "or pass --overwrite to start again")
    checkpoint = latest_checkpoint(run / CHECKPOINTS)
    if checkpoint is not None:
        check_checkpoint(checkpoint)
    return checkpoint


def resume_refusal(run, sharding: str | None) -> str | None:
    """Why the folder alone says a --resume makes no sense (a complete run, one whose eval only failed, files that
    are not a run, checkpoints of another sharding than `sharding`, the FSDP or DEEPSPEED this launch engages), or
    None; light, so that it is asked before any training process starts."""
    manifest = run.manifest()
    ran = (manifest.get("distributed") or {}).get("type") if isinstance(manifest.get("distributed"), dict) else None
    if ran in ("FSDP", "DEEPSPEED") and sharding != ran and manifest.get("status") != "complete":
        from hftoolkit.training.relaunch import launch_options

        options = shlex.join(launch_options(shlex.split(manifest.get("command") or ""))) or "its launch options"
        return (f"--resume: run {run.path} trained under {ran}, whose checkpoints only {ran} reads: resume it with "
                f"the launch it started with ({options})")
    if not manifest:
        if run.contents():
            return (f"--resume: {run.path} holds files but no manifest.json, so it is not a run directory: "
                    "choose another --output")
        return None
    if manifest.get("status") == "complete":
        return (f"--resume: run {run.path} is already complete, so there is nothing to resume; "
                "pass --overwrite to train it again or choose another --output")
    if manifest.get("status") == "trained, eval failed":
        return (f"--resume: run {run.path} finished training and saved its weights; only its eval failed: "
                f"run `hftoolkit eval {run.path}` to complete it")
    return None


def check_checkpoint(path: Path) -> None:
    """Raise UserError naming the file when a checkpoint's weights or states cannot be read back."""
    import zipfile

    fix = f"delete {path.name} to resume from the checkpoint before it, or pass --overwrite to start again"
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"--resume: {path / 'trainer_state.json'} is damaged ({err}): {fix}") from None
    for file in sorted(path.glob("*.safetensors")):  # (FSDP and DeepSpeed keep sharded states in sub-folders)
        problem = _safetensors_problem(file)
        if problem:
            raise UserError(f"--resume: {file} is damaged ({problem}): {fix}")
    for file in sorted(path.glob("*.pt")) + sorted(path.glob("*.pth")):
        try:
            with zipfile.ZipFile(file) as archive:
                bad = archive.testzip()
        except (OSError, zipfile.BadZipFile) as err:
            bad = str(err)
        if bad:
            raise UserError(f"--resume: {file} is damaged ({bad}): {fix}")


def _safetensors_problem(file: Path) -> str | None:
    """Why a .safetensors file is unreadable (truncated, bad header), or None; reads the header only."""
    try:
        data = file.open("rb")
    except OSError as err:
        return str(err)
    with data:
        head = data.read(8)
        if len(head) < 8:
            return "shorter than a safetensors header"
        size = int.from_bytes(head, "little")
        if size > file.stat().st_size - 8:
            return "truncated inside the header"
        try:
            header = json.loads(data.read(size))
        except ValueError:
            return "the header is not valid JSON"
    ends = [info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"]
    expected = 8 + size + max(ends, default=0)
    actual = file.stat().st_size
    return None if actual == expected else f"{actual} bytes where the header promises {expected}: truncated"


def clear_results(run) -> None:
    """Remove a previous attempt's result files and staging folders before the resumed run writes its own."""
    for name in RESULTS:
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    remove_staging(run / CHECKPOINTS)


def changed_keys(saved_yaml: str, new_yaml: str) -> list[str]:
    import yaml

    def flat(node, prefix=""):
        if isinstance(node, dict):
            return {k: v for key, child in node.items() for k, v in flat(child, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): node}

    # (recipe.yaml is written with its secrets masked, base/secrets.py: the new recipe is compared as it would be)
    old, new = (flat(yaml.safe_load(redact(text, yaml=True)) or {}) for text in (saved_yaml, new_yaml))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_pause(variable: str, step: int) -> None:
    """A test hook, never set outside tests: HFTOOLKIT_TEST_PAUSE_IN_SAVE=N sleeps in the save of checkpoint N
    before the rename, HFTOOLKIT_TEST_PAUSE_AFTER_SAVE=N once it is complete and rotated; each prints a line
    that a test kills on."""
    if os.environ.get(variable) == str(step):
        # The line tells a test the pause has begun: waiting for a folder instead would race what follows it.
        console.note(f"{PAUSED} {variable}={step}")
        time.sleep(600)


class AtomicCheckpoints:
    """Trainer mixin: `_save_checkpoint` stages into a hidden folder, fsyncs, renames, then rotates.

    Set `keep_last` (None: keep all) and `keep_best` after construction. With keep_best the checkpoint of
    the best eval so far (state.best_global_step) is never rotated away, and the trainer state records
    its committed folder, not the staging folder the save wrote into: a resumed run finds it there.
    """

    _staging_root: str | None = None
    keep_last: int | None = None
    keep_best = False

    def _get_output_dir(self, trial):
        return self._staging_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer import TRAINER_STATE_NAME

        final_dir = Path(super()._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
        staging_root = final_dir.parent / f"{STAGING_PREFIX}{final_dir.name}"
        if self.args.should_save and staging_root.exists():
            shutil.rmtree(staging_root)  # left by a run killed while saving this step
        self.accelerator.wait_for_everyone()
        self._staging_root = str(staging_root)
        try:
            super()._save_checkpoint(model, trial)  # writes staging_root/checkpoint-N (every rank its RNG file)
        finally:
            self._staging_root = None
        best = self._best_checkpoint(final_dir)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            staged = staging_root / final_dir.name
            if self.state.best_model_checkpoint != (None if best is None else str(best)):
                self.state.best_model_checkpoint = None if best is None else str(best)
                self.state.save_to_json(str(staged / TRAINER_STATE_NAME))
            (staged / PICKLED_ARGS).unlink(missing_ok=True)
            test_pause("HFTOOLKIT_TEST_PAUSE_IN_SAVE", self.state.global_step)
            commit(staged, final_dir)
            staging_root.rmdir()
            if self.keep_last:
                rotate(final_dir.parent, keep_last=self.keep_last, keep=best if self.keep_best else None)
            test_pause("HFTOOLKIT_TEST_PAUSE_AFTER_SAVE", self.state.global_step)
        self.state.best_model_checkpoint = None if best is None else str(best)
        self.accelerator.wait_for_everyone()

    def _best_checkpoint(self, saving: Path) -> Path | None:
        """The committed folder of the best checkpoint so far (`saving` is the one being saved), or None."""
        step = self.state.best_global_step
        if not step:
            return None
        path = saving.parent / f"checkpoint-{step}"
        return path if path == saving or path.is_dir() else None
