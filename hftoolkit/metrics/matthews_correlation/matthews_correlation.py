"""Matthews correlation coefficient (scikit-learn), shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from sklearn.metrics import matthews_corrcoef


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Matthews correlation coefficient, computed by sklearn.metrics.matthews_corrcoef.",
            citation="Pedregosa et al., Scikit-learn: Machine Learning in Python, JMLR 12, 2011.",
            inputs_description="predictions and references: lists of integer class ids.",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
