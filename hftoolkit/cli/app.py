"""The command line: the Typer app, its commands registered in the order `--help` lists them, and `main`.
The commands live in modules by what they do; heavy imports (torch, transformers) live inside their bodies,
so `--help`, `validate`, `recipes` and `doctor` stay fast."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Annotated

import typer

from hftoolkit.base.ranks import under_launcher
from hftoolkit.cli.evaluation import eval_, predict
from hftoolkit.cli.helpformat import Command
from hftoolkit.cli.plan import plan
from hftoolkit.cli.recipes import list_recipes, validate
from hftoolkit.cli.rundirs import compare, export, list_run_dirs, merge, push
from hftoolkit.cli.serving import serve
from hftoolkit.cli.tools import doctor, init_model, parity
from hftoolkit.cli.training import bench, sweep, train
from hftoolkit.runs.rundir import LIBRARIES, installed_version

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Fine-tune and evaluate pretrained transformers from one YAML recipe.")

# Printed by --version beside hftoolkit's own (read from the installed metadata: no import of them): the engines
# among the libraries a run's manifest records, its data libraries left out.
VERSION_PACKAGES = tuple(name for name in LIBRARIES if name not in ("datasets", "evaluate"))


def _print_version(value: bool) -> None:
    if not value:
        return
    from hftoolkit import __version__

    shown = ", ".join(f"{p} {installed_version(p) or 'not installed'}" for p in VERSION_PACKAGES)
    typer.echo(f"hftoolkit {__version__} ({shown})")
    raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="Print the versions of hftoolkit and its engines.")] = False):
    """Fine-tune and evaluate pretrained transformers from one YAML recipe."""


# The commands, in the order `--help` lists them.
app.command("train")(train)
app.command("eval")(eval_)
app.command("predict")(predict)
app.command("validate")(validate)
app.command("recipes")(list_recipes)
app.command("init-model")(init_model)
app.command("doctor")(doctor)
app.command("runs")(list_run_dirs)
app.command("compare")(compare)
app.command("merge")(merge)
app.command("export")(export)
app.command("push")(push)
app.command("serve")(serve)
app.command("sweep")(sweep)
app.command("bench")(bench)
app.command("parity")(parity)
app.command("plan")(plan)

# Every command's help reads as conventional tools' do (set here, once every command is registered).
for _info in app.registered_commands:
    _info.cls = Command


def main() -> None:
    """The console script. A stop signal (Ctrl-C, SIGTERM, a closed terminal) ends a command in one line with exit
    status 128 + the signal; a process started by a launcher ends with it (base/lifecycle.die_with_parent). Once every
    exit handler has run, the process ends without the interpreter's teardown: freeing the modules torch,
    transformers and datasets import is slow and comes after the results are written (docs/performance.md has
    the time); the handlers that flush logs and remove temporary files still run."""
    from hftoolkit.base.lifecycle import Stopped, die_with_parent, record_reason, stop_on_signals
    from hftoolkit.base.ranks import is_main_process

    status = [0]
    atexit.register(_end_now, status)  # registered first, so it runs after every library's handler
    stop_on_signals()
    if under_launcher():
        die_with_parent()
    try:
        app()
    except SystemExit as done:
        status[0] = done.code if isinstance(done.code, int) else int(done.code is not None)
        raise
    except Stopped as stop:  # asked for: no traceback
        status[0] = stop.exit_code
        if not stop.said and is_main_process():
            print(f"stopped by {stop.name}", file=sys.stderr)
    except BaseException as crash:  # a crash: Python prints the traceback, the exit status says it failed
        status[0] = 1
        record_reason(f"{type(crash).__name__}: {crash}")  # (under a relaunch: the line the launch ends with)
        raise


def _end_now(status: list[int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status[0])
