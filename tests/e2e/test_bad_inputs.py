"""The bad input catalogue: recipes, data files, checkpoints and CLI arguments a user gets wrong.

Each row must end the command with a non-zero exit and one sentence (one line) that names
the input and what to do, no traceback, and nothing half-written: no run directory (or
output folder) appears, and an existing run directory is left byte for byte as it was.
tests/e2e/test_encoder_classification.py holds issue 2's first eleven cases; none repeat here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers import RECIPES, plain, run_cli
from tests.helpers.inputs import (
    class_images,
    edit_json,
    rows_file,
    sentiment_csv,
    tiny_checkpoint_copy,
    tokenizer_without,
    vit_with,
    without_tokenizer,
    write_file,
)

ENCODER = RECIPES / "encoder-classification.yaml"
TAGGING = RECIPES / "encoder-tagging.yaml"
SEQ2SEQ = RECIPES / "seq2seq-translation-t5.yaml"
VISION = RECIPES / "vision-classification.yaml"
PREFERENCE = RECIPES / "decoder-preference.yaml"


@dataclass
class Case:
    kind: str  # recipe, data, checkpoint or cli
    make: Callable[[Path], list]  # tmp_path -> CLI arguments (train commands get --output <tmp>/run)
    expect: str  # a phrase of the one-line error


def _sets(*pairs: str) -> list[str]:
    return [x for p in pairs for x in ("--set", p)]


def _recipe(tmp: Path, base: Path = ENCODER, drop: str | None = None, **sections) -> Path:
    """The base recipe with whole sections replaced or dropped, written to tmp/recipe.yaml."""
    raw = yaml.safe_load(base.read_text())
    raw.update(sections)
    raw.pop(drop, None)
    return write_file(tmp, "recipe.yaml", yaml.safe_dump(raw))


def _train(recipe: Path, *pairs: str) -> list:
    return ["train", recipe, *_sets(*pairs)]


def _data(recipe: Path, path: Path, *pairs: str) -> list:
    return _train(recipe, f"data.train={path}", *pairs)


def _pairs(tmp: Path, *rows: dict) -> Path:
    return write_file(tmp, "pairs.jsonl", "\n".join(json.dumps(row) for row in rows * 5) + "\n")


def _turns(*pairs: tuple[str, str]) -> list[dict]:
    return [{"role": role, "content": content} for role, content in pairs]


def _truncated_weights(tmp: Path) -> Path:
    ckpt = tiny_checkpoint_copy(tmp)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return ckpt


def _config(tmp: Path, text: str) -> Path:
    ckpt = tiny_checkpoint_copy(tmp)
    (ckpt / "config.json").write_text(text)
    return ckpt


def _image_folder(tmp: Path) -> Path:
    from PIL import Image

    for label in ("cat", "dog"):
        for i in range(3):
            path = tmp / "images" / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(path)
    write_file(tmp, "images/dog/broken.png", "this is a text file named like an image")
    return tmp / "images"


def _killed_run(tmp: Path, damage: Callable[[Path], None]) -> Path:
    """A run directory as a SIGKILL leaves it (manifest "running", one checkpoint), then damaged.

    Built without training: the resolved recipe as train writes it, and a checkpoint whose
    files have the right form (a safetensors adapter, zip archives of states).
    """
    import torch
    from safetensors.torch import save_file

    from hftoolkit.config.recipe import load_recipe, recipe_to_yaml
    from hftoolkit.job.resolve import resolve_job

    job = resolve_job(load_recipe(ENCODER))  # what train resolves (family, label names) before writing recipe.yaml
    run = tmp / "killed"
    ckpt = run / "checkpoints" / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (run / "recipe.yaml").write_text(recipe_to_yaml(job.recorded_recipe()))
    (run / "manifest.json").write_text(json.dumps({"status": "running"}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    save_file({"lora_A": torch.ones(4, 2), "lora_B": torch.zeros(2, 4)}, str(ckpt / "adapter_model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": {}}, ckpt / name)
    damage(ckpt)
    return run


def _truncate(name: str, keep: float = 0.5):
    def damage(ckpt: Path):
        data = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(data[: int(len(data) * keep)])
    return damage


# ---------------------------------------------------------------- data x model fixtures (preflight)

MLM = RECIPES / "encoder-mlm.yaml"
CLM = RECIPES / "decoder-clm.yaml"


def _tags(tmp: Path, name: str, tags: list[str]) -> Path:
    return write_file(tmp, name, "".join(json.dumps({"text": ["ann", "saw", "kyoto"], "label": tags}) + "\n"
                                     for _ in range(6)))


def _grown_tokenizer(tmp: Path) -> Path:
    """The checkpoint's tokenizer with more tokens added than its embedding table has rows."""
    from transformers import AutoTokenizer

    ckpt = tiny_checkpoint_copy(tmp)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    tokenizer.add_tokens(["movie", "film", "plot", *(f"word{i}" for i in range(len(tokenizer)))])
    tokenizer.save_pretrained(ckpt)
    return ckpt


def _foreign_tokenizer(tmp: Path) -> Path:
    """A tokenizer of 40-odd tokens (another model's) saved over the checkpoint's own."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "mask_token": "[MASK]"}
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(["the movie was good", "the film was bad"],
                            trainers.WordPieceTrainer(vocab_size=40, special_tokens=list(specials.values())))
    ckpt = tiny_checkpoint_copy(tmp)
    for path in ckpt.glob("tokenizer*"):
        path.unlink()
    PreTrainedTokenizerFast(tokenizer_object=tok, **specials).save_pretrained(ckpt)
    return ckpt


def _retyped(tmp: Path, arch: str, model_type: str) -> Path:
    """A tiny checkpoint whose config names another model type of the same family (a type without some head)."""
    ckpt = tiny_checkpoint_copy(tmp, arch)
    edit_json(ckpt / "config.json", model_type=model_type, architectures=None)
    return ckpt


def _opt_folder(tmp: Path) -> Path:
    """An OPT config (a decoder transformers gives no token-classification head) with the tiny GPT-2 tokenizer."""
    from transformers import OPTConfig

    ckpt = tiny_checkpoint_copy(tmp, "gpt2")
    (ckpt / "model.safetensors").unlink()
    vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    OPTConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
              max_position_embeddings=512, word_embed_proj_dim=64).save_pretrained(ckpt)
    return ckpt


def _two_label_classifier(tmp: Path) -> Path:
    """A BERT already fine-tuned for 2 labels (its classifier saved with it)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from hftoolkit.sources.tiny import ensure_tiny

    model = AutoModelForSequenceClassification.from_pretrained(
        ensure_tiny("bert"), num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    model.save_pretrained(tmp / "sst2-bert")
    AutoTokenizer.from_pretrained(ensure_tiny("bert")).save_pretrained(tmp / "sst2-bert")
    return tmp / "sst2-bert"


def _flat_images(tmp: Path) -> Path:
    """Images straight in the folder, none in a class subfolder."""
    folder = class_images(tmp)
    for path in list(folder.rglob("*.png")):
        path.rename(folder / f"{path.parent.name}-{path.name}")
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    return folder


def _truncated_image(tmp: Path) -> Path:
    """A PNG cut in half: its header reads (so a header check passes), its pixels do not."""
    from PIL import Image

    folder = class_images(tmp)
    Image.effect_noise((64, 64), 50).convert("RGB").save(folder / "dog" / "cut.png")
    data = (folder / "dog" / "cut.png").read_bytes()
    (folder / "dog" / "cut.png").write_bytes(data[: len(data) // 2])
    return folder


CASES: dict[str, Case] = {
    # ------------------------------------------------------------ recipes
    "recipe is a YAML list": Case("recipe", lambda t: ["train", write_file(t, "r.yaml", "- name: x\n- task: y\n")],
                                  "a recipe is a YAML mapping of sections"),
    "recipe file is empty": Case("recipe", lambda t: ["train", write_file(t, "r.yaml", "")],
                                 "a recipe is a YAML mapping of sections"),
    "recipe is not UTF-8": Case("recipe", lambda t: ["train", write_file(t, "r.yaml", b"name: caf\xe9\n")],
                                "not UTF-8 text: save the recipe as UTF-8"),
    "python object tag in YAML": Case(
        "recipe", lambda t: ["train", write_file(t, "r.yaml", "name: !!python/object/apply:os.system ['true']\n")],
        "YAML syntax error"),
    "unknown task": Case("recipe", lambda t: _train(ENCODER, "task=question-answering"), "task: input should be"),
    "typo in a section name": Case(
        "recipe", lambda t: ["train", _recipe(t, drop="training", trainig={"epochs": 1})], "did you mean 'training'"),
    "section given as a string": Case("recipe", lambda t: _train(ENCODER, "model=init:bert"), "model:"),
    "required section missing": Case("recipe", lambda t: ["train", _recipe(t, drop="data")],
                                     "data: required key missing"),
    "negative batch size": Case("recipe", lambda t: _train(ENCODER, "training.batch_size=-8"),
                                "training.batch_size: input should be greater than 0"),
    "zero epochs": Case("recipe", lambda t: _train(ENCODER, "training.epochs=0"),
                        "training.epochs: input should be greater than 0"),
    "zero LoRA rank": Case("recipe", lambda t: _train(ENCODER, "lora.r=0"), "lora.r: input should be greater than 0"),
    "LoRA dropout of 1": Case("recipe", lambda t: _train(ENCODER, "lora.dropout=1"), "lora.dropout: input should be"),
    "negative learning rate": Case("recipe", lambda t: _train(ENCODER, "training.learning_rate=-0.001"),
                                   "training.learning_rate: input should be greater than 0"),
    "a list where a number goes": Case("recipe", lambda t: _train(ENCODER, "training.epochs=[1, 2]"),
                                       "training.epochs: input should be a valid number"),
    "top_p above 1": Case("recipe", lambda t: _train(SEQ2SEQ, "eval.generation.top_p=1.5"),
                          "eval.generation.top_p: input should be less than or equal to 1"),
    "task the family cannot do": Case("recipe", lambda t: _train(ENCODER, "task=clm"),
                                      "task 'clm' can't be done by 'init:bert', an encoder model"),
    "remote code without a pinned revision": Case("recipe", lambda t: _train(ENCODER, "model.trust_remote_code=true"),
                                                  "set model.revision to a pinned commit"),
    "run name that is a path": Case("recipe", lambda t: _train(ENCODER, "name=../elsewhere"), "name: string should"),
    "T5 in fp16": Case("recipe", lambda t: _train(SEQ2SEQ, "training.precision=fp16"), "T5 overflows in fp16"),
    "denoising with T5": Case("recipe", lambda t: _train(SEQ2SEQ, "task=denoise"), "use a bart checkpoint"),
    "--set without a value": Case("cli", lambda t: ["train", ENCODER, "--set", "training.epochs"],
                                  "expected key=value"),
    "--set below a plain value": Case("cli", lambda t: _train(ENCODER, "name.first=x"), "name is not a section"),
    # ------------------------------------------------------------ data files
    "one-class data": Case("data", lambda t: _data(ENCODER, write_file(t, "d.csv", "text,label\n" + "fine,pos\n" * 6)),
                           "only one class"),
    "label column of mixed types": Case(
        "data", lambda t: _data(ENCODER, write_file(t, "d.jsonl", '{"text": "a", "label": 1}\n'
                                                              '{"text": "b", "label": "pos"}\n'
                                                              '{"text": "c", "label": 0}\n')),
        "make every label a name or every label an integer id"),
    "data file is not UTF-8": Case(
        "data", lambda t: _data(ENCODER, write_file(t, "d.csv", b"text,label\ncaf\xe9,a\nb,b\n")),
        "is not UTF-8 text: convert it to UTF-8"),
    "unsupported data extension": Case("data", lambda t: _data(ENCODER, write_file(t, "d.xlsx", "not a sheet")),
                                       "unsupported extension"),
    "malformed JSON lines": Case(
        "data", lambda t: _data(ENCODER, write_file(t, "d.jsonl", '{"text": "a", "label": 1}\n{oops\n')),
        "check its format"),
    "a .gz that is not gzip": Case(
        "data", lambda t: _data(RECIPES / "encoder-mlm.yaml", write_file(t, "d.txt.gz", "plain")), "could not read"),
    "empty eval file": Case("data", lambda t: _train(ENCODER, f"data.eval={write_file(t, 'e.csv', 'text,label')}"),
                            "data.eval"),
    "a single row and no eval split": Case(
        "data", lambda t: _data(ENCODER, write_file(t, "d.csv", "text,label\na,pos\n")), "single row"),
    "unknown built-in set": Case("data", lambda t: _train(ENCODER, "data.train=builtin:nope"), "unknown built-in set"),
    "aligned files of different lengths": Case(
        "data", lambda t: _data(SEQ2SEQ, write_file(t, "src.txt", "a\nb\nc\n"),
                                "data.train_target=" + str(write_file(t, "tgt.txt", "x\ny\n"))),
        "aligned files differ in length"),
    "aligned target file missing": Case(
        "data", lambda t: _data(SEQ2SEQ, write_file(t, "src.txt", "a\nb\n"), f"data.train_target={t / 'nothing.txt'}"),
        "target file"),
    "tagging rows that are text, not words": Case(
        "data", lambda t: _data(TAGGING, write_file(t, "d.jsonl", '{"text": "a b", "label": ["O", "O"]}\n' * 4)),
        "tagging needs a list of words per row"),
    "tagging row with fewer tags than words": Case(
        "data", lambda t: _data(TAGGING, write_file(t, "d.jsonl",
                                                '{"text": ["a", "b", "c"], "label": ["O", "B-X"]}\n' * 4)),
        "give exactly one tag per word"),
    "an image that is not an image": Case("data", lambda t: _data(VISION, _image_folder(t)), "broken.png"),
    # ------------------------------------------------------------ checkpoints
    "checkpoint folder without config.json": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={(t / 'empty').mkdir() or t / 'empty'}"),
        "has no config.json"),
    "truncated safetensors weights": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_truncated_weights(t)}"), "model.checkpoint"),
    "config.json that is not JSON": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_config(t, '{oops')}"), "model.checkpoint"),
    "unknown model type": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_config(t, json.dumps({'model_type': 'nope'}))}"),
        "model.checkpoint"),
    "checkpoint under an unknown ~user": Case(
        "checkpoint", lambda t: _train(ENCODER, "model.checkpoint=~nobody-here/bert"),
        "starts with an unknown ~user: write the full path"),
    "data under an unknown ~user": Case("data", lambda t: _train(ENCODER, "data.train=~nobody-here/d.csv"),
                                        "data.train: ~nobody-here/d.csv starts with an unknown ~user"),
    "LoRA target that matches no module": Case("checkpoint", lambda t: _train(ENCODER, "lora.targets=[q_proj]"),
                                               "match no module"),
    "resume from a truncated adapter": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("adapter_model.safetensors"))],
        "adapter_model.safetensors is damaged"),
    "resume from a damaged optimizer state": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("optimizer.pt", 0.3))],
        "optimizer.pt is damaged"),
    "resume from a damaged trainer state": Case(
        "checkpoint", lambda t: ["train", "--resume", _killed_run(t, _truncate("trainer_state.json"))],
        "trainer_state.json is damaged"),
    # ------------------------------------------------------------ CLI arguments
    "--output is a file": Case("cli", lambda t: ["train", ENCODER, "--output", write_file(t, "taken", "x")],
                               "is a file, not a folder"),
    "--resume with --overwrite": Case("cli", lambda t: ["train", ENCODER, "--resume", "--overwrite"],
                                      "contradict each other"),
    "unknown option": Case("cli", lambda t: ["train", ENCODER, "--epochs", "3"], "No such option: --epochs"),
    "eval of a folder that is not a run": Case("cli", lambda t: ["eval", t], "not a run folder"),
    "predict with a run that never finished": Case(
        "cli", lambda t: ["predict", _killed_run(t, lambda c: None), "--input", "hello"],
        "no adapter/ or model/ folder"),
    "merge to an unknown dtype": Case("cli", lambda t: ["merge", t, "--out", t / "merged", "--dtype", "int8"],
                                      "--dtype: 'int8' is not one of"),
    "init-model of an unknown architecture": Case("cli", lambda t: ["init-model", "llama", t / "model"],
                                                  "unknown architecture"),
    # ------------------------------------------------------------ data x model (preflight, before any weights load)
    "eval labels the train file never had": Case(
        "data", lambda t: _data(ENCODER, sentiment_csv(t), f"data.eval={sentiment_csv(t, 'e.csv', ('pos', 'meh'))}"),
        "label 'meh' (6 eval rows) never occurs in the train split"),
    "eval tags the train file never had": Case(
        "data", lambda t: _data(TAGGING, _tags(t, "train.jsonl", ["B-PER", "O", "O"]),
                                f"data.eval={_tags(t, 'eval.jsonl', ['B-PER', 'O', 'B-LOC'])}"),
        "tag 'B-LOC' (6 eval words) never occurs in the train split"),
    "data.label_names listing a label twice": Case(
        "data", lambda t: _train(ENCODER, "data.label_names=[negative, positive, positive]"),
        "data.label_names: 'positive' listed more than once"),
    "every text empty": Case(
        "data", lambda t: _data(ENCODER, rows_file(t, "d.csv", "text,label", [",pos", ",neg"] * 3)),
        "data.train: every row of"),
    "every target empty": Case(
        "data", lambda t: _data(SEQ2SEQ, rows_file(t, "d.csv", "text,target", ["the cat,", "a dog,  "] * 3)),
        "has an empty target, so nothing is left"),
    "image folder with a single class subfolder": Case(
        "data", lambda t: _data(VISION, class_images(t, classes=("cat",))),
        "has a single class subfolder (cat), but image classification needs at least two"),
    "image folder without class subfolders": Case(
        "data", lambda t: _data(VISION, _flat_images(t)), "has no class subfolders"),
    "an image cut short": Case("data", lambda t: _data(VISION, _truncated_image(t)),
                               "cut.png can't be read as an image (image file is truncated"),
    "checkpoint folder without tokenizer files": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={without_tokenizer(t)}"),
        "no tokenizer files (expected tokenizer.json, or vocab.txt)"),
    "tokenizer larger than the embedding table": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_grown_tokenizer(t)}"),
        "but the model's embedding table only"),
    "another model's tokenizer": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_foreign_tokenizer(t)}"),
        "fewer than half the model's"),
    "classification with a type that has no classifier": Case(
        "checkpoint", lambda t: _train(ENCODER, f"model.checkpoint={_retyped(t, 'bart', 'marian')}"),
        "transformers has no SequenceClassification head for marian"),
    "tagging with a decoder that has no tagger": Case(
        "checkpoint", lambda t: _train(TAGGING, f"model.checkpoint={_opt_folder(t)}", "lora.targets=[q_proj]"),
        "transformers has no TokenClassification head for opt"),
    "a classifier fine-tuned for other labels": Case(
        "checkpoint", lambda t: _data(ENCODER, sentiment_csv(t, labels=("pos", "neg", "meh")),
                                      f"model.checkpoint={_two_label_classifier(t)}"),
        "already has a SequenceClassification head for 2 labels (neg, pos), but the data needs 3 labels"),
    "masked LM with a tokenizer without a mask token": Case(
        "checkpoint", lambda t: _train(MLM, f"model.checkpoint={tokenizer_without(t, 'bert', 'mask')}"),
        "has no mask token"),
    "decoder classifier with neither pad nor eos token": Case(
        "checkpoint", lambda t: _train(ENCODER, "model.checkpoint=" + str(tokenizer_without(
            t, "gpt2", "pad", "eos", "bos", "unk")), "lora.targets=[c_attn]"), "has no pad token"),
    "causal LM with a tokenizer without an eos token": Case(
        "checkpoint", lambda t: _train(CLM, f"model.checkpoint={tokenizer_without(t, 'gpt2', 'eos', 'bos', 'unk')}"),
        "has no eos token"),
    "image processor for another image size": Case(
        "checkpoint", lambda t: _train(VISION, f"model.checkpoint={vit_with(t, 64)}"),
        "makes 64x64 images but the model's position embeddings take 32x32"),
    "vision checkpoint without its image processor": Case(
        "checkpoint", lambda t: _train(VISION, f"model.checkpoint={vit_with(t, None)}"),
        "no image processor file (preprocessor_config.json)"),
    "preference on an encoder": Case(
        "recipe", lambda t: _train(PREFERENCE, "model.checkpoint=init:bert"),
        "task 'preference' can't be done by 'init:bert', an encoder model"),
    "preference method TRL does not have": Case(
        "recipe", lambda t: _train(PREFERENCE, "preference.method=kto_pair"),  # (TRL 0.x's, since removed)
        "preference.method: input should be 'dpo', 'ipo', 'orpo' or 'kto'"),
    "an adapter whose base is gone": Case(
        "checkpoint", lambda t: _train(PREFERENCE, "model.checkpoint=" + str(write_file(
            t, "adapter/adapter_config.json", '{"peft_type": "LORA", "base_model_name_or_path": "/gone/base"}'
        ).parent)),
        "checkpoint directory /gone/base not found: check the path (the base the adapter"),
    "kto answers labelled neither good nor bad": Case(
        "data", lambda t: _data(PREFERENCE, write_file(t, "answers.jsonl", "".join(
            json.dumps({"text": f"q{i}", "target": f"a{i}", "label": ["yes", 1][i % 2]}) + "\n" for i in range(8))),
            "preference.method=kto"),
        "labels its answer 'yes'; kto reads true (a good answer) or false (a bad one), or 1 or 0"),
    "kto in batches of one": Case(
        "recipe", lambda t: _train(PREFERENCE, "preference.method=kto", "training.batch_size=1"),
        "takes each answer's KL term against the other answers of its batch, and training.batch_size is 1"),
    "kto's weights on another method": Case(
        "recipe", lambda t: _train(PREFERENCE, "preference.undesirable_weight=2"),
        "preference.undesirable_weight weighs kto's good and bad answers, and the method is dpo"),
    "preference beta of 0": Case(
        "recipe", lambda t: _train(PREFERENCE, "preference.beta=0"), "preference.beta: input should be greater than 0"),
    "preference section on another task": Case(
        "recipe", lambda t: _train(ENCODER, "preference.beta=0.5"),
        "the preference section says how preference pairs are learned, and the task is classification"),
    "preference pairs without a chosen column": Case(
        "data", lambda t: _data(PREFERENCE, _pairs(t, {"text": "Hi?", "rejected": "No."})),
        "data.chosen_column: column 'chosen' not found"),
    "preference conversations that do not share their prompt": Case(
        "data", lambda t: _data(PREFERENCE, _pairs(t, {
            "chosen": _turns(("user", "What is 2 plus 2?"), ("assistant", "4.")),
            "rejected": _turns(("user", "Name a colour."), ("assistant", "Blue."))})),
        "the chosen and rejected conversations do not start with the same turns"),
    "preference pairs whose answers are all the same": Case(
        "data", lambda t: _data(PREFERENCE, _pairs(t, {"text": "Hi?", "chosen": "Hello.", "rejected": "Hello."})),
        "the chosen and rejected answers are the same, so there is no preference to learn"),
}


@pytest.fixture(autouse=True)
def library_logs_to_the_current_stderr():
    """datasets and transformers bind their log handlers to the stderr of the first CliRunner call, closed
    since; re-bound here, a library's log line is printed, not a "Logging error" traceback."""
    import logging
    import sys

    for name in ("datasets", "transformers"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.stderr  # (setStream would flush the closed one)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_catalogue_is_large_and_covers_every_kind_of_input():
    kinds = [c.kind for c in CASES.values()]
    assert len(CASES) >= 30 and SLOW_CASES <= set(CASES)
    assert {k: kinds.count(k) >= 4 for k in ("recipe", "data", "checkpoint", "cli")} == dict.fromkeys(
        ("recipe", "data", "checkpoint", "cli"), True)


# The cases that train or load weights before the refusal comes (seconds each): in the slow tier.
SLOW_CASES = {"one-class data", "label column of mixed types", "truncated safetensors weights",
              "resume from a truncated adapter", "resume from a damaged trainer state",
              "resume from a damaged optimizer state", "image processor for another image size"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CASES else name
                                  for name in CASES])
def test_bad_input_fails_with_one_sentence_and_leaves_nothing_half_written(name, tmp_path):
    case = CASES[name]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args = [str(a) for a in case.make(inputs)]
    run = tmp_path / "run"
    if args[0] == "train" and "--output" not in args and "--resume" not in args:
        args += ["--output", str(run)]
    before = _snapshot(inputs)
    result = run_cli(*args, expect=None)
    output = result.output
    assert result.exit_code != 0, f"{name}: exit 0\n{output}"
    assert "Traceback" not in output and not (result.exception and result.exit_code == 1), \
        f"{name}: crashed\n{output}\n{result.exception!r}"
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and output.rstrip().endswith(errors[0]), f"{name}: not one line of error\n{output}"
    assert case.expect in plain(errors[0]), f"{name}: {errors[0]!r} lacks {case.expect!r}"
    assert not run.exists(), f"{name}: left a run directory behind"
    assert _snapshot(inputs) == before, f"{name}: changed or added files among its inputs"
