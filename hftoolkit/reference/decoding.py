"""Decoding: greedy, top-k and top-p (nucleus) filtering, and beam search with length normalisation.

`model` is any function from token ids (B, T) to next-token logits (B, T, V);
only the last position's logits are used at each step. Nothing is cached: every
step re-reads the whole prefix, which is slower than HF's KV cache and simpler.

Greedy: append argmax p(x_t | x_<t) until EOS or max_new_tokens.
Top-k (Fan et al., 2018): keep the k most probable tokens, renormalise, sample.
Top-p (Holtzman et al., 2020): keep the smallest set of tokens whose probability
mass reaches p, renormalise, sample.
Beam search: keep the `num_beams` best partial sequences by summed log-probability.
A finished hypothesis is scored by  sum log p / (generated length)^length_penalty,
so that long sequences are not punished merely for having more factors below 1
(Wu et al., 2016, use a smoothed variant; HF and this file use the plain power).

The beam search reproduces transformers' `_beam_search` (generation/utils.py) with
`early_stopping=True`: 2 * num_beams candidates are ranked at each step, so that
num_beams continue even if some end; a candidate ending in EOS becomes a finished
hypothesis only if it ranks among the top num_beams; the search stops when
num_beams hypotheses are finished or the length runs out (all running beams finish).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Model = Callable[[torch.Tensor], torch.Tensor]  # (B, T) token ids -> (B, T, V) logits


def greedy_decode(
    model: Model,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> torch.Tensor:
    """(B, T) prompts -> (B, T + generated); finished rows are padded with pad_token_id (default: EOS)."""
    ids = input_ids
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    for _ in range(max_new_tokens):
        next_token = model(ids)[:, -1].argmax(dim=-1)  # (B,)
        if eos_token_id is not None:
            next_token = next_token.masked_fill(finished, pad)
            finished |= next_token == eos_token_id
        ids = torch.cat([ids, next_token[:, None]], dim=1)  # (B, T + 1)
        if finished.all():
            break
    return ids


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf (ties with the k-th are kept)."""
    kth_largest = logits.topk(min(k, logits.size(-1)), dim=-1).values[..., -1:]  # (.., 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the most probable tokens until their mass reaches p; the rest -> -inf. The top token always stays."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above this one
    remove_sorted = mass_before >= p  # p already reached without this token
    remove_sorted[..., 0] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def sample_next_token(
    logits: torch.Tensor,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B, V) logits -> (B,) sampled token ids after temperature, top-k and top-p."""
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def beam_search(
    model: Model,
    prompt: torch.Tensor,
    num_beams: int,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    length_penalty: float = 1.0,
) -> torch.Tensor:
    """prompt: (T,) -> the best finished sequence (T + generated,), EOS included if it ended on one."""
    beams: list[tuple[torch.Tensor, float]] = [(prompt, 0.0)]  # running: (tokens, sum of log-probs)
    finished: list[tuple[float, torch.Tensor]] = []  # (length-normalised score, tokens)
    for step in range(1, max_new_tokens + 1):
        sequences = torch.stack([tokens for tokens, _ in beams])  # (nb, T + step - 1)
        log_probs = model(sequences)[:, -1].float().log_softmax(dim=-1)  # (nb, V)
        totals = log_probs + torch.tensor([score for _, score in beams])[:, None]  # (nb, V)
        vocab = totals.size(-1)
        scores, flat = totals.flatten().topk(2 * num_beams)  # beam-major flattening: index = beam * V + token
        running: list[tuple[torch.Tensor, float]] = []
        for rank, (score, index) in enumerate(zip(scores.tolist(), flat.tolist())):
            beam, token = divmod(index, vocab)
            tokens = torch.cat([sequences[beam], torch.tensor([token])])
            if token == eos_token_id or step == max_new_tokens:
                if rank < num_beams:  # only a top-num_beams candidate may finish
                    finished.append((score / step**length_penalty, tokens))
            elif len(running) < num_beams:
                running.append((tokens, score))
        finished = sorted(finished, key=lambda hyp: hyp[0], reverse=True)[:num_beams]
        if len(finished) == num_beams:  # early stopping: num_beams hypotheses are done
            break
        beams = running
    return finished[0][1]
