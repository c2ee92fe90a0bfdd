"""chrF: character n-gram F-score as sacrebleu computes it, shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
import sacrebleu


class Chrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="chrF (0-100) from sacrebleu: F-beta over character n-grams (n <= 6, beta 2); "
                        "word_order=2 gives chrF++.",
            citation="Popovic, chrF: character n-gram F-score for automatic MT evaluation, WMT 2015.",
            inputs_description="predictions: list of strings; references: list of strings, or list of lists of "
                               "strings (the same count for every prediction).",
            features=[
                datasets.Features({"predictions": datasets.Value("string"),
                                   "references": datasets.Sequence(datasets.Value("string"))}),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
        )

    def _compute(self, predictions, references, word_order=0):
        per_prediction = [r if isinstance(r, list) else [r] for r in references]
        if len({len(r) for r in per_prediction}) > 1:
            raise ValueError("chrf needs the same number of references for every prediction")
        streams = [list(refs) for refs in zip(*per_prediction)]
        return {"chrf": float(sacrebleu.corpus_chrf(predictions, streams, word_order=word_order).score)}
