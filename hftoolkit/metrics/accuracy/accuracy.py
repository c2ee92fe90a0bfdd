"""Accuracy: the fraction of predictions equal to the reference (scikit-learn),
shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from sklearn.metrics import accuracy_score


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Accuracy: the fraction of predictions equal to the reference, "
                        "computed by sklearn.metrics.accuracy_score.",
            citation="Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, 2011.",
            inputs_description="predictions and references: lists of integer class ids.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        return {"accuracy": float(accuracy_score(references, predictions))}
