"""`export --format gguf`: the run's causal LM as one .gguf file (written by exports/gguf_file.py), read back through
transformers' GGUF loader and checked beside the run's model."""

from __future__ import annotations

from hftoolkit.base import console
from hftoolkit.base.errors import UserError
from hftoolkit.exports.format import Check, Exporting, Written
from hftoolkit.exports.gguf_file import QUANTIZATIONS, read_back, refusal, round_like_file, write_gguf

# An export whose outputs differ from those of the run's model with its weights rounded as the file stores them
# by more than this share of the largest logit is wrong (a tensor misplaced, a setting lost), not rounded.
GGUF_TOLERANCE = 1e-3


class GgufFormat:
    """`export --format gguf`: the run's causal LM as one .gguf file, read back through transformers' GGUF loader
    and run beside the run's model: logits against the run's weights rounded as the file stores them, greedy
    answers, and the tokenizer's ids."""

    name = "gguf"
    title = "GGUF"
    help = "one .gguf file for llama.cpp and LM Studio (decoder runs)"
    runs = "decoder runs"
    holds = "GGUF holds a decoder language model (llama.cpp and Ollama run those)"
    extra = "gguf"
    quantizations = QUANTIZATIONS
    default_quantization = "f16"

    def takes(self, family: str | None, task: str) -> bool:
        from hftoolkit.config import tasks

        return family == "decoder" and tasks.head(task, family) == tasks.CAUSAL_LM

    def write(self, export: Exporting) -> Written:
        held = refusal(export.model.config.model_type)
        if held:
            raise UserError(f"--format {self.name}: {held}")
        name = f"{_slug(export.job.recipe.name)}-{export.quantization}.gguf"
        console.phase(f"writing {name}")
        write_gguf(export.model, export.processor, export.folder / name, export.quantization,
                   chat_template=getattr(export.processor, "chat_template", None), name=export.job.recipe.name)
        return Written([name])

    def check(self, export: Exporting, written: Written) -> Check:
        import dataclasses

        import torch

        from hftoolkit.config.recipe import replaced

        name, inputs, model, form, quantization = (written.files[0], export.inputs, export.model, export.form,
                                                   export.quantization)
        console.phase(f"checking {name}: read back with transformers' GGUF loader, run beside the run's model")
        job = export.job
        greedy = dataclasses.replace(job, recipe=replaced(job.recipe, {"eval.generation.strategy": "greedy"},
                                                          "export"))
        ids = _prompt_ids(greedy, form, export.processor, inputs)
        ours = _logits(model, ids)
        answers = form.generate(greedy, model, export.processor, inputs)
        back, back_tokenizer = read_back(export.folder / name)
        theirs = _logits(back, ids)
        back_answers = form.generate(greedy, back, back_tokenizer, inputs)
        same_ids = ids == _prompt_ids(greedy, form, back_tokenizer, inputs)
        del back
        with torch.no_grad():  # the run's model with its weights rounded as the file stores them
            round_like_file(model, quantization)
        rounded = _logits(model, ids)
        scale = max(float(max(t.abs().max() for t in ours)), 1.0)
        vs_run = max(float((a - b).abs().max()) for a, b in zip(ours, theirs))
        vs_rounding = max(float((a - b).abs().max()) for a, b in zip(rounded, theirs))
        rounding = max(float((a - b).abs().max()) for a, b in zip(ours, rounded))
        equal = sum(a == b for a, b in zip(answers, back_answers))
        line = (f"checked {name} on {len(inputs)} eval inputs: largest logit difference from the run {vs_run:.3g} "
                f"({quantization} rounding of the weights alone: {rounding:.3g}); greedy answers identical "
                f"{equal}/{len(inputs)}; tokenizer {'identical' if same_ids else 'DIFFERS'}")
        return Check(line, same_ids and vs_rounding <= GGUF_TOLERANCE * scale, {
            "inputs": len(inputs), "max_logit_difference": vs_run, "rounding_difference": rounding,
            "difference_beyond_rounding": vs_rounding, "greedy_identical": equal, "tokenizer_identical": same_ids})


FORMAT = GgufFormat()


def _prompt_ids(job, form, tokenizer, inputs: list) -> list[list[int]]:
    """The token ids generation starts from: the formulation's prompts where it has them, else the text's."""
    if hasattr(form, "prompts") and all(isinstance(x, str) for x in inputs):
        return form.prompts(job, tokenizer, inputs)
    if any(isinstance(x, list) for x in inputs):
        from hftoolkit.sources.conversations import prompt

        return [prompt(tokenizer, x) for x in inputs]
    return tokenizer(list(inputs))["input_ids"]


def _logits(model, ids: list[list[int]]):
    import torch

    model.eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([row], device=model.device)).logits[0].float().cpu() for row in ids]


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"
