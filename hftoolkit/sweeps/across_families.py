"""`bench`: the course's comparison in one offline command: the same task done by different architectures.

Sentiment classification with an encoder (BERT), a decoder (GPT-2) and an encoder-decoder (BART); translation
with T5, BART and a decoder (GPT-2, prompt + target); image classification with ViT. Runs go to
OUT/runs/<task>-<arch>/, the report to OUT.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from hftoolkit.base.errors import UserError

# (run name prefix, smoke recipe under recipes/, checkpoints, settings for this bench)
BENCH = (
    ("classification", "encoder-classification.yaml", ("init:bert", "init:gpt2", "init:bart"), ()),
    ("translation", "seq2seq-translation-t5.yaml", ("init:t5", "init:bart", "init:gpt2"),
     ("training.epochs=12", "data.source_prefix=")),
    ("vision", "vision-classification.yaml", ("init:vit",), ("training.epochs=8",)),
)


def bench_variants(families: list[str] | None, recipes_dir: Path, overrides: list[str] = ()) -> list:
    """The bench's runs as sweep variants, only those of `families` when given (encoder, decoder, seq2seq, vision).

    Each run starts from a shipped smoke recipe (init: checkpoints, builtin: data) with only the checkpoint
    changed; the runs of one task share every other setting, epochs included. BENCH's last column holds what the
    bench changes for all runs of a task: fewer epochs than the recipe (to stay short), and translation without
    T5's task prefix, a convention that a randomly initialized model cannot know and that the tiny tokenizers
    split into more tokens than a whole source sentence has."""
    from hftoolkit.config.families import FAMILIES, INIT_FAMILIES
    from hftoolkit.sweeps.variants import Variant

    known = sorted(FAMILIES)
    unknown = [f for f in families or () if f not in known]
    if unknown:
        raise UserError(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    variants = []
    for prefix, recipe, checkpoints, settings in BENCH:
        for checkpoint in checkpoints:
            arch = checkpoint.removeprefix("init:")
            if families and INIT_FAMILIES[arch] not in families:
                continue
            variants.append(Variant(f"{prefix}-{arch}", recipes_dir / recipe,
                                    [*settings, f"model.checkpoint={checkpoint}", *overrides]))
    return variants


def bench(families: list[str] | None, out: Path, recipes_dir: Path, overrides: list[str] = (),
          echo: Callable[[str], None] = print, verbosity=None):
    """Train the bench's runs into OUT/runs/ and write OUT/report.md; returns the sweep's result.

    The runs go through the sweep machinery (`variants.prepare`, `variants.run_variants`): every recipe is
    validated before anything trains, one progress line per run, a failing run is recorded and the others go on.
    A bench measures, so every run trains again from scratch."""
    from hftoolkit.runs.report import write_report
    from hftoolkit.sweeps.variants import SweepResult, prepare, run_variants

    variants = bench_variants(families, recipes_dir, list(overrides))
    folder = prepare(variants, Path(out) / "runs", overwrite=True)
    echo(f"bench: {len(variants)} runs -> {folder}")
    with one_thread():
        outcomes = run_variants(variants, list(sys.argv), echo=echo, verbosity=verbosity)
    report = write_report([v.run_dir for v in variants], Path(out))
    return SweepResult(folder, report, outcomes)


@contextlib.contextmanager
def one_thread():
    """torch on one intra-op thread while the bench trains (restored after).

    The bench's models are 64 wide: splitting their matmuls over threads gains nothing, and OpenMP threads
    spin-wait for each other, which turns into lost time wherever other processes share the cores. One
    thread keeps the bench's times steady on a busy machine.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
