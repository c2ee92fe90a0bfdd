"""The plan, a stage of its own: the memory and time a run will take, per process, before any weight is loaded.

`model.py` is the arithmetic (a model's shape, built on the meta device, and the recipe, into bytes and seconds on
a device from job/devices.py), `items.py` the bytes of its single items, and `plan.py` what `hftoolkit plan`
prints for every strategy at once and what `train` asks before it loads anything (`planned_job`), records as the
run starts (`StrategyPlan.record`) and measures beside it once trained (`StrategyPlan.measured`).
"""
