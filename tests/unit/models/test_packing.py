"""Padding-free packing (data.packing: true): the loss of packed rows equals the unpacked loss; who may pack."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe
from tests.helpers.packing import PadOnlyTokenizer, prompt_answer_examples, tiny_causal_lm

INSTRUCT = RECIPES / "smollm2-instruct.yaml"
ON_GPT2 = ("model.checkpoint=init:gpt2", "model.gguf_file=null", "model.revision=null")


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("flat", [False, True], ids=["rows", "one-flat-row"])
def test_the_loss_of_packed_rows_equals_the_loss_of_the_same_examples_unpacked(model_type, flat):
    import torch
    from datasets import Dataset

    from hftoolkit.models.families.packing import PackedCollator, pack

    model, examples = tiny_causal_lm(model_type), prompt_answer_examples()
    width = max(e["length"] for e in examples)
    pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731 (right padding)
    padded = {"input_ids": torch.tensor(pad([e["input_ids"] for e in examples], 0)),
              "labels": torch.tensor(pad([e["labels"] for e in examples], -100)),
              "attention_mask": torch.tensor(pad([[1] * e["length"] for e in examples], 0))}
    rows = pack(Dataset.from_list(examples), 24)
    assert len(rows) < len(examples), "several examples share a row"
    packed = PackedCollator(PadOnlyTokenizer(), flat=flat)([dict(r) for r in rows])
    assert "attention_mask" not in packed
    with torch.no_grad():
        unpacked_loss = model(**padded).loss
        packed_out = model(**packed)
        leaking = dict(packed, position_ids=torch.arange(packed["input_ids"].shape[1]).expand_as(packed["input_ids"]))
        leaking_out = model(**leaking)  # positions that never restart: examples attend to each other
    assert packed_out.loss.item() == pytest.approx(unpacked_loss.item(), abs=1e-5)
    assert (leaking_out.logits - packed_out.logits).abs().max() > 1e-2, "the check can fail"


def test_rows_hold_every_example_once_within_the_capacity():
    from datasets import Dataset

    from hftoolkit.models.families.packing import pack, split_row

    examples = prompt_answer_examples(30)
    rows = pack(Dataset.from_list(examples), 24)
    assert all(length <= 24 for length in rows["length"]) and len(rows) < 30
    found = sorted(tuple(e["input_ids"]) for row in rows for e in split_row(row))
    assert found == sorted(tuple(e["input_ids"]) for e in examples)
    assert sum(rows["length"]) == sum(e["length"] for e in examples), "no padding inside a row"


def test_clm_packing_keeps_documents_apart_and_whole():
    from datasets import Dataset

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import decoder
    from hftoolkit.models.families.packing import split_row

    job = resolve_job(load_recipe(RECIPES / "decoder-clm.yaml", ["data.packing=true", "data.max_length=16"]),
                      data=False)
    tokenizer = job.model.processor
    texts = ["a cat.", "the big dog sees the small cat near the old house by the river and the hill.", "a dog."]
    rows = decoder.FORMULATIONS["clm"].preprocess(job, tokenizer, Dataset.from_dict({"text": texts}))
    pieces = [e["input_ids"] for row in rows for e in split_row(row)]
    assert all(len(p) <= 16 for p in pieces) and all(length <= 16 for length in rows["length"])
    documents = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    long = documents[1]
    assert [long[i:i + 16] for i in range(0, len(long), 16)] == [p for p in pieces if p[0] == long[0] or
                                                                  p == long[16:32]], "a long text in pieces, in order"
    assert sum(len(p) for p in pieces) == sum(len(d) for d in documents), "every token kept"


def test_which_model_types_pack():
    from hftoolkit.job.architectures import packs_by_positions

    for model_type in ("llama", "mistral", "qwen2", "gemma", "gpt2", "phi3", "gpt_neox"):
        assert packs_by_positions(model_type), model_type
    # A mask from the attention mask alone, or a state along the sequence. (Not a fixed list of every type: a new
    # release may start handing position_ids to the mask builders, as transformers 5.25 did for BERT's decoder.)
    for model_type in ("bloom", "opt", "jamba", "mamba"):
        assert not packs_by_positions(model_type), model_type


# Dimensions that make most causal LMs of transformers' table tiny (a config keeps those it does not have as set).
TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=128, n_embd=64, n_layer=2, n_head=4, num_layers=2,
                 d_model=64, ffn_dim=128, max_position_embeddings=128, n_positions=128, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                 num_experts=4, num_experts_per_tok=2, num_local_experts=4, n_routed_experts=4)
SHARDS = 4


def _tiny_of_type(model_type: str):
    """A tiny random causal LM of `model_type` from its default config with TINY_DIMS; None where that config
    can't be made tiny this way (sub-configs, per-layer attributes, kernels the type requires)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.for_model(model_type)
        for target in {id(config): config, id(text := config.get_text_config()): text}.values():
            for key, value in TINY_DIMS.items():
                if isinstance(getattr(target, key, None), int):
                    setattr(target, key, value)
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:2]
        config._attn_implementation = "sdpa"
        with torch.device("meta"):
            if sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) > 5_000_000:
                return None
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()
    except Exception:
        return None


def _keeps_examples_apart(model) -> bool | None:
    """Whether the logits of an example packed after another equal its logits alone; None where it can't run."""
    import torch

    first, second = torch.randint(3, 120, (1, 5)), torch.randint(3, 120, (1, 6))
    positions = torch.cat([torch.arange(5), torch.arange(6)]).unsqueeze(0)
    try:
        with torch.no_grad():
            packed = model(input_ids=torch.cat([first, second], 1), position_ids=positions, use_cache=False)
            alone = model(input_ids=second, position_ids=torch.arange(6).unsqueeze(0), use_cache=False)
    except Exception:
        return None
    return bool((packed.logits[0, 5:] - alone.logits[0]).abs().max() < 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_model_type_said_to_pack_keeps_packed_examples_apart(shard):
    """packs_by_positions reads the installed transformers' modeling code; here every causal-LM type it says packs
    runs, tiny, with a packed row: none may let one example see another (a refused type only costs padding)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from hftoolkit.job.architectures import packs_by_positions

    said = sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if packs_by_positions(t))[shard::SHARDS]
    ran = {t: _keeps_examples_apart(model) for t in said if (model := _tiny_of_type(t)) is not None}
    ran = {t: apart for t, apart in ran.items() if apart is not None}
    assert len(ran) >= len(said) // 2, f"only {sorted(ran)} of {said} could be checked"
    assert [t for t, apart in ran.items() if not apart] == []
    assert _keeps_examples_apart(_tiny_of_type("opt")) is False, "the check can fail (OPT masks from the mask)"


def test_a_model_type_that_cannot_pack_is_refused_in_one_line():
    from transformers import BloomConfig

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.preflight import preflight
    from hftoolkit.job.spec import ResolvedModel

    recipe = load_recipe(INSTRUCT, [*ON_GPT2, "data.packing=true"])
    model = ResolvedModel(checkpoint="bigscience/bloom-560m", path="x", revision=None, config=BloomConfig(),
                          family="decoder", processor=None)
    problems = [p for p in preflight(recipe, model, None, None).problems if p.startswith("data.packing")]
    assert problems == [problems[0]] and "bloom models build their attention from the attention mask alone" \
        in problems[0] and "set data.packing to false" in problems[0]


def test_blocks_is_clm_only():
    result = run_cli("validate", INSTRUCT, "--set", "data.packing=blocks", expect=2)
    assert "data.packing blocks cuts concatenated texts, which only task clm trains on" in plain(result.output)


@pytest.mark.slow
def test_an_instruction_run_packs_without_padding(tmp_path):
    sets = (*ON_GPT2, "training.max_steps=3", "data.max_eval_samples=8", "eval.generation.max_new_tokens=2",
            "training.batch_size=4", "data.max_length=64", "data.max_target_length=32")
    train_recipe(INSTRUCT, tmp_path / "padded", *sets, "data.packing=false")
    train_recipe(INSTRUCT, tmp_path / "packed", *sets, "data.packing=true", "training.sampling=group_by_length")
    padded, packed = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("padded", "packed"))
    assert packed["padding_fraction"] < padded["padding_fraction"]
    assert packed["padding_fraction"] < 0.1, "rows are full"


@pytest.mark.slow
def test_padding_free_is_the_default_on_a_model_that_packs_and_pads_less(tmp_path):
    sets = (*ON_GPT2, "training.max_steps=3", "data.max_eval_samples=8", "eval.generation.max_new_tokens=2",
            "training.batch_size=8")
    train_recipe(INSTRUCT, tmp_path / "flat", *sets)
    train_recipe(INSTRUCT, tmp_path / "padded", *sets, "data.packing=false")
    flat, padded = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("flat", "padded"))
    manifest = json.loads((tmp_path / "flat" / "manifest.json").read_text())
    assert manifest["batch_order"] == {"sampling": "random", "layout": "padding_free"}
    assert flat["padding_fraction"] < padded["padding_fraction"] and flat["eval"]["loss"] > 0


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_a_batch_packed_into_rows_has_the_loss_and_gradients_of_the_same_batch_padded(model_type):
    import torch

    from hftoolkit.models.families.packing import FlatCollator, attention_break_even

    model, examples = tiny_causal_lm(model_type), prompt_answer_examples(16)
    width = max(e["length"] for e in examples)
    pad = lambda values, fill: [v + [fill] * (width - len(v)) for v in values]  # noqa: E731 (right padding)
    padded = {"input_ids": torch.tensor(pad([e["input_ids"] for e in examples], 0)),
              "labels": torch.tensor(pad([e["labels"] for e in examples], -100)),
              "attention_mask": torch.tensor(pad([[1] * e["length"] for e in examples], 0))}
    break_even = attention_break_even(model.config)
    flat = FlatCollator(PadOnlyTokenizer(), padded=None, break_even=break_even)([dict(e) for e in examples])
    total = sum(e["length"] for e in examples)
    rows, row_width = flat["input_ids"].shape
    assert 1 < rows < len(examples) and row_width < total and "attention_mask" not in flat
    cost = lambda rows, width: rows * width * (1 + width / break_even)  # noqa: E731 (rows_of's measure)
    assert rows * row_width < len(examples) * width and cost(rows, row_width) < cost(1, total)
    assert int(flat["labels"].ne(-100).sum()) == sum(sum(x != -100 for x in e["labels"][1:]) for e in examples)
    grads = []
    for batch in (padded, flat):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        grads.append((loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    assert grads[1][0] == pytest.approx(grads[0][0], abs=1e-5)
    assert torch.allclose(grads[1][1], grads[0][1], atol=1e-5)


def test_rows_are_as_long_as_attention_lets_them_pay():
    from hftoolkit.models.families.packing import attention_break_even, rows_of

    def widths(lengths, **kwargs):
        return sorted(sum(lengths[i] for i in row) for row in rows_of(lengths, **kwargs))

    tail = [400] + [30] * 7
    assert widths(tail) == [610]  # attention free (flash attention's kernel): one row, no padding
    assert widths(tail, break_even=50) == [210, 400]  # dear attention: rows no longer than the longest example
    assert widths(tail, break_even=3000) == [610]  # cheap attention: the long tail shares a row
    assert widths([64] * 8, break_even=3000) == [64] * 8  # nothing to gain from longer rows
    llama_7b = type("Config", (), {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                                   "num_key_value_heads": 32, "hidden_act": "silu"})
    smollm2 = type("Config", (), {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                                  "num_key_value_heads": 3, "hidden_act": "silu"})
    assert attention_break_even(llama_7b) > 5 * attention_break_even(smollm2) > 5 * 500
