"""models/lora.py: what counts as a linear layer, and the explicit and all-linear rules (auto's rules are tested
against transformers' and peft's tables in test_architectures_auto.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.models import lora


def job_asking(targets):
    return SimpleNamespace(recipe=SimpleNamespace(lora=SimpleNamespace(targets=targets),
                                                  model=SimpleNamespace(checkpoint="tiny-bert")))


@pytest.fixture(scope="module")
def bert_classifier():
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))


def test_linear_layers_are_torch_s_gpt2_s_conv1d_and_bitsandbytes_quantized_ones():
    import torch
    from transformers.pytorch_utils import Conv1D

    class Subclassed(torch.nn.Linear):  # (as FalconLinear)
        pass

    assert all(lora.is_linear(m) for m in (torch.nn.Linear(4, 4), Subclassed(4, 4), Conv1D(4, 4)))
    others = (torch.nn.Embedding(4, 4), torch.nn.LayerNorm(4), torch.nn.Conv2d(1, 1, 1))
    assert not any(lora.is_linear(m) for m in others)
    bnb = pytest.importorskip("bitsandbytes")
    assert lora.is_linear(bnb.nn.Linear8bitLt(4, 4)) and lora.is_linear(bnb.nn.Linear4bit(4, 4))


def test_all_linear_adapts_every_linear_layer_but_the_head(bert_classifier):
    chosen = lora.targets(bert_classifier, job_asking("all-linear"), lora.head_modules(bert_classifier))
    assert lora.head_modules(bert_classifier) == ["classifier"]
    assert "classifier" not in chosen and "bert.pooler.dense" in chosen
    per_layer = {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                 "intermediate.dense", "output.dense"}
    assert {name.split(".", 4)[4] for name in chosen if name.startswith("bert.encoder.layer.")} == per_layer
    assert len(chosen) == 2 * len(per_layer) + 1


def test_named_targets_are_kept_and_a_name_the_model_lacks_is_refused_naming_its_linear_layers(bert_classifier):
    assert lora.targets(bert_classifier, job_asking(["query", "value"])) == ["query", "value"]
    with pytest.raises(UserError) as refused:
        lora.targets(bert_classifier, job_asking(["q_proj", "value"]))
    assert str(refused.value).startswith("lora.targets: 'q_proj' match no module of tiny-bert; linear layers it "
                                         "has: classifier, dense, key, query, value")


def test_a_bare_base_model_has_no_head(bert_classifier):
    assert lora.head_modules(bert_classifier.bert) == []
