"""LoRA invariants: starts as the base model, merges without changing the function, counts 2 d r."""

from __future__ import annotations

import torch

from hftoolkit.reference import lora
from hftoolkit.reference.bert import Bert, BertConfig
from hftoolkit.reference.parity_models import peft_lora_query, reference_lora_from
from tests.helpers.reference import assert_close


def test_b_is_zero_at_init_so_the_adapter_starts_as_the_base_layer():
    base = torch.nn.Linear(16, 8)
    adapted = lora.LoRALinear(base, r=4, alpha=8)
    x = torch.randn(3, 16)
    assert torch.count_nonzero(adapted.lora_B) == 0
    assert torch.equal(adapted(x), base(x))


def test_the_adapter_changes_the_output_once_b_is_not_zero():
    adapted = lora.LoRALinear(torch.nn.Linear(16, 8), r=4, alpha=8)
    x = torch.randn(3, 16)
    before = adapted(x)
    with torch.no_grad():
        adapted.lora_B.normal_()
    assert not torch.allclose(adapted(x), before)


def test_merged_equals_unmerged():
    adapted = lora.LoRALinear(torch.nn.Linear(16, 8), r=4, alpha=8)
    with torch.no_grad():
        adapted.lora_B.normal_()
    x = torch.randn(5, 16)
    assert_close(adapted.merged()(x), adapted(x), 1e-5, "merged vs unmerged LoRA")


def test_update_is_alpha_over_r_times_b_a():
    adapted = lora.LoRALinear(torch.nn.Linear(16, 8, bias=False), r=4, alpha=2)
    with torch.no_grad():
        adapted.lora_B.normal_()
    delta = adapted.merged().weight - adapted.base.weight
    assert_close(delta, 0.5 * adapted.lora_B @ adapted.lora_A, 1e-6, "merged update")


def test_peft_adapter_merged_by_the_reference_equals_peft_unmerged():
    layer = peft_lora_query()
    x = torch.randn(2, 7, 32)
    assert_close(reference_lora_from(layer).merged()(x), layer(x), 1e-5, "reference-merged vs peft unmerged")


def test_only_a_and_b_train_after_apply_lora():
    model = lora.apply_lora(Bert(BertConfig()), ("q_proj", "v_proj"), r=4, alpha=8)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith(("lora_A", "lora_B")) for name in trainable)
    # 2 layers x 2 matrices x r (d_in + d_out) with d = 32, r = 4
    assert lora.trainable_parameters(model) == 2 * 2 * lora.lora_parameter_count(32, 32, 4) == 1024


def test_course_counts():
    assert lora.lora_parameter_count(4096, 4096, 16) == 2 * 4096 * 16 == 131_072
    assert lora.full_update_parameter_count(4096, 4096) == 4096**2 == 16_777_216
