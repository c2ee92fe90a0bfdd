"""`--help` as people know it from other tools: capital metavars, `-h`, one name for output folders."""

from __future__ import annotations

import re

import pytest
import typer

from hftoolkit.cli.app import app
from hftoolkit.cli.helpformat import HIDDEN_ALIASES
from tests.helpers import run_cli

COMMANDS = [info.name or info.callback.__name__ for info in app.registered_commands]
METAVAR = re.compile(r"[A-Z][A-Z0-9_]*([=|/,.:-]*[A-Z0-9_]+)*(\|-)?(\.\.\.)?")  # RUN_DIR, KEY=VALUE, TEXT|FILE|-


def click_command(name: str):
    return typer.main.get_command(app).commands[name]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_uses_capital_metavars_and_no_python_types(name):
    text = run_cli(name, "--help").stdout
    usage = text.splitlines()[0]
    assert usage.startswith(f"Usage: root {name} [OPTIONS]"), usage
    assert "<" not in text and "{" not in text, text  # Typer's <list[str]>, <int range>, {recipe}
    for piece in usage.split()[4:]:
        assert METAVAR.fullmatch(piece.strip("[]")), f"usage of {name}: {piece}"
    for param in click_command(name).params:
        if param.param_type_name == "argument":
            assert param.metavar and METAVAR.fullmatch(param.metavar), f"{name} {param.name}: {param.metavar}"
            assert param.metavar in usage
        elif not param.is_flag:
            assert param.metavar and METAVAR.fullmatch(param.metavar), f"{name} {param.opts}: {param.metavar}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_output_is_named_output_and_out_still_works_unseen(name):
    params = click_command(name).params
    for param in params:
        if param.name == "output":
            assert {"--output", "-o"} <= set(param.opts)
        elif param.param_type_name == "option":
            assert not set(param.opts) & HIDDEN_ALIASES, f"{name}: {param.opts}"
    assert not re.search(r"--out\b", run_cli(name, "--help").stdout)


def test_the_old_out_option_still_parses(tmp_path):
    # --out reaches the command: the error is about the run folder, not an unknown option
    result = run_cli("merge", tmp_path / "missing", "--out", tmp_path / "merged", expect=2)
    assert "No such option" not in result.output and "no such run folder" in result.output


def test_commands_show_help_with_h_too():
    assert run_cli("-h").stdout == run_cli("--help").stdout
    assert run_cli("train", "-h").stdout.startswith("Usage: root train [OPTIONS] RECIPE")


def test_shell_completion_installs_with_one_command():
    text = run_cli("--help").stdout
    assert "--install-completion" in text and "--show-completion" in text


@pytest.mark.parametrize("name", COMMANDS)
def test_no_two_options_of_a_command_share_a_flag(name):
    flags = [flag for param in click_command(name).params for flag in param.opts + param.secondary_opts]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)


def test_export_s_short_q_is_its_quantization():
    context = click_command("export").make_context("export", ["RUN", "-f", "gguf", "-o", "OUT", "-q", "q8_0"])
    assert context.params["quantization"] == "q8_0" and context.params["quiet"] is False
