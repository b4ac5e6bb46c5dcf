"""Run a bench against an earlier revision of Grove: before and after on the same machine.

Usage: ``python -m bench.support.baseline REV [--without PACKAGE ...] -- COMMAND``, e.g.
``python -m bench.support.baseline 8e87f2b --without uvloop -- python -m bench.gateway --quick``

The command runs from the checkout (so the bench is today's), with Grove itself imported from
``REV``: the revision is checked out once into a worktree under ``.grove/baseline/REV`` (git's,
kept for the next run), a tree of links there lays it out as the installed packages
(``grove``, ``grove.ledger`` → ``ledger/``, ...), and a ``sitecustomize`` on ``PYTHONPATH``
makes ``import grove`` resolve to that tree in the command and in every process it starts (the
bench's server process too), ahead of the checkout and its editable install. The bench's own
code must still run on the revision's Grove. ``--without PACKAGE`` hides an installed package
the revision did not depend on (``uvloop``: uvicorn would pick it up by itself), so the
revision runs as it was installed. Alternate runs with and without it (``docs/benchmarks.md``
does) so that both see the same load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
LAYERS: Final = ("ledger", "storage", "capture", "training", "migrations")
SITECUSTOMIZE: Final = '''"""Import Grove from this tree (bench/support/baseline.py)."""
import sys
from importlib.machinery import PathFinder

_TREE = __file__.rsplit("/", 1)[0]
_HIDDEN = {hidden!r}
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]


class _Baseline:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname in ("grove", "grove_errors"):
            return PathFinder.find_spec(fullname, [_TREE])
        if fullname.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None


sys.meta_path.insert(0, _Baseline)
'''


def baseline_tree(revision: str, hidden: tuple[str, ...] = ()) -> Path:
    """The link tree of ``revision``'s packages (made on first use), where ``hidden`` packages
    cannot be imported; its directory."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    home = ROOT / ".grove" / "baseline" / commit[:12]
    source, tree = home / "source", home / ("packages" + "".join(f"-{h}" for h in sorted(hidden)))
    if not source.exists():
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(source), commit], cwd=ROOT, check=True
        )
    if not tree.exists():
        (tree / "grove").mkdir(parents=True)
        for entry in (source / "grove").iterdir():
            (tree / "grove" / entry.name).symlink_to(entry)
        for layer in LAYERS:
            (tree / "grove" / layer).symlink_to(source / layer)
        (tree / "grove_errors").symlink_to(source / "grove_errors")
        (tree / "sitecustomize.py").write_text(SITECUSTOMIZE.format(hidden=sorted(hidden)))
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s REV [--without PACKAGE ...] -- COMMAND",
    )
    parser.add_argument("revision", help="the git revision whose Grove the command imports")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="an installed package the command cannot import (the revision did not use it)",
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not command:
        parser.error("give the command to run after --")
    tree = baseline_tree(args.revision, tuple(args.without))
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    print(f"Grove from {args.revision} ({tree})", file=sys.stderr)
    sys.exit(subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path}).returncode)


if __name__ == "__main__":
    main()
