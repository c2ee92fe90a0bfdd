"""task preference: pairs read in both layouts, tokenized as instruction runs are, learned with TRL's DPO trainer
(and ORPO's loss, which has no reference); the base scores 0, the tuned model prefers the chosen answers of
held-out pairs, a run starts from an earlier one, and the run reloads, predicts and merges like any other. (Bad
input: tests/e2e/test_bad_inputs.py; the losses at parity with TRL: tests/unit/reference.)"""

from __future__ import annotations

import json

import pytest

from tests.helpers import RECIPES, run_cli, train_recipe

PREFERENCE = RECIPES / "decoder-preference.yaml"
QUICK = ("data.max_train_samples=160", "data.max_eval_samples=32", "eval.max_predictions=4",
         "eval.generation.max_new_tokens=4")


def conversation_pairs(path, rows: list[dict]):
    """`rows` (text, chosen, rejected) as a JSONL file of chosen and rejected conversations sharing their prompt."""
    with open(path, "w") as f:
        for row in rows:
            prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["text"]}]
            f.write(json.dumps({"chosen": prompt + [{"role": "assistant", "content": row["chosen"]}],
                                "rejected": prompt + [{"role": "assistant", "content": row["rejected"]}]}) + "\n")
    return path


def test_texts_and_conversations_become_prompt_chosen_and_rejected(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.builtin import preferences
    from hftoolkit.sources.data import load_data

    rows = preferences(20, seed=3)
    texts, _ = load_data(load_recipe(PREFERENCE))
    assert texts["train"].column_names == ["text", "chosen", "rejected"]
    recipe = load_recipe(PREFERENCE, [f"data.train={conversation_pairs(tmp_path / 'c.jsonl', rows)}"])
    talks, _ = load_data(recipe)
    first = talks["train"][0]
    assert [t["role"] for t in first["text"]] == ["system", "user"]  # the shared turns are the prompt
    assert [t["role"] for t in first["chosen"]] == [t["role"] for t in first["rejected"]] == ["assistant"]
    assert {r["chosen"][0]["content"] for r in talks["train"]} | {r["chosen"][0]["content"] for r in talks["eval"]} \
        == {r["chosen"] for r in rows}


def test_identical_pairs_and_empty_answers_are_dropped_and_said(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.sources.builtin import preferences

    rows = preferences(40, seed=4)
    rows[:3] = [{**row, "rejected": row["chosen"]} for row in rows[:3]]
    rows[3] = {**rows[3], "chosen": " "}
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    job = resolve_job(load_recipe(PREFERENCE, [f"data.train={data}"]))
    assert "data.train: dropped 1 row with an empty prompt or answer" in job.findings.notes
    assert "data.train: dropped 3 pairs whose chosen and rejected answers are the same (no preference to learn)" \
        in job.findings.notes
    assert job.findings.record["dropped_identical_pairs"]["train"] == 3
    assert len(job.data["train"]) + len(job.data["eval"]) == 36


def test_pairs_are_tokenized_as_the_instruction_run_writes_prompt_and_answer():
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import decoder, formulation

    job = resolve_job(load_recipe(PREFERENCE, list(QUICK)))
    tokenizer, pair = job.model.processor, job.data["train"][:2]
    prompts, chosen, rejected = formulation(job).encode(job, tokenizer, pair)
    instruction = decoder.FORMULATIONS["instruction"]
    assert prompts == instruction.prompts(job, tokenizer, pair["text"])
    assert chosen == instruction.targets(job, tokenizer, pair["chosen"])
    assert rejected == instruction.targets(job, tokenizer, pair["rejected"])
    assert all(ids[-1] == tokenizer.eos_token_id for ids in chosen + rejected)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    run = tmp_path_factory.mktemp("preference") / "run"
    train_recipe(PREFERENCE, run, *QUICK, "training.epochs=3", "training.logging_steps=2")
    return run


@pytest.mark.slow
def test_the_tuned_model_prefers_the_chosen_answers_of_held_out_pairs(tuned, tmp_path):
    base = json.loads(run_cli("eval", PREFERENCE, *[x for s in QUICK for x in ("--set", s)], "--json").stdout)
    assert base["eval"]["reward_accuracy"] == 0 and base["eval"]["reward_margin"] == 0  # the base is the reference
    tuned_eval = json.loads((tuned / "metrics.json").read_text())["eval"]
    assert tuned_eval["reward_accuracy"] >= base["eval"]["reward_accuracy"] + 0.2
    assert tuned_eval["reward_margin"] > 0 and tuned_eval["reward_chosen"] > tuned_eval["reward_rejected"]
    history = [json.loads(line) for line in (tuned / "log_history.jsonl").read_text().splitlines()]
    margins = [row["reward_margin"] for row in history if "reward_margin" in row and "eval_loss" not in row]
    assert len(margins) >= 4 and sum(margins[-2:]) > sum(margins[:2]), margins  # the margin grows over training
    assert not any("rewards/" in key for row in history for key in row), "TRL's names are renamed"


@pytest.mark.slow
def test_orpo_learns_without_a_reference_and_logs_its_two_terms(tmp_path):
    orpo = (*QUICK, "preference.method=orpo", "preference.beta=0.5")
    base = json.loads(run_cli("eval", PREFERENCE, *[x for s in orpo for x in ("--set", s)], "--json").stdout)["eval"]
    # No reference: the rewards are beta times the mean log-probabilities, so the base already ranks some pairs.
    assert 0 < base["reward_accuracy"] < 1 and base["reward_chosen"] < 0
    train_recipe(PREFERENCE, tmp_path / "run", *orpo, "training.epochs=3", "training.logging_steps=2")
    tuned = json.loads((tmp_path / "run" / "metrics.json").read_text())["eval"]
    assert tuned["reward_accuracy"] >= base["reward_accuracy"] + 0.2
    assert tuned["nll_loss"] < base["nll_loss"] and tuned["log_odds_ratio"] > base["log_odds_ratio"]
    history = [json.loads(line) for line in (tmp_path / "run" / "log_history.jsonl").read_text().splitlines()]
    margins = [row["reward_margin"] for row in history if "reward_margin" in row and "eval_loss" not in row]
    assert sum(margins[-2:]) > sum(margins[:2]), margins


@pytest.mark.slow
def test_kto_learns_answers_labelled_good_or_bad_and_pairs_split_into_them(tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.builtin import BUILTIN

    rows = BUILTIN["preferences"](seed=load_recipe(PREFERENCE).training.seed)
    labelled = tmp_path / "labelled.jsonl"  # kto's own layout: one answer a row, no pairs (one in 3 good)
    with open(labelled, "w") as f:
        for i, row in enumerate(rows[:200]):
            good = i % 3 == 0
            f.write(json.dumps({"prompt": row["text"], "answer": row["chosen" if good else "rejected"],
                                "good": good}) + "\n")
    layouts = {"pairs": (), "labelled": (f"data.train={labelled}", "data.text_column=prompt",
                                         "data.target_column=answer", "data.label_column=good",
                                         "preference.desirable_weight=2")}
    for name, data in layouts.items():
        sets = (*QUICK, "preference.method=kto", "training.epochs=3", *data)
        base = json.loads(run_cli("eval", PREFERENCE, *[x for s in sets for x in ("--set", s)], "--json").stdout)
        assert base["eval"]["reward_margin"] == 0 and base["eval"]["kl"] == 0  # the base is the reference
        train_recipe(PREFERENCE, tmp_path / name, *sets)
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        assert metrics["main_metric"] == "reward_margin" and metrics["eval"]["reward_margin"] > 0.5, name
        records = [json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]
        good_answers = {row["chosen"] for row in rows}
        assert records and all(r["reference"] in good_answers for r in records), "records answer the good answers"


@pytest.mark.slow
def test_a_run_starts_from_an_earlier_instruction_run_its_adapter_or_its_merged_folder(tmp_path):
    instruction = tmp_path / "instruction"
    train_recipe(PREFERENCE, instruction, *QUICK, "task=instruction", "data.train=builtin:instructions",
                 "preference=null")
    run_cli("merge", instruction, "--output", tmp_path / "merged")
    scored = {}
    for start in (instruction, instruction / "adapter", tmp_path / "merged", "init:gpt2"):
        sets = (*QUICK, f"model.checkpoint={start}")
        scored[start] = json.loads(run_cli("eval", PREFERENCE, *[x for s in sets for x in ("--set", s)],
                                           "--json").stdout)["eval"]
    # The earlier run's adapter is merged into its base as it loads: the same model as its merged folder, not the
    # bare base, and that model is the reference (reward accuracy 0).
    starts = [scored[instruction], scored[instruction / "adapter"], scored[tmp_path / "merged"]]
    assert all(s["logps_chosen"] == pytest.approx(starts[0]["logps_chosen"], rel=1e-4) for s in starts)
    assert abs(starts[0]["logps_chosen"] - scored["init:gpt2"]["logps_chosen"]) > 1
    assert all(s["reward_accuracy"] == 0 for s in starts)
    train_recipe(PREFERENCE, tmp_path / "preference", *QUICK, f"model.checkpoint={instruction}")
    recorded = json.loads((tmp_path / "preference" / "metrics.json").read_text())["eval"]
    assert recorded["reward_accuracy"] > 0 and recorded["logps_chosen"] != starts[0]["logps_chosen"]
    again = json.loads(run_cli("eval", tmp_path / "preference", "--json").stdout)["eval"]
    assert again == pytest.approx(recorded)  # reloaded on the same merged base


@pytest.mark.slow
def test_a_sweep_over_beta_trains_each_variant_and_ranks_them_by_reward_accuracy(tmp_path):
    sets = (*QUICK, "training.max_steps=6", "eval.max_predictions=0")
    result = run_cli("sweep", PREFERENCE, "--out", tmp_path, "--grid", "preference.beta=0.05,0.5",
                     *[x for s in sets for x in ("--set", s)])
    runs = sorted(p for p in (tmp_path / "decoder-preference").iterdir() if (p / "metrics.json").is_file())
    assert len(runs) == 2 and all("reward_accuracy=" in result.output.split(run.name, 1)[1][:40] for run in runs)
    metrics = [json.loads((run / "metrics.json").read_text()) for run in runs]
    assert sorted(load_beta(run) for run in runs) == [0.05, 0.5]
    assert metrics[0]["eval"]["reward_margin"] != metrics[1]["eval"]["reward_margin"]  # beta scales the rewards
    assert "reward_accuracy" in (tmp_path / "decoder-preference" / "report.md").read_text()


def load_beta(run) -> float:
    from hftoolkit.config.recipe import load_recipe

    return load_recipe(run / "recipe.yaml").preference.beta


@pytest.mark.slow
def test_a_tuned_run_reloads_to_its_scores_predicts_and_merges(tuned, tmp_path):
    recorded = json.loads((tuned / "metrics.json").read_text())["eval"]
    again = json.loads(run_cli("eval", tuned, "--json").stdout)["eval"]
    assert again == pytest.approx(recorded)  # the reference is the base with the adapter off, as in training
    assert not (tuned / "adapter" / "ref").exists(), "no copy of the adapter saved as TRL's reference"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is 2 plus 3?\n")
    out = tmp_path / "predictions.jsonl"
    run_cli("predict", tuned, "--input", prompts, "--format", "jsonl", "--output", out)
    assert set(json.loads(out.read_text().splitlines()[0])) >= {"input", "text"}
    merged = tmp_path / "merged"
    run_cli("merge", tuned, "--output", merged)
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))


@pytest.mark.slow
def test_the_report_has_a_preference_section_with_the_loss_and_margin_plot(tuned, tmp_path):
    run_cli("compare", tuned, "--output", tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Eval metrics: preference" in report and "reward_accuracy" in report
    assert "## Preference: loss and reward margin" in report and (tmp_path / "report" / "preference.png").is_file()
    from hftoolkit.runs.summary import load_run

    margins = [margin for _, margin in sorted(load_run(tuned).margin_curve)]
    assert margins[-1] > margins[0]


@pytest.mark.slow
def test_conversation_pairs_train_smollm2_in_its_chat_template(tiny_smollm2, tmp_path):
    """SmolLM2's own tokenizer and chat template, on the tiny stand-in."""
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.sources.builtin import preferences
    from hftoolkit.sources.conversations import render

    data = conversation_pairs(tmp_path / "pairs.jsonl", preferences(48, seed=5))
    sets = (f"model.checkpoint={tiny_smollm2}", "lora.targets=auto", f"data.train={data}", "data.max_length=96",
            "training.max_steps=2", "training.batch_size=4", "data.max_eval_samples=8", "eval.max_predictions=2",
            "eval.generation.max_new_tokens=4")
    job = resolve_job(load_recipe(PREFERENCE, list(sets)))
    tokenizer, pair = job.model.processor, job.data["train"][:1]
    prompts, chosen, rejected = formulation(job).encode(job, tokenizer, pair)
    whole = tokenizer(render(tokenizer, pair["text"][0] + pair["chosen"][0]), add_special_tokens=False)["input_ids"]
    assert prompts[0] + chosen[0] == whole  # the template's own rendering, split where the answer starts
    assert tokenizer.decode(prompts[0]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(chosen[0]).startswith(pair["chosen"][0][0]["content"])
    train_recipe(PREFERENCE, tmp_path / "run", *sets)
    assert 0 <= json.loads((tmp_path / "run" / "metrics.json").read_text())["eval"]["reward_accuracy"] <= 1


def ultrafeedback(n: int = 6) -> tuple:
    """ultrafeedback_binarized's columns (prompt, prompt_id, chosen, rejected, messages, scores), n made-up rows a
    split."""
    import datasets

    text, score = datasets.Value("string"), datasets.Value("float64")
    turns = [{"content": text, "role": text}]
    features = datasets.Features({"prompt": text, "prompt_id": text, "chosen": turns, "rejected": turns,
                                  "messages": turns, "score_chosen": score, "score_rejected": score})
    rows = []
    for i in range(n):
        prompt = f"What is {i} plus {i}?"
        chosen = [{"content": prompt, "role": "user"}, {"content": f"{i} plus {i} is {2 * i}.", "role": "assistant"}]
        rejected = [{"content": prompt, "role": "user"}, {"content": "I don't know.", "role": "assistant"}]
        rows.append({"prompt": prompt, "prompt_id": f"p{i}", "chosen": chosen, "rejected": rejected,
                     "messages": chosen, "score_chosen": 9.0, "score_rejected": 2.0})
    return features, {"train_prefs": rows, "test_prefs": rows[: n // 2]}


def test_the_ultrafeedback_recipe_reads_the_hub_set_as_an_online_run_leaves_it(monkeypatch, tmp_path):
    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.sources.data import load_data
    from tests.helpers import hub_cache

    home = tmp_path / "hf"
    hub_cache.plant_dataset(home / "hub", home / "datasets", "HuggingFaceH4/ultrafeedback_binarized",
                            {"default": ultrafeedback()})
    hub_cache.use_hf_home(monkeypatch, home)
    splits, _ = load_data(load_recipe(RECIPES / "smollm2-ultrafeedback.yaml"))
    assert (len(splits["train"]), len(splits["eval"])) == (6, 3)  # train_prefs, and test_prefs to score
    pair = splits["eval"][1]
    assert pair["text"] == [{"content": "What is 1 plus 1?", "role": "user"}]
    assert pair["chosen"] == [{"content": "1 plus 1 is 2.", "role": "assistant"}]
    assert pair["rejected"] == [{"content": "I don't know.", "role": "assistant"}]


@pytest.mark.slow
def test_the_reference_losses_equal_trl_s_on_a_smollm2_batch(tiny_smollm2, tmp_path):
    """Three conversation pairs tokenized as a run does (SmolLM2's tokenizer and chat template), the tiny stand-in as
    the reference and a nudged copy as the policy:
    the reference layer's DPO, IPO and KTO losses (reference/preference.py) against TRL's own `_compute_loss`, and
    its ORPO loss against the one training computes with TRL's odds-ratio loss, each within 1e-6."""
    from types import SimpleNamespace

    import torch
    import transformers

    from hftoolkit.config.recipe import load_recipe
    from hftoolkit.job.resolve import resolve_job
    from hftoolkit.models.families import formulation
    from hftoolkit.patches.trl_1_16 import collator
    from hftoolkit.reference import parity_preference, preference
    from hftoolkit.sources.builtin import preferences
    from hftoolkit.training.preference import orpo_loss

    data = conversation_pairs(tmp_path / "pairs.jsonl", preferences(12, seed=6))
    job = resolve_job(load_recipe(PREFERENCE, [f"model.checkpoint={tiny_smollm2}", f"data.train={data}"]))
    prompts, chosen, rejected = formulation(job).encode(job, job.model.processor, job.data["train"][:3])
    batch = collator(False, job.model.processor.pad_token_id)(
        [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r} for p, c, r in zip(prompts, chosen, rejected)])
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "completion_mask")}
    # In float64: the two sides compute the same sums in different orders, which float32 rounds apart.
    policy, reference = (transformers.AutoModelForCausalLM.from_pretrained(tiny_smollm2, dtype=torch.float64)
                         for _ in range(2))
    torch.manual_seed(0)
    with torch.no_grad():
        for weight in policy.parameters():
            weight.add_(torch.randn_like(weight) * 2e-2)  # (a tenth of the weights' spread)
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    lengths = (labels[:, 1:] != -100).sum(-1)
    with torch.no_grad():
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = [preference.sequence_logps(logits, labels), preference.sequence_logps(
            reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, labels)]
        chosen_nll = -preference.sequence_logps(logits[:3], labels[:3]).sum() / lengths[:3].sum()
        means = logps[0] / lengths
        # KTO on the same answers, unpaired (chosen good, rejected bad), each answer's KL one the next prompt's.
        answers = [{"prompt_ids": p, "completion_ids": c, "label": good} for good, side in ((True, chosen),
                   (False, rejected)) for p, c in zip(prompts, side)]
        for example, other in zip(answers, answers[-1:] + answers[:-1]):
            example["KL_completion_ids"] = other["completion_ids"]
        unpaired = collator(True, job.model.processor.pad_token_id)(answers)
        kto_logps = {}
        for key, prefix in (("answer", ""), ("kl", "KL_")):
            kto_labels = unpaired[f"{prefix}input_ids"].masked_fill(unpaired[f"{prefix}completion_mask"] == 0, -100)
            kto_logps[key] = [preference.sequence_logps(model(
                input_ids=unpaired[f"{prefix}input_ids"], attention_mask=unpaired[f"{prefix}attention_mask"]).logits,
                kto_labels) for model in (policy, reference)]
        for model in (policy, reference):
            parity_preference.trl().add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        library = {}
        for loss in ("sigmoid", "ipo"):
            trainer = parity_preference.standin(
                parity_preference.trl().DPO, policy, ref_model=reference, beta=0.1, loss_types=[loss],
                loss_weights=[1.0], f_divergence_type="reverse_kl", ld_alpha=None, use_weighting=False,
                precompute_ref_logps=False, args=SimpleNamespace(gradient_checkpointing_kwargs=None))
            library[loss] = trainer._compute_loss(policy, inputs, return_outputs=False)
        trainer.accelerator.num_processes = 1
        library["orpo"] = orpo_loss(trainer, policy, inputs)
        kto = parity_preference.standin(
            parity_preference.trl().KTO, policy, ref_model=reference, beta=0.1, loss_type="kto",
            desirable_weight=1.0, undesirable_weight=1.33, calculate_KL=True, precompute_ref_logps=False,
            args=SimpleNamespace(gradient_checkpointing_kwargs=None))
        library["kto"] = kto._compute_loss(policy, dict(unpaired), return_outputs=False)
    ours = {"sigmoid": preference.dpo_loss(logps[0][:3], logps[0][3:], logps[1][:3], logps[1][3:], beta=0.1).mean(),
            "ipo": preference.ipo_loss(logps[0][:3], logps[0][3:], logps[1][:3], logps[1][3:], tau=0.1,
                                       chosen_lengths=lengths[:3], rejected_lengths=lengths[3:]).mean(),
            "orpo": preference.orpo_loss(chosen_nll, means[:3], means[3:], lam=0.1),
            "kto": preference.kto_loss(*kto_logps["answer"], unpaired["label"], preference.kto_reference_point(
                *kto_logps["kl"]), 0.1, 1.0, 1.33).mean()}
    for loss in ours:  # (relative: TRL returns float32, whose spacing near IPO's 24 is 2e-6)
        assert float(ours[loss]) == pytest.approx(float(library[loss]), rel=1e-6, abs=1e-6), loss
    assert abs(float(ours["sigmoid"]) - 0.6931) > 1e-3, "the policy differs from the reference: the check can fail"
