"""The optional features' libraries: pyproject's extras, the modules each installs, and the one line said where a
feature's library is missing (what is missing, for what, and the pip command that installs it)."""

from __future__ import annotations

import importlib.util

from hftoolkit.base.errors import UserError

# pyproject's optional dependencies, by extra: the modules their libraries install, each with the name it goes by
# (tests/unit/base/test_extras.py holds this table to pyproject.toml).
EXTRAS = {
    "preference": {"trl": "TRL"},  # tasks preference and grpo (TRL's trainers)
    "gguf": {"gguf": "gguf"},  # a .gguf checkpoint, export --format gguf|ollama
    "quantization": {"bitsandbytes": "bitsandbytes"},  # model.quantization 8bit|4bit, the 8-bit optimizers
    "serve": {"fastapi": "FastAPI", "uvicorn": "uvicorn"},
    "benchmarks": {"lm_eval": "lm-evaluation-harness"},
    "deepspeed": {"deepspeed": "DeepSpeed"},
    "tensorboard": {"tensorboard": "TensorBoard"},
    "onnx": {"onnx": "onnx", "onnxruntime": "ONNX Runtime", "onnxscript": "onnxscript"},
    "search": {"optuna": "Optuna", "psycopg": "psycopg"},  # (psycopg: only for a --storage in PostgreSQL)
}


# What each extra enables, as `doctor` says it (docs/getting-started.md's table says the same).
FEATURES = {
    "preference": "task preference (DPO, IPO, ORPO, KTO) and task grpo (GRPO, RLOO)",
    "gguf": "a .gguf checkpoint, export --format gguf|ollama",
    "quantization": "model.quantization 8bit|4bit, training.optimizer adamw_8bit|paged_adamw_8bit",
    "serve": "serve",
    "benchmarks": "eval --benchmark, eval.benchmarks",
    "deepspeed": "ZeRO-2 and ZeRO-3 launches",
    "tensorboard": "training.report_to: tensorboard",
    "onnx": "export --format onnx, predict on an ONNX export",
    "search": "sweep --search",
}


def install_command(extra: str) -> str:
    return f"pip install 'hftoolkit[{extra}]'"


def missing_line(extra: str, feature: str, libraries: list[str] | None = None) -> str:
    """`feature` needs `libraries` (by default every library of `extra`), which are not installed: the command."""
    names = libraries or list(EXTRAS[extra].values())
    verb = "is" if len(names) == 1 else "are"
    return f"{feature} needs {' and '.join(names)}, which {verb} not installed: {install_command(extra)}"


def absent(extra: str) -> list[str]:
    """The names of `extra`'s libraries that are not installed here (found without importing them)."""
    return [name for module, name in EXTRAS[extra].items() if importlib.util.find_spec(module) is None]


def missing(extra: str, feature: str) -> str | None:
    """The line saying which of `extra`'s libraries `feature` lacks here, or None when all are installed."""
    names = absent(extra)
    return missing_line(extra, feature, names) if names else None


def requires(extra: str, feature: str) -> None:
    """Refuse `feature` in one line where a library of `extra` is not installed."""
    line = missing(extra, feature)
    if line:
        raise UserError(line)
