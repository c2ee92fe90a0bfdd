"""Conversations: lists of `{role, content}` turns, checked, rendered and tokenized with the loss on the answers.

A conversation data set has a `data.messages_column` (default `messages`) whose rows are lists of turns, as most
hub instruction sets ship them. It is rendered with the tokenizer's chat template, or the plain format below
where there is none. Light: imports nothing heavy (the tokenizer is handed in).
"""

from __future__ import annotations

from dataclasses import dataclass

from hftoolkit.base.errors import UserError
from hftoolkit.sources.labels import IGNORE_INDEX

ANSWER = "assistant"
# The plain format, for a tokenizer without a chat template: one turn a line, `role: content`, each answer
# followed by the tokenizer's eos; generation starts after "assistant: ".
PLAIN_TURN = "{role}: {content}"


@dataclass(frozen=True)
class Encoded:
    """One conversation tokenized: ids, labels (-100 outside the answers), and how it was cut to fit."""

    input_ids: list[int]
    labels: list[int]
    cut: str | None = None  # None (it fit), "turn" (later turns dropped), "inside" (cut inside a turn)


def problem(turns, row: int, source: str, key: str) -> str | None:
    """What is wrong with one row of a messages column, as a recipe problem line; None when it is a conversation."""
    where = f"{key}: row {row} of {source}"
    if not isinstance(turns, list) or not turns:
        return f"{where} is not a list of turns: each row holds a list of {{role, content}} mappings"
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) \
                or not isinstance(turn.get("content"), str):
            return (f"{where}: turn {i} is not a {{role, content}} mapping of two strings ({str(turn)[:60]}): "
                    "write each turn as {\"role\": \"user\", \"content\": \"...\"}")
    if turns[0]["role"] == ANSWER:
        return f"{where} starts with an assistant turn: start each conversation with a system or user turn"
    return None


def answered(turns: list[dict]) -> bool:
    """Whether the conversation holds an answer to learn (an assistant turn with text)."""
    return any(t["role"] == ANSWER and t["content"].strip() for t in turns)


def question(turns: list[dict]) -> list[dict]:
    """The turns that the model answers at eval and predict time: up to the last user turn (a final assistant
    turn, the reference answer, is left out)."""
    last = max((i for i, t in enumerate(turns) if t["role"] != ANSWER), default=-1)
    return turns[:last + 1]


def reference(turns: list[dict]) -> str:
    """The answer the eval compares with: the last assistant turn's text ("" where the last turn is not one)."""
    return turns[-1]["content"] if turns and turns[-1]["role"] == ANSWER else ""


def last_user_text(turns: list[dict]) -> str:
    """What a prediction record shows as the input: the last user turn's text."""
    return next((t["content"] for t in reversed(turns) if t["role"] != ANSWER), "")


def render(tokenizer, turns: list[dict], add_generation_prompt: bool = False) -> str:
    """The conversation as the model reads it: the chat template's rendering, or the plain format."""
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as err:  # jinja's TemplateError, or raise_exception() inside the template
            raise UserError(f"data.messages_column: the chat template refuses a conversation "
                            f"({str(err).splitlines()[0][:120]}): fix the turns' roles or order") from None
    eos = tokenizer.eos_token or ""
    lines = [PLAIN_TURN.format(**t) + (eos if t["role"] == ANSWER else "") + "\n" for t in turns]
    return "".join(lines) + (f"{ANSWER}: " if add_generation_prompt else "")


def answer_spans(tokenizer, turns: list[dict], full: str) -> list[tuple[int, int]]:
    """(start, end) characters of each assistant turn in `full`: from after the generation prompt to the end of
    the token that closes the turn (eos where the template writes one; what follows it is not trained).

    Where the loss falls is read from the rendering itself: the template is rendered once for the whole
    conversation, and once up to each assistant turn with the generation prompt; the characters between the two
    are that turn's answer. So the labels follow any template that renders a conversation's beginning the same
    way whether it ends there or goes on; one that does not is refused in one line."""
    spans = []
    for i, turn in enumerate(turns):
        if turn["role"] != ANSWER:
            continue
        before = render(tokenizer, turns[:i], add_generation_prompt=True)
        through = render(tokenizer, turns[:i + 1])
        if not (full.startswith(before) and full.startswith(through)):
            raise UserError("data.messages_column: the chat template renders a conversation's beginning differently "
                            "when more turns follow, so the answers can't be found in it: use a checkpoint whose "
                            "template renders turns one after another, or text and target columns")
        end, eos = len(through), tokenizer.eos_token
        closing = through.rfind(eos, len(before)) if eos else -1
        end = closing + len(eos) if closing >= 0 else len(through.rstrip())
        spans.append((len(before), end))
    return spans


def encode(tokenizer, turns: list[dict], max_length: int) -> Encoded:
    """The conversation's token ids (as the rendering tokenizes whole) and labels: the ids of the tokens that
    start inside an answer (`answer_spans`), -100 elsewhere. Longer than max_length: cut after the last assistant
    turn that fits, or at max_length where even the first answer does not."""
    full = render(tokenizer, turns)
    spans = answer_spans(tokenizer, turns, full)
    try:
        tokens = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:  # a Python ("slow") tokenizer: no character offsets
        raise UserError("data.messages_column: the checkpoint's tokenizer can't say which characters each token "
                        "covers (a slow tokenizer), so the answers can't be found: save its fast version "
                        "(tokenizer.json) into the checkpoint") from None
    ids, offsets = tokens["input_ids"], tokens["offset_mapping"]
    labels, ends, span = [IGNORE_INDEX] * len(ids), [], 0
    for j, (start, _) in enumerate(offsets):
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        if span < len(spans) and spans[span][0] <= start:
            labels[j] = ids[j]
            if j + 1 == len(ids) or offsets[j + 1][0] >= spans[span][1]:
                ends.append(j + 1)  # the token after an answer's last
    if len(ids) <= max_length:
        return Encoded(ids, labels)
    fits = [end for end in ends if end <= max_length]
    cut, kind = (fits[-1], "turn") if fits else (max_length, "inside")
    return Encoded(ids[:cut], labels[:cut], kind)


def prompt(tokenizer, turns: list[dict]) -> list[int]:
    """Token ids the model answers from: the turns up to the last user turn, and the generation prompt."""
    return tokenizer(render(tokenizer, question(turns), add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]


def cut_counts(tokenizer, conversations, max_length: int) -> dict[str, int]:
    """How many conversations are longer than max_length, by how they are cut: {"turn": n, "inside": m}, and the
    longest in tokens ("longest"); raises UserError where the template can't be split into prompts and answers."""
    counts = {"turn": 0, "inside": 0}
    conversations = list(conversations)
    # One batched tokenization finds the long ones; only those are encoded turn by turn to see where they are cut.
    lengths = [len(ids) for ids in tokenizer([render(tokenizer, turns) for turns in conversations],
                                             add_special_tokens=False)["input_ids"]]
    for i, (turns, length) in enumerate(zip(conversations, lengths)):
        # (the first is encoded whatever its length: a template whose answers can't be found is refused here)
        kind = encode(tokenizer, turns, max_length).cut if length > max_length or i == 0 else None
        if kind:
            counts[kind] += 1
    return {**counts, "longest": max(lengths, default=0)}
