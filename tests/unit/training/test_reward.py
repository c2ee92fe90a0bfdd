"""task reward: a one-output head learns to score the chosen answer of a pair above the rejected one (Bradley-Terry),
on an encoder and on a decoder, with LoRA; the eval scores every held-out pair at once; the finished run scores
answers for other code (`load_reward_scorer`), for predict and for serve exactly as its eval pass did. (The pairs'
layouts and checks are shared with task preference: test_preference.py.)"""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe

REWARD = RECIPES / "encoder-reward.yaml"
QUICK = ("data.max_train_samples=320", "data.max_eval_samples=64", "eval.max_predictions=8")
# The whole train set (900 pairs): enough steps that the ranking learned stands clear of the untrained head's (its
# scores nearly tie, so its accuracy is a coin toss over the 64 held-out pairs); every held-out pair recorded.
WHOLE = ("data.max_eval_samples=64", "eval.max_predictions=64")


def sets(*values: str) -> list[str]:
    return [x for s in values for x in ("--set", s)]


def test_the_loss_is_minus_log_sigmoid_of_the_score_difference_and_eval_counts_every_pair():
    import numpy as np
    import torch
    from transformers import EvalPrediction

    from hftoolkit.models.families.reward import pair_metrics
    from hftoolkit.training.reward import pair_losses

    chosen, rejected = torch.tensor([2.0, 0.5, -1.0, 0.3]), torch.tensor([1.0, 0.5, 1.0, -0.2])
    margin = torch.tensor([0.0, 0.0, 0.0, 1.0])
    delta = [1.0, 0.0, -2.0, 0.5 - 1.0]
    expected = [-math.log(1 / (1 + math.exp(-d))) for d in delta]
    assert pair_losses(chosen, rejected, margin).tolist() == pytest.approx(expected, rel=1e-6)
    scored = pair_metrics(EvalPrediction(np.stack([chosen.numpy(), rejected.numpy()], -1), margin.numpy()))
    assert scored["loss"] == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert scored["reward_accuracy"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)  # a tie counts half
    assert scored["reward_margin"] == pytest.approx((1.0 + 0 - 2.0 + 0.5) / 4)


def test_a_step_is_the_mean_over_its_pairs_however_its_micro_batches_split_them():
    import torch

    from hftoolkit.training.reward import BradleyTerryLoss

    class Scorer(torch.nn.Module):  # one score per row: the row's first feature times a weight
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.tensor(0.7))

        def forward(self, input_ids):
            return type("Out", (), {"logits": (input_ids[:, :1].float() * self.weight)})()

    class Accelerator:
        num_processes = 1

    class Step(BradleyTerryLoss):
        accelerator = Accelerator()

    def batch(rows):  # pairs as 2B rows, the chosen first
        return {"input_ids": torch.tensor([[g] for g, _ in rows] + [[p] for _, p in rows]),
                "margin": torch.zeros(len(rows))}

    pairs = [(3, 1), (1, 2), (4, 0), (2, 2)]
    model, step = Scorer(), Step()
    step._step_pairs = torch.tensor(4.0)
    split = sum(step.compute_loss(model, batch(part)) for part in (pairs[:3], pairs[3:]))
    split.backward()
    by_parts = model.weight.grad.clone()
    model.weight.grad = None
    whole = step.compute_loss(model.eval(), batch(pairs))  # (eval: the plain mean of one batch)
    whole.backward()
    assert float(split.detach()) == pytest.approx(float(whole.detach()))
    assert float(by_parts) == pytest.approx(float(model.weight.grad), rel=1e-5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("reward") / "run"
    train_recipe(REWARD, run, *WHOLE)
    return run


@pytest.mark.slow
def test_training_ranks_held_out_pairs_better_than_the_untrained_model(trained):
    base = json.loads(run_cli("eval", REWARD, *sets(*WHOLE), "--json").stdout)["eval"]
    metrics = json.loads((trained / "metrics.json").read_text())
    tuned = metrics["eval"]
    assert metrics["main_metric"] == "reward_accuracy"
    assert {"reward_accuracy", "reward_margin", "loss"} <= set(tuned)
    # (64 held-out pairs: an accuracy moves in steps of 1/64, and the untrained head's is a coin toss around 0.5)
    assert tuned["reward_accuracy"] >= 0.65 and tuned["reward_accuracy"] > base["reward_accuracy"]
    assert tuned["reward_margin"] > base["reward_margin"]
    assert tuned["loss"] < base["loss"] < 0.7  # (the untrained head scores every answer alike: about log 2)
    history = [json.loads(line) for line in (trained / "log_history.jsonl").read_text().splitlines()]
    steps = [row for row in history if "reward_accuracy" in row and "loss" in row]
    assert len(steps) >= 3 and steps[-1]["loss"] < steps[0]["loss"]
    records = [json.loads(line) for line in (trained / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 64 and all({"input", "chosen", "rejected", "chosen_score", "rejected_score"} <= set(r)
                                     for r in records)
    adapter = json.loads((trained / "adapter" / "adapter_config.json").read_text())
    assert "classifier" in adapter["modules_to_save"]  # the head trains and is saved beside the adapter


@pytest.mark.slow
def test_the_scorer_gives_the_eval_pass_s_scores_and_prefers_the_chosen_answers(trained):
    from hftoolkit.workflows.reward_model import load_reward_scorer

    records = [json.loads(line) for line in (trained / "predictions.jsonl").read_text().splitlines()]
    scorer = load_reward_scorer(trained)
    prompts = [r["input"] for r in records]
    good, poor = scorer.score(prompts, [r["chosen"] for r in records]), scorer.score(prompts, [r["rejected"]
                                                                                               for r in records])
    assert good == pytest.approx([r["chosen_score"] for r in records], abs=1e-5)
    assert poor == pytest.approx([r["rejected_score"] for r in records], abs=1e-5)
    assert sum(g > p for g, p in zip(good, poor)) > len(records) / 2
    assert all(isinstance(s, float) for s in good) and scorer.score([], []) == []


@pytest.mark.slow
def test_predict_scores_an_answer_to_a_prompt_and_both_answers_of_a_pairs_file(trained, tmp_path):
    records = [json.loads(line) for line in (trained / "predictions.jsonl").read_text().splitlines()][:3]
    line = f"{records[0]['input']}\\t{records[0]['chosen']}"
    one = json.loads(run_cli("predict", trained, "--input", line, "--format", "jsonl").stdout)
    assert one["input"] == records[0]["input"] and one["score"] == pytest.approx(records[0]["chosen_score"], abs=1e-5)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text": r["input"], "chosen": r["chosen"], "rejected": r["rejected"]}) + "\n"
                             for r in records))
    scored = [json.loads(x) for x in run_cli("predict", trained, "--input", pairs, "--format", "jsonl").stdout
              .splitlines()]
    # (flat lists: pytest.approx does not compare nested sequences element by element)
    assert [s[k] for s in scored for k in ("chosen_score", "rejected_score")] == pytest.approx(
        [r[k] for r in records for k in ("chosen_score", "rejected_score")], abs=1e-5)


def test_a_run_of_another_task_is_refused_in_one_line(tmp_path):
    from hftoolkit.base.errors import UserError
    from hftoolkit.workflows.reward_model import load_reward_scorer

    run = tmp_path / "classifier"
    (run / "adapter").mkdir(parents=True)
    (run / "recipe.yaml").write_text((RECIPES / "encoder-classification.yaml").read_text())
    with pytest.raises(UserError) as refused:
        load_reward_scorer(run)
    assert "a classification run" in str(refused.value) and "task: reward" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_a_decoder_learns_the_pairs_as_one_sequence_read_at_its_last_token(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import decoder, formulation

    gpt2 = (*QUICK, "model.checkpoint=init:gpt2", "lora.targets=[c_attn,c_proj,c_fc]")
    job = resolve_job(load_recipe(REWARD, list(gpt2)))
    tokenizer, pair = job.model.processor, job.data["train"][:2]
    encoded = formulation(job).encode(job, tokenizer, pair["text"], pair["chosen"])
    instruction = decoder.FORMULATIONS["instruction"]
    written = [p + t for p, t in zip(instruction.prompts(job, tokenizer, pair["text"]),
                                     instruction.targets(job, tokenizer, pair["chosen"]))]
    assert [e["input_ids"] for e in encoded] == written  # as an instruction run writes prompt and answer
    base = json.loads(run_cli("eval", REWARD, *sets(*gpt2), "--json").stdout)["eval"]
    train_recipe(REWARD, tmp_path / "run", *gpt2, "training.precision=fp32")
    tuned = json.loads((tmp_path / "run" / "metrics.json").read_text())["eval"]
    assert tuned["reward_accuracy"] >= base["reward_accuracy"] + 0.15 and tuned["loss"] < base["loss"]
    from hftoolkit.workflows.reward_model import load_reward_scorer

    scorer = load_reward_scorer(tmp_path / "run")
    assert scorer.model.config.pad_token_id == tokenizer.pad_token_id  # the head finds each row's last real token
    records = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert scorer.score([r["input"] for r in records], [r["chosen"] for r in records]) == pytest.approx(
        [r["chosen_score"] for r in records], abs=1e-4)


def conversations(path, rows: list[dict], separate_prompt: bool = False):
    """`rows` (text, chosen, rejected) as chosen and rejected conversations, each pair with a margin; with
    `separate_prompt`, the prompt in a column of its own and the answers as assistant turns alone."""
    with open(path, "w") as f:
        for i, row in enumerate(rows):
            prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["text"]}]
            good, poor = ([{"role": "assistant", "content": row[side]}] for side in ("chosen", "rejected"))
            pair = ({"text": prompt, "chosen": good, "rejected": poor} if separate_prompt else
                    {"chosen": prompt + good, "rejected": prompt + poor})
            f.write(json.dumps({**pair, "margin": float(i % 2)}) + "\n")
    return path


@pytest.mark.slow
def test_conversation_pairs_with_margins_train_and_score_in_the_chat_layout(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.builtin import preferences
    from hftoolkit.sources.data import load_data

    rows = preferences(240, seed=5)
    layouts = {name: conversations(tmp_path / f"{name}.jsonl", rows, separate) for name, separate
               in (("whole", False), ("separate", True))}
    read = {name: load_data(load_recipe(REWARD, [f"data.train={path}"]))[0]["train"] for name, path in layouts.items()}
    assert read["whole"][:] == read["separate"][:]  # the same pairs, whichever way the prompt was given
    first = read["whole"][0]
    assert [t["role"] for t in first["text"]] == ["system", "user"] and first["chosen"][0]["role"] == "assistant"
    assert set(read["whole"]["margin"]) == {0.0, 1.0}
    run = tmp_path / "run"
    train_recipe(REWARD, run, f"data.train={layouts['whole']}", "model.checkpoint=init:gpt2", "data.max_length=96",
                 "training.max_steps=6", "eval.max_predictions=2")
    metrics = json.loads((run / "metrics.json").read_text())["eval"]
    assert 0 <= metrics["reward_accuracy"] <= 1 and math.isfinite(metrics["loss"])
    records = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert records[0]["chosen"] in {r["chosen"] for r in rows}  # an answer's text, not its turns
    from hftoolkit.workflows.reward_model import load_reward_scorer

    scorer = load_reward_scorer(run)
    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": records[0]["input"]}]
    again = scorer.score([talk], [[{"role": "assistant", "content": records[0]["chosen"]}]])
    assert again == pytest.approx([records[0]["chosen_score"]], abs=1e-4)


def test_a_bad_margin_and_a_margin_on_another_task_are_said(tmp_path):
    from hftoolkit.base.errors import UserError
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.builtin import preferences
    from hftoolkit.sources.data import load_data

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({**row, "margin": "big" if i == 2 else 1}) + "\n"
                            for i, row in enumerate(preferences(20))))
    with pytest.raises(UserError, match="row 2 of .* has margin 'big'"):
        load_data(load_recipe(REWARD, [f"data.train={data}"]))
    preference = load_data(load_recipe(RECIPES / "decoder-preference.yaml", [f"data.train={data}"]))[0]
    assert "margin" not in preference["train"].column_names  # (DPO has no margin: the column is not read)


def test_preflight_drops_identical_pairs_and_counts_cut_answers_as_for_preference(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.sources.builtin import preferences

    rows = preferences(40, seed=4)
    rows[:2] = [{**row, "rejected": row["chosen"]} for row in rows[:2]]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    job = resolve_job(load_recipe(REWARD, [f"data.train={data}", "data.max_target_length=4"]))
    assert "data.train: dropped 2 pairs whose chosen and rejected answers are the same (no preference to learn)" \
        in job.findings.notes
    assert job.findings.record["pairs_cut"]["answers"] > 0
    from hftoolkit.models.families import formulation

    encoded = formulation(job).encode(job, job.model.processor, job.data["train"]["text"],
                                      job.data["train"]["chosen"])
    assert max(len(e["input_ids"]) for e in encoded) <= 64 + 4
