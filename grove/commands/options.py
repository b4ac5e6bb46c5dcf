"""What every ``grove`` command shares: the consoles, the workspace options, the configuration
file of the long-running commands and its overrides, the selection-policy check, the signal
handler and the ledger a tool reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from grove.workspace import Workspace

if TYPE_CHECKING:
    from grove.config import GroveConfig
    from grove.ledger.store import EventStore

__all__ = [
    "BlobOption",
    "ConfigArgument",
    "ConfigOption",
    "DatabaseOption",
    "HtmlOption",
    "JsonOption",
    "ResumeOption",
    "StepsOption",
    "WorkdirOption",
    "configured",
    "console",
    "errors",
    "exit_on_signal",
    "ledger_store",
    "overrides",
    "resolvable_policy",
    "workspace",
]

console = Console()
errors = Console(stderr=True)

WorkdirOption = Annotated[
    Path | None,
    typer.Option("--workdir", help="Directory for the embedded defaults (default .grove/)."),
]
DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="GROVE_DATABASE_URL",
        help="Ledger: sqlite:///PATH or postgresql+psycopg://… (default WORKDIR/ledger.db).",
    ),
]
BlobOption = Annotated[
    str | None,
    typer.Option(
        "--blob-url",
        envvar="GROVE_BLOB_URL",
        help="Blob store (a directory or s3://bucket/prefix); default WORKDIR/blobs.",
    ),
]


ConfigArgument = Annotated[
    Path | None,
    typer.Argument(
        help="CONFIG.yaml: the configuration grove train reads (docs/train.md); keys it leaves "
        "out, and every key without it, take the schema's defaults.",
        show_default=False,
        dir_okay=False,
        metavar="CONFIG.yaml",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="The same as the CONFIG argument.", dir_okay=False),
]


def overrides(key: str, text: str) -> str:
    """An override flag's help: what it sets, then the configuration key it overrides."""
    return f"{text} Overrides {key}."


def configured(argument: Path | None, option: Path | None, flags: Mapping[str, Any]) -> GroveConfig:
    """The configuration of CONFIG (the argument or ``--config``, not both) with ``flags``
    (dotted key to value; ``None``: the flag was not given) set over it: one schema, one set of
    defaults (``grove.config``). A ``ConfigurationError`` lists every problem."""
    from grove.config import load_config

    if argument is not None and option is not None and argument != option:
        raise typer.BadParameter(
            f"two configurations, {argument} and --config {option}: give one", param_hint="CONFIG"
        )
    given = {key: value for key, value in flags.items() if value is not None}
    return load_config(argument or option, given)


def existing_parent(html: Path) -> Path:
    """``--html``'s check: the page's directory must exist."""
    if not html.parent.is_dir():
        raise typer.BadParameter(f"directory {html.parent} does not exist", param_hint="--html")
    return html


HtmlOption = Annotated[
    Path,
    typer.Option(
        "--html", help="Write the page to this file.", dir_okay=False, callback=existing_parent
    ),
]


def resolvable_policy(spec: str | None) -> str | None:
    """A selection policy that resolves now (a custom ``module:function`` is imported here, on
    the operator's command line, before anything is served or replayed)."""
    from grove.training.errors import SelectionPolicyError
    from grove.training.selection import resolve_selection_policy

    if spec is not None:
        try:
            resolve_selection_policy(spec)
        except SelectionPolicyError as error:
            raise typer.BadParameter(str(error), param_hint="--selection-policy") from error
    return spec


def workspace(workdir: Path | None, database_url: str | None, blob_url: str | None) -> Workspace:
    """The workspace the three common options name."""
    return Workspace.resolve(workdir, database_url, blob_url)


StepsOption = Annotated[
    int | None,
    typer.Option("--steps", min=1, help="Train up to this many optimizer steps in all."),
]
ResumeOption = Annotated[
    bool, typer.Option("--resume", help="Continue the latest run (or --run) from its checkpoint.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print only one JSON line.")]


def exit_on_signal(signum: int, frame: object) -> None:
    """A signal as SystemExit, so that ``finally`` blocks run."""
    raise SystemExit(128 + signum)


@contextmanager
def ledger_store(ws: Workspace) -> Iterator[EventStore]:
    """The workspace's event store, once its schema is this Grove's (changed by nothing but
    ``grove db upgrade``), closed when the command is done."""
    from grove.ledger import migrate
    from grove.ledger.store import EventStore

    migrate.require_current(ws.existing_ledger())
    store = EventStore.open(ws.database_url, pool=False)
    try:
        yield store
    finally:
        store.close()
