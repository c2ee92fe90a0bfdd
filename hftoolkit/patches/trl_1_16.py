"""TRL 1.16: the trainers' own code that task preference steps into (training/preference.py, the formulation's
collators) and that the parity rows drive (reference/parity_preference.py).

- `_prepare_dataset` tokenizes text rows; hftoolkit's rows arrive tokenized in TRL's layout (prompt_ids,
  chosen_ids, rejected_ids; kto: completion_ids and label), so `TokenizedPreference` answers it, adding only KTO's
  mismatched answers (`KL_completion_ids`, which TRL's collator and `_compute_loss` read).
- `_precompute_ref_logps` is skipped: "precomputed" reference log-probabilities are asked for only to keep TRL from
  loading a reference copy for a method without one (ORPO), and there is nothing to compute.
- `_compute_loss(model, inputs, return_outputs)` is the DPO trainer's loss; ORPO's is put in its place.
- ORPO's loss reads the per-token log-probabilities of TRL's fused LM head (`add_fused_lm_head`, which the DPO
  trainer puts on the model; `model(..., fused_lm_head=True).log_probs`), calls `ORPOTrainer.odds_ratio_loss`
  (trl.experimental in 1.x) with the DPO trainer as its `self`, and logs into the trainer's `_metrics`.
- TRL copies an adapter it is handed into a frozen "ref" adapter; it is deleted (`TokenizedPreference.__init__`).
- The collators are imported from TRL's trainer modules (trl does not export them).
- GRPO and RLOO build a full fine-tuning's reference by reading the checkpoint again from the model's path
  (`create_model_from_path` in their modules); `reference_copied` hands them a frozen copy of the loaded model.

Why 1.16 and not earlier: 1.14 and before compute log-probabilities from full logits, with no fused head for ORPO's
loss and the parity rows to read; 1.15 has the head, but its kernel needs Triton (trl/trainer/utils.py sets
`_ChunkedLogProbFunction` to None where `trl.kernels` fails to import it), which torch's CPU builds lack, so every
DPO, KTO or ORPO step fails there ("'NoneType' object has no attribute 'apply'"); 1.16 computes it in torch where
Triton is missing. The parity rows (reference/ imports nothing of the toolkit) build trainers with `__new__` and set
the attributes `_compute_loss` reads; `LOSS_READS` records those, and `still_needed` says when TRL reads one more.
"""

from __future__ import annotations

import contextlib
import warnings

LIBRARY = "trl"
VERSIONS = ">=1.16,<1.17"  # (1.16.0 checked; 1.15.0 tried and refused: see above)

# The attributes TRL's `_compute_loss` reads from its trainer (1.16): what a parity stand-in may have to set.
LOSS_READS = {
    "DPOTrainer": frozenset({
        "_metrics", "_total_train_tokens", "_tp_size", "accelerator", "args", "aux_loss_enabled", "beta",
        "f_alpha_divergence_coef", "f_divergence_type", "label_smoothing", "ld_alpha", "loss_types", "loss_weights",
        "model", "precompute_ref_logps", "ref_model", "router_aux_loss_coef", "use_weighting"}),
    "KTOTrainer": frozenset({
        "_compute_kl_logps", "_metrics", "_total_train_tokens", "_tp_size", "accelerator", "args", "aux_loss_enabled",
        "beta", "calculate_KL", "desirable_weight", "loss_type", "model", "precompute_ref_logps", "ref_model",
        "router_aux_loss_coef", "undesirable_weight"}),
}
# The methods TokenizedPreference answers in place of TRL's, with the parameters TRL calls them with.
SIGNATURES = {"_prepare_dataset": ["self", "dataset", "processing_class", "args", "dataset_name"],
              "_precompute_ref_logps": ["self", "dataset", "name", "batch_size"],
              "_compute_loss": ["self", "model", "inputs", "return_outputs"]}
# What the fused LM head computes for the DPO trainer's metrics (and the parity rows' real batch).
FUSED_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")
# The methods of TRL's experimental ORPO trainer that training and the parity rows call.
ORPO_METHODS = ("odds_ratio_loss", "get_batch_logps", "get_batch_loss_metrics", "concatenated_forward")


class TokenizedPreference:
    """Placed before TRL's DPOTrainer or KTOTrainer: datasets taken as tokenized, no reference pass precomputed, no
    "ref" adapter, and `loss_in_place(model, inputs)`, where a subclass sets one, computed instead of DPO's loss."""

    loss_in_place = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # TRL copies an adapter it is handed into a frozen "ref" adapter, the reference for an adapter trained
        # earlier. This run's adapter starts at zero (an earlier run's is merged into the base as it loads), and a
        # finished run is scored against its base: the base with the adapter switched off is that reference,
        # without a second adapter (nor its saved copy).
        if "ref" in (getattr(self.model, "peft_config", None) or {}):
            self.model.delete_adapter("ref")

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        # KTO estimates its KL term from mismatched answers, each batch's rotated by one, as TRL does, but over the
        # batch of all processes (TRL: of each), so that processes train as one process would.
        from trl import KTOTrainer

        if not isinstance(self, KTOTrainer):
            return dataset
        if dataset_name == "train":  # (read in order: see training/arguments.batch_order)
            dataset = dataset.shuffle(seed=args.seed)
        if not self.calculate_KL:
            return dataset
        from accelerate import PartialState  # (the Trainer's accelerator is not built yet)

        batch = args.per_device_train_batch_size * PartialState().num_processes
        return dataset.map(lambda rows: {"KL_completion_ids": rows["completion_ids"][-1:]
                                         + rows["completion_ids"][:-1]}, batched=True, batch_size=batch)

    def _precompute_ref_logps(self, dataset, name, batch_size):
        return dataset  # (asked for only by a method without a reference: there is nothing to compute)

    def _compute_loss(self, model, inputs, return_outputs):
        if self.loss_in_place is None:
            return super()._compute_loss(model, inputs, return_outputs)
        return self.loss_in_place(model, inputs)


# The trainer modules whose reference model `reference_copied` provides.
REFERENCE_BUILDERS = ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer")


@contextlib.contextmanager
def reference_copied(model, beta: float):
    """While GRPO's or RLOO's trainer is built: with a KL term (beta > 0) and no adapter to switch off, its
    reference is a frozen copy of `model` as loaded, not the checkpoint read again from the model's path."""
    import copy
    import importlib

    if beta == 0 or getattr(model, "peft_config", None):
        yield
        return
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    modules = [importlib.import_module(name) for name in REFERENCE_BUILDERS]
    originals = [module.create_model_from_path for module in modules]
    try:
        for module in modules:
            module.create_model_from_path = lambda *args, **kwargs: reference
        yield
    finally:
        for module, original in zip(modules, originals):
            module.create_model_from_path = original


def fused_log_probs(model, inputs: dict, labels):
    """Per-token log-probabilities of `labels` (-100 where not scored) from the fused LM head the DPO trainer put on
    `model`: (B, T - 1), position t's of token t + 1."""
    return model(**inputs, labels=labels, use_cache=False, fused_lm_head=True).log_probs


def odds_ratio_loss(trainer, chosen, rejected):
    """TRL's ORPO odds-ratio loss of mean log-probabilities, `trainer` (a DPO trainer: `beta`, `accelerator`) as its
    self: (losses, chosen rewards, rejected rewards, mean log-sigmoid of the log odds ratio, mean log odds ratio)."""
    return orpo_trainer().odds_ratio_loss(trainer, chosen, rejected)


def log_metric(trainer, name: str, value: float) -> None:
    """One step's `value` of `name`, averaged with the others by TRL's `log` as it logs."""
    trainer._metrics["train" if trainer.model.training else "eval"][name].append(value)


def collator(unpaired: bool, pad_token_id: int):
    """TRL's collator of tokenized pairs (unpaired: of answers labelled good or bad)."""
    if unpaired:
        from trl.trainer.kto_trainer import DataCollatorForUnpairedPreference as Collator
    else:
        from trl.trainer.dpo_trainer import DataCollatorForPreference as Collator
    return Collator(pad_token_id=pad_token_id)


def orpo_trainer():
    with warnings.catch_warnings():  # (its module warns on import that trl.experimental may change)
        warnings.simplefilter("ignore")
        from trl.experimental.orpo import ORPOTrainer
    return ORPOTrainer


def self_reads(function) -> set[str]:
    """The attributes `function`'s body reads from `self`."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def still_needed() -> list[str]:
    """What in TRL's code these steps rely on, and whether it still reads so: an empty list when all holds."""
    import importlib
    import inspect

    from trl import DPOTrainer, KTOTrainer
    from trl.trainer import utils

    problems = []
    for trainer in (DPOTrainer, KTOTrainer):
        name = trainer.__name__
        for method, parameters in SIGNATURES.items():
            found = getattr(trainer, method, None)
            if found is None or list(inspect.signature(found).parameters) != parameters:
                problems.append(f"{name}.{method} is gone or takes other arguments than {parameters[1:]}")
            elif method == "_compute_loss" and (extra := self_reads(found) - LOSS_READS[name]):
                problems.append(f"{name}._compute_loss reads {sorted(extra)} too: the parity stand-ins "
                                "(reference/parity_preference.py) may have to set them")
        source = inspect.getsource(trainer)
        if 'add_adapter("ref"' not in source:
            problems.append(f"{name} no longer copies an adapter into a \"ref\" adapter: check TokenizedPreference")
        if "self._metrics[mode]" not in source:
            problems.append(f"{name} no longer collects its step metrics in self._metrics[mode]")
    kto = inspect.getsource(KTOTrainer)
    if "self.calculate_KL" not in kto or '"KL_completion_ids"' not in kto:
        problems.append("KTOTrainer no longer reads its mismatched answers from KL_completion_ids")
    dpo_init = inspect.getsource(DPOTrainer.__init__)
    if "add_fused_lm_head" not in dpo_init or not hasattr(utils, "add_fused_lm_head"):
        problems.append("DPOTrainer no longer puts trl.trainer.utils.add_fused_lm_head on the model: ORPO's loss "
                        "reads its log_probs")
    elif getattr(utils, "_ChunkedLogProbFunction", None) is None:
        problems.append("TRL's fused LM head has no kernel here (trl.kernels did not import: Triton missing?)")
    elif list(inspect.signature(utils.add_fused_lm_head).parameters)[:1] != ["model"] \
            or not all(f'"{output}"' in inspect.getsource(utils.add_fused_lm_head) for output in FUSED_OUTPUTS):
        problems.append(f"add_fused_lm_head no longer computes {FUSED_OUTPUTS}")
    try:
        orpo = orpo_trainer()
    except ImportError:
        return problems + ["trl.experimental.orpo.ORPOTrainer is gone: ORPO's loss and its parity rows use it"]
    problems += [f"ORPOTrainer.{method} is gone" for method in ORPO_METHODS if not hasattr(orpo, method)]
    if hasattr(orpo, "odds_ratio_loss") and self_reads(orpo.odds_ratio_loss) - {"beta", "accelerator"}:
        problems.append("ORPOTrainer.odds_ratio_loss reads more of its trainer than beta and accelerator: a DPO "
                        "trainer may not have it")
    problems += _grpo_still_needed()
    for module, name in (("trl.trainer.dpo_trainer", "DataCollatorForPreference"),
                         ("trl.trainer.kto_trainer", "DataCollatorForUnpairedPreference")):
        if not hasattr(importlib.import_module(module), name):
            problems.append(f"{module}.{name} is gone")
    return problems


def _grpo_still_needed() -> list[str]:
    """What training/grpo.py relies on in TRL's GRPO and RLOO trainers."""
    import importlib
    import inspect

    from trl import GRPOTrainer, RLOOTrainer

    problems = []
    for trainer, module in zip((GRPOTrainer, RLOOTrainer), REFERENCE_BUILDERS):
        name, init = trainer.__name__, inspect.getsource(trainer.__init__)
        if "self.ref_model = create_model_from_path(" not in init or \
                not hasattr(importlib.import_module(module), "create_model_from_path"):
            problems.append(f"{name} no longer builds its reference with create_model_from_path: check "
                            "reference_copied")
        if 'add_adapter("ref"' not in init:
            problems.append(f"{name} no longer copies an adapter into a \"ref\" adapter: check training/grpo.py")
        source = inspect.getsource(trainer._generate_and_score_completions)
        if '"prompt_mask"' not in source or '"completion_mask"' not in source:
            problems.append(f"{name}'s batches no longer hold prompt_mask and completion_mask: check "
                            "training/grpo.SampledBatches")
    return problems
