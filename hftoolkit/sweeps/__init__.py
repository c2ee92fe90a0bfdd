"""Many runs of one recipe, each trained by workflows/train: a grid (`sweep`), one task across families (`bench`),
and an Optuna study (`sweep --search`) whose workers run as `python -m hftoolkit.sweeps.worker`."""
