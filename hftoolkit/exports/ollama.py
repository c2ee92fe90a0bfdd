"""An Ollama folder: the GGUF file and a Modelfile that `ollama create NAME -f Modelfile` takes as it is.

Ollama renders prompts with Go templates, not the Jinja chat templates transformers reads, so the run's template
is translated: rendered with a marker for each role's message, it gives the text around each message, and the
Go template writes the same text around each of Ollama's messages. A template that is not such a wrapper around
each message (one that rewrites the messages, or numbers them) is left out, and Ollama then takes the chat
template from the GGUF file's metadata. The translation is checked by rendering both on one conversation here.

The Modelfile also holds the run's stop tokens, its generation settings as parameters, and the system prompt:
the data's own when every conversation began with the same one, else the one the template adds by itself
(SmolLM2's), since Ollama renders a conversation without a system turn with the Modelfile's SYSTEM only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hftoolkit.exports.format import Exporting, Written
from hftoolkit.exports.gguf import GgufFormat

MODELFILE = "Modelfile"
ROLES = ("system", "user", "assistant")
_MARK = "\u2063{}\u2063"  # stands in for a message while the template is rendered


@dataclass(frozen=True)
class Wrapping:
    """The text the chat template writes before and after each role's message, and at the start of an answer."""

    around: dict[str, tuple[str, str]]
    generation: str
    default_system: str | None  # what the template says as system when the conversation has no system turn
    start: str = ""  # written once before the messages: a bos in the template's text that the tokenizer doesn't add

    def render(self, messages: list[dict]) -> str:
        """What the Go template below writes for `messages` (the prompt for the next answer)."""
        return self.start + "".join(self.around[m["role"]][0] + m["content"] + self.around[m["role"]][1]
                                    for m in messages) + self.generation

    def go_template(self) -> str:
        branches = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq .Role "{role}" }}}}{_go_text(before)}'
                           f"{{{{ .Content }}}}{_go_text(after)}" for i, (role, (before, after))
                           in enumerate(self.around.items()))
        return (f"{_go_text(self.start)}{{{{- range .Messages }}}}{branches}{{{{ end }}}}{{{{ end }}}}"
                f"{_go_text(self.generation)}")


def wrapping(tokenizer) -> Wrapping | None:
    """The run's chat template as text around each role's message, or None where it is not one."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None

    def render(messages, **options) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, **options)

    marks = [_MARK.format(role) for role in ROLES]
    try:
        full = render([{"role": role, "content": mark} for role, mark in zip(ROLES, marks)])
        prompt = render([{"role": "user", "content": marks[1]}], add_generation_prompt=True)
        without = render([{"role": "user", "content": marks[1]}])
    except Exception:  # a template that refuses a system turn or these roles (Jinja raises what it likes)
        return None
    start = _bos_in_text(tokenizer, full, without, prompt)
    full, without, prompt = (_bos_dropped(tokenizer, text[len(start):]) for text in (full, without, prompt))
    pieces = _between(full, marks)  # [before system, system..user, user..assistant, after assistant]
    if pieces is None or not prompt.startswith(without):
        return None
    end = pieces[3]
    # The text after the last message ends every message where the template gives each the same end
    # (ChatML's <|im_end|> and a line break); what follows it opens the next.
    ends = [end if p.startswith(end) else "" for p in pieces[1:3]]
    around = {"system": (pieces[0], ends[0]), "user": (pieces[1][len(ends[0]):], ends[1]),
              "assistant": (pieces[2][len(ends[1]):], end)}
    generation = prompt[len(without):]
    default = None
    if not without.startswith(around["user"][0] + marks[1]):  # something comes first: the template's own system
        text, sep, rest = without.removeprefix(pieces[0]).partition(around["system"][1])
        if not without.startswith(pieces[0]) or not sep or marks[1] in text or \
                rest != around["user"][0] + marks[1] + around["user"][1]:
            return None
        default = text
    found = Wrapping(around, generation, default, start)
    talk = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"}]
    system = [{"role": "system", "content": default}] if default is not None else []
    for conversation, as_ollama in (([{"role": "system", "content": "Be brief."}, *talk],) * 2, (talk, system + talk)):
        if _bos_dropped(tokenizer, render(conversation, add_generation_prompt=True)) != found.render(as_ollama):
            return None
    return found


def _bos_in_text(tokenizer, *rendered: str) -> str:
    """The bos every rendering starts with where the template writes it and the tokenizer does not add it."""
    bos = getattr(tokenizer, "bos_token", None)
    if bos and all(text.startswith(bos) for text in rendered) and not _adds_bos(tokenizer):
        return bos
    return ""


def _between(text: str, marks: list[str]) -> list[str] | None:
    """The text before, between and after the marks, in order; None if one is missing or out of order."""
    pieces, rest = [], text
    for mark in marks:
        before, found, rest = rest.partition(mark)
        if not found:
            return None
        pieces.append(before)
    return [*pieces, rest]


def _bos_dropped(tokenizer, text: str) -> str:
    """The rendered text without the bos the tokenizer adds by itself (llama.cpp adds it as the GGUF says)."""
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        return text[len(bos):]
    return text


def _adds_bos(tokenizer) -> bool:
    return tokenizer.bos_token_id is not None and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]


def _go_text(text: str) -> str:
    """Literal text of a Go template: `{{` would open an action, so it is written as an action printing it."""
    return text.replace("{{", '{{ "{{" }}')


def modelfile(gguf_name: str, tokenizer, stops: list[str], generation: dict, system: str | None) -> str:
    """The Modelfile's text: FROM the GGUF file beside it, the template where it translates, the parameters and
    the system prompt. `generation` is the run's eval.generation section as a dict; `system` the data's own."""
    wrap = wrapping(tokenizer)
    lines = [f"# Written by hftoolkit export: ollama create NAME -f {MODELFILE}", f"FROM ./{gguf_name}"]
    if wrap is not None:
        lines += ['TEMPLATE """' + wrap.go_template() + '"""']
    elif getattr(tokenizer, "chat_template", None):
        lines += ["# The chat template is not one Ollama's templates can write: Ollama reads it from the GGUF file."]
    for stop in dict.fromkeys(stops):
        lines.append(f"PARAMETER stop {json.dumps(stop)}")
    lines += [f"PARAMETER {name} {value}" for name, value in parameters(generation).items()]
    said = system if system is not None else wrap.default_system if wrap is not None else None
    if said:
        lines.append('SYSTEM """' + said.replace('"""', '\\"\\"\\"') + '"""')
    return "\n".join(lines) + "\n"


def parameters(generation: dict) -> dict[str, object]:
    """The run's decoding as Ollama's parameters: greedy and beam search are temperature 0 (Ollama has no beams)."""
    out: dict[str, object] = {"num_predict": generation["max_new_tokens"]}
    if generation["strategy"] != "sample":
        return {**out, "temperature": 0}
    out["temperature"] = generation["temperature"]
    out["top_k"] = generation.get("top_k") or 0  # (0: off, as the run samples)
    out["top_p"] = generation.get("top_p") or 1.0
    return out


def system_prompt(job) -> str | None:
    """The system turn every training conversation opens with, where they all share one; else None."""
    from itertools import islice

    rows = job.data.get("train") if hasattr(job.data, "get") else None
    if rows is None:
        return None
    seen = set()
    for row in islice(iter(rows), 1000):
        turns = row.get("messages") if isinstance(row, dict) else None
        if not turns or turns[0].get("role") != "system":
            return None
        seen.add(turns[0].get("content"))
        if len(seen) > 1:
            return None
    return next(iter(seen), None)


# ---------------------------------------------------------------- --format ollama


class OllamaFormat(GgufFormat):
    """`export --format ollama`: the GGUF file, checked as --format gguf checks it, and the Modelfile beside it."""

    name = "ollama"
    title = "Ollama"
    help = "the GGUF file and a Modelfile for `ollama create`"

    def write(self, export: Exporting) -> Written:
        from hftoolkit.models.families.decoder import CHAT_PROMPT_AND_TARGET

        written = super().write(export)
        tokenizer, job = export.processor, export.job
        # Where an answer ends when the model chats (its template's end of turn, and eos), whatever the task was
        stops = [tokenizer.decode([i]) for i in CHAT_PROMPT_AND_TARGET.stops(tokenizer) if i is not None]
        text = modelfile(written.files[0], tokenizer, stops, job.recipe.eval.generation.model_dump(),
                         system_prompt(job))
        export.write_text(export.folder / MODELFILE, text)  # (secrets masked: a system prompt may hold one)
        return Written([*written.files, MODELFILE])


FORMAT = OllamaFormat()
