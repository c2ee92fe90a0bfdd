"""The four families, and the family of each tiny architecture `init:<arch>` builds: static facts, no I/O.

A real checkpoint's family is read from transformers' own tables once its config is loaded
(job/architectures.py); an `init:` checkpoint's is known before anything loads, so `validate` checks it.
"""

from hftoolkit.config import tasks

FAMILIES = ("encoder", "decoder", "seq2seq", "vision")

# What turns each family's input into tensors: the processor loaded with the checkpoint (job/resolve.py).
TOKENIZER, IMAGE_PROCESSOR = "tokenizer", "image processor"
PROCESSORS = {"encoder": TOKENIZER, "decoder": TOKENIZER, "seq2seq": TOKENIZER, "vision": IMAGE_PROCESSOR}

# Each tiny architecture is the course's example of its family (sources/tiny.py builds them).
INIT_FAMILIES = {"bert": "encoder", "gpt2": "decoder", "t5": "seq2seq", "bart": "seq2seq", "vit": "vision"}


# Model types whose activations overflow fp16 (training.precision auto never picks fp16 for them).
NO_FP16 = ("t5", "mt5", "umt5", "longt5")
# The model types whose pretraining objective `task: denoise` is (BART's text infilling).
DENOISERS = ("bart", "mbart")


def model_rules(model_type: str, task: str, precision: str) -> list[str]:
    """What a model type can't do, known from its name alone: checked by the validator for init: checkpoints
    (whose type is known before anything loads) and on resolve for every other."""
    problems = []
    if task == tasks.DENOISE and model_type not in DENOISERS:
        problems.append("task 'denoise' is BART's text-infilling objective: use a bart checkpoint")
    if model_type in NO_FP16 and precision == "fp16":
        problems.append("T5 overflows in fp16 and trains to NaN losses: set training.precision to bf16 or fp32")
    return problems


def static_family(checkpoint: str, family: str | None = None) -> str | None:
    """The family known without loading anything: model.family where set, else an init: checkpoint's."""
    if family or not checkpoint.startswith("init:"):
        return family
    return INIT_FAMILIES.get(checkpoint.removeprefix("init:"))


def reads_text(family: str | None) -> bool:
    """Whether the family's input is text, read through a tokenizer."""
    return PROCESSORS.get(family or "") == TOKENIZER
