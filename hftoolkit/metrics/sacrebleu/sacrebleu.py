"""BLEU as sacrebleu computes it (corpus level, 13a tokenization),
shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
import sacrebleu


class Sacrebleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus BLEU (0-100) from sacrebleu: n-gram precisions up to 4 with a brevity penalty.",
            citation="Post, A Call for Clarity in Reporting BLEU Scores, WMT 2018.",
            inputs_description="predictions: list of strings; references: list of strings, or list of lists of "
                               "strings (several references per prediction, the same count for every prediction).",
            features=[
                datasets.Features({"predictions": datasets.Value("string"),
                                   "references": datasets.Sequence(datasets.Value("string"))}),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
        )

    def _compute(self, predictions, references, tokenize="13a", lowercase=False):
        per_prediction = [r if isinstance(r, list) else [r] for r in references]
        counts = {len(r) for r in per_prediction}
        if len(counts) > 1:
            raise ValueError("sacrebleu needs the same number of references for every prediction")
        # sacrebleu wants one stream per reference position: transpose.
        streams = [list(refs) for refs in zip(*per_prediction)]
        score = sacrebleu.corpus_bleu(predictions, streams, tokenize=tokenize, lowercase=lowercase)
        return {"bleu": float(score.score), "precisions": [float(p) for p in score.precisions],
                "brevity_penalty": float(score.bp), "sys_len": int(score.sys_len), "ref_len": int(score.ref_len)}
