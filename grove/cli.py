"""The ``grove`` command line: every command that reads the ledger takes --workdir,
--database-url and --blob-url (``grove report`` takes --workdir alone, ``grove export`` none).

This module holds the app, the ledger database commands (``grove db``), the training commands
(train, demo, export) and the table of every command; the serving commands live in
``grove/commands/serving.py``, the debugging tools in ``grove/commands/tools.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from grove.commands import serving, tools
from grove.commands.options import (
    BlobOption,
    DatabaseOption,
    JsonOption,
    ResumeOption,
    StepsOption,
    WorkdirOption,
    console,
    errors,
    ledger_store,
    workspace,
)
from grove.errors import GroveError, exit_status
from grove.workspace import Workspace

__all__ = ["app", "main"]

app = typer.Typer(
    help="Grove: capture ledger and forest projector for RL of context-rewriting LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(
    help="The ledger database: migrations, status, checks and projection rebuilds.",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Create or upgrade the ledger schema."""
    from grove.ledger import migrate

    ws = workspace(workdir, database_url, blob_url)
    migrate.upgrade(ws.database_url, revision)
    console.print(f"ledger schema at revision {migrate.current_revision(ws.database_url)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision (base removes everything).")],
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Take the ledger schema down to REVISION."""
    from grove.ledger import migrate

    ws = workspace(workdir, database_url, blob_url)
    migrate.downgrade(ws.database_url, revision)
    console.print(f"ledger schema at revision {migrate.current_revision(ws.database_url)}")


@db_app.command("status")
def db_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Head revision, the database's revision, event count and projection positions."""
    from grove.ledger import migrate
    from grove.ledger.catch_up import projection_marks
    from grove.ledger.store import EventStore

    ws = workspace(workdir, database_url, blob_url)
    current = migrate.current_revision(ws.database_url)
    status: dict[str, object] = {
        "database": Workspace.redacted(ws.database_url),
        "head_revision": migrate.head_revision(),
        "current_revision": current,
    }
    if current is not None:
        store = EventStore.open(ws.database_url, pool=False)
        try:
            status["events"] = store.count()
            status["projections"] = {
                name: mark.model_dump() for name, mark in projection_marks(store).items()
            }
        finally:
            store.close()
    if as_json:
        print(json.dumps(status))
        return
    table = Table(show_header=False, box=None)
    for key, value in status.items():
        table.add_row(key, str(value))
    console.print(table)
    if current is None:
        console.print("[yellow]no ledger schema yet: run `grove db upgrade`[/]")


@db_app.command("rebuild-projections")
def db_rebuild_projections(
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Empty the projection tables and fold the whole ledger again (as the schema's owner:
    it deletes rows; docs/ledger.md)."""
    from grove.ledger.catch_up import rebuild

    with ledger_store(workspace(workdir, database_url, blob_url)) as store:
        marks = {name: mark.model_dump() for name, mark in rebuild(store).items()}
        events = store.count()
    if as_json:
        print(json.dumps({"events": events, "projections": marks}))
        return
    console.print(f"projections folded again from {events} events: {marks}", highlight=False)


@db_app.command("check")
def db_check(
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Compare the schema with this Grove's tables and the projection tables with the fold of
    the events; exit 1 on any difference (docs/ledger.md)."""
    from grove.ledger import migrate
    from grove.ledger.fold_drift import fold_drift

    ws = workspace(workdir, database_url, blob_url)
    with ledger_store(ws) as store:
        schema = migrate.check_drift(ws.database_url)
        drift = fold_drift(store)
    if as_json:
        print(
            json.dumps(
                {
                    "schema_drift": schema,
                    "fold_drift": [
                        {"capture_key": d.capture_key, "table": d.table, "detail": d.describe()}
                        for d in drift
                    ],
                }
            )
        )
    else:
        if schema is not None:
            errors.print(f"schema drift: {escape(schema)}", highlight=False, soft_wrap=True)
        for item in drift:
            errors.print(f"fold drift: {escape(item.describe())}", highlight=False, soft_wrap=True)
        if drift:
            errors.print(
                f"{len(drift)} projection rows differ from the fold of the events: "
                "run `grove db rebuild-projections` as the schema's owner",
                highlight=False,
                soft_wrap=True,
            )
        if schema is None and not drift:
            console.print("schema and projections match this Grove and the events")
    if schema is not None or drift:
        raise typer.Exit(1)


def _train(
    source: Path,
    steps: int | None,
    resume: bool,
    run: str | None,
    as_json: bool,
    ws: Workspace,
) -> None:
    from grove.config import load_config
    from grove.train.distributed import is_main_rank
    from grove.train.job import run_training

    config = load_config(source)
    summary = run_training(
        config,
        ws,
        source=str(source),
        steps=steps,
        resume=resume,
        run_id=run,
        console=None if as_json else console,
    )
    if is_main_rank():  # under torchrun, the other ranks return the same summary
        print(json.dumps(summary.as_dict()))


def train(
    config: Annotated[
        Path, typer.Argument(help="The run's configuration (YAML or JSON; docs/train.md).")
    ],
    steps: StepsOption = None,
    resume: ResumeOption = False,
    run: Annotated[
        str | None, typer.Option("--run", help="Name the new run, or the run to resume.")
    ] = None,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Train the configured model with GRPO on the rollouts its harness plays (docs/train.md)."""
    _train(config, steps, resume, run, as_json, workspace(workdir, database_url, blob_url))


def demo(
    steps: StepsOption = None,
    resume: ResumeOption = False,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """``grove train grove/demo/demo.yaml``: a tool-using compaction agent on the warm-started
    embedded model."""
    from grove.demo import DEMO_CONFIG

    _train(DEMO_CONFIG, steps, resume, None, as_json, workspace(workdir, database_url, blob_url))


def export(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint directory (step_…) written by a run.")
    ],
    hf: Annotated[
        Path, typer.Option("--hf", help="Write the Hugging Face model directory here (new).")
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The run's model.path: `embedded` or a model directory (default: read from "
            "config.json next to the checkpoint).",
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="The run's model.dtype, with --model (default float32)."),
    ] = None,
) -> None:
    """Export a checkpoint as a Hugging Face model directory (docs/export.md)."""
    from grove.engines.models import ModelLoadError
    from grove.tools.export import ExportError, export_checkpoint, export_from_run

    if model is None and dtype is not None:
        raise typer.BadParameter(
            "--dtype goes with --model; without --model the run's model.dtype is used",
            param_hint="--dtype",
        )
    try:
        if model is None:
            out = export_from_run(checkpoint, hf)
        else:
            out = export_checkpoint(checkpoint, hf, model_path=model, dtype=dtype or "float32")
    except (ExportError, ModelLoadError) as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"exported {checkpoint} to {out}", highlight=False, soft_wrap=True)


for command in (
    train,
    demo,
    serving.serve,
    serving.project,
    tools.walkthrough,
    tools.lineage,
    tools.replay,
    tools.show,
    tools.fork,
    tools.report,
    export,
    tools.gc,
):
    app.command(command.__name__)(command)


def main() -> None:
    """Entry point: run the app and report any Grove error as one clear line, without a trace,
    exiting with its status (``grove.errors.exit_status``: 75 when a service did not answer,
    else 1)."""
    try:
        app()
    except GroveError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise SystemExit(exit_status(error)) from None
