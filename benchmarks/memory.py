"""Memory: full fine-tuning, LoRA, LoRA + 8-bit and LoRA + 4-bit for a BERT-base-size model.

Random weights from BertConfig() (110M parameters), saved once to a temporary folder; each
variant runs in its own process (peak RSS is per process): load through hftoolkit's loader,
report get_memory_footprint(), train a few steps (batch 8, 128 tokens), report peak RSS.
`--hidden 384 --layers 6 --intermediate 1536` gives a MiniLM-size model for the crossover.

    python benchmarks/memory.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile

VARIANTS = {"full fine-tuning": ("none", False), "LoRA": ("none", True), "LoRA + 8-bit": ("8bit", True),
            "LoRA + 4-bit": ("4bit", True)}


def worker(checkpoint: str, variant: str, steps: int) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    from hftoolkit.config.recipe import validate_recipe
    from hftoolkit.job.precision import resolve_precision
    from hftoolkit.job.resolve import load_config
    from hftoolkit.job.spec import Job, ResolvedModel
    from hftoolkit.models import loading

    quantization, lora = VARIANTS[variant]
    recipe = validate_recipe({"name": "mem", "task": "classification",
                              "model": {"checkpoint": checkpoint, "quantization": quantization},
                              "lora": {"enabled": lora}, "data": {"train": "builtin:sentiment"}})
    # The folder holds weights and config only (no tokenizer: the batches are random ids), so the job is
    # assembled here rather than by resolve_job, which would load (and check) a tokenizer.
    config = load_config(recipe, checkpoint)
    job = Job(recipe=recipe, precision=resolve_precision(recipe.training.precision, config.model_type),
              model=ResolvedModel(checkpoint=checkpoint, path=checkpoint, revision=None, config=config,
                                  family="encoder", processor=None),
              label_names=("negative", "positive"))
    model = loading.load_task_model(AutoModelForSequenceClassification, job, "SEQ_CLS", num_labels=2)
    footprint = model.get_memory_footprint()
    model.train()  # as the Trainer does (bitsandbytes' 8-bit layers take another code path in eval mode)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (8, 128))
        loss = model(input_ids=ids, labels=torch.zeros(8, dtype=torch.long)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"footprint_mb": footprint / 2**20, "peak_rss_mb": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.steps)
    from transformers import BertConfig, BertForSequenceClassification

    with tempfile.TemporaryDirectory() as tmp:
        config = BertConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                            intermediate_size=args.intermediate, num_attention_heads=max(1, args.hidden // 64))
        model = BertForSequenceClassification(config)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        del model
        print(f"BERT from config: {params / 1e6:.1f}M parameters; {args.steps} steps, batch 8 x 128 tokens")
        rows = {}
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--worker", tmp, variant, "--steps", str(args.steps)],
                                 capture_output=True, text=True)
            if out.returncode:
                print(f"{variant}: failed\n{out.stderr[-2000:]}")
                continue
            rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    base = rows.get("full fine-tuning", {}).get("footprint_mb")
    print(f"{'':20}{'footprint MB':>14}{'ratio':>7}{'peak RSS MB':>13}")
    for variant, r in rows.items():
        ratio = r["footprint_mb"] / base if base else float("nan")
        print(f"{variant:20}{r['footprint_mb']:14.0f}{ratio:7.2f}{r['peak_rss_mb']:13.0f}")


if __name__ == "__main__":
    main()
