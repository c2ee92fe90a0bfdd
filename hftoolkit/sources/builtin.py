"""Offline data sets the package makes itself, for smoke runs and tests (`builtin:<name>`).

All text sets are SYNTHETIC: generated from small templates with a fixed seed, so a
model can learn them in seconds and nothing is downloaded. `digits` is real:
scikit-learn's 8x8 handwritten digits (1,797 images), upscaled for the model.
Every set uses the canonical column names data.py produces: text, label, target, image, chosen, rejected;
`arithmetic` adds an `answer` column for task grpo's exact-answer reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable

SUBJECTS = ["the movie", "the film", "this story", "the acting", "the plot", "the music", "the ending",
            "the cast", "the script", "the director", "the soundtrack", "every scene"]
POSITIVE = ["wonderful", "brilliant", "moving", "delightful", "superb", "charming", "gripping", "beautiful"]
NEGATIVE = ["terrible", "boring", "dull", "awful", "clumsy", "tedious", "painful", "forgettable"]
FILLERS = ["honestly", "in the end", "for the most part", "from start to finish", "as expected",
           "to my surprise", "without a doubt", "all things considered"]
NAMES = ["alice", "bruno", "chen", "dana", "emeka", "farah", "goran", "hana", "ivan", "julia"]
PLACES = ["paris", "lagos", "lima", "oslo", "kyoto", "cairo", "dublin", "quito"]
VERBS = ["visited", "left", "loved", "described", "remembered", "painted"]
# A made-up target language: a fixed word-for-word dictionary, so translation is learnable.
LEXICON = {"the": "de", "a": "ein", "cat": "katze", "dog": "hund", "bird": "vogel", "man": "mann",
           "woman": "frau", "child": "kind", "sees": "sieht", "likes": "mag", "follows": "folgt",
           "big": "gross", "small": "klein", "red": "rot", "old": "alt", "house": "haus", "tree": "baum",
           "ball": "ball", "and": "und", "near": "nahe", "garden": "garten", "river": "fluss"}


def sentiment(n: int = 1200, seed: int = 0) -> list[dict]:
    """Synthetic movie-review sentences labelled positive/negative by their adjective (lengths vary 5-30 words)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        words = [rng.choice(SUBJECTS), "was", rng.choice(POSITIVE if label else NEGATIVE)]
        for _ in range(rng.choice([0, 0, 1, 2, 4, 6])):
            words.insert(rng.randrange(len(words) + 1), rng.choice(FILLERS))
        rows.append({"text": " ".join(words), "label": ["negative", "positive"][label]})
    return rows


def tagging(n: int = 800, seed: int = 0) -> list[dict]:
    """Synthetic sentences with person (PER) and place (LOC) entities, BIO-tagged word by word."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        person = rng.choice(NAMES).split() + ([rng.choice(NAMES)] if rng.random() < 0.3 else [])
        place = [rng.choice(PLACES)]
        tokens, tags = [], []
        for part, kind in ((person, "PER"), ([rng.choice(VERBS)], None), (place, "LOC")):
            for i, word in enumerate(part):
                tokens.append(word)
                tags.append("O" if kind is None else f"{'B' if i == 0 else 'I'}-{kind}")
        if rng.random() < 0.5:
            tokens += rng.choice(FILLERS).split()
            tags += ["O"] * (len(tokens) - len(tags))
        rows.append({"text": tokens, "label": tags})
    return rows


def _sentence(rng: random.Random) -> list[str]:
    noun = lambda: [rng.choice(["the", "a"]),
                    *([rng.choice(["big", "small", "red", "old"])] if rng.random() < .5 else []),
                    rng.choice(["cat", "dog", "bird", "man", "woman", "child"])]
    words = noun() + [rng.choice(["sees", "likes", "follows"])] + noun()
    if rng.random() < 0.4:
        words += ["near", "the", rng.choice(["house", "tree", "garden", "river"])]
    return words


def translation(n: int = 1000, seed: int = 0) -> list[dict]:
    """Synthetic English-like sentences and their word-for-word rendering in a made-up language."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = _sentence(rng)
        rows.append({"text": " ".join(words), "target": " ".join(LEXICON[w] for w in words)})
    return rows


def summarization(n: int = 600, seed: int = 0) -> list[dict]:
    """Synthetic 'documents' (a headline sentence padded with filler sentences) summarized by the headline."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        headline = " ".join(_sentence(rng))
        filler = [f"{rng.choice(SUBJECTS)} was {rng.choice(POSITIVE + NEGATIVE)} {rng.choice(FILLERS)}."
                  for _ in range(rng.randint(1, 3))]
        rows.append({"text": " ".join([headline + "."] + filler), "target": headline})
    return rows


def text(n: int = 1500, seed: int = 0) -> list[dict]:
    """Synthetic plain text (for mlm, clm and denoise): short paragraphs of simple sentences."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        sentences = [" ".join(_sentence(rng)) + "." for _ in range(rng.randint(1, 4))]
        rows.append({"text": " ".join(sentences)})
    return rows


def instructions(n: int = 1000, seed: int = 0) -> list[dict]:
    """Synthetic instruction/answer pairs (five kinds: toy translation, capitals, sums, reversal, sentiment)."""
    rng = random.Random(seed)

    def translate():
        words = _sentence(rng)
        return f"Translate into the toy language: {' '.join(words)}", " ".join(LEXICON[w] for w in words)

    def capitals():
        words = _sentence(rng)
        return f"Write in capital letters: {' '.join(words)}", " ".join(words).upper()

    def arithmetic():
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."

    def reverse():
        words = _sentence(rng)
        return f"Reverse the order of the words: {' '.join(words)}", " ".join(reversed(words))

    def review():
        row = sentiment(1, seed=rng.randrange(1 << 30))[0]
        return f"Is this review positive or negative? {row['text']}", f"The review is {row['label']}."

    kinds = [translate, capitals, arithmetic, reverse, review]
    rows = []
    for _ in range(n):
        prompt, answer = rng.choice(kinds)()
        rows.append({"text": prompt, "target": answer})
    return rows


def preferences(n: int = 1000, seed: int = 0) -> list[dict]:
    """Synthetic preference pairs over the instruction set: the chosen answer is the right one, the rejected one
    fails as a weak model does (it refuses, answers another question, or jumbles the right words)."""
    rng = random.Random(seed)
    rows = instructions(n, seed=rng.randrange(1 << 30))
    others = [row["target"] for row in instructions(n, seed=rng.randrange(1 << 30))]
    refusals = ["I can't help with that.", "I don't know.", "Ask someone else.", "No idea, sorry."]
    pairs = []
    for row, other in zip(rows, others):
        words = row["target"].split()
        rng.shuffle(words)
        wrong = [answer for answer in (rng.choice(refusals), other, " ".join(words)) if answer != row["target"]]
        pairs.append({"text": row["text"], "chosen": row["target"], "rejected": rng.choice(wrong)})
    return pairs


def arithmetic(n: int = 1000, seed: int = 0) -> list[dict]:
    """Questions of sums and differences of two numbers up to 20, each with its answer in the `answer` column: a
    verifiable task for grpo (the exact answer, and a format reward for answering with the number alone)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        plus = rng.random() < 0.5
        said = "plus" if plus else "minus"
        rows.append({"text": f"What is {a} {said} {b}? Answer with the number only.",
                     "answer": str(a + b if plus else a - b)})
    return rows


def digits(n: int | None = None, seed: int = 0, size: int = 32) -> list[dict]:
    """scikit-learn's real 8x8 handwritten digits, upscaled to size x size RGB images, labels '0'-'9'."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    rows = []
    for pixels, label in zip(data.images, data.target):
        grey = Image.fromarray((pixels * (255 / 16)).astype("uint8"), mode="L")
        rows.append({"image": grey.resize((size, size), Image.Resampling.NEAREST).convert("RGB"), "label": str(label)})
    rng = random.Random(seed)
    rng.shuffle(rows)
    return rows[:n] if n else rows


BUILTIN: dict[str, Callable[..., list[dict]]] = {
    "sentiment": sentiment, "tagging": tagging, "translation": translation,
    "summarization": summarization, "text": text, "instructions": instructions, "preferences": preferences,
    "arithmetic": arithmetic, "digits": digits,
}


def corpus() -> str:
    """The package's own text, on which init-model trains its tokenizers."""
    parts = [row["text"] for row in sentiment(400) + text(400) + summarization(200)]
    parts += [row["target"] for row in translation(400)] + [" ".join(row["text"]) for row in tagging(200)]
    return "\n".join(parts)
