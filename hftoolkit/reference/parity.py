"""The parity suite: every reference mechanism against the library implementation people run.

Each comparison is a function returning `(reference_tensor, library_tensor)`,
registered with `@comparison(component, against, kind)` in one of the
`parity_*.py` modules; `all_comparisons()` collects them, the `hftoolkit parity`
command prints them as a table, and tests/unit/reference parametrizes over the same
list. A comparison builds a tiny random library module (nothing is downloaded),
copies its weights into the reference module through the weight map, runs both
on the same random fp32 inputs and compares the whole output tensors. Nothing is
compared with a stored number. A row registered slow=True loads a real installed
checkpoint instead; one that cannot run here raises Skip, and the table says why.

All tolerances live in TOLERANCES, keyed by the kind of thing compared.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

Pair = tuple[torch.Tensor, torch.Tensor]

# kind -> (absolute tolerance on the largest elementwise difference, why this value)
TOLERANCES: dict[str, tuple[float, str]] = {
    "layer": (1e-5, "one fp32 layer"),
    "model": (1e-4, "a whole fp32 model: rounding differences add up over the layers"),
    "optimizer": (1e-5, "parameters after 20 fp32 steps"),
    "loss": (1e-5, "a scalar fp32 loss"),
    "preference loss": (
        1e-6,
        "preference losses and rewards against TRL's trainers, on float64 log-probs (TRL's ORPO casts them to "
        "float32; the real-batch row's are a fp32 model's, scaled down by beta): what is left is rounding, and a "
        "departure from the papers' formulas is orders of magnitude larger",
    ),
    "sequence log-prob": (
        1e-5,
        "a completion's summed fp32 log-probs: TRL's fused LM head keeps its running log-sum-exp in float32 "
        "(even for a float64 model), so each token's log-prob carries fp32 rounding and the sum adds them up",
    ),
    "rl loss": (
        1e-6,
        "reward-model losses, advantages and GRPO/RLOO losses (and their gradients) against TRL's trainers on float64 "
        "inputs: what is left is rounding, and a wrong normalisation or clip is orders of magnitude larger",
    ),
    "rl loss, real model": (
        1e-6,
        "GRPO's loss on a real model, loaded in float64: TRL's fused LM head and a full log-softmax still round each "
        "token's log-prob differently, and the ratio exp(logp - old) carries that rounding into the loss",
    ),
    "exact": (0.0, "integers (token ids, bucket ids, parameter counts) must be identical"),
    "rate": (
        0.02,
        "looser: sampled frequencies, >= 15,000 draws per estimate, so 0.02 is about 4-6 standard "
        "errors of a difference of proportions",
    ),
}

PARITY_MODULES = (
    "hftoolkit.reference.parity_layers",
    "hftoolkit.reference.parity_models",
    "hftoolkit.reference.parity_training",
    "hftoolkit.reference.parity_preference",
    "hftoolkit.reference.parity_rl",
)


@dataclass(frozen=True)
class Comparison:
    component: str  # "attention.sdpa[causal]": group, then the variant
    against: str  # the library implementation it must equal
    kind: str  # key into TOLERANCES
    run: Callable[[], Pair]
    slow: bool = False  # loads a real checkpoint: the fast test loop leaves it out (pytest -m 'not slow')

    @property
    def group(self) -> str:
        return self.component.split(".")[0].split("[")[0]

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.kind][0]


COMPARISONS: list[Comparison] = []


class Skip(Exception):
    """Raised by a row that cannot run on this machine (an optional package is absent): skipped, with the reason."""


def comparison(
    component: str, against: str, kind: str, slow: bool = False
) -> Callable[[Callable[[], Pair]], Callable[[], Pair]]:
    """Register a function returning (reference, library) as one row of the parity table."""
    if kind not in TOLERANCES:
        raise ValueError(f"Comparison {component!r}: unknown kind {kind!r}; use one of {sorted(TOLERANCES)}.")

    def register(run: Callable[[], Pair]) -> Callable[[], Pair]:
        if any(c.component == component for c in COMPARISONS):
            raise ValueError(f"Comparison {component!r} is registered twice; give each row its own name.")
        COMPARISONS.append(Comparison(component, against, kind, run, slow))
        return run

    return register


def all_comparisons() -> list[Comparison]:
    """Every registered row, in registration order (importing the parity modules registers them)."""
    for name in PARITY_MODULES:
        importlib.import_module(name)
    return list(COMPARISONS)


def max_abs_difference(reference: torch.Tensor, library: torch.Tensor) -> float:
    """Largest |reference - library|; equal infinities count as equal, a shape mismatch as infinite."""
    reference, library = reference.detach().double(), library.detach().double()
    if reference.shape != library.shape:
        return math.inf
    if reference.numel() == 0:
        return 0.0
    diff = torch.where(reference == library, torch.zeros_like(reference), (reference - library).abs())
    return float(diff.max())  # NaN propagates, and NaN <= tol is False


@dataclass
class Result:
    comparison: Comparison
    max_diff: float
    seconds: float
    error: str | None = None
    skipped: str | None = None  # why the row could not run here; neither a pass nor a failure

    @property
    def passed(self) -> bool:
        return self.error is None and self.skipped is None and self.max_diff <= self.comparison.tolerance

    @property
    def failed(self) -> bool:
        return self.skipped is None and not self.passed


def run_comparison(c: Comparison) -> Result:
    """Run one row from a fixed seed; an exception becomes a failed row, not a crash."""
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        reference, library = c.run()
        diff = max_abs_difference(reference, library)
        error = None
        if reference.shape != library.shape:
            error = f"shape {tuple(reference.shape)} vs {tuple(library.shape)}"
    except Skip as reason:
        return Result(c, math.nan, time.perf_counter() - start, skipped=str(reason))
    except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
        diff, error = math.nan, f"{type(exc).__name__}: {exc}"
    return Result(c, diff, time.perf_counter() - start, error)


def select(comparisons: list[Comparison], only: str | None) -> list[Comparison]:
    """The rows named by `only`: an exact component name, or a group such as "attention"."""
    if only is None:
        return comparisons
    return [c for c in comparisons if only in (c.component, c.group)]


def _format_diff(result: Result) -> str:
    if result.skipped is not None:
        return "-"
    if result.error is not None:
        return result.error if len(result.error) < 60 else result.error[:57] + "..."
    return "0" if result.max_diff == 0 else f"{result.max_diff:.2e}"


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence the libraries' deprecation chatter while the table is built; restore it afterwards."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def main(only: str | None = None, worked_examples: bool = False) -> int:
    """Run the parity suite (or the rows `only` names) and print it.

    Returns 0 if every row passes, 1 if any fails, 2 if `only` names no row.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=max(console.width, 150))
    comparisons = all_comparisons()
    chosen = select(comparisons, only)
    if not chosen:
        names = sorted({c.group for c in comparisons}) + [c.component for c in comparisons]
        console.print(f"Unknown component {only!r}; valid names are: {', '.join(names)}.", soft_wrap=True, markup=False)
        return 2

    table = Table(title="Reference layers vs library implementations (fp32, tiny random configs)")
    table.add_column("component", no_wrap=True)
    table.add_column("compared against")
    table.add_column("max abs diff", justify="right", no_wrap=True)
    table.add_column("tolerance", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    with quiet_libraries():
        results = [run_comparison(c) for c in chosen]
    for r in results:
        verdict = ("[green]pass[/green]" if r.passed else "[yellow]skipped[/yellow]" if r.skipped is not None
                   else "[bold red]FAIL[/bold red]")
        row = (r.comparison.component, r.comparison.against, _format_diff(r), f"{r.comparison.tolerance:g}")
        table.add_row(*(escape(cell) for cell in row), verdict)  # "[causal]" is text, not rich markup
    console.print(table)
    failed = [r for r in results if r.failed]
    skipped = [r for r in results if r.skipped is not None]
    ran = len(results) - len(skipped)
    console.print(f"{ran - len(failed)} of {ran} comparisons pass" + (f", {len(skipped)} skipped:" if skipped else "."))
    for r in skipped:
        console.print(f"  {r.comparison.component}: {r.skipped}", soft_wrap=True, markup=False)
    for kind, (tol, why) in TOLERANCES.items():
        if kind in {r.comparison.kind for r in results}:
            console.print(f"  tolerance {kind} = {tol:g}: {why}", soft_wrap=True, markup=False)

    if worked_examples:
        from hftoolkit.reference.worked_examples import print_worked_examples

        with quiet_libraries():
            print_worked_examples(console)
    return 1 if failed else 0
