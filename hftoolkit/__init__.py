"""hftoolkit: fine-tune and evaluate pretrained transformers from one YAML recipe.

Importing this package imports no torch: the CLI's light commands rely on it.
"""

__version__ = "0.1.0"
