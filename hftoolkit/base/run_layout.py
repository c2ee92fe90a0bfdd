"""Every file name of a run directory, stated once (docs/architecture.md, "The run directory"). Nothing else
spells them: the writers (workflows/train.py, runs/rundir.py), the readers (runs/summary.py, listing, publish),
the commands that open a finished run (runs/rundir.open_run) and a checkpoint that names an earlier run
(sources/checkpoint.py, which is why the names sit in the base layer) name these."""

RECIPE = "recipe.yaml"  # the recipe as resolved: what `train --resume`, eval, predict, serve and push read
MANIFEST = "manifest.json"  # status, command, versions, hardware, what was resolved and planned
METRICS = "metrics.json"  # the eval scores and what training measured
HISTORY = "log_history.jsonl"  # the Trainer's log, one record a logging step
PREDICTIONS = "predictions.jsonl"  # the eval split's predictions
CARD = "README.md"  # the model card
LOG = "train.log"  # everything the toolkit and the libraries said
LOCK = "run.lock"  # held by the one writer
CHECKPOINTS = "checkpoints"  # the Trainer's checkpoint-N folders, which --resume continues from
ADAPTER = "adapter"  # a LoRA run's weights: its adapter, loaded onto the recipe's base
MODEL = "model"  # a full fine-tuning's weights: the whole model
CONFIG = "config.json"  # beside recipe.yaml in a folder `merge` wrote: the folder is the model itself
EXPORT = "export.json"  # in a folder `export` wrote: what, from which run, how, and the measured difference

# What a run writes besides its weights, checkpoints and log.
FILES = (RECIPE, MANIFEST, METRICS, HISTORY, PREDICTIONS, CARD)
# The files of a finished run: removed when a failed or killed run is resumed, so the folder never looks complete
# before the resumed run has really finished.
RESULTS = (METRICS, PREDICTIONS, CARD, ADAPTER, MODEL)
