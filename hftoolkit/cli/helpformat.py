"""Help as people know it from other tools, for every command of the CLI (cli/app.py sets `Command` on each).

Typer writes usage lines as `hftoolkit train [OPTIONS] {recipe}` and lists arguments with their Python types
(`<path>`); `Command` writes `RECIPE`, `[DIR]`, `RUN_DIR...` instead, and leaves the old option names in
HIDDEN_ALIASES out of the Options list while they still parse.
"""

from __future__ import annotations

import typer.core

# Old names of options, accepted and not shown: --out, before every command named its output --output.
HIDDEN_ALIASES = {"--out"}


class Command(typer.core.TyperCommand):
    """A command whose usage line and Arguments list name its arguments by their metavars, whose Arguments list
    shows no Python types, and whose Options list leaves HIDDEN_ALIASES out."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                pieces.append(_shown_name(param) if param.required else f"[{_shown_name(param)}]")
        return pieces

    def format_options(self, ctx, formatter) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument) and not param.hidden:
                arguments.append((_shown_name(param), param.get_help_record(ctx)[1]))
            elif isinstance(param, typer.core.TyperOption):
                shown, param.opts = param.opts, [o for o in param.opts if o not in HIDDEN_ALIASES]
                try:
                    record = param.get_help_record(ctx)
                finally:
                    param.opts = shown
                if record:
                    options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _shown_name(argument) -> str:
    """An argument as help shows it: its metavar (RUN_DIR), `...` when it takes several."""
    return (argument.metavar or argument.name.upper()) + ("..." if argument.nargs != 1 else "")
