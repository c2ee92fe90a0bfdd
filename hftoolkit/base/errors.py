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
    # True when this process failed only because another process of its run did (a lost peer): under a launch,
    # said only if no process has a reason of its own.
    consequence = False

    def format_message(self) -> str:
        """The message as it is printed and recorded: a secret it quotes (a URL's password) masked."""
        from hftoolkit.base.secrets import redact

        return redact(super().format_message())

    def show(self, file=None) -> None:
        """Said once per run: every process of a launch raises the same error for the same input, so the
        relaunching process prints the one reason (lifecycle.first_reason); under a launcher started by hand, the
        main process says it."""
        from hftoolkit.base.lifecycle import record_reason
        from hftoolkit.base.ranks import is_main_process, under_launcher

        if record_reason(self.format_message(), self.consequence):
            return
        if not under_launcher() or is_main_process():
            super().show(file)
