"""The one exception type for bad input: the CLI prints its message and exits non-zero.

It is a click exception, so Typer (and its test runner) show "Error: <message>" on
stderr with exit code 2 and no traceback, wherever in the run it was raised.
"""

try:  # Typer 0.2x carries its own copy of click and catches only that copy's exceptions
    from typer._click.exceptions import ClickException
except ImportError:  # older Typer runs on click itself
    from click import ClickException


class UserError(ClickException):
    """A problem with the user's input: the message names the input, what is wrong and what to do."""

    exit_code = 2
