"""A trained model written in the formats other runtimes read, one module per format: gguf (llama.cpp, Ollama,
LM Studio), ollama (the Modelfile beside a GGUF file), onnx (ONNX Runtime, for encoder runs). Each module writes
its format and reads it back; workflows/export.py merges the run, calls one of them, checks what it wrote against
the run's own outputs and records the export."""
