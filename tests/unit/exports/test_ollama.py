"""The Ollama Modelfile: the run's Jinja chat template as an Ollama (Go) template that writes the same prompt, the
stop tokens, the generation settings and the system prompt. Where Go is installed, Go's own text/template renders
the template as Ollama does (its messages, the Modelfile's SYSTEM first where a conversation has none)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from hftoolkit.exports.ollama import MODELFILE, modelfile, wrapping

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama 3's shape: a bos in the text, headers around each role, no system prompt of its own.
HEADERS = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
           "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
           "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
SHOUTING = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
             "<turn>{{ m['role'] }}\n{{ m['content'] }}</turn>\n{% endfor %}{% if add_generation_prompt %}"
             "<turn>assistant\n{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "How are you?\nWell?"}],
]


@pytest.fixture
def tokenizer(tiny_cache):
    from transformers import AutoTokenizer

    from hftoolkit.sources.tiny import ensure_tiny

    return AutoTokenizer.from_pretrained(ensure_tiny("gpt2"))


def with_template(tokenizer, template: str):
    tokenizer.chat_template = template
    return tokenizer


def parse(text: str) -> dict:
    """The Modelfile's commands as Ollama's parser reads them: one a line, or a triple-quoted value over lines;
    comment lines skipped."""
    found: dict = {"PARAMETER": []}
    for match in re.finditer(r'^([A-Z]+) (?:"""(.*?)"""|([^\n]*))$', text, re.M | re.S):
        command, value = match[1], match[2] if match[2] is not None else match[3]
        if command == "PARAMETER":
            found["PARAMETER"].append(tuple(value.split(" ", 1)))
        else:
            found[command] = value
    return found


def test_chatml_becomes_a_go_template_with_the_templates_own_system_prompt(tokenizer):
    wrap = wrapping(with_template(tokenizer, CHATML))
    assert wrap.around["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert wrap.generation == "<|im_start|>assistant\n"
    assert wrap.default_system == "You are a helpful assistant."
    text = modelfile("run-f16.gguf", tokenizer, ["<|im_end|>", "<|endoftext|>"],
                     {"strategy": "sample", "max_new_tokens": 64, "temperature": 0.7, "top_k": None, "top_p": 0.9},
                     None)
    commands = parse(text)
    assert commands["FROM"] == "./run-f16.gguf"
    assert '{{ else if eq .Role "user" }}<|im_start|>user\n{{ .Content }}' in commands["TEMPLATE"]
    assert commands["PARAMETER"] == [("stop", '"<|im_end|>"'), ("stop", '"<|endoftext|>"'), ("num_predict", "64"),
                                     ("temperature", "0.7"), ("top_k", "0"), ("top_p", "0.9")]
    assert commands["SYSTEM"] == "You are a helpful assistant."


def test_the_datas_system_prompt_wins_and_greedy_is_temperature_zero(tokenizer):
    text = modelfile("m.gguf", with_template(tokenizer, CHATML), ["<|im_end|>"],
                     {"strategy": "greedy", "max_new_tokens": 32}, "You grade essays.")
    assert parse(text)["SYSTEM"] == "You grade essays."
    assert ("temperature", "0") in parse(text)["PARAMETER"]


@pytest.mark.parametrize("template", [CHATML, HEADERS])
def test_the_wrapping_writes_what_the_jinja_template_writes(tokenizer, template):
    wrap = wrapping(with_template(tokenizer, template))
    assert wrap is not None
    for conversation in CONVERSATIONS:
        system = [] if conversation[0]["role"] == "system" or wrap.default_system is None else \
            [{"role": "system", "content": wrap.default_system}]
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert wrap.render(system + conversation) == rendered


@pytest.mark.parametrize("template", [SHOUTING, NO_SYSTEM])
def test_a_template_that_is_no_wrapping_is_left_to_ollama(tokenizer, template):
    assert wrapping(with_template(tokenizer, template)) is None
    text = modelfile("m.gguf", tokenizer, [], {"strategy": "greedy", "max_new_tokens": 8}, None)
    assert "TEMPLATE" not in parse(text) and "Ollama reads it from the GGUF file" in text


GO_RENDER = """package main

import (
	"encoding/json"
	"os"
	"text/template"
)

type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func main() {
	var input struct {
		Template string    `json:"template"`
		Messages []Message `json:"messages"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&input); err != nil {
		panic(err)
	}
	t := template.Must(template.New("").Parse(input.Template))
	if err := t.Execute(os.Stdout, map[string]any{"Messages": input.Messages}); err != nil {
		panic(err)
	}
}
"""


@pytest.mark.skipif(shutil.which("go") is None, reason="Go renders Ollama's templates: apt-get install golang-go")
def test_go_renders_the_modelfile_template_as_the_run_was_trained(tokenizer, tmp_path):
    """Ollama's own engine (Go's text/template) renders each conversation as the run's Jinja template does; a
    conversation without a system turn gets the Modelfile's SYSTEM first, as Ollama gives it."""
    with_template(tokenizer, CHATML)
    (tmp_path / MODELFILE).write_text(modelfile("m.gguf", tokenizer, [], {"strategy": "greedy",
                                                                            "max_new_tokens": 8}, None))
    commands = parse((tmp_path / MODELFILE).read_text())
    (tmp_path / "render.go").write_text(GO_RENDER)
    env = {"GOCACHE": str(tmp_path / "go-cache"), "GOPATH": str(tmp_path / "go"), "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin:/usr/local/bin", "GOFLAGS": "-mod=mod", "GO111MODULE": "off"}
    subprocess.run(["go", "build", "-o", str(tmp_path / "render"), str(tmp_path / "render.go")], env=env,
                   check=True, timeout=300)
    for conversation in CONVERSATIONS:
        messages = conversation if conversation[0]["role"] == "system" else \
            [{"role": "system", "content": commands["SYSTEM"]}, *conversation]
        out = subprocess.run([str(tmp_path / "render")], input=json.dumps({"template": commands["TEMPLATE"],
                                                                          "messages": messages}),
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert out == tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
