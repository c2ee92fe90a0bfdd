"""Generation: batched against one-example-at-a-time generation for a seq2seq model.

The tiny init:t5 model (random weights, so outputs run to max_new_tokens: a fair worst case),
64 builtin:translation sources, greedy, 32 new tokens. Batched uses hftoolkit's seq2seq
generate (length-sorted batches of eval.batch_size); the baseline calls it one input at a time.

    python benchmarks/generation.py [--examples 64]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    import torch

    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.sources.builtin import translation

    recipe = validate_recipe({"name": "gen", "task": "translation", "model": {"checkpoint": "init:t5"},
                              "data": {"train": "builtin:translation"},
                              "eval": {"batch_size": args.batch_size, "generation": {"max_new_tokens": 32}}})
    job = resolve_job(recipe, data=False)
    form = formulation(job)
    model, tokenizer = form.load_model(job)
    model.eval()
    sources = [row["text"] for row in translation(n=args.examples)]
    torch.manual_seed(0)
    start = time.perf_counter()
    batched = form.generate(job, model, tokenizer, sources)
    batched_seconds = time.perf_counter() - start
    start = time.perf_counter()
    single = [form.generate(job, model, tokenizer, [s])[0] for s in sources]
    single_seconds = time.perf_counter() - start
    same = sum(a["text"] == b["text"] for a, b in zip(batched, single))
    print(f"one at a time: {args.examples / single_seconds:8.1f} examples/s")
    print(f"batched ({args.batch_size}):  {args.examples / batched_seconds:8.1f} examples/s")
    print(f"speed-up: {single_seconds / batched_seconds:.1f}x (target >= 4x); identical outputs: {same}/{len(sources)}")


if __name__ == "__main__":
    main()
