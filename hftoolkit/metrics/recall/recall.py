"""Recall (macro average by default) (scikit-learn), shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from sklearn.metrics import recall_score


class Recall(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Recall (macro average by default), computed by sklearn.metrics.recall_score.",
            citation="Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, 2011.",
            inputs_description="predictions and references: lists of integer class ids.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, average="macro"):
        return {"recall": float(recall_score(references, predictions, average=average, zero_division=0))}
