"""seqeval: entity-level precision, recall and F1 (conlleval-compatible) plus token accuracy,
shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from seqeval.metrics import accuracy_score, classification_report


class Seqeval(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Entity-level precision, recall and F1 (an entity counts only when its type and span "
                        "both match), micro-averaged over entity types, per-type F1, and token accuracy, "
                        "computed by seqeval.",
            citation="Nakayama, seqeval: A Python framework for sequence labeling evaluation, 2018; "
                     "Tjong Kim Sang and De Meulder, CoNLL-2003 shared task, 2003.",
            inputs_description="predictions and references: one list of tag names (BIO, e.g. B-PER, I-PER, O) "
                               "per sentence.",
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Sequence(datasets.Value("string"))}),
        )

    def _compute(self, predictions, references, mode=None, scheme=None):
        # zero_division=0: a model that predicts no entity (all "O") scores 0, without a warning per call.
        report = classification_report(references, predictions, output_dict=True, mode=mode, scheme=scheme,
                                       zero_division=0)
        overall = report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0})
        scores = {"precision": float(overall["precision"]), "recall": float(overall["recall"]),
                  "f1": float(overall["f1-score"]), "accuracy": float(accuracy_score(references, predictions))}
        for kind, row in report.items():
            if not kind.endswith(" avg"):
                scores[f"f1_{kind}"] = float(row["f1-score"])
        return scores
