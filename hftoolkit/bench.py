"""`bench`: the course's comparison in one offline command: the same task done by different architectures.

Sentiment classification with an encoder (BERT), a decoder (GPT-2) and an encoder-decoder (BART);
translation with T5, BART and a decoder (GPT-2, prompt + target); image classification with ViT.
Each run starts from a shipped smoke recipe (init: checkpoints, builtin: data) with only the checkpoint
changed, plus BENCH_SETTINGS where a run needs fewer steps to keep the whole bench short. The runs go
through the sweep machinery (`sweep.prepare`, `sweep.run_variants`): every recipe is validated before
anything trains, one progress line per run, a failing run is recorded and the others go on. A bench
measures, so every run trains again from scratch. Runs go to OUT/runs/<task>-<arch>/, the report to OUT.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from hftoolkit.errors import UserError

# (run name prefix, smoke recipe under recipes/, checkpoints, settings for this bench)
BENCH = (
    ("classification", "encoder-classification.yaml", ("init:bert", "init:gpt2", "init:bart"), ()),
    ("translation", "seq2seq-translation-t5.yaml", ("init:t5", "init:bart", "init:gpt2"), ("training.epochs=8",)),
    ("vision", "vision-classification.yaml", ("init:vit",), ()),
)


def bench_variants(families: list[str] | None, recipes_dir: Path, overrides: list[str] = ()) -> list:
    """The bench's runs as sweep variants, only those of `families` when given (encoder, decoder, seq2seq, vision)."""
    from hftoolkit.recipe import MODEL_TYPE_FAMILIES
    from hftoolkit.sweep import Variant

    known = sorted(set(MODEL_TYPE_FAMILIES.values()))
    unknown = [f for f in families or () if f not in known]
    if unknown:
        raise UserError(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    variants = []
    for prefix, recipe, checkpoints, settings in BENCH:
        for checkpoint in checkpoints:
            arch = checkpoint.removeprefix("init:")
            if families and MODEL_TYPE_FAMILIES[arch] not in families:
                continue
            variants.append(Variant(f"{prefix}-{arch}", recipes_dir / recipe,
                                    [*settings, f"model.checkpoint={checkpoint}", *overrides],
                                    grid={"model.checkpoint": checkpoint}))
    return variants


def bench(families: list[str] | None, out: Path, recipes_dir: Path, overrides: list[str] = (),
          echo: Callable[[str], None] = print):
    """Train the bench's runs into OUT/runs/ and write OUT/report.md; returns the sweep's result."""
    from hftoolkit.report import write_report
    from hftoolkit.sweep import SweepResult, prepare, run_variants

    variants = bench_variants(families, recipes_dir, list(overrides))
    folder = prepare(variants, Path(out) / "runs", overwrite=True)
    echo(f"bench: {len(variants)} runs -> {folder}")
    outcomes = run_variants(variants, list(sys.argv), echo=echo)
    report = write_report([v.run_dir for v in variants], Path(out))
    return SweepResult(folder, report, outcomes)
