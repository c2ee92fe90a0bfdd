"""The shipped tasks' data: jsonl files beside this file, read with datasets (no hub, no network).

lm-evaluation-harness calls `custom_dataset` with the task's metadata and dataset_kwargs; `data_file` names
the file, relative to this folder, so the tasks work from any working directory.
"""

from pathlib import Path


def load(data_file: str, **_metadata):
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(Path(__file__).with_name(data_file))})
