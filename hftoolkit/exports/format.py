"""What an export format is to `hftoolkit export`: the protocol each format module's `FORMAT` follows, and what
the workflow hands it (the run's merged model, once loaded) and takes back (the files written, the check).

workflows/export.py does the parts every format shares: the format and quantization asked, the output folder, the
run (finished, not in use, one the format takes), the staging folder, export.json and the run's manifest. A format
only writes its files into the folder and reads them back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hftoolkit.job.spec import Job


@dataclass(frozen=True)
class Exporting:
    """One export as the workflow resolved it, handed to its format's `write` and `check`."""

    job: Job  # the run's job, its data read
    form: Any  # the run's formulation (models/families): its generate, its prompts
    model: Any  # the run's model, adapter merged in, float32, eval()
    processor: Any  # its tokenizer
    folder: Path  # the staging folder; moved to --output once the check passed
    inputs: list  # the first eval inputs of the run, as the formulation's generate takes them
    quantization: str | None  # one of the format's `quantizations`, or None where it has none
    write_text: Callable[[Path, str], Path]  # a text file written with its secrets masked (runs/rundir)


@dataclass(frozen=True)
class Written:
    """What a format's `write` put in the folder."""

    files: list[str]  # export.json's "files", in the order the format names them
    recorded: dict = field(default_factory=dict)  # export.json's keys beside the shared ones (onnx: its facts)


@dataclass(frozen=True)
class Check:
    """What a format's `check` measured: the written files run beside the run's own model."""

    line: str  # the check in one line, printed under the summary and recorded
    passed: bool  # False: beyond the format's tolerance, so the export fails and nothing is kept
    measured: dict  # export.json's "check" (after "line") and the manifest's


@runtime_checkable
class ExportFormat(Protocol):
    """One `--format` of `hftoolkit export`: a module in exports/ holds one as `FORMAT`, and one line of
    exports/__init__.py's `FORMATS` registers it."""

    name: str  # the --format value
    title: str  # the format's name in a sentence ("an ONNX export keeps ...")
    help: str  # what --format NAME writes, for the command's help
    runs: str  # the runs it is for, in a few words ("decoder runs"), as an unknown --format's refusal lists them
    holds: str  # which runs it takes, as its refusal of another run says it
    extra: str | None  # the optional feature (base/extras.py) whose libraries it needs; None: none
    quantizations: tuple[str, ...]  # the --quantization values it writes; (): it keeps the run's float32 weights
    default_quantization: str | None  # what it writes without --quantization

    def takes(self, family: str | None, task: str) -> bool:
        """Whether a run of `task` in `family` (None: not set in the recipe) can be written in this format."""
        ...

    def write(self, export: Exporting) -> Written:
        """Write the run's model into export.folder; refuse in one line (UserError) what only the loaded model
        shows it can't hold."""
        ...

    def check(self, export: Exporting, written: Written) -> Check:
        """Read the files back and run them on export.inputs beside export.model."""
        ...
