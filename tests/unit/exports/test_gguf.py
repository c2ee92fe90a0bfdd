"""GGUF export: a model written with hftoolkit.exports.gguf_file and read back through transformers' own GGUF loader
computes what the model computed, tokenizes as its tokenizer did and chats with the run's template."""

from __future__ import annotations

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.exports import gguf_file as export

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEXTS = ["Hello, world! 123 naive cafe", "  two spaces\nand\ttabs", "<|im_start|>user\nHi<|im_end|>\n"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Largest |logit difference| / largest |logit|: f32 against the model itself; f16 and bf16 against the model with
# its weights rounded to that type (the file's rounding is then the only difference, and there is none left);
# q8_0 against the model itself (8-bit blocks, one f16 scale per 32 values).
TOLERANCE = {"f32": 1e-5, "f16": 1e-5, "bf16": 1e-5, "q8_0": 5e-2}
ROUND_TRIPS = ("llama", "mistral", "qwen2", "gpt2")  # the model types `decoder` builds, each read back below


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny byte-level BPE tokenizer, with chat tokens and a chat template, as a tuned run's would have."""
    from hftoolkit.sources.tiny import ensure_tiny

    tokenizer = tf.AutoTokenizer.from_pretrained(ensure_tiny("gpt2"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def decoder(model_type: str, tokenizer, **changes):
    """A tiny random causal LM of `model_type`, seeded, with an embedding padded past the tokenizer's vocabulary
    (as tuned checkpoints often are) and random biases where it has any (zeros would hide a misplaced one)."""
    size = (len(tokenizer) + 7) // 8 * 8
    shape = dict(vocab_size=size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)
    configs = {
        "llama": lambda: tf.LlamaConfig(**shape, tie_word_embeddings=True),
        "mistral": lambda: tf.MistralConfig(**shape, head_dim=32),  # a head size that isn't hidden / heads
        "qwen2": lambda: tf.Qwen2Config(**shape, tie_word_embeddings=False),
        "gpt2": lambda: tf.GPT2Config(vocab_size=size, n_embd=64, n_layer=2, n_head=4, initializer_range=0.1,
                                      bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id),
    }
    config = configs[model_type]()
    for key, value in changes.items():
        setattr(config, key, value)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("bias"):
                    parameter.normal_(std=0.1)
    return model


def logits(model, tokenizer):
    ids = torch.tensor([tokenizer(TEXTS[0] + " " + TEXTS[1]).input_ids])
    with torch.no_grad():
        return model(input_ids=ids).logits


def relative_difference(expected, actual) -> float:
    return ((expected - actual).abs().max() / expected.abs().max()).item()


def rounded(model, dtype):
    """A copy of `model` whose 2-D weights went through `dtype` and back, as the file stores them."""
    import copy

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in twin.parameters():
            if parameter.ndim == 2:
                parameter.copy_(parameter.to(dtype).float())
    return twin


def fields(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def tensor_types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(UserError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ROUND_TRIPS)
def test_a_written_model_reads_back_with_the_same_logits(model_type, tokenizer, tmp_path):
    model = decoder(model_type, tokenizer)
    path = tmp_path / "model.gguf"
    export.write_gguf(model, tokenizer, path, "f32")
    back, _ = export.read_back(path)
    assert relative_difference(logits(model, tokenizer), logits(back, tokenizer)) <= TOLERANCE["f32"]


def test_every_writable_type_has_its_round_trip_above():
    assert sorted(export.writable_types()) == sorted(ROUND_TRIPS)


def test_llama_s_rope_rows_are_permuted_as_llama_cpp_stores_them(tokenizer, tmp_path):
    """Without the permutation the file would still load, and compute another model: the attention scores of q
    and k rotated in the wrong pairs."""
    model = decoder("llama", tokenizer)
    path = tmp_path / "model.gguf"
    export.write_gguf(model, tokenizer, path, "f32")
    stored = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    assert (stored.data == export._rope_rows(torch.from_numpy(q), 4).numpy()).all()
    assert not (stored.data == q).all()


@pytest.mark.slow
@pytest.mark.parametrize("quantization,dtype", [("f16", "float16"), ("bf16", "bfloat16")])
def test_f16_and_bf16_differ_from_the_model_only_by_the_rounding_of_its_weights(quantization, dtype, tokenizer,
                                                                                 tmp_path):
    model = decoder("llama", tokenizer)
    path = tmp_path / "model.gguf"
    export.write_gguf(model, tokenizer, path, quantization)
    back, _ = export.read_back(path)
    expected = logits(rounded(model, getattr(torch, dtype)), tokenizer)
    assert relative_difference(expected, logits(back, tokenizer)) <= TOLERANCE[quantization]
    assert fields(path)["general.file_type"] == {"f16": 1, "bf16": 32}[quantization]


def test_q8_0_quantizes_whole_blocks_keeps_norms_f32_and_stays_close(tokenizer, tmp_path):
    # hidden 48: rows of 48 values are not whole 32-value blocks and fall back to f16; the MLP's down projection
    # reads rows of 128 and is quantized
    model = decoder("llama", tokenizer, hidden_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=24)
    path = tmp_path / "model.gguf"
    export.write_gguf(model, tokenizer, path, "q8_0")
    types = tensor_types(path)
    assert types["blk.0.ffn_down.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "F16"
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"
    assert fields(path)["general.file_type"] == 7
    wide = decoder("llama", tokenizer)
    export.write_gguf(wide, tokenizer, tmp_path / "wide.gguf", "q8_0")
    export.write_gguf(wide, tokenizer, tmp_path / "wide-f16.gguf", "f16")
    assert set(tensor_types(tmp_path / "wide.gguf").values()) == {"Q8_0", "F32"}
    assert (tmp_path / "wide.gguf").stat().st_size < 0.7 * (tmp_path / "wide-f16.gguf").stat().st_size
    back, _ = export.read_back(tmp_path / "wide.gguf")
    difference = relative_difference(logits(wide, tokenizer), logits(back, tokenizer))
    assert 0 < difference <= TOLERANCE["q8_0"]


def test_the_tokenizer_reads_back_with_the_same_ids_special_tokens_and_chat_template(tokenizer, tmp_path):
    path = tmp_path / "model.gguf"
    export.write_gguf(decoder("llama", tokenizer), tokenizer, path, "f16")
    _, back = export.read_back(path)
    for text in TEXTS:
        assert back(text).input_ids == tokenizer(text).input_ids, text
    chat = [{"role": "user", "content": "Hi there"}]
    assert back.chat_template == TEMPLATE
    assert back.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"] == (
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"])
    meta = fields(path)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert meta["tokenizer.ggml.token_type"][im_end] == gguf.TokenType.CONTROL  # kept whole by llama.cpp
    assert meta["tokenizer.ggml.tokens"][-1].startswith("[PAD")  # the embedding rows past the vocabulary


def split_then_byte_level(regex: str, bos: str | None = None):
    """The tiny tokenizer's vocabulary behind Llama 3's or Qwen2's shape of pre-tokenizer (a regex split, then bytes),
    adding `bos` before each text as Llama 3's does."""
    from tokenizers import Regex, pre_tokenizers, processors

    from hftoolkit.sources.tiny import ensure_tiny

    backend = tf.AutoTokenizer.from_pretrained(ensure_tiny("gpt2")).backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                               special_tokens=[(bos, backend.token_to_id(bos))])
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token="<|endoftext|>")


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_a_regex_split_tokenizer_is_named_for_llama_cpp_and_keeps_its_ids_and_bos(pre, tmp_path):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    tokenizer = split_then_byte_level(GGUF_PRE_TOKENIZER_SPLITS[pre], bos="<|endoftext|>")
    path = tmp_path / "model.gguf"
    export.write_gguf(decoder("llama", tokenizer), tokenizer, path, "f16")
    meta = fields(path)
    assert meta["tokenizer.ggml.pre"] == pre and meta["tokenizer.ggml.add_bos_token"] is True
    _, back = export.read_back(path)
    for text in TEXTS + ["I've 12345 'RE"]:
        assert back(text).input_ids == tokenizer(text).input_ids == [tokenizer.bos_token_id, *tokenizer(
            text, add_special_tokens=False).input_ids], text


def test_a_pre_tokenizer_llama_cpp_does_not_know_is_refused(tmp_path):
    tokenizer = split_then_byte_level(r"\w+|\s+")
    model = decoder("llama", tokenizer)
    assert "llama.cpp" in one_line_error(export.write_gguf, model, tokenizer, tmp_path / "m.gguf", "f16")
    assert list(tmp_path.iterdir()) == []


def test_the_run_s_chat_template_is_written_over_the_tokenizer_s(tokenizer, tmp_path):
    run_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    path = tmp_path / "model.gguf"
    export.write_gguf(decoder("llama", tokenizer), tokenizer, path, "f16", chat_template=run_template, name="my-run")
    meta = fields(path)
    assert meta["tokenizer.chat_template"] == run_template and meta["general.name"] == "my-run"
    assert export.read_back(path)[1].chat_template == run_template


@pytest.mark.parametrize("model_type", ["bert", "t5"])
def test_a_model_type_that_can_t_be_written_is_refused_naming_the_types_that_can(model_type):
    message = export.refusal(model_type)
    assert message and "\n" not in message and model_type in message
    assert all(writable in message for writable in export.writable_types())
    assert export.refusal("llama") is None


def test_an_unknown_quantization_is_refused_in_one_line_and_writes_nothing(tokenizer, tmp_path):
    message = one_line_error(export.write_gguf, decoder("llama", tokenizer), tokenizer, tmp_path / "m.gguf", "q4_k")
    assert "q4_k" in message and all(q in message for q in export.QUANTIZATIONS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model_type,changes,said", [
    ("gpt2", {"n_positions": 512}, "512 positions"),  # hftoolkit's init:gpt2 shape, which transformers can't read
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "rope scaling"),
])
def test_a_model_its_readers_would_compute_differently_is_refused_and_writes_nothing(model_type, changes, said,
                                                                                      tokenizer, tmp_path):
    model = decoder(model_type, tokenizer, **changes)
    assert said in one_line_error(export.write_gguf, model, tokenizer, tmp_path / "m.gguf", "f16")
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_that_is_not_byte_level_bpe_is_refused(tokenizer, tmp_path):
    from hftoolkit.sources.tiny import ensure_tiny

    wordpiece = tf.AutoTokenizer.from_pretrained(ensure_tiny("bert"))
    model = decoder("llama", tokenizer)
    assert "byte-level BPE" in one_line_error(export.write_gguf, model, wordpiece, tmp_path / "m.gguf", "f16")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_at_f16_generates_the_same_greedy_tokens(tiny_smollm2, tmp_path):
    """SmolLM2's tokenizer and chat template on the tiny stand-in (a tied llama): the file chats in the template and
    generates what its weights, rounded to f16 as the file stores them, generate. (Random weights' top logits are
    close: that f16's rounding leaves a real model's answers as they were is for a real model to show.)"""
    model = tf.AutoModelForCausalLM.from_pretrained(tiny_smollm2, dtype=torch.float32).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(tiny_smollm2)
    path = tmp_path / "smollm2.gguf"
    export.write_gguf(model, tokenizer, path, "f16")
    back, back_tokenizer = export.read_back(path)
    reader = gguf.GGUFReader(path)  # (one field's contents: all of them, a 49k-token vocabulary, take seconds)
    pre = reader.fields["tokenizer.ggml.pre"].contents()
    assert pre == "smollm"  # what llama.cpp's converter names this vocabulary
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied: llama.cpp reuses token_embd
    f16 = rounded(model, torch.float16)
    for question in ["What is the capital of France?", "Write a haiku about the sea.", "Name three primes."]:
        chat = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        again = back_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
        assert again["input_ids"] == ids["input_ids"][0].tolist()
        with torch.no_grad():
            ours, theirs, rounded_logits = model(**ids).logits, back(**ids).logits, f16(**ids).logits
            expected = f16.generate(**ids, max_new_tokens=16, do_sample=False)
            generated = back.generate(**ids, max_new_tokens=16, do_sample=False)
        print(f"{question}: max |logit difference| {(ours - theirs).abs().max().item():.4f} "
              f"(largest logit {ours.abs().max().item():.1f})")
        assert torch.equal(expected, generated), (tokenizer.decode(expected[0]), tokenizer.decode(generated[0]))
        assert relative_difference(rounded_logits, theirs) <= TOLERANCE["f16"]
        assert relative_difference(ours, theirs) <= 5e-3  # f16's rounding of the weights, carried through the layers
