"""Preflight: the recipe, the data and the model checked together, before any weights load or step runs.

Every problem is raised at once as one `RecipeError` of `where: what is wrong: what to do` lines; what can be
settled without asking (a length clamped to the position table, empty rows dropped) is settled and said as a note
and kept in manifest.json. One rule, one `check_*` function; `CHECKS` is their order (docs/architecture.md).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.config.families import reads_text
from hftoolkit.config.recipe import Recipe
from hftoolkit.job.spec import Findings, ResolvedModel
from hftoolkit.sources.pairs import cut_counts

# Position ids that start after the padding index (RoBERTa's create_position_ids_from_input_ids): the
# table holds max_position_embeddings - pad_token_id - 1 usable positions.
OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "mpnet"}
# Vision models whose position embeddings fix the input size (no interpolation by default).
FIXED_IMAGE_SIZE = {"vit", "deit", "beit"}
# A tokenizer's model_max_length when it has none (transformers' VERY_LARGE_INTEGER is about 1e30).
NO_LIMIT = 10**9


@dataclass(frozen=True)
class Subject:
    """What the checks look at together; model and data are None where they failed to load."""

    recipe: Recipe
    model: ResolvedModel | None
    data: Any
    label_names: list[str] | None

    @property
    def family(self) -> str | None:
        return self.model.family if self.model else None

    @property
    def config(self):
        return self.model.config if self.model else None

    @property
    def processor(self):
        return self.model.processor if self.model else None


def preflight(recipe: Recipe, model: ResolvedModel | None, data, label_names: list[str] | None,
              dropped: dict[str, int] | None = None) -> Findings:
    """Every check on the recipe, its data and its model together; what was clamped is in `lengths`."""
    found, subject = Findings(), Subject(recipe, model, data, label_names)
    for check in CHECKS:
        check(subject, found)
    if dropped is not None:
        _dropped(recipe, dropped, found, data)
    return found


def _dropped(recipe: Recipe, dropped: dict, found: Findings, data) -> None:
    """The rows set aside as the data was read, one note per split and reason: an empty input or target, and a
    label that data.label_map maps to null."""
    unlabelled, identical = dropped.get("label_map"), dropped.get("identical_pairs")
    found.record["dropped_empty"] = {k: v for k, v in dropped.items() if k not in ("label_map", "identical_pairs")}
    if unlabelled is not None:
        found.record["dropped_by_label_map"] = dict(unlabelled)
    if identical is not None:
        found.record["dropped_identical_pairs"] = dict(identical)
    columns = tasks.spec(recipe.task).columns
    what = "text or target" if "target" in columns else ("prompt or answer" if "chosen" in columns else "text")
    if data is not None and "messages" in data["train"].column_names:
        what = "conversation (no assistant turn with text)"
    for split, count in found.record["dropped_empty"].items():
        if count:
            found.notes.append(f"{_split_key(recipe, split)}: dropped {count} row{'s' * (count != 1)} with an "
                               f"empty {what}")
    for split, count in (unlabelled or {}).items():
        if count:
            found.notes.append(f"{_split_key(recipe, split)}: dropped {count} row{'s' * (count != 1)} whose label "
                               "data.label_map maps to null")
    for split, count in (identical or {}).items():
        if count:
            found.notes.append(f"{_split_key(recipe, split)}: dropped {count} pair{'s' * (count != 1)} whose chosen "
                               "and rejected answers are the same (no preference to learn)")


def _split_key(recipe: Recipe, split: str) -> str:
    return "data.train" if split == "train" else ("data.eval" if recipe.data.eval else "data.eval_split")


# ---------------------------------------------------------------- checks


def check_head(s: Subject, found: Findings) -> None:
    """The task's head exists for the checkpoint's type, and a head it already has fits the data's labels."""
    recipe, config = s.recipe, s.config
    if config is None or getattr(config, "auto_map", None):  # remote code brings its own classes
        return
    import transformers

    name = tasks.head(recipe.task, s.family)
    auto = getattr(transformers, name)
    if type(config) not in auto._model_mapping:
        from hftoolkit.sources.tiny import ARCHS

        known = auto._model_mapping._model_mapping  # model_type -> class name
        others = [t for t in ARCHS if t in known]  # the course's architectures that have the head
        found.problems.append(
            f"model.checkpoint: {recipe.model.checkpoint} is {'an' if config.model_type[:1] in 'aeiou' else 'a'} "
            f"{config.model_type} model, and transformers has no "
            f"{name.removeprefix('AutoModelFor')} head for {config.model_type} (task {recipe.task!r}): use a "
            f"checkpoint of a type that has one" + (f", such as {', '.join(others)}" if others else ""))
        return
    suffix = tasks.trained_head(recipe.task, s.family)
    names = ["value"] if tasks.spec(recipe.task).labels == "value" else s.label_names  # regression: 1
    if suffix and names and any(a.endswith(suffix) for a in getattr(config, "architectures", None) or []):
        if config.num_labels != len(names):
            trained = ", ".join(str(v) for _, v in sorted((getattr(config, "id2label", None) or {}).items()))
            wanted = "one output (regression)" if recipe.task == tasks.REGRESSION else \
                f"{len(names)} labels ({', '.join(names)})"
            found.problems.append(
                f"model.checkpoint: {recipe.model.checkpoint} already has a {suffix.removeprefix('For')} head for "
                f"{config.num_labels} labels ({trained}), but the data needs {wanted}: start from the base "
                "checkpoint it was fine-tuned from, or use data with its labels")


def check_tokenizer(s: Subject, found: Findings) -> None:
    """The tokenizer belongs to the checkpoint (its vocabulary fits the embedding table) and has the special
    tokens the task needs."""
    recipe, config, processor = s.recipe, s.config, s.processor
    if config is None or processor is None or not reads_text(s.family):
        return
    ckpt, text = recipe.model.checkpoint, config.get_text_config()
    vocab, size = getattr(text, "vocab_size", None), len(processor)
    if isinstance(vocab, int) and size > vocab:
        found.problems.append(
            f"model.checkpoint: the tokenizer of {ckpt} has {size} tokens but the model's embedding table only "
            f"{vocab}, so ids from {vocab} on have no embedding: use the tokenizer saved with this checkpoint, or "
            "resize the model's embeddings (model.resize_token_embeddings) and save it again")
    elif isinstance(vocab, int) and size < vocab / 2:
        found.problems.append(
            f"model.checkpoint: the tokenizer of {ckpt} has {size} tokens, fewer than half the model's {vocab} "
            "embeddings, so it is not the tokenizer this model was trained with: save that tokenizer into the "
            "checkpoint folder (tokenizer.save_pretrained)")
    needs = []
    if processor.pad_token is None:
        needs.append(("pad", "batches of different lengths are padded with it (or with eos, which it lacks too)"))
    if s.family == "decoder" and recipe.task in tasks.language_model_tasks("decoder") and processor.eos_token is None:
        needs.append(("eos", f"task {recipe.task!r} on a decoder ends each text with it"))
    if recipe.task in (tasks.MLM, tasks.DENOISE) and processor.mask_token is None:
        needs.append(("mask", f"task {recipe.task!r} replaces tokens with it"))
    for token, why in needs:
        found.problems.append(f"model.checkpoint: the tokenizer of {ckpt} has no {token} token, and {why}: use a "
                              f"checkpoint whose tokenizer has one, or add it (tokenizer.add_special_tokens) and "
                              "save the tokenizer into the checkpoint")


def check_lengths(s: Subject, found: Findings) -> None:
    """Lengths within the model's position table, clamped to it where they are not."""
    recipe, config, processor = s.recipe, s.config, s.processor
    if config is None or not reads_text(s.family):
        return
    limit = position_limit(config, processor)
    if limit is None:  # relative positions (T5): no table to run past
        return
    d, ckpt = recipe.data, recipe.model.checkpoint
    where = f"more than {ckpt} takes ({limit} positions)"
    talks = s.data is not None and "messages" in s.data["train"].column_names  # a conversation: max_length bounds it
    # (a reward model reads prompt and answer as one sequence on either family: a text pair on an encoder)
    if (s.family == "decoder" and recipe.task in tasks.prompted() or recipe.task == tasks.REWARD) and not talks:
        if d.max_length + d.max_target_length > limit:  # prompt and target are one sequence
            target = min(d.max_target_length, max(limit - d.max_length, limit // 2))
            source = min(d.max_length, limit - target)
            found.notes.append(f"data.max_length + data.max_target_length: {d.max_length} + {d.max_target_length} "
                               f"tokens in one sequence is {where}: using {source} + {target}")
            for attr, used in (("max_length", source), ("max_target_length", target)):
                if getattr(d, attr) != used:
                    found.record[attr] = {"asked": getattr(d, attr), "used": used}
                    found.lengths[attr] = used
    else:
        _clamp(found, d, "max_length", "data.max_length", limit, where)
        if s.family == "seq2seq" and recipe.task in tasks.prompted():
            _clamp(found, d, "max_target_length", "data.max_target_length", limit, where)
    if s.family in ("decoder", "seq2seq") and tasks.spec(recipe.task).labels is None:
        # Text generated for the eval's prediction records: a decoder's prompt and new tokens share its positions.
        _clamp(found, recipe.eval.generation, "max_new_tokens", "eval.generation.max_new_tokens", limit - 1,
               f"more than {ckpt} can add ({limit} positions, one of them for the prompt or the start token)")


def _clamp(found: Findings, section, attr: str, key: str, limit: int, where: str) -> None:
    asked = getattr(section, attr)
    if asked > limit:
        found.lengths[attr] = limit
        found.record[attr] = {"asked": asked, "used": limit}
        found.notes.append(f"{key}: {asked} tokens is {where}: using {limit}, as transformers' example scripts do")


def position_limit(config, processor) -> int | None:
    """Tokens one sequence may hold: the position table's size (max_position_embeddings, or GPT-2's n_positions),
    lowered to the tokenizer's model_max_length where that is smaller; None for relative positions (T5)."""
    text = config.get_text_config()
    limit = next((v for v in (getattr(text, "max_position_embeddings", None), getattr(text, "n_positions", None))
                  if isinstance(v, int) and v > 0), None)
    if limit is None:
        return None
    if text.model_type in OFFSET_POSITIONS and isinstance(getattr(text, "pad_token_id", None), int):
        limit -= text.pad_token_id + 1
    told = getattr(processor, "model_max_length", None)
    if isinstance(told, int) and 0 < told < min(limit, NO_LIMIT):
        limit = told
    return limit


def check_labels(s: Subject, found: Findings) -> None:
    """Every label the eval split holds occurs in the train split; data.label_names lists each label once."""
    recipe, data = s.recipe, s.data
    spec = tasks.spec(recipe.task)
    names = s.label_names or recipe.data.label_names
    if spec.labels in ("class", "tags") and names and len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        found.problems.append(f"data.label_names: {', '.join(map(repr, twice))} listed more than once, so two "
                              "outputs would share one name: list each label once")
        return
    if data is None or spec.labels not in ("class", "tags") or not names:
        return
    train, evaluation = (_counts(data[split]["label"]) for split in ("train", "eval"))
    unseen = sorted(set(evaluation) - set(train))
    if unseen:
        d = recipe.data
        where = "data.eval" if d.eval else "data.eval_split" if d.eval_split else "data.eval_fraction"
        shown = ", ".join(repr(names[i]) for i in unseen[:5]) + (" ..." if len(unseen) > 5 else "")
        rows = sum(evaluation[i] for i in unseen)
        kind, unit = ("label", "row") if spec.labels == "class" else ("tag", "word")
        many = len(unseen) > 1
        found.problems.append(
            f"{where}: {kind}{'s' * many} {shown} ({rows} eval {unit}{'s' * (rows != 1)}) never "
            f"occur{'' if many else 's'} in the train split of {d.train}, so the model can't learn "
            f"{'them' if many else 'it'}: add training examples of {'them' if many else 'it'}, or remove those rows "
            "from the eval data")
    absent = [names[i] for i in range(len(names)) if i not in train and i not in evaluation]
    if absent:
        one = len(absent) == 1
        found.notes.append(f"data.label_names: {', '.join(map(repr, absent))} occur{'s' * one} in no row, so the "
                           f"model gets an output for {'it' if one else 'each'} that it never learns: remove "
                           f"{'it' if one else 'them'} from data.label_names (the classes are the values the data "
                           "holds), or add rows of " + ("it" if one else "them"))


def _counts(column) -> dict[int, int]:
    counts: dict[int, int] = {}
    for item in column:
        for v in item if isinstance(item, list) else [item]:
            counts[v] = counts.get(v, 0) + 1
    return counts


def check_images(s: Subject, found: Findings) -> None:
    """Every image decodes in full (a truncated file passes a header check, then fails mid-run), and the
    processor makes what the model takes: its channels, and its size where position embeddings fix it.
    Decoding every image costs about one epoch of image decoding, spread over threads."""
    recipe, data, config, processor = s.recipe, s.data, s.config, s.processor
    if data is None or recipe.task != tasks.IMAGE_CLASSIFICATION or "image" not in data["train"].column_names:
        return
    import os
    from concurrent.futures import ThreadPoolExecutor

    import datasets

    first = None
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # PIL decodes without the GIL
        for split in ("train", "eval"):
            stored = data[split].cast_column("image", datasets.Image(decode=False))  # {"path", "bytes"}: named
            broken, row = [], 0
            for batch in stored.iter(batch_size=256):
                for item, outcome in zip(batch["image"], pool.map(_decoded, batch["image"])):
                    if isinstance(outcome, Exception):
                        reason = str(outcome).splitlines()[0][:160] if str(outcome) else type(outcome).__name__
                        broken.append((_name(item, row, split), reason))
                    elif first is None:
                        first = outcome
                    row += 1
            if len(broken) == 1:  # (the words of families/vision.py, which names a file that fails when drawn)
                name, reason = broken[0]
                found.problems.append(f"data: {name} can't be read as an image ({reason}): replace or remove it")
            elif broken:
                shown = "; ".join(f"{name} ({reason})" for name, reason in broken[:3])
                shown += f"; and {len(broken) - 3} more" if len(broken) > 3 else ""
                found.problems.append(f"data: {len(broken)} images of the {split} split can't be read as images: "
                                      f"{shown}: replace or remove them")
    if first is None or config is None or processor is None:
        return
    shape = tuple(processor([first], return_tensors="pt")["pixel_values"].shape[1:])  # (C, H, W)
    channels, size = getattr(config, "num_channels", None), getattr(config, "image_size", None)
    ckpt = recipe.model.checkpoint
    if isinstance(channels, int) and shape[0] != channels:
        found.problems.append(f"model.checkpoint: the image processor of {ckpt} makes {shape[0]}-channel images but "
                              f"the model takes {channels}: use the processor saved with this checkpoint")
    elif config.model_type in FIXED_IMAGE_SIZE and isinstance(size, int) and shape[1:] != (size, size):
        found.problems.append(f"model.checkpoint: the image processor of {ckpt} makes {shape[1]}x{shape[2]} images "
                              f"but the model's position embeddings take {size}x{size}: use the processor saved "
                              "with this checkpoint (or set its size to the model's image_size)")


def _decoded(item):
    """The image as RGB, every pixel decoded as training will; the exception instead where it can't be."""
    from PIL import Image

    try:
        if isinstance(item, Image.Image):
            return item.convert("RGB")
        source = item if isinstance(item, str) else (
            io.BytesIO(item["bytes"]) if item and item.get("bytes") is not None else (item or {}).get("path"))
        if source is None:
            raise ValueError("the row holds no image")
        with Image.open(source) as image:
            return image.convert("RGB")
    except Exception as err:  # PIL raises several types for a file that is not a whole image
        return err


def _name(item, row: int, split: str) -> str:
    path = item if isinstance(item, str) else (item or {}).get("path")
    return f"image file {path}" if path else f"the image in row {row} of the {split} split"


def check_packing(s: Subject, found: Findings) -> None:
    """data.packing true or padding_free packs whole examples only where a decoder's formulation packs them
    (tasks.packed), on a model type that keeps them apart by position ids (architectures.packs_by_positions);
    anywhere else it is refused, never ignored (unset, padding_free is taken only where it works)."""
    recipe, config = s.recipe, s.config
    if recipe.data.packing not in (True, "padding_free"):
        return
    packs = tasks.packed()
    if recipe.task not in packs:  # no family packs these: known without the model
        packed = f"{', '.join(packs[:-1])} or {packs[-1]}"
        found.problems.append(f"data.packing: packing whole examples into rows is for tasks {packed} on decoder "
                              f"models, and task {recipe.task} trains one example a row whatever the family: remove "
                              "data.packing (or set it to false)")
        return
    if config is None:
        return
    from hftoolkit.job.architectures import packs_by_positions

    ckpt = recipe.model.checkpoint
    if s.family != "decoder":
        found.problems.append(f"data.packing: packing whole examples into rows is for decoder models, and {ckpt} is "
                              f"{s.family}: set data.packing to false")
    elif not packs_by_positions(config.model_type):
        other = " or blocks" if recipe.task == tasks.CLM else ""
        found.problems.append(f"data.packing: {config.model_type} models build their attention from the attention "
                              "mask alone (or carry a state along the sequence), so packed examples would see each "
                              f"other: set data.packing to false{other}, or use a model type that packs (llama, "
                              "mistral, qwen2, gemma, gpt2, phi3 and most decoders)")


def check_conversations(s: Subject, found: Findings) -> None:
    """A conversation set trains a decoder; its chat template splits answers from prompts; conversations longer
    than data.max_length are counted, by where they are cut (after a whole turn, or inside one)."""
    recipe, data, processor = s.recipe, s.data, s.processor
    if data is None or "messages" not in data["train"].column_names:
        return
    if s.family is not None and s.family != "decoder":
        found.problems.append(f"data.messages_column: conversations train decoder models, and "
                              f"{recipe.model.checkpoint} is {s.family}: use a decoder checkpoint, or text and target "
                              "columns (data.text_column, data.target_column)")
        return
    if processor is None:
        return
    from hftoolkit.sources.conversations import cut_counts

    size = found.lengths.get("max_length", recipe.data.max_length)
    try:
        counts = [cut_counts(processor, data[split]["messages"], size) for split in ("train", "eval")]
    except UserError as err:
        found.problems.append(err.message)
        return
    turn, inside = (sum(c[kind] for c in counts) for kind in ("turn", "inside"))
    # (a conversation is one sequence, cut to max_length: no answer is added after it)
    found.longest.update(max_length=max(c["longest"] for c in counts), max_target_length=0)
    if turn or inside:
        found.record["conversations_cut"] = {"turn": turn, "inside": inside}
        found.notes.append(f"data.max_length: {turn + inside} conversation{'s' * (turn + inside != 1)} longer than "
                           f"{size} tokens: {turn} cut after the last assistant turn that fits, {inside} cut inside "
                           "a turn (raise data.max_length to keep them whole)")


def check_pairs(s: Subject, found: Findings) -> None:
    """Preference and reward pairs (or kto's labelled answers) whose prompt or answers tokenization will cut are
    counted, in one line."""
    if s.data is None or s.processor is None or s.recipe.task not in tasks.paired():
        return
    size, answer = (found.lengths.get(key, getattr(s.recipe.data, key)) for key in ("max_length", "max_target_length"))
    cut = [cut_counts(s.processor, s.data[split], size, answer) for split in ("train", "eval")]
    found.longest.update(max_length=max(c["longest_prompt"] for c in cut),
                         max_target_length=max(c["longest_answer"] for c in cut))
    if (prompts := sum(c["prompts"] for c in cut)) + (answers := sum(c["answers"] for c in cut)):
        found.record["pairs_cut"] = {"prompts": prompts, "answers": answers}
        found.notes.append(f"data.max_length, data.max_target_length: {prompts} prompt{'s' * (prompts != 1)} longer "
                           f"than {size} tokens and {answers} answer{'s' * (answers != 1)} longer than {answer} are "
                           "cut to fit (raise them to keep the pairs whole)")


def check_rewards(s: Subject, found: Findings) -> None:
    """Each reward of rl.rewards can score answers: an exact answer's column is in the data; a function is found,
    and called once on a dry batch of the data's first prompts it neither raises nor returns other than one number
    per answer; a run is a finished task reward run. vLLM sampling needs vllm and a GPU."""
    from hftoolkit.sources import rewards

    rl = s.recipe.rl
    if rl is None:
        return
    train = s.data["train"] if s.data is not None else None
    columns = [c for c in train.column_names if c != "text"] if train is not None else []
    for i, entry in enumerate(rl.rewards):
        key = f"rl.rewards.{i}.{entry.kind}"
        if entry.exact is not None and train is not None and entry.exact not in columns:
            found.problems.append(f"{key}: column {entry.exact!r} not found in data.train (its other columns: "
                                  f"{', '.join(columns) or 'none'}): set it to the column holding the right answers")
        elif entry.run is not None and (problem := rewards.reward_run_problem(entry.run, key)):
            found.problems.append(problem)
        elif entry.function is not None:
            try:
                function = rewards.load_function(entry.function, key)
            except UserError as err:
                found.problems.append(err.message)
                continue
            if train is not None and len(train):
                rows = train.select(range(min(2, len(train))))
                problem = rewards.dry_call(function, key, rows["text"], {c: rows[c] for c in columns})
                if problem:
                    found.problems.append(problem)
    if rl.generation == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            found.problems.append("rl.generation: vllm samples answers on a GPU with the vllm package, which is not "
                                  "installed: pip install vllm on a CUDA machine, or set rl.generation to generate")


def check_prompts(s: Subject, found: Findings) -> None:
    """Task grpo's prompts that are conversations are well-formed turns, which the tokenizer's chat template
    renders (TRL samples from the rendering): a tokenizer without one is refused, not failed on at the first step."""
    from hftoolkit.sources.conversations import problem

    if s.recipe.task != tasks.GRPO or s.data is None:
        return
    key, source = "data.text_column", s.recipe.data.train
    turns = [(row, text) for row, text in enumerate(s.data["train"]["text"]) if isinstance(text, list)]
    bad = [line for row, text in turns if (line := problem(text, row, source, key)) is not None]
    if bad:
        found.problems.append(bad[0] + (f" (and {len(bad) - 1} more rows like it)" if len(bad) > 1 else ""))
    elif turns and s.processor is not None and not getattr(s.processor, "chat_template", None):
        found.problems.append(f"{key}: the prompts of {source} are conversations, and the tokenizer of "
                              f"{s.recipe.model.checkpoint} has no chat template to render them: give the prompts "
                              "as texts, or use a chat model")


CHECKS = (check_head, check_tokenizer, check_lengths, check_labels, check_images, check_packing, check_conversations,
          check_pairs, check_prompts, check_rewards)
