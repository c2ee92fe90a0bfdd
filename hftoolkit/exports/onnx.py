"""An encoder run as ONNX, for ONNX Runtime: the task head's graph (model.onnx), the tokenizer (tokenizer.json),
and the predictor that runs the two without torch or transformers, with the records the run's `predict` gives.

The graph comes from torch.onnx.export's dynamo exporter (torch.export, translated by onnxscript), the exporter
torch has defaulted to since 2.9; the TorchScript one it replaced is deprecated. The graph takes the tokenizer's
tensors (input_ids, attention_mask, and token_type_ids where the model reads them) with the batch and the
sequence length free, and gives the head's float32 logits.

transformers' tokenizers set their truncation and padding on every call; tokenizer.json is written with the run's
(truncation at max_length, longest first; padding to the batch's longest, with the run's pad token and side), so
the `tokenizers` library alone encodes a text, a sentence pair or a list of words to the same ids.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from pathlib import Path

from hftoolkit.base import console, extras
from hftoolkit.base.errors import UserError
from hftoolkit.base.run_layout import EXPORT
from hftoolkit.config import tasks
from hftoolkit.exports.format import Check, Exporting, Written

TASKS = (tasks.CLASSIFICATION, tasks.REGRESSION, tasks.TAGGING)
ONNX_TOLERANCE = 1e-4  # probabilities (regression: the value), ONNX Runtime against torch, both float32
MODEL = "model.onnx"
TOKENIZER = "tokenizer.json"
# The ai.onnx opset the graph is written in: ONNX Runtime runs it from 1.14, and onnx>=1.16 (the extra) reads it.
OPSET = 18
# The tensors a tokenizer gives, by the name the model's forward takes, with the tokenizers Encoding field.
TOKENIZER_TENSORS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
# Protobuf's limit on one file: a graph whose weights pass it keeps them in model.onnx.data beside it.
PROTOBUF_LIMIT = 2 * 1024**3


def refusal(task: str) -> str | None:
    """None where a run of `task` exports to ONNX; else the one line that says so and names the tasks that do."""
    if task in TASKS:
        return None
    return (f"--format onnx: a {task} run has no ONNX export, which is for encoder heads ({', '.join(TASKS)} "
            "runs): export a decoder run with --format gguf or ollama")


def write_onnx(model, tokenizer, folder: Path, task: str, max_length: int, pairs: bool) -> dict:
    """Write `model` (an eval()'d transformers encoder with its task head, any adapter merged) to folder/model.onnx
    and its tokenizer beside it; return what a predictor needs (export.json holds it): the task, the labels in
    id order (None for regression), the graph's input names, max_length and whether inputs are sentence pairs.

    The graph is float32 on the CPU: a model held in another dtype or on another device is exported from a copy.
    """
    extras.requires("onnx", "export --format onnx")
    if line := refusal(task):
        raise UserError(line)
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    if not (folder / TOKENIZER).is_file():
        raise UserError(f"--format onnx: the run's tokenizer ({type(tokenizer).__name__}) has no fast version, so no "
                        f"{TOKENIZER} for ONNX Runtime's side: train the run with a checkpoint that has one")
    _write_encoding(tokenizer, folder / TOKENIZER, max_length)
    example = _example(tokenizer, task, pairs, max_length)
    names = [n for n in TOKENIZER_TENSORS if n in example and n in _forward_arguments(model)]
    parameters = list(model.parameters())
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in parameters):
        model = copy.deepcopy(model).float().cpu()
    large = sum(p.numel() * 4 for p in parameters) > PROTOBUF_LIMIT * 0.9
    head = _logits_module()(model, names).eval()
    # (named axes, not torch.export.Dim: a Dim's range is checked against the model's guards, and BERT's
    # position table bounds the sequence; the graph need not know that bound, the tokenizer keeps to it)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    with torch.no_grad(), warnings.catch_warnings():
        # (said for each input beyond the first that shares the batch and sequence axes: it names them once)
        warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
        program = torch.onnx.export(head, (), kwargs={n: example[n] for n in names}, output_names=["logits"],
                                    dynamic_shapes=dynamic, opset_version=OPSET, dynamo=True, verbose=False,
                                    external_data=large)
    program.save(str(folder / MODEL), external_data=large)
    config = model.config
    labels = None if task == tasks.REGRESSION else [config.id2label[i] for i in sorted(config.id2label)]
    return {"task": task, "labels": labels, "inputs": graph_inputs(folder / MODEL), "max_length": max_length,
            "pairs": bool(pairs)}


def graph_inputs(path: Path) -> list[str]:
    """The input names of the graph at `path`, in its order (its weights are not read)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {w.name for w in graph.initializer}
    return [i.name for i in graph.input if i.name not in weights]


class OnnxPredictor:
    """An exported folder's model under ONNX Runtime: logits, and the records the run's own `predict` gives (a
    label and its probability, a value, or a tag per word), for the inputs workflows/predict.py parses: texts,
    (text, pair) tuples, or word lists for tagging. Needs onnxruntime, numpy and tokenizers only."""

    def __init__(self, folder: Path, facts: dict | None = None, threads: int | None = None,
                 providers: list[str] | None = None):
        """facts: what write_onnx returned (default: the folder's export.json). threads: ONNX Runtime's intra-op
        threads (default: its own choice, one per core). providers: its execution providers (default: the CPU)."""
        self.folder = Path(folder)
        if not (self.folder / MODEL).is_file() or not (self.folder / TOKENIZER).is_file():
            raise UserError(f"{folder}: not an ONNX export (no {MODEL} and {TOKENIZER}): pass a folder written by "
                            "hftoolkit export --format onnx")
        if importlib.util.find_spec("onnxruntime") is None:  # (the runtime alone: onnx is for writing the graph)
            raise UserError(extras.missing_line("onnx", "predict on an ONNX export", ["ONNX Runtime"]))
        import onnxruntime
        from tokenizers import Tokenizer

        self.facts = facts if facts is not None else _read_facts(self.folder)
        self.task, self.labels = self.facts["task"], self.facts["labels"]
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3  # errors only: its warnings about unused initializers are no user's concern
        self.session = onnxruntime.InferenceSession(str(self.folder / MODEL), options,
                                                    providers=providers or ["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        unknown = [n for n in self.inputs if n not in TOKENIZER_TENSORS]
        if unknown:
            raise UserError(f"{self.folder / MODEL}: the graph takes {', '.join(unknown)}, which no tokenizer gives: "
                            "export the run again with hftoolkit export --format onnx")
        self.tokenizer = Tokenizer.from_file(str(self.folder / TOKENIZER))
        if self.tokenizer.padding is None:
            raise UserError(f"{self.folder / TOKENIZER}: no padding set, so batches can't be formed: export the run "
                            "again with hftoolkit export --format onnx")
        truncation = self.tokenizer.truncation or {"strategy": "longest_first", "direction": "right"}
        self.tokenizer.enable_truncation(self.facts["max_length"], strategy=truncation["strategy"],
                                         direction=truncation["direction"])

    def logits(self, inputs: list):
        """The head's float32 logits for `inputs` run as one batch: (inputs, labels), or (inputs, tokens, labels)
        for tagging."""
        return self._run(self._encode(inputs))

    def predict(self, inputs: list, batch_size: int = 32) -> list[dict]:
        """One record per input, in batches of `batch_size`, as the run's torch path writes them."""
        from hftoolkit.models.families import label_records
        from hftoolkit.models.families.labels import value_records

        records = []
        for start in range(0, len(inputs), batch_size):
            chunk = inputs[start:start + batch_size]
            encodings = self._encode(chunk)
            logits = self._run(encodings)
            if self.task == tasks.REGRESSION:
                records += value_records(logits)
            elif self.task == tasks.TAGGING:
                records += self._tags(self._words(chunk), encodings, logits.argmax(-1))
            else:
                records += label_records(_softmax(logits), dict(enumerate(self.labels)))
        return records

    def _words(self, inputs: list) -> list[list[str]]:
        return [x.split() if isinstance(x, str) else list(x) for x in inputs]

    def _encode(self, inputs: list):
        """Encodings as the torch path's tokenizer call makes them: a tagging input's words as given (an empty
        list as one empty word); a tuple as a sentence pair, truncated longest first; else a text."""
        if self.task == tasks.TAGGING:
            return self.tokenizer.encode_batch([words or [""] for words in self._words(inputs)], is_pretokenized=True)
        if not isinstance(inputs[0], str):
            return self.tokenizer.encode_batch([(first, second) for first, second in inputs])
        return self.tokenizer.encode_batch(list(inputs))

    def _run(self, encodings):
        import numpy as np

        feeds = {name: np.array([getattr(e, TOKENIZER_TENSORS[name]) for e in encodings], dtype=np.int64)
                 for name in self.inputs}
        if not len(encodings[0]):  # no tokens in any row (a tokenizer without specials, empty inputs)
            if self.task == tasks.TAGGING:  # no word has a token to be tagged at, as in torch's (B, 0) batch
                return np.zeros((len(encodings), 0, len(self.labels)), dtype=np.float32)
            raise UserError("predict: the inputs of a batch have no tokens at all (empty texts, and a tokenizer that "
                            "adds no special tokens): give each input some text")
        return self.session.run(["logits"], feeds)[0]

    def _tags(self, sentences: list[list[str]], encodings, best) -> list[dict]:
        """One tag per word, read at its first subword; None for a word that truncation cut."""
        out = []
        for row, (words, encoding) in enumerate(zip(sentences, encodings)):
            tags = [None] * len(words)
            for position, word in enumerate(encoding.word_ids):
                if word is not None and word < len(words) and tags[word] is None:
                    tags[word] = self.labels[int(best[row][position])]
            out.append({"tags": tags})
        return out


def _read_facts(folder: Path) -> dict:
    path = folder / EXPORT
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{folder}: no {EXPORT} beside {MODEL}: pass a folder written by hftoolkit export "
                        "--format onnx") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not JSON ({err.msg}, line {err.lineno}): export the run again") from None


def _softmax(logits):
    """Class probabilities in float32, as torch's softmax of the float logits gives them."""
    import numpy as np

    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def _write_encoding(tokenizer, path: Path, max_length: int) -> None:
    """Write the run's truncation and padding into tokenizer.json, as transformers sets them for each call."""
    from tokenizers import Tokenizer

    if tokenizer.pad_token_id is None:
        raise UserError(f"--format onnx: the run's tokenizer has no pad token, so {TOKENIZER} can't batch inputs: "
                        "set one in the run's tokenizer (its eos token, as train does) and export again")
    backend = Tokenizer.from_file(str(path))
    backend.enable_truncation(max_length, strategy="longest_first", direction=tokenizer.truncation_side)
    backend.enable_padding(direction=tokenizer.padding_side, pad_id=tokenizer.pad_token_id,
                           pad_type_id=tokenizer.pad_token_type_id, pad_token=tokenizer.pad_token)
    backend.save(str(path))


def _example(tokenizer, task: str, pairs: bool, max_length: int) -> dict:
    """Tensors to trace the graph with: two rows of different lengths (batch and sequence above 1, which
    torch.export would otherwise take as fixed, and a padded row, so the mask is traced as it is used)."""
    texts = ["an example sentence that is long enough to have some padding beside it", "a short one"]
    if task == tasks.TAGGING:
        return dict(tokenizer([t.split() for t in texts], is_split_into_words=True, truncation=True,
                              max_length=max_length, padding=True, return_tensors="pt"))
    second = ["and its second sentence", "another"] if pairs else None
    return dict(tokenizer(texts, second, truncation=True, max_length=max_length, padding=True, return_tensors="pt"))


def _forward_arguments(model) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def _logits_module():
    import torch

    class Logits(torch.nn.Module):
        """The model's logits alone, from the tokenizer's tensors given by name."""

        def __init__(self, model, names: list[str]):
            super().__init__()
            self.model, self.names = model, names

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            given = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return self.model(**{n: given[n] for n in self.names}).logits

    return Logits


# ---------------------------------------------------------------- --format onnx


class OnnxFormat:
    """`export --format onnx`: an encoder run's head as model.onnx and its tokenizer, run in ONNX Runtime beside
    the run's model: labels (tags) identical, and probabilities (values) within ONNX_TOLERANCE."""

    name = "onnx"
    title = "ONNX"
    help = ("model.onnx and the tokenizer for ONNX Runtime (encoder classification, regression and tagging "
            "runs)")
    runs = "encoder runs"
    holds = f"exports encoder runs of the tasks {', '.join(TASKS)}"
    extra = "onnx"
    quantizations: tuple[str, ...] = ()
    default_quantization = None

    def takes(self, family: str | None, task: str) -> bool:
        return family == "encoder" and task in TASKS

    def write(self, export: Exporting) -> Written:
        job = export.job
        console.phase(f"writing {MODEL}")
        facts = write_onnx(export.model, export.processor, export.folder, job.task, job.max_length,
                           bool(job.recipe.data.text_pair_column))
        return Written(sorted(p.name for p in export.folder.iterdir()), {"onnx": facts})

    def check(self, export: Exporting, written: Written) -> Check:
        import numpy as np

        from hftoolkit.models.families.labels import head_logits

        job, model, tokenizer, inputs = export.job, export.model, export.processor, export.inputs
        console.phase(f"checking {MODEL}: run in ONNX Runtime beside the run's model")
        runtime = OnnxPredictor(export.folder, written.recorded["onnx"])
        ours = export.form.generate(job, model, tokenizer, inputs)
        theirs = runtime.predict(inputs)
        if job.task == tasks.TAGGING:
            equal = sum(a == b for a, b in zip(ours, theirs))
            difference = None
            passed = equal == len(inputs)
            what = f"tags identical {equal}/{len(inputs)}"
        else:
            torch_logits = np.concatenate([t.numpy() for t in head_logits(job, model, tokenizer, inputs)])
            onnx_logits = runtime.logits(inputs)
            if job.task == tasks.REGRESSION:
                difference = float(np.abs(onnx_logits - torch_logits).max())
                what, equal = f"largest value difference from the run {difference:.3g}", None
            else:
                difference = float(np.abs(_softmax(onnx_logits) - _softmax(torch_logits)).max())
                equal = sum(a["label"] == b["label"] for a, b in zip(ours, theirs))
                what = f"labels identical {equal}/{len(inputs)}; largest probability difference {difference:.3g}"
            passed = difference <= ONNX_TOLERANCE and (equal is None or equal == len(inputs))
        line = f"checked {MODEL} with ONNX Runtime on {len(inputs)} eval inputs: {what}"
        return Check(line, passed, {"inputs": len(inputs), "max_difference": difference, "identical": equal})


FORMAT = OnnxFormat()
