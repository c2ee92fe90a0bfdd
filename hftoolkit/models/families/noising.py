"""BART's noising for the denoise task: sentence permutation, then text infilling, on token ids.

Lewis et al. 2020, section 2.2, with the settings of its best model (and of fairseq's DenoisingDataset); where
this departs from fairseq, on purpose, `noise` says so. Special tokens are never masked or moved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

MASK_RATIO = 0.3
POISSON_LAMBDA = 3.0
SENTENCE_END = (".", "!", "?")


def noise(ids: Sequence[int], special_ids: set[int], mask_id: int, is_sentence_end: Callable[[int], bool],
          rng, ratio: float = MASK_RATIO, lam: float = POISSON_LAMBDA) -> list[int]:
    """The noised copy of `ids`: each run of non-special tokens permuted by sentence, then span-masked.

    Spans with Poisson(lam) lengths are masked until `ratio` of the tokens are, each replaced by ONE mask token
    (a zero-length span inserts one), so the model must also infer how many tokens are missing. Unlike fairseq,
    on purpose: masking works on tokens, not whole words; spans never overlap, so exactly the budgeted share is
    masked; the budget is rounded at random, so short texts are masked at `ratio` on average too; masked tokens
    are never swapped for random ones. rng: a numpy Generator; the same state gives the same noise.
    """
    out: list[int] = []
    run: list[int] = []
    for token in [*ids, None]:  # None flushes the last run
        if token is not None and token not in special_ids:
            run.append(token)
            continue
        if run:
            body = permute_sentences(run, is_sentence_end, rng)
            out += apply_spans(body, infill_spans(len(body), rng, ratio, lam), mask_id)
            run = []
        if token is not None:
            out.append(token)
    return out


def permute_sentences(tokens: list[int], is_sentence_end: Callable[[int], bool], rng) -> list[int]:
    """The sentences of `tokens` (each ending after a sentence-end token) in a random order."""
    sentences, current = [], []
    for token in tokens:
        current.append(token)
        if is_sentence_end(token):
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return [token for i in rng.permutation(len(sentences)) for token in sentences[i]]


def infill_spans(n: int, rng, ratio: float = MASK_RATIO, lam: float = POISSON_LAMBDA) -> list[tuple[int, int]]:
    """(start, length) of the spans to mask in a run of `n` tokens, in order and not overlapping.

    Span lengths are drawn from Poisson(lam) until they cover the budget (the last one trimmed
    to fit), as in fairseq; a length of 0 is an inserted mask. Spans are placed uniformly at
    random: the kept tokens and the spans, as blocks, are put in a random order.
    """
    exact = n * ratio
    budget = math.floor(exact) + int(rng.random() < exact - math.floor(exact))
    lengths, covered = [], 0
    while covered < budget:
        length = min(int(rng.poisson(lam)), budget - covered)
        lengths.append(length)
        covered += length
    kept = n - budget
    block_slots = set(rng.choice(kept + len(lengths), size=len(lengths), replace=False).tolist())
    spans, position, next_span = [], 0, 0
    for slot in range(kept + len(lengths)):
        if slot in block_slots:
            spans.append((position, lengths[next_span]))
            position += lengths[next_span]
            next_span += 1
        else:
            position += 1
    return spans


def apply_spans(tokens: list[int], spans: list[tuple[int, int]], mask_id: int) -> list[int]:
    """`tokens` with each span replaced by one `mask_id` (a zero-length span inserts one)."""
    out, position = [], 0
    for start, length in spans:
        out += tokens[position:start]
        out.append(mask_id)
        position = start + length
    return out + tokens[position:]
