"""The four families, and the family of each tiny architecture `init:<arch>` builds: static facts, no I/O.

A real checkpoint's family is read from transformers' own tables once its config is loaded
(job/architectures.py); an `init:` checkpoint's is known before anything loads, so `validate` checks it.
"""

FAMILIES = ("encoder", "decoder", "seq2seq", "vision")

# Each tiny architecture is the course's example of its family (sources/tiny.py builds them).
INIT_FAMILIES = {"bert": "encoder", "gpt2": "decoder", "t5": "seq2seq", "bart": "seq2seq", "vit": "vision"}


def static_family(checkpoint: str, family: str | None = None) -> str | None:
    """The family known without loading anything: model.family where set, else an init: checkpoint's."""
    if family or not checkpoint.startswith("init:"):
        return family
    return INIT_FAMILIES.get(checkpoint.removeprefix("init:"))
