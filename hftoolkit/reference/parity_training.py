"""Parity rows for training: optimizers over 20 steps, and the objectives (losses, MLM and BART noising rates)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers

from hftoolkit.reference import objectives, optim
from hftoolkit.reference.parity import comparison
from hftoolkit.reference.parity_models import gpt2_pair

# --- optimizers ----------------------------------------------------------------------------------

STEPS = 20


def train(make_optimizer: Callable[[list[torch.nn.Parameter]], object]) -> torch.Tensor:
    """20 full-batch steps of a small tanh MLP on fixed regression data; returns the final parameters, flattened."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        x, y = torch.randn(32, 8), torch.randn(32, 4)
    optimizer = make_optimizer(list(model.parameters()))
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@comparison("optim.sgd", "torch.optim.SGD(lr=0.1)", "optimizer")
def sgd():
    return train(lambda ps: optim.SGD(ps, lr=0.1)), train(lambda ps: torch.optim.SGD(ps, lr=0.1))


@comparison("optim.momentum", "torch.optim.SGD(lr=eta*(1-beta), momentum=beta, dampening=0)", "optimizer")
def momentum():
    eta, beta = 0.5, 0.9  # the course's form, rescaled onto torch's (see optim.py)
    ours = train(lambda ps: optim.Momentum(ps, lr=eta, beta=beta))
    return ours, train(lambda ps: torch.optim.SGD(ps, lr=eta * (1 - beta), momentum=beta, dampening=0))


@comparison("optim.adagrad", "torch.optim.Adagrad(lr=0.05)", "optimizer")
def adagrad():
    return train(lambda ps: optim.Adagrad(ps, lr=0.05)), train(lambda ps: torch.optim.Adagrad(ps, lr=0.05))


@comparison("optim.rmsprop", "torch.optim.RMSprop(lr=0.01, alpha=0.99)", "optimizer")
def rmsprop():
    return train(lambda ps: optim.RMSProp(ps, lr=0.01)), train(lambda ps: torch.optim.RMSprop(ps, lr=0.01))


@comparison("optim.adam", "torch.optim.Adam(lr=0.01)", "optimizer")
def adam():
    return train(lambda ps: optim.Adam(ps, lr=0.01)), train(lambda ps: torch.optim.Adam(ps, lr=0.01))


@comparison("optim.adamw", "torch.optim.AdamW(lr=0.01, weight_decay=0.1)", "optimizer")
def adamw():
    ours = train(lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1))
    return ours, train(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1))


# --- losses --------------------------------------------------------------------------------------


@comparison("objectives.label_smoothing", "F.cross_entropy(label_smoothing=0.1, ignore_index=-100)", "loss")
def label_smoothing():
    logits, target = 2.0 * torch.randn(64, 10), torch.randint(10, (64,))
    target[::7] = objectives.IGNORE_INDEX
    ours = objectives.label_smoothed_cross_entropy(logits, target, 0.1)
    return ours, F.cross_entropy(logits, target, label_smoothing=0.1)


@comparison("objectives.causal_lm_loss", "GPT2LMHeadModel(labels=input_ids).loss", "loss")
def causal_lm_loss():
    _, hf = gpt2_pair()
    ids = torch.randint(100, (3, 10))
    labels = ids.clone()
    labels[1, 7:] = objectives.IGNORE_INDEX  # padding positions are left out of the loss
    out = hf(input_ids=ids, labels=labels)
    return objectives.causal_lm_loss(out.logits, labels), out.loss


# --- MLM 80/10/10 --------------------------------------------------------------------------------

MLM_ROWS, MLM_LENGTH = 1000, 200  # 200,000 tokens, about 30,000 chosen


@functools.cache
def word_level_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A 100-word tokenizer made on the spot (no download): 5 special tokens, then w0 .. w94."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(95)])}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")), pad_token="[PAD]", unk_token="[UNK]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def mlm_rates(original: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[P(chosen), P([MASK] | chosen), P(other token | chosen), P(unchanged | chosen)] among non-special tokens."""
    eligible = original >= 5  # the five special tokens are never chosen
    chosen = labels != objectives.IGNORE_INDEX
    n = chosen.sum().double()
    masked = (chosen & (inputs == mask_id)).sum()
    unchanged = (chosen & (inputs == original)).sum()
    other = n - masked - unchanged
    return torch.stack([n / eligible.sum(), masked / n, other / n, unchanged / n])


def mlm_batch(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    words = torch.randint(5, 100, (MLM_ROWS, MLM_LENGTH - 2), generator=generator)
    cls, sep = torch.full((MLM_ROWS, 1), 2), torch.full((MLM_ROWS, 1), 3)
    return torch.cat([cls, words, sep], dim=1)  # [CLS] w ... w [SEP]


@comparison("objectives.mlm_rates", "DataCollatorForLanguageModeling(mlm_probability=0.15)", "rate")
def mlm():
    tokenizer = word_level_tokenizer()
    ours_ids, theirs_ids = mlm_batch(1), mlm_batch(2)
    inputs, labels = objectives.mlm_mask(
        ours_ids, tokenizer.mask_token_id, len(tokenizer), special_tokens_mask=ours_ids < 5,
        generator=torch.Generator().manual_seed(3),
    )
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=4)
    batch = collator([{"input_ids": row} for row in theirs_ids.tolist()])
    return (
        mlm_rates(ours_ids, inputs, labels, tokenizer.mask_token_id),
        mlm_rates(theirs_ids, batch["input_ids"], batch["labels"], tokenizer.mask_token_id),
    )


# --- BART noising --------------------------------------------------------------------------------


@comparison("objectives.bart_span_lengths", "torch.distributions.Poisson(3) pmf, k = 0..12", "rate")
def bart_span_lengths():
    draws = torch.tensor(objectives.draw_span_lengths(60_000, 3.0, torch.Generator().manual_seed(5)))
    k = torch.arange(13)
    empirical = (draws[:, None] == k).double().mean(dim=0)  # about 20,000 draws
    return empirical, torch.distributions.Poisson(torch.tensor(3.0)).log_prob(k.float()).exp().double()
