"""ROUGE-1, ROUGE-2 and ROUGE-L F-measures from Google's rouge-score package,
shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class Rouge(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="ROUGE F-measures (0-1) averaged over predictions: unigram and bigram overlap and the "
                        "longest common subsequence, with the Porter stemmer.",
            citation="Lin, ROUGE: A Package for Automatic Evaluation of Summaries, ACL workshop 2004.",
            inputs_description="predictions and references: lists of strings, one reference per prediction.",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references, use_stemmer=True):
        scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
        totals = dict.fromkeys(ROUGE_TYPES, 0.0)
        for prediction, reference in zip(predictions, references):
            for name, score in scorer.score(reference, prediction).items():
                totals[name] += score.fmeasure
        return {name: total / max(len(predictions), 1) for name, total in totals.items()}
