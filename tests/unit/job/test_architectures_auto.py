"""architectures.py: families, heads and LoRA targets read from transformers' and peft's own tables, for model
types hftoolkit's hand table lists and for those it does not. Configs only, or tiny random models."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hftoolkit.config import tasks
from hftoolkit.job import architectures as arch
from hftoolkit.models import lora
from tests.helpers import ROOT

# The hand-typed table hftoolkit kept before it read transformers' own: every type in it must keep its family.
MODEL_TYPE_FAMILIES: dict[str, str] = {
    **dict.fromkeys(["bert", "roberta", "distilbert", "electra", "deberta", "deberta-v2", "albert", "xlm-roberta",
                     "mpnet", "camembert", "modernbert"], "encoder"),
    **dict.fromkeys(["gpt2", "gpt_neo", "gptj", "llama", "mistral", "qwen2", "qwen3", "opt", "phi", "gemma",
                     "smollm3"], "decoder"),
    **dict.fromkeys(["t5", "mt5", "bart", "mbart", "marian", "pegasus"], "seq2seq"),
    **dict.fromkeys(["vit", "deit", "beit", "swin", "convnext", "dinov2"], "vision"),
}

# Types the hand table lacks, with their family and tiny dimensions (defaults are full size).
UNLISTED = {
    "phi3": ("decoder", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                             num_key_value_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma2": ("decoder", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8)),
    "qwen2_moe": ("decoder", dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                  shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)),
    "gpt_neox": ("decoder", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)),
    "falcon": ("decoder", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4)),
    "olmo": ("decoder", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "umt5": ("seq2seq", dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                             relative_attention_num_buckets=8)),
    "deberta-v2": ("encoder", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   max_position_embeddings=64)),
}
VOCAB = 128
RECIPES = ROOT / "recipes"
# The task each family's model is built for in the forward and backward pass.
MAIN_TASK = {"decoder": "clm", "seq2seq": "translation", "encoder": "classification"}
# peft 0.21's table has these types; the others of UNLISTED fall back on their attention's linear layers.
PEFT_HAS = {"gemma2": ["q_proj", "v_proj"], "gpt_neox": ["query_key_value"], "falcon": ["query_key_value"],
            "deberta-v2": ["query_proj", "value_proj"]}
FALLBACK = {"phi3": ["o_proj", "qkv_proj"], "qwen2_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "olmo": ["q_proj", "k_proj", "v_proj", "o_proj"], "umt5": ["q", "k", "v", "o"]}


def config_of(model_type: str, **dims):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **dims)


def tiny_model(model_type: str):
    import torch
    import transformers

    family, dims = UNLISTED[model_type]
    config = config_of(model_type, vocab_size=VOCAB, **dims)
    auto = arch.head_class(config, MAIN_TASK[family], family)
    torch.manual_seed(0)
    return getattr(transformers, auto).from_config(config)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(MODEL_TYPE_FAMILIES))
def test_family_of_agrees_with_the_hand_table(model_type):
    import transformers

    config, family = config_of(model_type), MODEL_TYPE_FAMILIES[model_type]
    assert arch.family_of(config) == family
    for task in tasks.names():  # the heads agree with the Auto classes' own lookup (preflight's)
        auto = tasks.head(task, family)
        if auto is None:
            continue
        has = type(config) in getattr(transformers, auto)._model_mapping
        assert arch.head_class(config, task, family) == (auto if has else None), task
    assert arch.tasks_with_heads(config)


def test_unlisted_types_get_their_family():
    got = {t: arch.family_of(config_of(t)) for t in [*UNLISTED, "mistral", "qwen3"]}
    assert got == {**{t: family for t, (family, _) in UNLISTED.items()}, "mistral": "decoder", "qwen3": "decoder"}


def test_unlisted_types_get_the_heads_transformers_gives_them():
    heads = {t: arch.tasks_with_heads(config_of(t)) for t in ("gpt_neox", "umt5", "deberta-v2", "olmo")}
    assert heads["gpt_neox"] == ("classification", "regression", "tagging", "clm", "translation", "summarization",
                                 "instruction", "preference", "reward", "grpo")
    assert heads["umt5"] == ("classification", "regression", "translation", "summarization", "instruction", "denoise")
    assert heads["deberta-v2"] == ("classification", "regression", "tagging", "mlm", "reward")
    assert "tagging" not in heads["olmo"]  # transformers has no OlmoForTokenClassification
    umt5 = config_of("umt5")
    assert arch.head_class(umt5, "translation", "seq2seq") == "AutoModelForSeq2SeqLM"
    assert arch.head_class(umt5, "classification", "seq2seq") == "AutoModelForSequenceClassification"
    assert arch.head_class(umt5, "tagging", "seq2seq") is None  # the seq2seq family has no tagging formulation
    assert arch.head_class(config_of("phi3"), "summarization", "decoder") == "AutoModelForCausalLM"
    assert arch.head_class(config_of("vit"), "image-classification", "vision") == "AutoModelForImageClassification"


def test_saved_class_names_decide_between_an_encoder_and_a_decoder_of_one_type():
    assert arch.family_of(config_of("roberta", architectures=["RobertaForCausalLM"])) == "decoder"
    assert arch.family_of(config_of("bert", architectures=["BertForMaskedLM"])) == "encoder"
    assert arch.family_of(config_of("bert", architectures=["BertForSequenceClassification"])) == "encoder"
    perceiver = config_of("perceiver", architectures=["PerceiverForImageClassificationLearned"])
    assert (arch.family_of(config_of("perceiver")), arch.family_of(perceiver)) == ("encoder", "vision")


def test_models_of_speech_or_several_modalities_get_no_family():
    for model_type in ("whisper", "wav2vec2", "clip", "gemma3", "llava", "qwen2_audio"):
        assert arch.family_of(config_of(model_type)) is None, model_type
    assert arch.tasks_with_heads(config_of("whisper")) == ()


def test_remote_code_is_read_from_its_class_names_and_auto_map():
    from transformers import PretrainedConfig

    def remote(**fields):
        config = PretrainedConfig(**fields)
        config.model_type = "not_in_transformers"
        return config

    assert arch.family_of(remote(vocab_size=10, architectures=["BaichuanForCausalLM"])) == "decoder"
    assert arch.family_of(remote(vocab_size=10, auto_map={"AutoModelForCausalLM": "m.ChatGLM"})) == "decoder"
    assert arch.family_of(remote(vocab_size=10, is_encoder_decoder=True)) == "seq2seq"
    assert arch.family_of(remote(vocab_size=10, architectures=["NewBertForMaskedLM"])) == "encoder"
    assert arch.family_of(remote(image_size=32, architectures=["NewViTForImageClassification"])) == "vision"
    assert arch.family_of(remote(vocab_size=10, architectures=["NewForConditionalGeneration"])) is None
    config = remote(vocab_size=10, auto_map={"AutoModelForSequenceClassification": "m.X"})
    assert arch.head_class(config, "classification", "decoder") == "AutoModelForSequenceClassification"
    assert arch.head_class(config, "clm", "decoder") is None


def test_formulation_heads_are_the_auto_classes_the_families_load(monkeypatch):
    from hftoolkit.config.families import FAMILIES
    from hftoolkit.models import loading
    from hftoolkit.models.families import family_module

    class Loaded(Exception):
        pass

    def load_task_model(auto_class, *args, **kwargs):
        raise Loaded(auto_class.__name__)

    monkeypatch.setattr(loading, "load_task_model", load_task_model)
    for family in FAMILIES:
        formulations = family_module(family).FORMULATIONS
        assert set(formulations) == {t.name for t in tasks.TASKS if family in t.families}
        for task, formulation in formulations.items():
            job = SimpleNamespace(task=task, family=family, label_names=("a", "b"),
                                  recipe=SimpleNamespace(task=task, model=SimpleNamespace(checkpoint="unused")),
                                  model=SimpleNamespace(processor=None, config=None))
            with pytest.raises(Loaded) as loaded:
                formulation.load_model(job)
            assert str(loaded.value) == tasks.head(task, family), (family, task)


def test_lora_targets_are_peft_s_where_peft_has_the_type():
    for model_type, expected in PEFT_HAS.items():
        assert lora.auto_targets(tiny_model(model_type)) == (expected, None), model_type


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPE_FAMILIES))
def test_every_listed_type_has_default_targets_in_peft_s_table_or_ours(model_type):
    import torch
    import transformers

    family = MODEL_TYPE_FAMILIES[model_type]
    config = config_of(model_type)
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers"):
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, 1)
    auto = arch.head_class(config, arch.tasks_with_heads(config)[0], family)
    names = getattr(transformers, auto)._model_mapping._model_mapping[model_type]
    if isinstance(names, tuple):  # (DeiT's entry names two classes: from_config must be told which)
        config.architectures = [names[0]]
    with torch.device("meta"):  # full width, no memory
        model = getattr(transformers, auto).from_config(config)
    targets, note = lora.auto_targets(model)
    assert targets
    if model_type == "convnext":  # no attention at all
        assert note.startswith("lora.targets auto: peft has no default for model type 'convnext', and no attention")
    else:
        assert note is None, note


def test_lora_targets_of_a_type_neither_table_has_are_its_attention_s_linear_layers():
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    for model_type, expected in FALLBACK.items():
        assert model_type not in PEFT_TARGETS and model_type not in lora.TARGETS_PEFT_LACKS
        targets, note = lora.auto_targets(tiny_model(model_type))
        assert targets == expected, model_type
        assert note == (f"lora.targets auto: peft has no default for model type {model_type!r}; chose the "
                        f"attention's linear layers: {', '.join(expected)}")


def test_attention_layers_are_found_by_class_as_well_as_by_name(monkeypatch):
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    monkeypatch.delitem(PEFT_TARGETS, "falcon")  # as if peft lacked it: FalconAttention's FalconLinear layers
    targets, note = lora.auto_targets(tiny_model("falcon"))
    assert targets == ["query_key_value", "dense"]  # not the feed-forward's dense_h_to_4h and dense_4h_to_h
    assert note.endswith("chose the attention's linear layers: query_key_value, dense")


def test_the_note_says_when_a_table_s_names_match_no_layer(monkeypatch):
    monkeypatch.setitem(lora.TARGETS_PEFT_LACKS, "olmo", ["query", "value"])  # as after a rename
    targets, note = lora.auto_targets(tiny_model("olmo"))
    assert targets == FALLBACK["olmo"]
    assert note.startswith("lora.targets auto: the default targets of model type 'olmo' (query, value) match none "
                           "of its layers; chose the attention's linear layers: q_proj")


def test_a_model_without_attention_gets_every_linear_layer_but_its_head():
    import transformers

    config = config_of("convnext", num_stages=2, depths=[1, 1], hidden_sizes=[8, 16], num_labels=3)
    for auto in (transformers.AutoModelForImageClassification, transformers.AutoModel):  # with a head, and bare
        targets, note = lora.auto_targets(auto.from_config(config))
        assert targets == ["pwconv1", "pwconv2"], auto
        assert "no attention layer was found; chose every linear layer but the output embedding and the task " \
               "head: pwconv1, pwconv2" in note


@pytest.mark.parametrize("model_type", sorted(UNLISTED))
def test_a_tiny_model_of_each_unlisted_type_trains_with_its_default_targets(model_type):
    import torch
    from peft import LoraConfig, get_peft_model

    family = UNLISTED[model_type][0]
    model = tiny_model(model_type)
    targets, _ = lora.auto_targets(model)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    ids = torch.randint(4, VOCAB, (2, 6))
    labels = torch.tensor([0, 1]) if family == "encoder" else ids
    peft_model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
    grads = {n: p.grad for n, p in peft_model.named_parameters() if "lora_B" in n}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values()), model_type


# The recipe each family trains in the end-to-end test, and the tiny tokenizer its checkpoint borrows.
END_TO_END = {"decoder": ("decoder-clm.yaml", "gpt2"), "seq2seq": ("seq2seq-translation-t5.yaml", "t5"),
              "encoder": ("encoder-classification.yaml", "bert")}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["phi3", "gemma2", "qwen2_moe", "gpt_neox", "umt5", "deberta-v2"])
def test_a_type_nobody_listed_validates_and_trains_a_few_steps(tmp_path, model_type):
    """A checkpoint folder of the type (random weights, a tiny tokenizer), validated with its data and then
    trained with LoRA's default targets, with no model.family set."""
    import shutil

    import transformers
    from transformers import AutoTokenizer

    from hftoolkit.sources.tiny import ensure_tiny
    from tests.helpers import run_cli

    family, dims = UNLISTED[model_type]
    recipe, borrowed = END_TO_END[family]
    folder = tmp_path / model_type
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny(borrowed))
    ids = {k: getattr(tokenizer, f"{k}_id") for k in ("pad_token", "eos_token", "bos_token")}
    config = config_of(model_type, vocab_size=len(tokenizer), **{**dims, **{f"{k}_id": v for k, v in ids.items()
                                                                            if v is not None}})
    if family == "seq2seq":
        config.decoder_start_token_id = tokenizer.pad_token_id
    head = getattr(transformers, arch.head_class(config, MAIN_TASK[family], family))
    head.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    sets = ["--set", f"model.checkpoint={folder}", "--set", "lora.targets=auto", "--set", "training.max_steps=2",
            "--set", "data.max_eval_samples=8",
            "--set", "eval.max_predictions=2", "--set", "eval.generation.max_new_tokens=4"]
    checked = run_cli("validate", RECIPES / recipe, "--data", *sets)
    assert checked.stdout.startswith("ok: ")
    run_cli("train", RECIPES / recipe, "--output", tmp_path / "run", *sets)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["family"] == family and metrics["trainable_params"] > 0
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["resolved"]["model_type"] == model_type
