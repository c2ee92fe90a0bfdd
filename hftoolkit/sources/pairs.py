"""Preference pairs: a prompt, a chosen answer and a rejected one, in the two layouts users bring.

Texts: data.text_column (the prompt), data.chosen_column and data.rejected_column. Conversations: chosen and
rejected are whole conversations that share their first turns (HuggingFaceH4/ultrafeedback_binarized): the shared
turns become the prompt and the rest each answer, as TRL's conversational format holds them; answers that are
assistant turns alone take their prompt from data.text_column (a text, the user's turn, or turns), as TRL's
conversational format with a separate prompt holds them. task reward also reads a pair's margin from a `margin`
column where the data has one (TRL's RewardTrainer reads the same column). Light: no torch.
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.sources.conversations import ANSWER, problem

# The column a pair's margin is read from (task reward): the chosen answer should win by at least this much.
MARGIN = "margin"


def is_conversation(value) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def conversation_pairs(ds, chosen: str, rejected: str, key: str, source: str, prompts: list | None = None,
                       margins: list[float] | None = None):
    """`ds` as canonical columns text (the shared turns), chosen and rejected (the turns after them), and margin where
    `margins` are given; a row whose conversations are not conversations, or do not share their prompt, is refused in
    one line (with a count). `prompts` (data.text_column's rows) go before answers that are assistant turns alone."""
    import datasets

    rows, bad = {"text": [], "chosen": [], "rejected": [], **({MARGIN: []} if margins is not None else {})}, []
    for row, (good, poor) in enumerate(zip(ds[chosen], ds[rejected], strict=True)):
        if prompts is not None and _answers_only(good) and _answers_only(poor):
            good, poor = as_turns(prompts[row]) + good, as_turns(prompts[row]) + poor
        line = (problem(good, row, source, f"data.chosen_column {chosen!r}")
                or problem(poor, row, source, f"data.rejected_column {rejected!r}")
                or _unshared(good, poor, row, key, source))
        if line:
            bad.append(line)
            continue
        shared = _shared_turns(good, poor)
        rows["text"].append(good[:shared])
        rows["chosen"].append(good[shared:])
        rows["rejected"].append(poor[shared:])
        if margins is not None:
            rows[MARGIN].append(margins[row])
    if bad:
        more = f" (and {len(bad) - 1} more rows like it)" if len(bad) > 1 else ""
        raise UserError(bad[0] + more)
    return datasets.Dataset.from_dict(rows)


def _answers_only(turns) -> bool:
    return is_conversation(turns) and turns[0].get("role") == ANSWER


def as_turns(prompt) -> list[dict]:
    """A prompt as conversation turns: a text is the user's turn."""
    return list(prompt) if is_conversation(prompt) else [{"role": "user", "content": str(prompt)}]


def margins(ds, key: str, source: str) -> list[float]:
    """The `margin` column's values as floats; a cell that is not a number is refused in one line."""
    out = []
    for row, value in enumerate(ds[MARGIN]):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if number != number or number in (float("inf"), float("-inf")):
            raise UserError(f"{key}: row {row} of {source} has margin {value!r}; task reward reads the margin "
                            "column as the number the chosen answer's score should beat the rejected one's by: "
                            "write a finite number, or rename the column if it means something else")
        out.append(number)
    return out


def common_prefix(a: list, b: list) -> int:
    """How many first items the two lists share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _shared_turns(good: list[dict], poor: list[dict]) -> int:
    """How many first turns the two conversations share: the prompt ends before the first answer that differs."""
    shared = common_prefix(good, poor)
    while shared and good[shared - 1]["role"] == ANSWER:  # (an answer both give is context, but the prompt
        shared -= 1                                       # ends on the turn the answers reply to)
    return shared


def _unshared(good: list[dict], poor: list[dict], row: int, key: str, source: str) -> str | None:
    """Why a pair of conversations is not a preference pair: no shared prompt, or no answer after it."""
    shared = _shared_turns(good, poor)
    where = f"{key}: row {row} of {source}"
    if shared == 0:
        return (f"{where}: the chosen and rejected conversations do not start with the same turns, so there is no "
                "prompt they answer: give both the prompt's turns first, then each its answer")
    if not good[shared:] or not poor[shared:] or good[shared]["role"] != ANSWER or poor[shared]["role"] != ANSWER:
        return (f"{where}: after the turns they share, the chosen and rejected conversations must each go on with "
                "an assistant answer: end both with the answer they are compared on")
    return None


def identical_rows(ds) -> list[int]:
    """The rows whose chosen and rejected answers are the same: they carry no preference."""
    return [i for i, (a, b) in enumerate(zip(ds["chosen"], ds["rejected"], strict=True)) if a == b]


def cut_counts(tokenizer, pairs, max_prompt: int, max_answer: int) -> dict[str, int]:
    """How many prompts are longer than max_prompt tokens and how many answers (chosen or rejected, or kto's
    labelled answer) longer than max_answer: what tokenization will cut; and the longest of each, in tokens.
    Conversations are counted as the chat template renders them."""
    from hftoolkit.sources.conversations import render

    def length(value, prompt: bool) -> int:
        text = render(tokenizer, value, add_generation_prompt=prompt) if is_conversation(value) else value
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompts = [length(p, True) for p in pairs["text"]]
    answers = [length(a, False) for column in ("chosen", "rejected", "target") if column in pairs.column_names
               for a in pairs[column]]
    return {"prompts": sum(n > max_prompt for n in prompts), "answers": sum(n > max_answer for n in answers),
            "longest_prompt": max(prompts, default=0), "longest_answer": max(answers, default=0)}
