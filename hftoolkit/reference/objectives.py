"""Training objectives: label smoothing, the causal-LM shift, BERT's MLM masking, BART's noising.

Label smoothing (Szegedy et al., 2016): the target is (1 - eps) one-hot + eps uniform over K classes,
    loss = (1 - eps) * (-log p_y) + eps * mean_k(-log p_k)
which is what torch.nn.functional.cross_entropy(label_smoothing=eps) computes.

Causal LM: the logits at position t predict token t + 1, so logits[:, :-1] are scored
against labels[:, 1:] (positions labelled -100 are skipped). HF models do this shift
inside `loss_function` when given `labels=input_ids`.

MLM (Devlin et al., 2019): choose 15% of the non-special tokens; of those, 80% become
[MASK], 10% a random token, 10% stay as they are; the loss is on the chosen ones only.
The random and unchanged 10% keep the model from learning that only [MASK] matters.
Mirrors DataCollatorForLanguageModeling.torch_mask_tokens (transformers/data/data_collator.py).

BART noising (Lewis et al., 2020, section 2.2 and 5.1): text infilling masks 30% of the
tokens in spans whose lengths are drawn from Poisson(lambda = 3); each span, whatever its
length, becomes ONE mask token (a 0-length span inserts a mask), so the model must also
predict how many tokens are missing. Sentence permutation shuffles the sentences.
The span placement follows fairseq's DenoisingDataset in spirit: draw lengths until 30%
is covered, cut the last to fit, and place the spans so that they do not overlap.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# The label a loss skips: PyTorch's cross_entropy default, which transformers' models and collators use. Kept here,
# not imported from the toolkit's own (hftoolkit/sources/labels.py): this package stands apart from the toolkit.
IGNORE_INDEX = -100


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """logits: (N, K), target: (N,) -> the mean smoothed loss over targets that are not ignore_index."""
    keep = target != ignore_index
    log_p = logits[keep].log_softmax(dim=-1)  # (n, K)
    nll = -log_p.gather(1, target[keep, None]).squeeze(1)  # -log p_y
    uniform = -log_p.mean(dim=-1)  # cross-entropy against the uniform distribution
    return ((1 - smoothing) * nll + smoothing * uniform).mean()


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """logits: (B, T, V), labels: (B, T), unshifted (usually the input ids)."""
    predictions = logits[:, :-1]  # (B, T-1, V): positions 0 .. T-2 predict ...
    targets = labels[:, 1:]  # (B, T-1): ... tokens 1 .. T-1
    return F.cross_entropy(predictions.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=ignore_index)


def mlm_mask(
    input_ids: torch.Tensor,
    mask_token_id: int,
    vocab_size: int,
    special_tokens_mask: torch.Tensor | None = None,
    mlm_probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (inputs with 80/10/10 corruption, labels with -100 on tokens not chosen)."""
    chosen = torch.rand(input_ids.shape, generator=generator) < mlm_probability
    if special_tokens_mask is not None:
        chosen &= ~special_tokens_mask.bool()  # never mask [CLS], [SEP], padding
    labels = input_ids.masked_fill(~chosen, IGNORE_INDEX)
    u = torch.rand(input_ids.shape, generator=generator)  # one draw splits the chosen 80 / 10 / 10
    to_mask = chosen & (u < 0.8)
    to_random = chosen & (u >= 0.8) & (u < 0.9)
    random_tokens = torch.randint(vocab_size, input_ids.shape, generator=generator)
    inputs = input_ids.masked_fill(to_mask, mask_token_id)
    inputs = torch.where(to_random, random_tokens, inputs)
    return inputs, labels  # the other 10% of the chosen keep their token


def draw_span_lengths(
    n_to_mask: int, poisson_lambda: float = 3.0, generator: torch.Generator | None = None
) -> list[int]:
    """Poisson(lambda) draws until they cover n_to_mask tokens (the last draw may overshoot)."""
    rate = torch.tensor([poisson_lambda])
    lengths: list[int] = []
    covered = 0
    while covered < n_to_mask:
        lengths.append(int(torch.poisson(rate, generator=generator)))
        covered += lengths[-1]
    return lengths


def text_infilling(
    tokens: torch.Tensor,
    mask_token_id: int,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """tokens: (n,). Returns the noised tokens and the span lengths in order (the last one may be cut)."""
    n = tokens.numel()
    n_to_mask = math.ceil(n * mask_ratio)
    lengths = draw_span_lengths(n_to_mask, poisson_lambda, generator)
    if lengths:
        lengths[-1] -= sum(lengths) - n_to_mask  # cut the last span so that exactly n_to_mask tokens go
    kept = n - sum(lengths)
    # Stars and bars: among kept + len(lengths) slots, choose which slots hold a span.
    slots = kept + len(lengths)
    span_slots = set(torch.randperm(slots, generator=generator)[: len(lengths)].tolist())
    out, position, span = [], 0, 0
    for slot in range(slots):
        if slot in span_slots:
            out.append(mask_token_id)  # the whole span -> one mask
            position += lengths[span]
            span += 1
        else:
            out.append(int(tokens[position]))
            position += 1
    return torch.tensor(out, dtype=tokens.dtype), lengths


def sentence_permutation(
    tokens: torch.Tensor, sentence_end_id: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Split after every sentence_end_id (a full stop) and shuffle the sentences."""
    ends = (tokens == sentence_end_id).nonzero().flatten().tolist()
    bounds = [0] + [e + 1 for e in ends if e + 1 < tokens.numel()] + [tokens.numel()]
    sentences = [tokens[a:b] for a, b in zip(bounds, bounds[1:])]
    order = torch.randperm(len(sentences), generator=generator).tolist()
    return torch.cat([sentences[i] for i in order])
