"""Task grpo end to end on a tiny random GPT-2: answers sampled and rewarded, the adapter moved, the rewards per step
in the log, the eval's rewards in metrics.json; the reference of the KL term; and bad input refused in one line
before anything is written."""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe

GRPO = RECIPES / "decoder-grpo.yaml"
QUICK = ("training.max_steps=3", "data.max_train_samples=32", "data.max_eval_samples=8", "rl.max_completion_length=8",
         "eval.generation.max_new_tokens=8")
# A reward a random model's answers differ in, so that every group has advantages to learn from.
VOWELS = '''
def vowels(completions, **_):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(len(t), 1) for t in texts]
'''


@pytest.fixture
def vowels(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(VOWELS)
    return f"rl.rewards=[{{function: {path}:vowels}}, {{regex: '\\d+', weight: 0.5}}]"


def history(run) -> list[dict]:
    return [json.loads(line) for line in (run / "log_history.jsonl").read_text().splitlines()]


def adapter_moved(run) -> float:
    from safetensors.torch import load_file

    weights = load_file(run / "adapter" / "adapter_model.safetensors")
    return max(float(w.abs().max()) for name, w in weights.items() if "lora_B" in name)


@pytest.mark.slow
def test_grpo_samples_rewards_and_moves_the_adapter(tmp_path, vowels):
    run = tmp_path / "run"
    trained = train_recipe(GRPO, run, *QUICK, vowels)
    steps = [h for h in history(run) if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2, 3]
    for h in steps:  # one mean and spread per reward function, the answers' length, the summed reward
        assert {"rewards/vowels/mean", "rewards/vowels/std", "rewards/format/mean", "reward",
                "completions/mean_length"} <= set(h)
        assert 0 <= h["rewards/vowels/mean"] <= 1
    assert adapter_moved(run) > 0, "the advantages moved the adapter"
    evaluation = json.loads((run / "metrics.json").read_text())["eval"]
    assert set(evaluation) == {"reward", "rewards/vowels", "rewards/format"}
    assert evaluation["reward"] == pytest.approx(evaluation["rewards/vowels"] + 0.5 * evaluation["rewards/format"])
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["input"].startswith("What is ") for r in records)
    assert "reward" in plain(trained.output)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["batch_order"]["sampling"] == "prompts shuffled, each sampled 4 times"


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_kl_term_starts_at_zero_against_the_reference(tmp_path, vowels, lora):
    """With LoRA the reference is the base with the adapter off (no "ref" adapter is kept or saved); with full
    fine-tuning, a copy of the loaded model: either way the policy starts equal to it."""
    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, vowels, "rl.beta=0.1", f"lora.enabled={str(lora).lower()}",
                 *(() if lora else ("training.learning_rate=0.0005",)))
    steps = [h for h in history(run) if "loss" in h]
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert steps[-1]["kl"] > 0, "the policy moved away from the reference"
    if lora:
        assert not (run / "adapter" / "ref").exists()
        config = json.loads((run / "adapter" / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dapo", "dr_grpo", "gspo", "rloo"])
def test_every_method_trains(tmp_path, vowels, method):
    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, vowels, f"rl.method={method}", "training.max_steps=2")
    assert adapter_moved(run) > 0
    assert f"method: {method}" in (run / "recipe.yaml").read_text()


@pytest.mark.parametrize(("sets", "said"), [
    (("rl.rewards=[{function: missing.py:f}]",), "rl.rewards.0.function: reward file missing.py not found"),
    (("rl.num_generations=1",), "rl.num_generations: 1 answer per prompt leaves no group to compare it with"),
    (("training.batch_size=6",), "training.batch_size counts sampled answers, and 6 is not a whole number of groups"),
    (("model.checkpoint=init:bert",), "task 'grpo' can't be done by 'init:bert', an encoder model"),
    (("model.checkpoint=init:t5",), "task 'grpo' can't be done by 'init:t5', a seq2seq model"),
    (("rl.rewards=[{exact: solution}]",), "rl.rewards.0.exact: column 'solution' not found in data.train"),
])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(tmp_path, sets, said):
    run = tmp_path / "run"
    result = train_recipe(GRPO, run, *QUICK, *sets, expect=2)
    error = result.output.split("Error: ", 1)[1].strip()
    assert said in plain(error) and len(error.splitlines()) <= 2, error
    assert not run.exists()


def test_a_reward_function_that_fails_its_dry_batch_is_refused_before_anything_loads(tmp_path, monkeypatch):
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))
    (tmp_path / "bad.py").write_text("def raises(completions, **_):\n    raise ValueError('no answer column')\n"
                                     "def short(completions, **_):\n    return [0.0]\n")
    for name, said in (("raises", "reward function raises raised ValueError: no answer column on a dry batch"),
                       ("short", "reward function short returned 1 value for a dry batch of 4 answers")):
        run = tmp_path / name
        result = train_recipe(GRPO, run, *QUICK, f"rl.rewards=[{{function: {tmp_path}/bad.py:{name}}}]", expect=2)
        assert said in plain(result.output) and not run.exists()


def test_a_reward_run_of_another_task_is_refused_in_one_line(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "recipe.yaml").write_text("name: other\ntask: classification\n")
    result = run_cli("validate", GRPO, "--data", "--set", f"rl.rewards=[{{run: {other}}}]", expect=2)
    assert (f"rl.rewards.0.run: {other} is a task classification run, and a reward comes from a task reward run"
            in plain(result.output))


def test_prompts_with_no_text_are_refused_in_one_line(tmp_path):
    data = tmp_path / "prompts.csv"
    data.write_text("text,answer\n,1\n  ,2\n")
    result = run_cli("validate", GRPO, "--data", "--set", f"data.train={data}", expect=2)
    assert "every row of" in plain(result.output) and "has an empty text" in plain(result.output)


@pytest.mark.slow
def test_the_data_s_other_columns_reach_the_reward_functions(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Say {w}.", "word": w, "level": i})
                              for i, w in enumerate(["cat", "dog", "sun", "sea"] * 4)))
    (tmp_path / "seen.py").write_text(
        "def said_the_word(completions, word, level, **_):\n"
        "    assert len(word) == len(level) == len(completions)\n"
        "    return [float(w in c) for c, w in zip(completions, word)]\n")
    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, f"data.train={data}", "data.text_column=question", "data.eval_fraction=0.25",
                 f"rl.rewards=[{{function: {tmp_path}/seen.py:said_the_word}}]", "training.max_steps=1")
    assert "rewards/said_the_word" in json.loads((run / "metrics.json").read_text())["eval"]


@pytest.mark.slow
def test_a_sweep_over_the_kl_weight_trains_each_variant_and_reports_its_rewards(tmp_path, vowels):
    out = tmp_path / "sweeps"
    run_cli("sweep", GRPO, "--grid", "rl.beta=0,0.05", "--output", out, *[a for s in (*QUICK, vowels,
                                                                                         "training.max_steps=1")
                                                                       for a in ("--set", s)])
    variants = sorted(p.name for p in (out / "decoder-grpo").iterdir() if (p / "metrics.json").is_file())
    assert variants == ["beta-0", "beta-0.05"]
    assert "## Rewards: per step, answer length and KL" in (out / "decoder-grpo" / "report.md").read_text()


@pytest.mark.slow
def test_a_grpo_run_is_predicted_from_and_merged(tmp_path, vowels):
    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, vowels, "training.max_steps=1")
    question = "What is 2 plus 3? Answer with the number only."

    def answer(folder) -> str:
        return run_cli("predict", folder, "-i", question).output.rsplit(question, 1)[1].strip()

    adapter_answer = answer(run)
    assert adapter_answer
    run_cli("merge", run, "--output", tmp_path / "merged")
    assert answer(tmp_path / "merged") == adapter_answer, "the merged model answers as the adapter did (greedy)"


@pytest.mark.slow
def test_a_grpo_run_is_served_as_a_chat_model(tmp_path, vowels):
    import httpx

    from tests.helpers.serving import serving

    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, vowels, "training.max_steps=1")
    question = [{"role": "user", "content": "What is 2 plus 3? Answer with the number only."}]
    with serving([("grpo", run)]) as (url, served, _):
        assert served["grpo"].chats, "tuned on prompts as the instruction task writes them: it answers chats"
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "grpo", "messages": question, "max_tokens": 8, "temperature": 1.0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.slow
def test_a_reward_run_scores_the_sampled_answers(tmp_path):
    """A task reward run as GRPO's reward: its model scores each prompt and sampled answer, and those scores are the
    step's rewards (they differ between answers, so the step learns from them)."""
    reward_run = tmp_path / "reward"
    train_recipe(RECIPES / "encoder-reward.yaml", reward_run, "data.max_train_samples=64", "data.max_eval_samples=8",
                 "training.max_steps=2", "eval.max_predictions=2")
    run = tmp_path / "run"
    train_recipe(GRPO, run, *QUICK, f"rl.rewards=[{{run: {reward_run}}}]", "training.max_steps=2")
    steps = [h for h in history(run) if "loss" in h]
    assert all(h["rewards/reward_model/std"] > 0 for h in steps), "the reward model tells answers apart"
    assert adapter_moved(run) > 0
    assert "rewards/reward_model" in json.loads((run / "metrics.json").read_text())["eval"]


def test_conversation_prompts_need_a_chat_template_and_well_formed_turns(tmp_path):
    chats, broken = tmp_path / "chats.jsonl", tmp_path / "broken.jsonl"
    chats.write_text("\n".join(json.dumps({"text": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)})
                               for i in range(8)))
    broken.write_text("\n".join(json.dumps({"text": [{"role": "user"}], "answer": str(i)}) for i in range(8)))
    result = run_cli("validate", GRPO, "--data", "--set", f"data.train={chats}", expect=2)
    assert ("data.text_column: the prompts of " in plain(result.output)
            and "has no chat template to render them: give the prompts as texts, or use a chat model"
            in plain(result.output))
    result = run_cli("validate", GRPO, "--data", "--set", f"data.train={broken}", expect=2)
    assert "turn 0 is not a {role, content} mapping of two strings" in plain(result.output)
