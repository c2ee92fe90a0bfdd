"""Online RL on prompts (task grpo) on a decoder: the model samples answers to each prompt, rl.rewards score them
and TRL's GRPO (or RLOO) trainer moves the model towards the better ones (training/grpo.py).

Nothing is tokenized ahead: TRL tokenizes the prompts as it samples. A prompt reaches TRL as the instruction
formulation would write it (`decoder.ChatPromptAndTarget`), so answers are sampled, scored in eval and served
from the same prompt: a conversation as it is, a text as the user's turn where the tokenizer has a chat template,
else as data.source_prefix + text and a line break. The data's other columns ride along to the reward functions.
"""

from __future__ import annotations

from hftoolkit.job.spec import Job
from hftoolkit.metrics import EvalMetrics


class SampledAnswers:
    def __init__(self, answers, prompt_end: str):
        self.answers = answers  # the instruction formulation: the model, prompts as it writes them, generation
        self.prompt_end = prompt_end  # what follows a plain prompt (decoder.PROMPT_END)

    def load_model(self, job: Job):
        return self.answers.load_model(job)

    def preprocess(self, job: Job, tokenizer, dataset):
        return dataset.map(lambda row: {"prompt": self.prompt(job, tokenizer, row["text"])}, remove_columns=["text"])

    def prompt(self, job: Job, tokenizer, text):
        """The prompt as TRL takes it (and the rewards see it): a conversation as it is, answered at its end; a
        text as the user's turn where the tokenizer has a chat template, else with a line break after it."""
        if isinstance(text, list):
            return text
        text = job.recipe.data.source_prefix + text
        chat = getattr(tokenizer, "chat_template", None)
        return [{"role": "user", "content": text}] if chat else text + self.prompt_end

    def collator(self, job: Job, tokenizer):
        return lambda features: features  # (TRL's own: the rows as they are, sampled from in its training step)

    def metrics(self, job: Job, tokenizer) -> EvalMetrics:
        # The rewards' scores of eval answers; workflows/rewards.py fills in compute, from the loaded rewards.
        return EvalMetrics(None, "reward", greater_is_better=True)

    def generate(self, job: Job, model, tokenizer, inputs: list) -> list[dict]:
        return self.answers.generate(job, model, tokenizer, inputs)
