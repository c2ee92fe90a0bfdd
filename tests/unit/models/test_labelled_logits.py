"""A causal LM's training loss projects onto the vocabulary only where a label is predicted, with the model's own
loss and gradients."""

from __future__ import annotations

import pytest

from tests.helpers.packing import PadOnlyTokenizer, prompt_answer_examples, tiny_causal_lm


def _padded(examples):
    import torch

    width = max(e["length"] for e in examples)
    pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731 (right padding)
    return {"input_ids": torch.tensor(pad([e["input_ids"] for e in examples], 0)),
            "labels": torch.tensor(pad([e["labels"] for e in examples], -100)),
            "attention_mask": torch.tensor(pad([[1] * e["length"] for e in examples], 0))}


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_labelled_positions_loss_and_gradients_equal_the_models_own(model_type, layout):
    import torch

    from hftoolkit.models.families.packing import FlatCollator
    from hftoolkit.training.loss import _labelled_logits_loss

    model, examples = tiny_causal_lm(model_type), prompt_answer_examples(16)
    packed = FlatCollator(PadOnlyTokenizer(), padded=None)([dict(e) for e in examples])
    batch = _padded(examples) if layout == "padded" else packed
    found = []
    for labelled_only in (False, True):
        model.zero_grad()
        if labelled_only:
            outputs, loss = _labelled_logits_loss(model, batch)
            predicted = int(batch["labels"][:, 1:].ne(-100).sum())
            assert outputs["logits"].shape[0] == predicted, "logits only where a label is predicted"
        else:
            loss = model(**batch).loss
        loss.backward()
        found.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    assert found[1][0] == pytest.approx(found[0][0], abs=1e-6)
    assert torch.allclose(found[1][1], found[0][1], atol=1e-6)


def test_a_toolkit_trainer_takes_the_labelled_path_for_a_causal_lm_and_not_for_a_classifier(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from hftoolkit.training.loss import ItemNormalizedLoss

    trainer_class = type("T", (ItemNormalizedLoss, Trainer), {})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    lm = trainer_class(model=tiny_causal_lm("llama").train(), args=args)
    classifier = trainer_class(model=BertForSequenceClassification(BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)), args=args)
    assert lm._projects_labelled_only(lm.model) and not classifier._projects_labelled_only(classifier.model)
