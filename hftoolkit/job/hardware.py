"""What this machine can do for a recipe: its CPU's bf16 matrix features (which `auto` precision reads:
job/precision.py), and the keys that ask it for what it lacks (an optional library: TRL, bitsandbytes,
TensorBoard; flash attention, TF32, fp16 on a CPU), refused when training starts and by `plan` for the device it
plans on (`validate` stays machine-independent: a recipe for a GPU server validates anywhere).
Imports torch only inside functions."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hftoolkit.config.recipe import Recipe


# The CPU features, as torch.cpu.get_capabilities() names them, on which oneDNN multiplies bf16 matrices in
# hardware (AMX tiles, AVX-512 BF16 dot products) at several times the fp32 rate. Elsewhere (AVX2, AVX-512
# without BF16) torch emulates bf16 by converting to fp32, and autocast only adds the conversions.
BF16_MATRIX_FEATURES = ("amx_bf16", "avx512_bf16")


def cpu_bf16_features() -> list[str]:
    """This CPU's bf16 matrix features as torch reports them; empty where it has none (or torch cannot say).
    The rule `auto` follows on a CPU; tests replace this function to play either kind of CPU."""
    return [name for name in BF16_MATRIX_FEATURES if _cpu_capabilities().get(name)]


def attention_in_fp32() -> bool:
    """Whether bf16 training on this machine computes attention in fp32 (patches/transformers_5.py): on a CPU,
    whose attention kernels are faster in fp32, AMX tiles or not (benchmarks/decoder_step.py --attention)."""
    import torch

    return not torch.cuda.is_available()


def cpu_record() -> dict:
    """The CPU behind a CPU run's precision, for metrics.json, manifest.json and `doctor`."""
    import platform

    return {"name": _cpu_capabilities().get("cpu_name") or platform.processor() or platform.machine(),
            "bf16_matrix_features": cpu_bf16_features()}


def _cpu_capabilities() -> dict:
    import torch

    report = getattr(torch.cpu, "get_capabilities", None)  # (torch 2.10 and later)
    return dict(report()) if report else {}


# The tasks whose runs train (and score: an eval pass builds the same trainer) with TRL's trainers, by their scoring
# (training/trainer.build_trainer): preference (DPO, IPO, ORPO, KTO) and rl (grpo: GRPO, RLOO).
TRL_SCORINGS = ("preference", "rl")
# training.optimizer's bitsandbytes optimizers (training/arguments.OPTIMIZERS).
BITSANDBYTES_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")


def library_problems(recipe: Recipe, training: bool = True) -> list[str]:
    """The optional libraries `recipe` needs that are not installed, one line each naming its extra (base/extras.py):
    TRL for the tasks TRL's trainers train, bitsandbytes for 8-bit and 4-bit weights, and when `training` (not an
    eval pass), gguf for a checkpoint that names a .gguf file, bitsandbytes for its 8-bit optimizers and TensorBoard
    where report_to names it. Asked before anything is loaded or written (`train` before its launch, sweep and
    search before their first run, resolve_job, `eval`); a folder that holds one .gguf file is refused where it is
    found (sources/checkpoint.py). Imports no torch."""
    from hftoolkit.base import extras
    from hftoolkit.config import tasks
    from hftoolkit.sources.checkpoint import GGUF_FEATURE

    t, m = recipe.training, recipe.model
    needs = []
    if tasks.spec(recipe.task).scoring in TRL_SCORINGS:
        needs.append(("preference", f"task: {recipe.task}"))
    # (not for eval: a fully tuned run's weights are its own, and a LoRA run's GGUF base is refused as it is located)
    if training and (m.checkpoint.lower().endswith(".gguf") or m.gguf_file):
        needs.append(("gguf", GGUF_FEATURE))
    if m.quantization != "none":
        needs.append(("quantization", f"model.quantization: {m.quantization}"))
    if training and t.optimizer in BITSANDBYTES_OPTIMIZERS:
        needs.append(("quantization", f"training.optimizer: {t.optimizer}"))
    if training and "tensorboard" in t.report_to:
        needs.append(("tensorboard", "training.report_to: tensorboard"))
    return [line for extra, feature in needs if (line := extras.missing(extra, feature))]


def precision_problems(precision: str, cuda: bool) -> list[str]:
    """training.precision against the device that trains (`cuda`: a GPU; else a CPU), one line where it can't:
    fp16 mixed precision is a GPU's. CPUs multiply fp16 in hardware rarely (AVX-512 FP16, AMX-FP16) and bf16 more
    often (BF16_MATRIX_FEATURES), and bf16 keeps fp32's range, so it needs no loss scaling: on a CPU the choice is
    bf16 or fp32, and `auto` never picks fp16 there."""
    if precision == "fp16" and not cuda:
        return ["training.precision: fp16 mixed precision is for GPUs, and this machine has none (a CPU's half "
                "precision is bf16: fp32's range, no loss scaling): set training.precision to fp32, or bf16 on a CPU "
                "with bf16 matrix units (auto picks for this machine)"]
    return []


def precision_warning(precision: str, cuda: bool) -> str | None:
    """One line where `precision` trains on this device, but slower than fp32 would: bf16 on a CPU without bf16
    matrix units (BF16_MATRIX_FEATURES), where torch emulates each bf16 product through fp32. None elsewhere."""
    if precision != "bf16" or cuda or cpu_bf16_features():
        return None
    return ("training.precision: bf16 on this CPU trains slower than fp32: it has no bf16 matrix units "
            f"({' or '.join(BF16_MATRIX_FEATURES)}), so torch emulates every bf16 product through fp32; set "
            "training.precision to fp32, or auto (which picks fp32 here)")


def hardware_problems(recipe: Recipe) -> list[str]:
    """What this recipe asks of the machine that the machine lacks, one `key: what: what to do` line each: its
    optional libraries (`library_problems`), then a GPU's features (`precision_problems` among them). Imports torch
    only when the recipe asks for something that needs a GPU."""
    import importlib.util

    t, m = recipe.training, recipe.model
    problems = library_problems(recipe)
    if not (m.attention == "flash_attention_2" or t.tf32 or t.precision == "fp16"):
        return problems
    import torch

    cuda = torch.cuda.is_available()
    if m.attention == "flash_attention_2":
        if not cuda:
            problems.append("model.attention: flash_attention_2 runs on NVIDIA GPUs only and this machine has no "
                            "CUDA device: use sdpa (the default, auto, picks it)")
        elif importlib.util.find_spec("flash_attn") is None:
            problems.append("model.attention: flash_attention_2 needs the flash-attn package, which is not installed: "
                            "pip install flash-attn --no-build-isolation, or use sdpa")
    if t.tf32 and not (cuda and torch.cuda.get_device_capability()[0] >= 8):
        problems.append("training.tf32: TF32 matmuls need an NVIDIA Ampere or newer GPU, which this machine lacks: "
                        "set training.tf32 to false")
    return problems + precision_problems(t.precision, cuda)
