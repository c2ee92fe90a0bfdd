"""`hftoolkit plan`: every strategy planned from the model's config alone; `train` asks the plan first and records it
beside what it measured. (The arithmetic itself: test_plan_model.py; planned against measured: benchmarks/plan.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import RECIPES, plain, run_cli, train_recipe

ENCODER = RECIPES / "encoder-classification.yaml"
DECODER = RECIPES / "decoder-clm.yaml"
LLAMA_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                vocab_size=32000)
GiB = 2**30


def plan_json(*args) -> dict:
    return json.loads(run_cli("plan", *args, "--json").stdout)


def llama_folder(tmp_path: Path, **sizes) -> Path:
    """A checkpoint folder holding config.json alone: a plan reads nothing else."""
    from transformers import LlamaConfig

    folder = tmp_path / "llama"
    LlamaConfig(**{**LLAMA_7B, **sizes}).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_plan_names_every_strategy_itemized_and_the_lowest_cost_that_fits():
    planned = plan_json(ENCODER)
    rows = {row["strategy"]: row for row in planned["strategies"]}
    assert list(rows) == ["single", "ddp", "zero2", "fsdp", "zero3"] and planned["launched"] == "single"
    single = rows["single"]["memory"]
    assert set(single["items"]) >= {"runtime", "weights", "gradients", "optimizer", "activations", "buffers"}
    assert single["peak"] == sum(single["items"].values()) and single["fits"] is True
    fitting = [row for row in rows.values() if row["fits"]]
    assert planned["lowest_cost_fit"] == min(fitting, key=lambda row: row["device_seconds"])["strategy"]
    assert rows["ddp"]["processes"] == 2 and rows["ddp"]["devices"] == 1, "CPU processes share one machine"
    assert rows["single"]["time"]["step_seconds"] > 0 and rows["single"]["time"]["train_seconds"] > 0
    time = rows["single"]["time"]
    assert time["step_seconds"] == pytest.approx(sum(time["items"].values()))
    assert time["items"]["overhead"] > 0 and time["items"]["element-wise"] > time["items"]["products"], \
        "a tiny model's step is its element-wise and fixed work more than its FLOPs"
    assert rows["ddp"]["time"]["items"]["communication"] > 0 == time["items"]["communication"]


@pytest.mark.slow
def test_a_decoder_plans_prompt_and_answer_and_a_preference_step_its_pairs_and_reference_pass():
    def single(*sets: str) -> dict:
        sets = ("data.max_length=64", "training.batch_size=8", *sets)
        return plan_json(RECIPES / "decoder-preference.yaml", *[x for s in sets for x in ("--set", s)])["strategies"][0]

    planned = {method: single("data.max_target_length=64", f"preference.method={method}")
               for method in ("dpo", "orpo", "kto")}
    instruction, short = (single(f"data.max_target_length={n}", "task=instruction", "preference=null") for n in (64, 2))
    activations = {method: row["memory"]["items"]["activations"] for method, row in planned.items()}
    # An instruction example is one sequence of prompt and answer, a kto answer too, and a pair two.
    assert instruction["memory"]["items"]["activations"] > short["memory"]["items"]["activations"]
    assert activations["kto"] == instruction["memory"]["items"]["activations"]
    assert activations["dpo"] == activations["orpo"] == pytest.approx(2 * activations["kto"], rel=0.05)
    assert planned["orpo"]["time"]["step_seconds"] < planned["dpo"]["time"]["step_seconds"], "no reference pass"
    assert planned["orpo"]["memory"]["items"]["buffers"] < planned["dpo"]["memory"]["items"]["buffers"]


@pytest.mark.slow
def test_a_reward_pair_is_planned_as_two_sequences_of_prompt_and_answer_through_a_score_head():
    def single(recipe: str, *sets: str) -> dict:
        sets = ("data.max_length=64", "data.max_target_length=64", "training.batch_size=8",
                "lora.targets=[c_attn,c_proj,c_fc]", *sets)
        return plan_json(RECIPES / recipe, *[x for s in sets for x in ("--set", s)])["strategies"][0]

    reward = single("encoder-reward.yaml", "model.checkpoint=init:gpt2")
    instruction = single("decoder-preference.yaml", "task=instruction", "preference=null")
    items = reward["memory"]["items"]
    assert items["activations"] == pytest.approx(2 * instruction["memory"]["items"]["activations"], rel=0.05)
    assert items["buffers"] < instruction["memory"]["items"]["buffers"], "one score a row: no vocabulary logits"
    assert reward["time"]["items"]["vocabulary"] == 0 and reward["time"]["step_seconds"] > 0
    encoder = plan_json(RECIPES / "encoder-reward.yaml")
    assert encoder["lowest_cost_fit"] is not None and encoder["strategies"][0]["time"]["eval_seconds"] > 0


@pytest.mark.slow
def test_llama_7b_from_its_config_alone_on_a100s(tmp_path):
    """Full fine-tuning keeps 16 bytes a parameter (fp32 weights and gradients, two Adam moments): more than one
    80 GB card, while sharding the states over 8 fits; LoRA r=16 and QLoRA fit one card."""
    folder = llama_folder(tmp_path)
    full = ["--set", f"model.checkpoint={folder}", "--set", "lora.enabled=false", "--gpu", "a100-80gb",
            "--num-processes", "8", "--set", "data.max_length=512"]
    planned = plan_json(DECODER, *full)
    assert 6.7e9 < planned["model"]["parameters"] < 6.8e9
    rows = {row["strategy"]: row for row in planned["strategies"]}
    states = sum(rows["single"]["memory"]["items"][k] for k in ("weights", "gradients", "optimizer"))
    assert states == pytest.approx(16 * planned["model"]["parameters"], rel=0.01)
    assert not rows["single"]["fits"] and not rows["ddp"]["fits"] and rows["fsdp"]["fits"] and rows["zero3"]["fits"]
    assert rows["fsdp"]["memory"]["items"]["optimizer"] == pytest.approx(rows["ddp"]["memory"]["items"]["optimizer"]
                                                                          / 8, rel=0.01)
    lora_16 = ["--set", f"model.checkpoint={folder}", "--set", "lora.r=16", "--set", "lora.targets=auto"]
    lora = plan_json(DECODER, *lora_16, "--gpu", "a100-80gb")
    qlora = plan_json(DECODER, *lora_16, "--set", "model.quantization=4bit", "--gpu", "t4")
    lora_peak, qlora_peak = (p["strategies"][0]["memory"]["peak"] for p in (lora, qlora))
    assert lora["lowest_cost_fit"] == "single" and qlora["lowest_cost_fit"] == "single"
    assert qlora_peak < lora_peak / 3 < 16 * 6.7e9 / 3


@pytest.mark.slow
def test_a_hub_id_whose_config_alone_is_cached_is_planned_offline(tmp_path, monkeypatch):
    from tests.helpers.hub_cache import plant_model, use_hf_home

    hub = use_hf_home(monkeypatch, tmp_path / "home")
    plant_model(hub, "meta-llama/Llama-2-70b-hf", llama_folder(tmp_path, hidden_size=8192, intermediate_size=28672,
                                                                num_hidden_layers=80, num_attention_heads=64,
                                                                num_key_value_heads=8))
    planned = plan_json(DECODER, "--set", "model.checkpoint=meta-llama/Llama-2-70b-hf", "--set", "lora.r=16",
                        "--set", "lora.targets=auto", "--gpu", "h100-80gb", "--num-processes", "8")
    assert 68e9 < planned["model"]["parameters"] < 70e9
    assert planned["lowest_cost_fit"] in ("fsdp", "zero3")  # its bf16 weights alone (138 GB) are more than one card


@pytest.mark.parametrize("args, said", [
    (["--gpu", "b300"], "--gpu b300: unknown GPU; known: t4,"),
    (["--gpu-memory", "0"], "--gpu-memory 0"),
    (["--gpu", "t4", "--gpu-memory", "16"], "--gpu and --gpu-memory both name the device"),
])
def test_bad_device_options_get_one_line(args, said):
    result = run_cli("plan", ENCODER, *args, expect=2)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], result.output


@pytest.mark.parametrize("config, said", [
    ({"model_type": "no-such-architecture"}, "could not read the config"),
    ({"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4, "num_hidden_layers": 1,
      "intermediate_size": 8, "vocab_size": 50}, "transformers can't build"),
])
def test_a_config_transformers_cannot_build_gets_one_line(tmp_path, config, said):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    result = run_cli("plan", ENCODER, "--set", f"model.checkpoint={folder}", expect=2)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], result.output


def test_a_strategy_the_recipe_cannot_use_is_named_not_possible():
    planned = plan_json(ENCODER, "--set", "model.quantization=8bit", "--gpu", "a100-80gb")
    rows = {row["strategy"]: row for row in planned["strategies"]}
    assert rows["fsdp"]["not_possible"] and "8bit (bitsandbytes) weights cannot be sharded" in \
        rows["fsdp"]["not_possible"][0]
    assert rows["zero3"]["not_possible"] and rows["ddp"]["not_possible"] == [] and not rows["fsdp"]["fits"]
    shown = plain(run_cli("plan", ENCODER, "--set", "model.quantization=8bit", "--gpu", "a100-80gb").stdout)
    assert "FSDP is not possible: model.quantization: 8bit" in shown
    picked = rows[planned["lowest_cost_fit"]]
    assert f"lowest cost per run that fits: {picked['label']}" in shown and "cheapest" not in shown


def test_a_new_strategy_is_one_class_and_one_line_in_the_table(monkeypatch):
    """Registered in STRATEGIES, a strategy is planned beside the others with nothing else changed."""
    from hftoolkit.training import strategies
    from hftoolkit.training.strategies.base import Strategy

    class HalfSharded(Strategy):  # optimizer states sharded, nothing else: ZeRO-1
        name, label, shards_optimizer, runtime = "zero1", "ZeRO-1", True, "deepspeed"

    monkeypatch.setitem(strategies.STRATEGIES, "zero1", HalfSharded)
    rows = {row["strategy"]: row for row in plan_json(ENCODER, "--set", "lora.enabled=false",
                                                      "--set", "training.precision=fp32")["strategies"]}
    optimizer = {name: rows[name]["memory"]["items"]["optimizer"] for name in ("ddp", "zero1")}
    assert rows["zero1"]["label"] == "ZeRO-1" and optimizer["zero1"] == pytest.approx(optimizer["ddp"] / 2, abs=1)


# ---------------------------------------------------------------- train asks first, and records what it measured


@pytest.mark.slow
def test_a_run_planned_over_the_memory_stops_before_loading_and_leaves_the_users_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = run_cli("train", ENCODER, "--output", out, "--overwrite", "--set", "training.batch_size=400000",
                     "--set", "data.max_length=512", expect=2)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "planned to need" in lines[0] and "set training.batch_size=" in lines[0], lines
    assert "--skip-memory-check trains anyway" in lines[0]
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    fresh = tmp_path / "fresh"
    train_recipe(ENCODER, fresh, "training.batch_size=400000", "data.max_length=512", expect=2)
    assert not fresh.exists(), "no run folder is left behind"


@pytest.mark.slow
def test_the_override_trains_where_the_plan_says_no(tmp_path, monkeypatch):
    from hftoolkit.job import devices

    small = devices.Device("a machine of 100 MiB", "cpu", 100 * 2**20)
    monkeypatch.setattr(devices, "this_machine", lambda: small)
    run = tmp_path / "run"
    refused = train_recipe(ENCODER, run, "training.max_steps=2", expect=2)
    assert "more than the 0.1 GiB each process has" in plain(refused.output)
    run_cli("train", ENCODER, "--output", run, "--set", "training.max_steps=2", "--skip-memory-check")
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.slow
def test_train_plans_a_pair_set_at_its_longest_pair_where_the_recipe_allows_longer(tmp_path):
    """Batches pad to their longest row: a step of short pairs is planned short, whatever data.max_length allows;
    `plan` plans memory at the recipe's lengths (a step at the data's batches)."""
    preference = RECIPES / "decoder-preference.yaml"

    def activations(length: int) -> float:
        sets = ("training.max_steps=1", f"data.max_length={length}", f"data.max_target_length={length}")
        train_recipe(preference, tmp_path / str(length), *sets)
        return json.loads((tmp_path / str(length) / "manifest.json").read_text())["plan"]["planned_items_mb"][
            "activations"]

    short, long = activations(64), activations(480)
    assert short == long, "builtin:preferences's pairs are shorter than 64 tokens"
    at_recipe = plan_json(preference, "--set", "data.max_length=480", "--set", "data.max_target_length=480")
    assert at_recipe["strategies"][0]["memory"]["items"]["activations"] / 2**20 > 5 * long


@pytest.mark.slow
def test_a_run_records_its_plan_beside_what_it_measured(tmp_path):
    run = tmp_path / "run"
    train_recipe(ENCODER, run, "training.max_steps=3")
    record = json.loads((run / "manifest.json").read_text())["plan"]
    assert record["strategy"] == "single" and record["processes"] == 1
    assert record["planned_peak_mb"] == pytest.approx(sum(record["planned_items_mb"].values()), abs=1)
    assert len(record["measured_peak_mb"]) == 1 and record["measured_peak_mb"][0] > 100
    assert record["peak_error"][0] == pytest.approx(record["planned_peak_mb"] / record["measured_peak_mb"][0] - 1,
                                                    abs=1e-3)
    assert record["planned_step_seconds"] > 0 and record["measured_step_seconds"] > 0
    assert record["planned_step_seconds"] == pytest.approx(sum(record["planned_step_items_s"].values()), abs=1e-3)
    report = run_cli("compare", run, "--output", tmp_path / "report")
    assert "(plan " in (tmp_path / "report" / "report.md").read_text(), report.output
