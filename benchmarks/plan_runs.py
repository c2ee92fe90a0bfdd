"""`hftoolkit plan`'s time against whole runs: shipped recipes that train in under a minute here, trained as shipped.

    python benchmarks/plan_runs.py [--recipes NAME,...] [--rounds N] [--out DIR] [--start]

Each round plans each recipe (`hftoolkit plan RECIPE --json`, as a user runs it: this machine, every core), then
trains it (`hftoolkit train RECIPE`), and sets the plan's training beside metrics.json's `train_seconds` (what
`trainer.train()` took: the Trainer's start, the steps, no loading, no evaluation after training), its step beside
the run's steady step, its start (`start_seconds`) beside what the run spent outside its
steady steps, and its eval beside `eval_seconds`. A recipe's figures are those of its fastest round (a shared
machine's slow spells only lengthen a run): run a few rounds.

`--launch` measures the plan's LAUNCH_SECONDS first: the whole command's wall time, one process against two
(`--num-processes 2`), less the difference of their train_seconds, on one step of the quickstart.

`--start` measures the plan's CPU_START_SECONDS first, on a recipe the comparison does not use (encoder-tagging): its
`train_seconds` at two step counts, the intercept over the machine's pace.

Writes runs.json and runs.md under --out (default benchmarks/results/plan). Offline: the recipes are the `init:`
ones on builtin data.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# The quickstart, a decoder and three seq2seq recipes (T5 and BART): each trains in under a minute on 2 idle cores.
DEFAULT = ("encoder-classification", "decoder-clm", "seq2seq-translation-t5", "seq2seq-translation-bart",
           "seq2seq-denoise")
# Writes the times of a run's steps (benchmarks/plan.py's STEP_HOOK: a sitecustomize on the run's PYTHONPATH).
HOOK_SOURCE = ROOT / "benchmarks" / "plan.py"


def _env(hook: Path | None = None, times: Path | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if hook is not None:
        env.update(PYTHONPATH=f"{hook}{os.pathsep}{ROOT}", HFTOOLKIT_STEP_TIMES=str(times))
    return env


def step_hook(work: Path) -> Path:
    """A folder holding benchmarks/plan.py's STEP_HOOK as sitecustomize.py (read from its source: importing
    benchmarks/plan.py would set OMP_NUM_THREADS=1 for these runs, which train on every core as a user's do)."""
    import ast

    tree = ast.parse(HOOK_SOURCE.read_text())
    hook = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "STEP_HOOK")
    folder = work / "step-hook"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    return folder


def plan(recipe: Path, sets: list[str]) -> dict:
    """The launched strategy's time as `hftoolkit plan --json` gives it."""
    cmd = [sys.executable, "-m", "hftoolkit", "plan", str(recipe), "--json"]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600, check=True)
    planned = json.loads(done.stdout)
    row = next(r for r in planned["strategies"] if r["strategy"] == planned["launched"])
    return {**row["time"], "lengths": row["lengths"], "lengths_from": planned["lengths_from"]}


def train(recipe: Path, sets: list[str], out: Path, hook: Path) -> dict:
    """One whole run as shipped: train_seconds, eval_seconds, steps, and from the step hook the steady step (the
    median between consecutive steps' ends after the first) and the rest of train_seconds (the Trainer's start, the
    first step's warm-up, the epochs' and logging's work)."""
    times = out.parent / f"{out.name}-steps"
    shutil.rmtree(times, ignore_errors=True)
    times.mkdir(parents=True)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(out)]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(hook, times), timeout=900)
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    metrics = json.loads((out / "metrics.json").read_text())
    found = json.loads(next(times.glob("*.json")).read_text())
    ends = found["ends"]
    gaps = [b - a for a, b in zip(ends[1:], ends[2:])]
    step = statistics.median(gaps) if gaps else None
    train_seconds = metrics["train_seconds"]
    return {"train_seconds": train_seconds, "eval_seconds": metrics.get("eval_seconds"), "steps": len(ends),
            "step": step and round(step, 5),
            "first_step": round(ends[0] - found["begin"][0], 4) if found.get("begin") else None,
            "outside_steps": step and round(train_seconds - len(ends) * step, 3)}


def compare(names: list[str], rounds: int, work: Path) -> list[dict]:
    """Each recipe planned then trained, `rounds` times over (recipe after recipe, so that a slow spell of the machine
    falls on each alike); a recipe's figures are its fastest round's, with the plan made just before it."""
    hook = step_hook(work)
    runs: dict[str, list[dict]] = {}
    for round_ in range(rounds):
        for name in names:
            recipe = RECIPES / f"{name}.yaml"
            planned = plan(recipe, [])
            run = train(recipe, [], work / "runs" / name, hook)
            runs.setdefault(name, []).append({"planned": planned, "measured": run})
            print(f"round {round_ + 1} of {rounds}: {name}: planned {planned['train_seconds']:.2f} s, measured "
                  f"{run.get('train_seconds') or run.get('failed')}", flush=True)
    rows = []
    for name in names:
        ran = [r for r in runs[name] if "train_seconds" in r["measured"]]
        if not ran:
            rows.append({"recipe": name, "failed": runs[name][0]["measured"].get("failed")})
            continue
        best = min(ran, key=lambda r: r["measured"]["train_seconds"])
        planned, measured = best["planned"], best["measured"]
        rows.append({"recipe": name, "planned": planned, "measured": measured,
                     "all_train_seconds": [r["measured"]["train_seconds"] for r in ran],
                     "ratio": round(planned["train_seconds"] / measured["train_seconds"], 3),
                     "step_ratio": measured["step"] and round(planned["step_seconds"] / measured["step"], 3)})
    return rows


HEADER = ("| recipe | steps | planned step | measured step | planned start | measured outside the steps | "
          "planned training | measured train_seconds (rounds) | planned / measured | planned eval | measured eval |"
          "\n|---|---|---|---|---|---|---|---|---|---|---|")


def line(row: dict) -> str:
    if "planned" not in row:
        return f"| {row['recipe']} | failed: {row.get('failed')} |"
    p, m = row["planned"], row["measured"]
    rounds = ", ".join(f"{s:.2f}" for s in row["all_train_seconds"])
    eval_planned = "-" if p.get("eval_seconds") is None else f"{p['eval_seconds']:.2f} s"
    return (f"| {row['recipe']} | {m['steps']} | {1000 * p['step_seconds']:.1f} ms | {1000 * m['step']:.1f} ms | "
            f"{p.get('start_seconds') or 0:.2f} s | {m['outside_steps']:.2f} s | "
            f"{p['train_seconds']:.2f} s | {m['train_seconds']:.2f} s ({rounds}) | {row['ratio']:.2f} | "
            f"{eval_planned} | {m['eval_seconds']:.2f} s |")


def start_calibration(work: Path, recipe: str = "encoder-tagging", counts: tuple[int, int] = (10, 90),
                      rounds: int = 3) -> dict:
    """planning/timing.py's CPU_START_SECONDS: the intercept of train_seconds over the step count (the fastest of
    `rounds` runs at each of two counts), over this machine's pace, on a recipe the comparison does not use."""
    from hftoolkit.planning.timing import cpu_pace

    hook = step_hook(work)
    seconds = {}
    for count in counts:
        runs = [train(RECIPES / f"{recipe}.yaml", [f"training.max_steps={count}"], work / "runs" / f"start-{count}",
                      hook) for _ in range(rounds)]
        seconds[count] = min(r["train_seconds"] for r in runs if "train_seconds" in r)
    low, high = counts
    per_step = (seconds[high] - seconds[low]) / (high - low)
    start = seconds[low] - low * per_step
    pace = cpu_pace()
    return {"recipe": recipe, "train_seconds": seconds, "per_step": round(per_step, 5), "start": round(start, 3),
            "pace": round(pace, 3), "start_at_reference_pace": round(start / pace, 3)}


def launch_calibration(work: Path, recipe: str = "encoder-classification", rounds: int = 3) -> dict:
    """planning/plan.py's LAUNCH_SECONDS: what `--num-processes 2` adds to a command's wall time beyond its training
    (the launcher, the second import of the libraries, the rendezvous), the fastest of `rounds` at each count."""
    import time

    walls, trains = {}, {}
    for processes in (1, 2):
        best = None
        for n in range(rounds):
            out = work / "runs" / f"launch-{processes}-{n}"
            shutil.rmtree(out, ignore_errors=True)
            began = time.monotonic()
            subprocess.run([sys.executable, "-m", "hftoolkit", "train", str(RECIPES / f"{recipe}.yaml"), "--quiet",
                            "--output", str(out), "--num-processes", str(processes), "--set", "training.max_steps=1"],
                           env=_env(), check=True, stdout=subprocess.DEVNULL)
            wall = time.monotonic() - began
            if best is None or wall < best[0]:
                best = (wall, json.loads((out / "metrics.json").read_text())["train_seconds"])
        walls[processes], trains[processes] = best
    launch = (walls[2] - walls[1]) - (trains[2] - trains[1])
    return {"recipe": recipe, "wall_seconds": walls, "train_seconds": trains, "launch": round(launch, 2)}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(DEFAULT), help="comma-separated shipped recipe names")
    parser.add_argument("--rounds", type=int, default=2, help="plan and train each recipe this many times")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "plan")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hftoolkit-plan-runs")
    parser.add_argument("--start", action="store_true", help="measure CPU_START_SECONDS first")
    parser.add_argument("--launch", action="store_true", help="measure LAUNCH_SECONDS first")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = {}
    if args.launch:
        report["launch"] = launch_calibration(args.work)
        print("launch:", report["launch"], flush=True)
    if args.start:
        report["start"] = start_calibration(args.work)
        print("start:", report["start"], flush=True)
    report["runs"] = compare([n for n in args.recipes.split(",") if n], args.rounds, args.work)
    table = "\n".join([HEADER, *(line(row) for row in report["runs"])])
    print(table)
    (args.out / "runs.json").write_text(json.dumps(report, indent=1))
    (args.out / "runs.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
