"""transformers' LOAD REPORT said in lines of our own: which weights the checkpoint lacked or left unused, and
whether that is expected (a new task head) or a problem (part of the base model). The console's captures hear
the report once `explain_in_captures` has run: the console sits below this layer and imports nothing of it."""

from __future__ import annotations

import contextlib

from hftoolkit.base.console import explains_loading, note, warn, watch_loading_with


def explain_in_captures() -> None:
    """Have every capture that explains loading (console.capture's explain_loading) hook the load report."""
    watch_loading_with(watch_load_reports)


def watch_load_reports(undo: contextlib.ExitStack) -> None:
    """Hear from_pretrained's load report as data: `PreTrainedModel._finalize_model_loading` calls
    `log_state_dict_report(model=..., loading_info=LoadStateDictInfo, ...)` through modeling_utils' module
    namespace (utils/loading_report.py formats the table and logs it as one warning). The wrapper says
    our line, then lets the original log its table (into the log file). Imports transformers' modeling code
    (and torch): a run imports it anyway to load its model."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("transformers") is None:
        return
    from transformers import modeling_utils

    original = modeling_utils.log_state_dict_report
    if getattr(original, "hftoolkit_hook", False):
        return  # an outer capture listens already
    signature = inspect.signature(original)

    def log_state_dict_report(*args, **kwargs):
        if explains_loading():
            given = signature.bind(*args, **kwargs).arguments
            for say, line in explain_load_report(given["model"], given["loading_info"]):
                say(line)
        return original(*args, **kwargs)

    log_state_dict_report.hftoolkit_hook = True
    modeling_utils.log_state_dict_report = log_state_dict_report
    undo.callback(setattr, modeling_utils, "log_state_dict_report", original)


def explain_load_report(model, info) -> list[tuple]:
    """(note or warn, line) per kind of problem in a `LoadStateDictInfo`.

    A missing key outside the base model (`model.base_model_prefix`) belongs to a task head that the
    checkpoint never had: initialised from scratch, which is what fine-tuning for a new task means.
    A missing key inside the base model means the checkpoint lacks part of the network it should hold.
    """
    prefix = getattr(model, "base_model_prefix", "") + "."
    head = sorted(k for k in info.missing_keys if not k.startswith(prefix))
    body = sorted(k[len(prefix):] for k in info.missing_keys if k.startswith(prefix))
    lines = []
    if head:
        lines.append((note, f"{_modules(head, 1)} head initialised from scratch ({_tensors(head)}): "
                            "expected when fine-tuning for a new task"))
    if body:
        lines.append((warn, f"{_tensors(body)} of the base model not in the checkpoint, initialised from scratch "
                            f"({_modules(body, 2)}): check that model.checkpoint matches the architecture"))
    if info.unexpected_keys:
        keys = sorted(info.unexpected_keys)
        lines.append((note, f"checkpoint weights unused by this task, left out ({_tensors(keys)}: "
                            f"{_modules(keys, 2)}): expected when the checkpoint was saved with another head"))
    if info.mismatched_keys:
        keys = sorted(k[0] for k in info.mismatched_keys)
        lines.append((warn, f"checkpoint weights of another shape, initialised from scratch ({_tensors(keys)}: "
                            f"{_modules(keys, 2)})"))
    return lines


def _modules(keys: list[str], depth: int) -> str:
    names = list(dict.fromkeys(".".join(k.split(".")[:-1][:depth]) or k for k in keys))
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _tensors(keys: list[str]) -> str:
    return f"{len(keys)} tensor{'s' if len(keys) != 1 else ''}"
