"""Pearson correlation between predicted and reference scores (scipy.stats.pearsonr), the regression metric of
GLUE STS-B, shipped with hftoolkit so evaluate.load works offline."""

import datasets
import evaluate
from scipy.stats import pearsonr


class Pearsonr(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Pearson correlation coefficient: how linearly the predictions follow the references, "
                        "from -1 to 1, computed by scipy.stats.pearsonr.",
            citation="Virtanen et al., SciPy 1.0: Fundamental Algorithms for Scientific Computing in Python, "
                     "Nature Methods 17, 2020.",
            inputs_description="predictions and references: lists of floats.",
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return {"pearsonr": float(pearsonr(references, predictions)[0])}
