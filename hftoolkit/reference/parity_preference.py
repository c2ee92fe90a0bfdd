"""Parity rows for the preference losses (reference/preference.py) against TRL's own trainer code.

TRL computes these losses inside its trainers' `_compute_loss`, so a row builds a trainer with `__new__`,
sets only the attributes that method reads, and lets a scripted policy hand it chosen log-probabilities
(float64: a float32 subtraction of summed log-probs near -100 already rounds by about 1e-5). The
real-batch rows run a tiny fp32 GPT-2 through TRL's fused LM head. TRL is imported here only; what these rows read of
its trainers (the attributes `_compute_loss` reads, ORPO's methods, the fused head) is checked, for the TRL releases
hftoolkit allows, by patches/trl_1_16.py's still_needed (this layer imports nothing of the toolkit).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import warnings
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace

import torch
import transformers

from hftoolkit.reference import preference
from hftoolkit.reference.objectives import IGNORE_INDEX
from hftoolkit.reference.parity import Skip, comparison
from hftoolkit.reference.parity_layers import gpt2_config, randomized

PAIRS = 8
BETA = 0.1
TRL_ABSENT = "TRL is not installed: hftoolkit's preference extra installs it"


@contextlib.contextmanager
def muted(*loggers: str) -> Iterator[None]:
    """Drop what these loggers emit meanwhile; a filter, since a library resets its logger's level on import."""
    drop_all = logging.Filter("\0")  # matches no logger name: every record is dropped
    for name in loggers:
        logging.getLogger(name).addFilter(drop_all)
    try:
        yield
    finally:
        for name in loggers:
            logging.getLogger(name).removeFilter(drop_all)


@functools.cache
def trl() -> SimpleNamespace:
    """TRL's trainers, imported on first use: importing TRL takes seconds that other rows should not pay. Without TRL
    (an extra of hftoolkit) the rows that compare against it are skipped."""
    if importlib.util.find_spec("trl") is None:
        raise Skip(TRL_ABSENT)
    # TRL's imports log a missing optional kernel (bitsandbytes) and the accelerator they pick (DeepSpeed)
    with muted("bitsandbytes.backends.cpu.ops", "DeepSpeed"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "you are importing from trl.experimental"
        from trl.experimental.orpo.orpo_trainer import ORPOTrainer
        from trl.trainer.dpo_trainer import DPOTrainer
        from trl.trainer.kto_trainer import KTOTrainer
        from trl.trainer.utils import add_fused_lm_head
    return SimpleNamespace(DPO=DPOTrainer, KTO=KTOTrainer, ORPO=ORPOTrainer, add_fused_lm_head=add_fused_lm_head)


class OneProcess:
    """The accelerator calls the trainers' loss code makes, on one CPU process: gathering is the identity."""

    device = torch.device("cpu")

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    gather_for_metrics = gather


class ScriptedPolicy(torch.nn.Module):
    """Stands in for a model patched by TRL's add_fused_lm_head: returns per-token log-probs whose sums are given.

    Row i of input_ids starts with the index of its sequence log-prob in `logps`; that whole value
    sits on the first position and zeros elsewhere, so TRL's sum over positions gives it back exactly.
    """

    def __init__(self, logps: torch.Tensor):
        super().__init__()
        self.logps = logps
        self.eval()  # TRL's "eval" mode: no token counting for the training throughput

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_) -> SimpleNamespace:
        per_token = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, dtype=self.logps.dtype)  # (B, T-1)
        per_token[:, 0] = self.logps[input_ids[:, 0]]
        zeros = torch.zeros_like(per_token)  # entropy and logits are only logged, never in the loss
        return SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool(),
                               log_sum_sq_probs=None, aux_loss=None)


def standin(trainer_class: type, model: torch.nn.Module, **attributes) -> object:
    """A trainer without __init__, holding the attributes its `_compute_loss` reads and a one-process accelerator."""
    trainer = trainer_class.__new__(trainer_class)
    trainer.model, trainer.accelerator = model, OneProcess()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens, trainer._tp_size, trainer.aux_loss_enabled = 0, 1, False
    for name, value in attributes.items():
        setattr(trainer, name, value)
    return trainer


def completion_rows(row_ids: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """input_ids whose first column is a row's index, and completion masks with `lengths` ones at the end."""
    width = int(lengths.max()) + 2  # one prompt token at least, and the shift drops one position
    positions = torch.arange(width)
    input_ids = torch.zeros(len(row_ids), width, dtype=torch.long)
    input_ids[:, 0] = row_ids
    completion_mask = (positions >= width - lengths[:, None]).long()  # (B, width)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": completion_mask}


def random_pairs(n: int = PAIRS) -> dict[str, torch.Tensor]:
    """Summed completion log-probs of plausible size, the reference within a few nats of the policy."""
    policy_chosen, policy_rejected = -20 - 100 * torch.rand(n, dtype=torch.float64), -20 - 100 * torch.rand(n).double()
    return {
        "policy_chosen": policy_chosen,
        "policy_rejected": policy_rejected,
        "ref_chosen": policy_chosen + 5 * torch.randn(n).double(),
        "ref_rejected": policy_rejected + 5 * torch.randn(n).double(),
        "chosen_lengths": torch.randint(5, 60, (n,)),
        "rejected_lengths": torch.randint(5, 60, (n,)),
    }


def trl_dpo_pair(pairs: dict[str, torch.Tensor], i: int, loss_type: str) -> torch.Tensor:
    """TRL's DPOTrainer._compute_loss on pair i alone: [loss, reward chosen, reward rejected, accuracy, margin]."""
    logps = torch.stack([pairs["policy_chosen"][i], pairs["policy_rejected"][i]])
    lengths = torch.stack([pairs["chosen_lengths"][i], pairs["rejected_lengths"][i]])
    trainer = standin(
        trl().DPO, ScriptedPolicy(logps), beta=BETA, loss_types=[loss_type], loss_weights=[1.0],
        f_divergence_type="reverse_kl", ld_alpha=None, use_weighting=False, precompute_ref_logps=True,
    )
    inputs = completion_rows(torch.arange(2), lengths)
    inputs["ref_chosen_logps"] = pairs["ref_chosen"][i, None]
    inputs["ref_rejected_logps"] = pairs["ref_rejected"][i, None]
    loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    logged = trainer._metrics["eval"]
    metrics = [logged[f"rewards/{name}"][-1] for name in ("chosen", "rejected", "accuracies", "margins")]
    return torch.cat([loss.detach().reshape(1), torch.tensor(metrics, dtype=torch.float64)])


@comparison("preference.dpo", "trl DPOTrainer._compute_loss(loss_type='sigmoid'): loss, rewards", "preference loss")
def dpo():
    pairs = random_pairs()
    args = (pairs["policy_chosen"], pairs["policy_rejected"], pairs["ref_chosen"], pairs["ref_rejected"])
    rewards = preference.implicit_rewards(*args, beta=BETA)
    ours = torch.stack([preference.dpo_loss(*args, beta=BETA), rewards.chosen, rewards.rejected, rewards.accuracy,
                        rewards.margin], dim=1)  # (pairs, 5)
    return ours, torch.stack([trl_dpo_pair(pairs, i, "sigmoid") for i in range(PAIRS)])


@comparison("preference.ipo[per_token]", "trl DPOTrainer._compute_loss(loss_type='ipo')", "preference loss")
def ipo():
    pairs = random_pairs()
    args = (pairs["policy_chosen"], pairs["policy_rejected"], pairs["ref_chosen"], pairs["ref_rejected"])
    ours = preference.ipo_loss(*args, tau=BETA, chosen_lengths=pairs["chosen_lengths"],
                               rejected_lengths=pairs["rejected_lengths"])
    return ours, torch.stack([trl_dpo_pair(pairs, i, "ipo")[0] for i in range(PAIRS)])


def mean_logps(n: int = PAIRS) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean per-token log-probs of completions, between about -3 and -0.05."""
    return -0.05 - 3 * torch.rand(n, dtype=torch.float64), -0.05 - 3 * torch.rand(n, dtype=torch.float64)


@comparison("preference.orpo[odds_ratio]", "trl ORPOTrainer.odds_ratio_loss: per pair, mean log odds ratio",
            "preference loss")
def orpo_odds_ratio():
    chosen, rejected = mean_logps()
    trainer = standin(trl().ORPO, torch.nn.Identity(), beta=BETA)
    losses, _, _, _, mean_log_odds = trainer.odds_ratio_loss(chosen, rejected)
    ours = BETA * preference.odds_ratio_loss(chosen, rejected)
    ours_log_odds = (preference.log_odds(chosen) - preference.log_odds(rejected)).mean()
    return torch.cat([ours, ours_log_odds.reshape(1)]), torch.cat([-losses, mean_log_odds.reshape(1)])  # TRL's sign


@comparison("preference.orpo", "trl ORPOTrainer.get_batch_loss_metrics: L_SFT + lambda * L_OR", "preference loss")
def orpo():
    chosen, rejected = mean_logps()
    nll = torch.tensor(2.5, dtype=torch.float64)
    logits = torch.zeros(PAIRS, 1, 1)  # only logged
    trainer = standin(trl().ORPO, torch.nn.Identity(), beta=BETA)
    trainer.concatenated_forward = lambda model, batch: (chosen, rejected, logits, logits, nll)  # the model's part
    loss, metrics = trainer.get_batch_loss_metrics(trainer.model, {})
    ours = preference.orpo_loss(nll, chosen, rejected, lam=BETA)
    ours_log_odds_ratio = -preference.odds_ratio_loss(chosen, rejected).mean()  # TRL logs log sigma(log OR)
    library = torch.tensor([float(loss), metrics["log_odds_ratio"]], dtype=torch.float64)
    return torch.stack([ours, ours_log_odds_ratio]), library


def random_kto(kl_shift: float) -> dict[str, torch.Tensor]:
    """Unpaired examples (half desirable), and mismatched (x, y') log-probs whose mean log-ratio is about kl_shift."""
    n = PAIRS
    policy = -20 - 100 * torch.rand(n, dtype=torch.float64)
    policy_kl = -20 - 100 * torch.rand(n, dtype=torch.float64)
    return {
        "policy": policy, "ref": policy + 5 * torch.randn(n).double(),
        "desirable": torch.tensor([True, False, True, True, False, False, True, False]),
        "policy_kl": policy_kl, "ref_kl": policy_kl - kl_shift + torch.randn(n).double(),
    }


def trl_kto(data: dict[str, torch.Tensor], rows: torch.Tensor, weights: tuple[float, float]) -> tuple[float, dict]:
    """TRL's KTOTrainer._compute_loss on the examples `rows`, with the whole batch's mismatched pairs for z0."""
    n = len(data["policy"])
    trainer = standin(
        trl().KTO, ScriptedPolicy(torch.cat([data["policy"], data["policy_kl"]])), beta=BETA, loss_type="kto",
        desirable_weight=weights[0], undesirable_weight=weights[1], calculate_KL=True, precompute_ref_logps=True,
    )
    batch = completion_rows(rows, torch.full((len(rows),), 4))
    kl = completion_rows(n + torch.arange(n), torch.full((n,), 4))
    batch.update({f"KL_{key}": value for key, value in kl.items()})
    batch.update(label=data["desirable"][rows], ref_logps=data["ref"][rows], ref_KL_logps=data["ref_kl"])
    loss = trainer._compute_loss(trainer.model, batch, return_outputs=False)
    return float(loss), trainer._metrics["eval"]


def kto_row(kl_shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[per-example losses, batch loss, z0, mean reward of desirable and of undesirable examples]."""
    data, weights = random_kto(kl_shift), (1.0, 1.33)
    z0 = preference.kto_reference_point(data["policy_kl"], data["ref_kl"])
    losses = preference.kto_loss(data["policy"], data["ref"], data["desirable"], z0, BETA, *weights)
    good, bad = data["desirable"], ~data["desirable"]
    rewards = preference.implicit_rewards(data["policy"][good], data["policy"][bad], data["ref"][good],
                                          data["ref"][bad], BETA)
    ours = torch.cat([losses, torch.stack([losses.mean(), z0, rewards.chosen.mean(), rewards.rejected.mean()])])

    each = [trl_kto(data, torch.tensor([i]), weights)[0] for i in range(PAIRS)]  # one example, the same z0
    loss, logged = trl_kto(data, torch.arange(PAIRS), weights)
    batch = [loss, logged["kl"][-1], logged["rewards/chosen"][-1], logged["rewards/rejected"][-1]]
    return ours, torch.tensor(each + batch, dtype=torch.float64)


@comparison("preference.kto", "trl KTOTrainer._compute_loss(loss_type='kto'): losses, z0, rewards", "preference loss")
def kto():
    return kto_row(kl_shift=2.0)


@comparison("preference.kto[z0_clamped]", "trl KTOTrainer._compute_loss, a negative KL estimate", "preference loss")
def kto_clamped():
    return kto_row(kl_shift=-2.0)  # the estimate is negative: z0 must be clamped to 0


# --- a real batch --------------------------------------------------------------------------------


@functools.cache
def preference_batch() -> tuple[transformers.GPT2LMHeadModel, dict[str, torch.Tensor]]:
    """A tiny random fp32 GPT-2 patched with TRL's fused LM head, and 3 prompt + chosen / rejected pairs.

    Rows are [chosen..., rejected...] as TRL batches them, right-padded; labels are -100 on the
    prompt and the padding, so that only the completion is scored.
    """
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = randomized(transformers.GPT2LMHeadModel(gpt2_config()))
        prompts, completions = torch.randint(3, 7, (3,)).repeat(2), torch.randint(2, 8, (6,))
        width = int((prompts + completions).max())
        input_ids = torch.randint(1, 100, (6, width))
        positions = torch.arange(width)
        attention_mask = (positions < (prompts + completions)[:, None]).long()
        completion_mask = attention_mask * (positions >= prompts[:, None]).long()
    trl().add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    labels = input_ids.masked_fill(completion_mask == 0, IGNORE_INDEX)
    return model, {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
                   "labels": labels}


@comparison("preference.sequence_logps[real batch]", "trl add_fused_lm_head(GPT2LMHeadModel).log_probs.sum(-1)",
            "sequence log-prob")
def sequence_logps_real_batch():
    model, batch = preference_batch()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        fused = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                      fused_lm_head=True)
    return preference.sequence_logps(logits, batch["labels"]), fused.log_probs.sum(-1)


@comparison("preference.sequence_logps[average]", "trl ORPOTrainer.get_batch_logps(average_log_prob=True)",
            "sequence log-prob")
def sequence_logps_average():
    model, batch = preference_batch()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    library = trl().ORPO.get_batch_logps(logits, batch["labels"], average_log_prob=True)
    return preference.sequence_logps(logits, batch["labels"], average=True), library


@comparison("preference.dpo[real batch]", "trl DPOTrainer._compute_loss on a fused GPT-2, policy and reference",
            "preference loss")
def dpo_real_batch():
    model, batch = preference_batch()
    with torch.random.fork_rng():
        torch.manual_seed(1)
        reference = randomized(transformers.GPT2LMHeadModel(gpt2_config()))
    trl().add_fused_lm_head(reference)
    trainer = standin(
        trl().DPO, model, ref_model=reference, args=SimpleNamespace(gradient_checkpointing_kwargs=None), beta=BETA,
        loss_types=["sigmoid"], loss_weights=[1.0], f_divergence_type="reverse_kl", ld_alpha=None,
        use_weighting=False, precompute_ref_logps=False,
    )
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "completion_mask")}
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        with muted("DeepSpeed"):  # its first accelerator lookup (CPU here) logs to stdout
            library = trainer._compute_loss(model, inputs, return_outputs=False)
        policy = preference.sequence_logps(model(input_ids=ids, attention_mask=mask).logits, batch["labels"])
        ref = preference.sequence_logps(reference(input_ids=ids, attention_mask=mask).logits, batch["labels"])
    ours = preference.dpo_loss(policy[:3], policy[3:], ref[:3], ref[3:], beta=BETA).mean()
    return ours, library
