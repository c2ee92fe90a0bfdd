"""Conversations (data.messages_column): the label mask against the chat template, cuts, train -> eval -> predict."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe

RECIPE = RECIPES / "smollm2-conversations.yaml"
TALK = [{"role": "system", "content": "Answer in one short sentence."},
        {"role": "user", "content": "What colour is the sky?"},
        {"role": "assistant", "content": "The sky is blue."},
        {"role": "user", "content": "And grass?"},
        {"role": "assistant", "content": "Grass is green."},
        {"role": "user", "content": "Snow?"},
        {"role": "assistant", "content": "Snow is white."}]


@pytest.fixture(scope="session")
def smol_tokenizer(tiny_smollm2):
    """SmolLM2's own tokenizer and chat template (the tiny stand-in's: the real model's, without its weights)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_smollm2))


def _runs(labels: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of trained positions."""
    runs, start = [], None
    for j, label in enumerate([*labels, -100]):
        if label != -100 and start is None:
            start = j
        elif label == -100 and start is not None:
            runs.append((start, j))
            start = None
    return runs


@pytest.mark.slow
def test_the_loss_falls_on_every_assistant_turn_token_by_token(smol_tokenizer):
    from hftoolkit.sources.conversations import encode

    tok = smol_tokenizer
    encoded = encode(tok, TALK, 1000)
    rendered = tok.apply_chat_template(TALK, tokenize=False)
    assert encoded.input_ids == tok(rendered, add_special_tokens=False)["input_ids"], "the template's own rendering"
    runs = _runs(encoded.labels)
    answers = [t["content"] for t in TALK if t["role"] == "assistant"]
    assert len(runs) == len(answers) == 3, "one trained span per assistant turn, several turns"
    for (start, end), answer in zip(runs, answers):
        expected = tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        assert encoded.input_ids[start:end] == expected, "the answer and the token that ends its turn, nothing else"
        assert encoded.labels[start:end] == expected
        before = tok.decode(encoded.input_ids[:start], skip_special_tokens=False)
        assert before.endswith("<|im_start|>assistant\n"), "the generation prompt is not trained"
    untrained = tok.decode([i for i, label in zip(encoded.input_ids, encoded.labels) if label == -100])
    assert "Answer in one short sentence." in untrained and "And grass?" in untrained and "blue" not in untrained


@pytest.mark.slow
def test_a_system_prompt_is_rendered_and_never_trained(smol_tokenizer):
    from hftoolkit.sources.conversations import encode

    tok = smol_tokenizer
    with_system, without = encode(tok, TALK[:3], 1000), encode(tok, TALK[1:3], 1000)
    shown = tok.decode(with_system.input_ids)
    assert "Answer in one short sentence." in shown and "named SmolLM" not in shown, "ours replaces the default"
    assert "named SmolLM" in tok.decode(without.input_ids), "the template's default system turn otherwise"
    for encoded in (with_system, without):
        assert tok.decode([i for i, x in zip(encoded.input_ids, encoded.labels) if x != -100]) \
            == "The sky is blue.<|im_end|>"


@pytest.mark.slow
def test_a_long_conversation_is_cut_at_a_turn_boundary(smol_tokenizer):
    from hftoolkit.sources.conversations import encode

    tok = smol_tokenizer
    whole = encode(tok, TALK, 1000)
    second_end = _runs(whole.labels)[1][1]
    cut = encode(tok, TALK, second_end + 3)  # room for two answers and part of the third turn
    assert cut.cut == "turn" and cut.input_ids == whole.input_ids[:second_end], "after the second answer"
    assert tok.decode(cut.input_ids).endswith("Grass is green.<|im_end|>")
    inside = encode(tok, TALK, 20)  # shorter than the first answer's end
    assert inside.cut == "inside" and len(inside.input_ids) == 20


def _write(path, rows):
    path.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows), encoding="utf-8")
    return path


def _chats(n: int) -> list[list[dict]]:
    colours = ["blue", "green", "red", "white", "black"]
    return [[{"role": "user", "content": f"Name colour {i % 5}."},
             {"role": "assistant", "content": f"Colour {i % 5} is {colours[i % 5]}."},
             {"role": "user", "content": "Say it again."},
             {"role": "assistant", "content": colours[i % 5]}] for i in range(n)]


@pytest.mark.slow
def test_preflight_counts_conversations_longer_than_max_length(tmp_path, tiny_smollm2):
    data = _write(tmp_path / "chats.jsonl", _chats(12) + [TALK * 6])
    result = run_cli("validate", RECIPE, "--data", "--set", f"model.checkpoint={tiny_smollm2}",
                     "--set", "model.gguf_file=null", "--set", "model.revision=null", "--set", f"data.train={data}",
                     "--set", "data.eval_split=null", "--set", "data.eval_fraction=0.2", "--set", "data.max_length=300")
    text = plain(result.output)
    assert "1 conversation longer than 300 tokens: 1 cut after the last assistant turn that fits, 0 cut inside" in text


def test_a_malformed_turn_is_one_line_naming_the_row(tmp_path):
    data = _write(tmp_path / "chats.jsonl", _chats(3) + [[{"role": "user", "text": "hi"}]])
    sets = ("model.checkpoint=init:gpt2", "model.gguf_file=null", "model.revision=null", f"data.train={data}",
            "data.eval_split=null")
    result = run_cli("validate", RECIPE, "--data", *[a for s in sets for a in ("--set", s)], expect=2)
    assert "data.messages_column: row 3 of" in plain(result.output) and "turn 0 is not a {role, content}" \
        in plain(result.output)


@pytest.mark.slow
def test_the_same_file_trains_evaluates_and_predicts(tmp_path):
    """init:gpt2 has no chat template: the plain format (role: content lines, eos after each answer)."""
    data = _write(tmp_path / "chats.jsonl", _chats(40))
    run = tmp_path / "run"
    sets = ("model.checkpoint=init:gpt2", "model.gguf_file=null", "model.revision=null", f"data.train={data}",
            "data.eval_split=null", "data.max_eval_samples=4", "data.max_length=64", "training.max_steps=3",
            "training.batch_size=4", "eval.batch_size=4", "eval.generation.max_new_tokens=4", "data.packing=false",
            "eval.every=3")
    train_recipe(RECIPE, run, *sets)
    logged = [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]
    assert any("eval_rougeL" in entry for entry in logged), "an eval during training scores the answers too"
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert records and all(r["input"] == "Say it again." for r in records), "eval answers the last user turn"
    assert {r["reference"] for r in records} <= {"blue", "green", "red", "white", "black"}
    run_cli("eval", run)
    result = run_cli("predict", run, "--input", str(data), "--format", "jsonl")
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert len(rows) == 40 and rows[0]["input"] == "Say it again." and "text" in rows[0]


def test_the_recipe_s_hub_set_loads_as_conversations_through_its_hub_id(tmp_path, monkeypatch):
    """HuggingFaceH4/no_robots planted in the caches as an online load leaves it (its columns and splits)."""
    import datasets

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data
    from tests.helpers import hub_cache

    turn = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    features = datasets.Features({"prompt": datasets.Value("string"), "prompt_id": datasets.Value("string"),
                                  "messages": datasets.List(turn), "category": datasets.Value("string")})
    rows = lambda split, n: [{"prompt": t[0]["content"], "prompt_id": f"{split}{i}", "messages": t,  # noqa: E731
                              "category": "Chat"} for i, t in enumerate(_chats(n))]
    home = tmp_path / "hf-home"
    hub_cache.plant_dataset(home / "hub", home / "datasets", "HuggingFaceH4/no_robots",
                            {"default": (features, {"train": rows("train", 10), "test": rows("test", 4)})})
    hub_cache.use_hf_home(monkeypatch, home)
    data, _ = load_data(load_recipe(RECIPE))
    assert data["train"].column_names == ["messages"] and (len(data["train"]), len(data["eval"])) == (10, 4)
    assert data["eval"][0]["messages"][-1] == {"role": "assistant", "content": "blue"}


@pytest.mark.slow
def test_smollm2_trains_packed_conversations_and_answers_the_last_user_turn(tmp_path, tiny_smollm2):
    """The shipped recipe, offline: a local conversation file, packed rows in SmolLM2's chat template (the tiny
    stand-in: trained at a high rate on five conversations repeated, the loss on the assistant turns falls), and
    `predict` on the same file answers each conversation's last user turn."""
    data = _write(tmp_path / "chats.jsonl", _chats(12))
    run = tmp_path / "run"
    train_recipe(RECIPE, run, f"model.checkpoint={tiny_smollm2}", "model.gguf_file=null", "model.revision=null",
                 f"data.train={data}", "data.eval_split=null", "data.max_eval_samples=2", "data.max_length=128",
                 "training.max_steps=8", "training.batch_size=4", "training.learning_rate=0.01",
                 "training.warmup_ratio=0", "training.logging_steps=1", "eval.generation.max_new_tokens=4")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["padding_fraction"] < 0.1, "packed rows"
    losses = [row["loss"] for row in map(json.loads, (run / "log_history.jsonl").read_text().splitlines())
              if "loss" in row]
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0], losses  # (measured: 12.2 -> 5.9)
    rows = [json.loads(line) for line in run_cli("predict", run, "--input", str(data), "--format", "jsonl",
                                                 "--max-new-tokens", "3").stdout.splitlines() if line.strip()]
    assert len(rows) == 12 and {r["input"] for r in rows} == {"Say it again."} and all(r["text"] for r in rows)


def test_a_conversation_without_an_answer_is_dropped_and_counted():
    from datasets import Dataset

    from hftoolkit.sources.data import drop_empty

    unanswered = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "  "}]
    kept, dropped = drop_empty(Dataset.from_dict({"messages": [*_chats(2), unanswered]}), "data.train", "chats.jsonl")
    assert (len(kept), dropped) == (2, 1)


def test_conversations_on_an_encoder_decoder_are_refused_with_every_problem_at_once(tmp_path):
    data = _write(tmp_path / "chats.jsonl", _chats(6))
    sets = ("model.checkpoint=init:t5", "model.gguf_file=null", "model.revision=null", f"data.train={data}",
            "data.eval_split=null", "lora.targets=auto")
    result = run_cli("validate", RECIPE, "--data", *[a for s in sets for a in ("--set", s)], expect=2)
    text = plain(result.output)
    assert "data.messages_column: conversations train decoder models, and init:t5 is seq2seq" in text
    assert "data.packing: packing whole examples into rows is for decoder models" in text


@pytest.mark.slow
def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line(smol_tokenizer):
    import copy

    from hftoolkit.base.errors import UserError
    from hftoolkit.sources.conversations import encode

    tok = copy.deepcopy(smol_tokenizer)
    # Marks the last turn: a conversation's beginning renders differently once more turns follow.
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}[last]{% endif %}{{ m['role'] }}: "
                         "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(UserError, match="renders a conversation's beginning differently when more turns follow"):
        encode(tok, TALK, 1000)
