"""Precision (macro average by default) (scikit-learn), shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from sklearn.metrics import precision_score


class Precision(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Precision (macro average by default), computed by sklearn.metrics.precision_score.",
            citation="Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, 2011.",
            inputs_description="predictions and references: lists of integer class ids.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, average="macro"):
        return {"precision": float(precision_score(references, predictions, average=average, zero_division=0))}
