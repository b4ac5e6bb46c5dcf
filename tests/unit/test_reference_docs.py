"""The docs name only what exists: every file, Python name, command and flag in ``docs/*.md`` and
``README.md``.

What is checked, in the docs' inline code (and, for commands, their code blocks too):

- a path whose first part is a top-level folder of the repository and that ends in a file
  extension or ``/`` (``ledger/store.py``, ``bench/support/``, ``docs/sql.md``), and a relative
  Markdown link (``[forest.md](forest.md)``), exists;
- a name followed in the same line by `` `name` `` right after a Python file
  (`` `grove/train/rollouts.py` `StepPlayer` ``) is defined in that file (``def``, ``class`` or an
  assignment, at any depth);
- a dotted name under ``grove`` (``grove.ledger.catch_up.rebuild``), and a ``module:function``
  under ``grove`` or ``examples``, imports and resolves, attribute by attribute (a name ending in
  a version, ``grove.media.v1``, is a wire-format name, not a Python one);
- a ``grove`` command line (``grove db check --json``) names commands that exist, and every
  ``--flag`` on it is an option of that command (``|`` separates alternative commands, as the
  README's command list writes them).

Placeholders (``NAME``, ``KEY``, ``…``, ``*``, ``{…}``) are never checked as names.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import typer.main

from grove.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
TOP_LEVEL = frozenset(
    p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"
) - {"README.md"}
WIRE_NAME = re.compile(r"\.v\d+$")
"""Grove's versioned wire and digest-domain names (``grove.media.v1``, ``grove.chain.v1``) are
not Python names."""

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"``?([^`\n]+?)``?")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
PATH = re.compile(
    r"^\.?[\w-]+(?:/[\w.-]+)*(?:/|\.(?:py|md|yaml|yml|toml|ini|sh|json|jsonl|txt|cfg|html|sql))$"
)
DOTTED = re.compile(r"^grove(?:\.\w+)+$")
COLON = re.compile(r"^((?:grove|examples)(?:\.\w+)*):(\w+)$")
FILE_THEN_NAME = re.compile(r"`([\w/.-]+\.py)`\s+`(\w+(?:\.\w+)?)`")
PLACEHOLDER = re.compile(r"[A-Z]{3,}|…|\*|\{|<")


@dataclass(frozen=True)
class Problem:
    """One thing a doc names that does not exist: where, what, and why."""

    doc: str
    line: int
    named: str
    why: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: `{self.named}` {self.why}"


def _lines(text: str, *, code: bool) -> list[tuple[int, str]]:
    """``(line number, line)`` of the prose (``code`` False) or of the code blocks (True)."""
    inside = set()
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start())
        inside.update(range(first, first + block.group(0).count("\n") + 1))
    return [
        (number + 1, line)
        for number, line in enumerate(text.splitlines())
        if (number in inside) == code
    ]


def _spans(line: str) -> list[str]:
    return [span.strip() for span in SPAN.findall(line)]


# -- files -----------------------------------------------------------------------------------------


def file_problems(doc: str, text: str, base: Path = ROOT) -> list[Problem]:
    """Paths under a top-level folder, and relative links, that name nothing."""
    problems = []
    for number, line in _lines(text, code=False):
        for span in _spans(line):
            if not PATH.match(span) or "/" not in span or PLACEHOLDER.search(span):
                continue
            if span.split("/")[0] in TOP_LEVEL and not (base / span).exists():
                problems.append(Problem(doc, number, span, "is no file or folder"))
        for target in LINK.findall(line):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (base / "docs" / target).exists() and not (base / target).exists():
                problems.append(Problem(doc, number, target, "is a link to no file"))
    return problems


@functools.cache
def _defined_names(path: Path) -> frozenset[str]:
    text = path.read_text()
    names = re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.MULTILINE)
    names += re.findall(r"^\s*(\w+)\s*(?::[^=\n]+)?=", text, re.MULTILINE)
    return frozenset(names)


def file_name_problems(doc: str, text: str, base: Path = ROOT) -> list[Problem]:
    """`` `file.py` `name` `` pairs whose name the file does not define."""
    problems = []
    for number, line in _lines(text, code=False):
        for file, name in FILE_THEN_NAME.findall(line):
            path = base / file
            if not path.is_file():
                continue  # file_problems reports it
            missing = [part for part in name.split(".") if part not in _defined_names(path)]
            if missing:
                problems.append(Problem(doc, number, f"{file} {name}", "is not defined there"))
    return problems


# -- Python names ----------------------------------------------------------------------------------


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def symbol_problems(doc: str, text: str) -> list[Problem]:
    """``grove.…`` dotted names and ``module:function`` names that do not resolve."""
    problems = []
    for number, line in _lines(text, code=False):
        for span in _spans(line):
            name = span.removesuffix("()")
            if DOTTED.match(name) and not WIRE_NAME.search(name) and not _resolves(name):
                problems.append(Problem(doc, number, name, "does not import"))
            colon = COLON.match(name)
            if colon and not _resolves(f"{colon.group(1)}.{colon.group(2)}"):
                problems.append(Problem(doc, number, name, "does not import"))
    return problems


# -- commands --------------------------------------------------------------------------------------

COMMAND_LINE = re.compile(r"(?:^|[\s`(])grove ((?:[a-z][\w-]*|--[a-z][\w-]*)[^`#\n]*)")
WORD = re.compile(r"[a-z][\w-]*")


@functools.cache
def _cli() -> click.Command:
    return typer.main.get_command(app)


def _options(command: click.Command) -> set[str]:
    return {"--help"} | {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def command_problems_in(line: str) -> list[tuple[str, str]]:
    """``(named, why)`` for each command or flag of the ``grove`` command lines in ``line``.

    Lowercase words name commands while the command so far is a group; after a leaf command
    they are its arguments. ``a | b``: ``b`` is an alternative to ``a``, under the same group.
    """
    problems = []
    for match in COMMAND_LINE.finditer(line):
        parent = command = _cli()
        path = ["grove"]
        alternative = False
        for word in match.group(1).replace("[", " ").replace("]", " ").split():
            if word == "|":
                alternative = True
                continue
            if word.startswith("--") and WORD.fullmatch(word[2:].split("=")[0].rstrip(",;.)")):
                flag = word.split("=")[0].rstrip(",;.)")
                if flag not in _options(command):
                    problems.append((f"{' '.join(path)} {flag}", "is no option of the command"))
            elif WORD.fullmatch(word):
                if alternative and command is not parent:  # `a | b`: b is a's sibling
                    command, path = parent, path[:-1]
                if hasattr(command, "commands"):
                    sub = command.commands.get(word)
                    path.append(word)
                    if sub is None:
                        problems.append((" ".join(path), "is no command"))
                        break
                    parent, command = command, sub
            alternative = False
    return problems


def command_problems(doc: str, text: str) -> list[Problem]:
    """``grove`` commands and flags, in prose spans and in code blocks, that do not exist."""
    problems = []
    for number, line in _lines(text, code=True):
        for named, why in command_problems_in(line.split("#")[0]):
            problems.append(Problem(doc, number, named, why))
    for number, line in _lines(text, code=False):
        for span in _spans(line):
            if span.startswith("grove "):
                for named, why in command_problems_in(span):
                    problems.append(Problem(doc, number, named, why))
    return problems


# -- the docs --------------------------------------------------------------------------------------

CHECKS = {
    "files": file_problems,
    "names after files": file_name_problems,
    "Python names": symbol_problems,
    "commands and flags": command_problems,
}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_doc_names_only_what_exists(doc: Path, check: str) -> None:
    problems = CHECKS[check](doc.relative_to(ROOT).as_posix(), doc.read_text())

    assert not problems, "\n".join(str(p) for p in problems)


# -- the checker finds drift -----------------------------------------------------------------------


def test_a_missing_file_and_a_dead_link_are_found() -> None:
    text = "See `ledger/nope.py`, `bench/support/` and [gone](gone.md), [sql](sql.md)."

    found = [p.named for p in file_problems("x.md", text)]

    assert found == ["ledger/nope.py", "gone.md"]


def test_a_name_the_file_does_not_define_is_found() -> None:
    text = "| `grove/train/rollouts.py` `StepPlayer` | `grove/train/harness.py` `play_rollout` |"

    found = [p.named for p in file_name_problems("x.md", text)]

    assert found == ["grove/train/harness.py play_rollout"]


def test_a_dotted_or_colon_name_that_does_not_import_is_found() -> None:
    text = (
        "`grove.ledger.catch_up.rebuild`, `grove.ledger.projections.rebuild`, "
        "`grove.demo.tool_agent:nothing`, `grove.media.v1`, `module:function`"
    )

    found = [p.named for p in symbol_problems("x.md", text)]

    assert found == ["grove.ledger.projections.rebuild", "grove.demo.tool_agent:nothing"]


def test_an_unknown_command_or_flag_is_found() -> None:
    assert command_problems_in("grove db check --json") == []
    assert command_problems_in("grove serve [CONFIG.yaml | --config CONFIG.yaml] [overrides]") == []
    assert command_problems_in("grove → capture, training → ledger --> storage") == []
    assert command_problems_in("grove db upgrade | downgrade REV | status [--json]") == []
    assert command_problems_in("grove report RUN --html FILE --database-url URL") == [
        ("grove report --database-url", "is no option of the command")
    ]
    assert command_problems_in("grove export CHECKPOINT --workdir DIR") == [
        ("grove export --workdir", "is no option of the command")
    ]
    assert command_problems_in("grove db vacuum") == [("grove db vacuum", "is no command")]
    assert command_problems_in("grove frobnicate --json") == [("grove frobnicate", "is no command")]
