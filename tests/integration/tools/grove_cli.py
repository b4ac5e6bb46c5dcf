"""Run the ``grove`` command line in this process, as ``grove`` itself does (``grove.cli.main``)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass

from grove.cli import main


@dataclass(frozen=True)
class Outcome:
    """A command's exit status and what it printed."""

    code: int
    stdout: str
    stderr: str


def run_grove(*args: str) -> Outcome:
    """``grove ARGS…`` in this process: exit status, stdout and stderr (usage errors drawn
    200 columns wide, so that messages are not wrapped)."""
    out, err = io.StringIO(), io.StringIO()
    argv, columns = sys.argv, os.environ.get("COLUMNS")
    sys.argv = ["grove", *args]
    os.environ["COLUMNS"] = "200"
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = argv
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return Outcome(code, out.getvalue(), err.getvalue())
