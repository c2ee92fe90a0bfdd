"""Decoder-only models (GPT-2, Llama and kin): causal language modelling, and the other text tasks written as
one sequence: translation and summarization as prompt + target, instruction tuning as prompt + target in the
tokenizer's chat template, classification and tagging with transformers' decoder heads (labels.py). The output
continues a prompt, so each token attends only to the tokens before it (the course's decision tree).
"""

from __future__ import annotations

from hftoolkit.base.errors import UserError
from hftoolkit.config import tasks
from hftoolkit.job.architectures import packs_by_positions
from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics
from hftoolkit.models import tokenized
from hftoolkit.models.families import decoding_options, labels, packing, sync_pad_token
from hftoolkit.models.families.grpo import SampledAnswers
from hftoolkit.models.families.preference import PreferencePairs
from hftoolkit.models.families.reward import RewardModel
from hftoolkit.sources import conversations
from hftoolkit.sources.labels import IGNORE_INDEX
from hftoolkit.sources.streaming import is_stream

# Between the source and the target of a prompt + target sequence (after data.source_prefix + text).
PROMPT_END = "\n"


def _load_causal_lm(job: Job):
    """Tokenizer (pad = eos where the checkpoint has none, as GPT-2) and causal-LM model with LoRA.

    The LM head is tied to the input embeddings, so there is no separate head to keep trainable.
    """
    import transformers as tf

    from hftoolkit.models import loading

    tokenizer = job.model.processor
    model = loading.load_task_model(tf.AutoModelForCausalLM, job, "CAUSAL_LM", with_head=False)
    sync_pad_token(model, tokenizer)
    return model, tokenizer


def _padding_collator(job: Job, tokenizer):
    """Pads input ids and attention mask per batch (right side), and labels with -100 so padding has no loss.

    DataCollatorForSeq2Seq does exactly that for any "labels" column. DataCollatorForLanguageModeling would
    instead mask every label equal to the pad token, which for GPT-2 (pad = eos) also hides the real eos.
    """
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")


def _packing(job: Job) -> str:
    """How the job packs: "blocks" (clm's fixed blocks), "rows" (whole examples packed into full rows), "flat"
    (each batch's examples in one row) or "none"."""
    packing = job.recipe.data.packing
    if packing is None:
        if job.task == tasks.CLM:
            return "blocks"
        return "flat" if job.task in tasks.packed() and packs_by_positions(job.model.model_type) else "none"
    return {"blocks": "blocks", "padding_free": "flat", True: "rows"}.get(packing, "none")


def _blocks(job: Job, tokenizer, dataset):
    """The split's texts, each followed by eos, concatenated and cut into blocks of exactly data.max_length."""
    size, eos = job.max_length, tokenizer.eos_token_id

    def pack(batch):
        ids = [i for text_ids in tokenizer(batch["text"])["input_ids"] for i in [*text_ids, eos]]
        blocks = [ids[start:start + size] for start in range(0, len(ids) - size + 1, size)]
        return {"input_ids": blocks, "attention_mask": [[1] * size for _ in blocks],
                "labels": [list(b) for b in blocks], "length": [size] * len(blocks)}

    # batch_size=None: the whole split is one batch, so packing concatenates across every document.
    encoded = tokenized.encode(job, tokenizer, dataset, pack, batch_size=None)
    if not is_stream(encoded) and len(encoded) == 0:
        tokens = sum(len(ids) + 1 for ids in tokenizer(list(dataset["text"]))["input_ids"])
        raise UserError(f"data.max_length: packing cuts blocks of {size} tokens, but a split of "
                        f"{job.recipe.data.train} holds only {tokens}: lower data.max_length, or add text "
                        "(or a larger data.eval_fraction)")
    return encoded


def _packed(job: Job, encoded):
    """The encoded examples packed into rows where data.packing is true; as they are otherwise."""
    return packing.pack(encoded, job.max_length) if _packing(job) == "rows" else encoded


def _collator(job: Job, tokenizer):
    """Packed rows (data.packing true) through packing.PackedCollator, a batch packed into rows of its own
    (padding_free) through packing.FlatCollator, else padded batches."""
    mode, one_row = _packing(job), job.recipe.model.attention == "flash_attention_2"
    if mode == "rows":
        return packing.PackedCollator(tokenizer, flat=one_row)
    if mode == "flat":
        return packing.FlatCollator(tokenizer, _padding_collator(job, tokenizer), flat=one_row,
                                     break_even=packing.attention_break_even(job.model.config))
    return _padding_collator(job, tokenizer)


class CausalLM:
    """Next-token prediction on the text itself; perplexity; predictions continue a prompt. The labels are the
    input ids: the model shifts them by one inside its loss."""

    def load_model(self, job: Job):
        return _load_causal_lm(job)

    def preprocess(self, job: Job, tokenizer, dataset):
        """Token ids with labels = input ids, and a "length" column; each text is followed by eos.

        data.packing blocks (the default for clm): the texts concatenated and cut into blocks of exactly
        data.max_length tokens; the remainder shorter than a block is dropped (no padding at all), and attention
        runs across the documents a block holds.
        data.packing true: each text cut into pieces of at most data.max_length tokens, the pieces packed into
        full rows whose position ids restart per piece (packing.py): no padding, no attention across documents.
        data.packing false: one example per text, truncated to data.max_length; the collator pads per batch.
        """
        mode = _packing(job)
        if mode == "blocks":
            return _blocks(job, tokenizer, dataset)
        size, eos = job.max_length, tokenizer.eos_token_id

        def pieces(batch):
            ids = [x + [eos] for x in tokenizer(batch["text"])["input_ids"]]
            ids = [text[start:start + size] for text in ids for start in range(0, len(text), size)]
            return {"input_ids": ids, "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

        def truncate(batch):
            ids = [x + [eos] for x in tokenizer(batch["text"], truncation=True,
                                                max_length=max(size - 1, 1))["input_ids"]]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids],
                    "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

        encoded = tokenized.encode(job, tokenizer, dataset, pieces if mode == "rows" else truncate)
        return packing.pack(encoded, size) if mode == "rows" else encoded

    def collator(self, job: Job, tokenizer):
        return _collator(job, tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        """Perplexity only, from the eval loss. No compute function, so the Trainer evaluates with
        prediction_loss_only and never gathers the (tokens x vocabulary) logits."""
        return EvalMetrics(compute=None, main="perplexity", greater_is_better=False)

    def generate(self, job: Job, model, tokenizer, inputs: list[str], prompt_fraction: float = 1.0):
        """Continuation of each input; prompt_fraction < 1 prompts with only the first fraction of each
        input's tokens (at least one): eval texts are whole documents, so the record shows the model
        continuing the first part of a real text ("prompt" in the output)."""
        prompts, room = [], _room(job, model)
        for ids in tokenizer(list(inputs), add_special_tokens=True)["input_ids"]:
            ids = ids or [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
            prompts.append((ids[:max(1, int(len(ids) * prompt_fraction))] if prompt_fraction < 1 else ids)[-room:])
        texts = _continue(job, model, tokenizer, prompts)
        if prompt_fraction < 1:
            return [{"prompt": tokenizer.decode(ids, skip_special_tokens=True), "text": text}
                    for ids, text in zip(prompts, texts)]
        return [{"text": text} for text in texts]


class PromptAndTarget:
    """Translation and summarization as one sequence: data.source_prefix + text + a line break, then the
    target and eos. The loss falls on the target only (the prompt's labels are -100), so the model learns
    to write the target given the source, as an encoder-decoder does; scored on generated text."""

    def load_model(self, job: Job):
        return _load_causal_lm(job)

    def prompts(self, job: Job, tokenizer, texts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, the source cut to fit data.max_length; generation starts after them."""
        d = job.recipe.data
        end = tokenizer(PROMPT_END, add_special_tokens=False)["input_ids"]
        sources = tokenizer([d.source_prefix + t for t in texts], truncation=True,
                            max_length=max(job.max_length - len(end), 1))["input_ids"]
        return [source + end for source in sources]

    def targets(self, job: Job, tokenizer, targets: list[str]) -> list[list[int]]:
        """Token ids of each target and the eos that ends it, at most data.max_target_length."""
        ids = tokenizer(targets, add_special_tokens=False, truncation=True,
                        max_length=max(job.max_target_length - 1, 1))["input_ids"]
        return [target + [tokenizer.eos_token_id] for target in ids]

    def preprocess(self, job: Job, tokenizer, dataset):
        def encode(batch):
            prompts = self.prompts(job, tokenizer, batch["text"])
            targets = self.targets(job, tokenizer, batch["target"])
            ids = [prompt + target for prompt, target in zip(prompts, targets)]
            masked = [[IGNORE_INDEX] * len(prompt) + target for prompt, target in zip(prompts, targets)]
            return {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids], "labels": masked,
                    "length": [len(x) for x in ids]}

        return _packed(job, tokenized.encode(job, tokenizer, dataset, encode))

    def collator(self, job: Job, tokenizer):
        return _collator(job, tokenizer)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        from hftoolkit.metrics import text_metrics

        return text_metrics(labels.metric_names(job))

    def stops(self, tokenizer) -> list[int]:
        """Token ids at which generation stops."""
        return [tokenizer.eos_token_id]

    def generate(self, job: Job, model, tokenizer, inputs: list[str]) -> list[dict]:
        room = _room(job, model)
        prompts = [prompt[-room:] for prompt in self.prompts(job, tokenizer, inputs)]
        texts = _continue(job, model, tokenizer, prompts, self.stops(tokenizer))
        return [{"text": text.strip()} for text in texts]


class ChatPromptAndTarget(PromptAndTarget):
    """Instruction tuning: the prompt is data.source_prefix + text as the user's turn of the tokenizer's chat
    template, followed by the template's opening of the assistant's turn (add_generation_prompt); the target
    is the answer and the template's end of that turn. As for PromptAndTarget the loss falls on the target
    only, and predictions generate from the same prompt, so a merged model answers
    `tokenizer.apply_chat_template(messages, add_generation_prompt=True)` as it was trained to.
    A tokenizer without a chat template (GPT-2's) gets PromptAndTarget's plain prompt and eos instead.

    The template is rendered once with a marker as the message, and split around it: the user's text is
    tokenized on its own, so data.max_length cuts the text and never the template around it.

    A conversation set (a "messages" column, sources/conversations.py) is rendered whole with the template and
    trained on every assistant turn; eval and predict answer its last user turn.
    """

    def preprocess(self, job: Job, tokenizer, dataset):
        if "messages" not in dataset.column_names:
            return super().preprocess(job, tokenizer, dataset)

        def encode(batch):
            done = [conversations.encode(tokenizer, turns, job.max_length) for turns in batch["messages"]]
            return {"input_ids": [e.input_ids for e in done], "labels": [e.labels for e in done],
                    "attention_mask": [[1] * len(e.input_ids) for e in done],
                    "length": [len(e.input_ids) for e in done]}

        return _packed(job, tokenized.encode(job, tokenizer, dataset, encode))

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        """A text is the user's turn (as PromptAndTarget's prompt); a conversation (a list of turns) is answered
        at its last user turn."""
        if not any(isinstance(x, list) for x in inputs):
            return super().generate(job, model, tokenizer, inputs)
        room = _room(job, model)
        prompts = [(conversations.prompt(tokenizer, x) if isinstance(x, list) else self.prompts(job, tokenizer, [x])[0])
                   [-room:] for x in inputs]
        texts = _continue(job, model, tokenizer, prompts, self.stops(tokenizer))
        return [{"text": text.strip()} for text in texts]

    def prompts(self, job: Job, tokenizer, texts: list[str]) -> list[list[int]]:
        if not getattr(tokenizer, "chat_template", None):
            return super().prompts(job, tokenizer, texts)
        head, tail = _chat_parts(tokenizer, [{"role": "user", "content": MARKER}], add_generation_prompt=True)
        head, tail = _ids(tokenizer, head), _ids(tokenizer, tail)
        room = max(job.max_length - len(head) - len(tail), 1)
        contents = tokenizer([job.recipe.data.source_prefix + t for t in texts], add_special_tokens=False,
                             truncation=True, max_length=room)["input_ids"]
        return [head + content + tail for content in contents]

    def targets(self, job: Job, tokenizer, targets: list[str]) -> list[list[int]]:
        if not getattr(tokenizer, "chat_template", None):
            return super().targets(job, tokenizer, targets)
        close = _turn_end(tokenizer)
        ids = tokenizer(targets, add_special_tokens=False, truncation=True,
                        max_length=max(job.max_target_length - len(close), 1))["input_ids"]
        return [target + close for target in ids]

    def stops(self, tokenizer) -> list[int]:
        """eos, and the token that ends the assistant's turn where the template has its own (Llama 3's
        <|eot_id|>)."""
        if not getattr(tokenizer, "chat_template", None):
            return super().stops(tokenizer)
        return list(dict.fromkeys([tokenizer.eos_token_id, _turn_end(tokenizer)[0]]))


# Stands in for a message while a chat template is rendered, to find where the message goes.
MARKER = "\u2063hftoolkit-message\u2063"


def _chat_parts(tokenizer, messages: list[dict], **options) -> tuple[str, str]:
    """The chat template rendered around MARKER: (text before it, text after it)."""
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **options)
    if rendered.count(MARKER) != 1:
        raise UserError(f"model.checkpoint: the tokenizer's chat template rewrites the message text, so the prompt "
                        f"can't be split from the answer ({rendered[:80]!r}): use task summarization, which "
                        "prompts with data.source_prefix + text and a line break")
    head, tail = rendered.split(MARKER)
    return head, tail


def _turn_end(tokenizer) -> list[int]:
    """Token ids the chat template ends an assistant's turn with, up to eos where it has one (a line break after
    eos is left out: generation stops at eos, so it would never be written)."""
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": MARKER}]
    close = _ids(tokenizer, _chat_parts(tokenizer, messages)[1])
    if tokenizer.eos_token_id in close:
        close = close[:close.index(tokenizer.eos_token_id) + 1]
    return close or [tokenizer.eos_token_id]


def _ids(tokenizer, text: str) -> list[int]:
    """Token ids of template text as written (its special tokens are in the text already)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _room(job: Job, model) -> int:
    """Prompt tokens that fit in the model's context beside the new ones (prompts keep their last tokens)."""
    context = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 1024)
    return max(1, min(job.max_length, context - job.max_new_tokens))


def _continue(job: Job, model, tokenizer, prompts: list[list[int]], stops: list[int] | None = None) -> list[str]:
    """The text each prompt (token ids) continues with, decoded as job.recipe.eval.generation says, up to eos (or
    any of the `stops` ids); the prompt is not repeated. Batches are left-padded so every prompt ends at the
    last position, where generation starts."""
    import torch

    model.eval()
    kwargs = dict(decoding_options(job), pad_token_id=tokenizer.pad_token_id,
                  eos_token_id=stops or tokenizer.eos_token_id)
    out = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(job.recipe.training.seed)  # sampled predictions are reproducible, as seq2seq's are
        for start in range(0, len(prompts), job.recipe.eval.batch_size):
            chunk = prompts[start:start + job.recipe.eval.batch_size]
            batch = tokenizer.pad({"input_ids": chunk}, padding=True, padding_side="left", return_tensors="pt")
            generated = model.generate(**batch.to(model.device), **kwargs)
            out += tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


PROMPT_AND_TARGET, CHAT_PROMPT_AND_TARGET = PromptAndTarget(), ChatPromptAndTarget()
FORMULATIONS = {tasks.CLM: CausalLM(), tasks.TRANSLATION: PROMPT_AND_TARGET, tasks.SUMMARIZATION: PROMPT_AND_TARGET,
                tasks.INSTRUCTION: CHAT_PROMPT_AND_TARGET, tasks.CLASSIFICATION: labels.CLASSIFICATION,
                tasks.REGRESSION: labels.REGRESSION, tasks.TAGGING: labels.TAGGING,
                tasks.PREFERENCE: PreferencePairs(CHAT_PROMPT_AND_TARGET),
                tasks.GRPO: SampledAnswers(CHAT_PROMPT_AND_TARGET, PROMPT_END),
                tasks.REWARD: RewardModel(CHAT_PROMPT_AND_TARGET)}
