"""A trained model written in the formats other runtimes read, one module per format, each holding its writer and
its `FORMAT` (exports/format.py's `ExportFormat`): gguf (llama.cpp, Ollama, LM Studio), ollama (the Modelfile
beside a GGUF file), onnx (ONNX Runtime, for encoder runs). workflows/export.py merges the run, asks the format
named by --format to write and check it, and records the export.

A new format is one module with its `FORMAT`, and one line below."""

from hftoolkit.exports import gguf, ollama, onnx
from hftoolkit.exports.format import ExportFormat

# --format's values, in the order the command's help and its refusals list them.
FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    gguf.FORMAT,
    ollama.FORMAT,
    onnx.FORMAT,
)}


def formats_help() -> str:
    """--format's help: what each format writes."""
    return "; ".join(f"{f.name}: {f.help}" for f in FORMATS.values()) + "."
