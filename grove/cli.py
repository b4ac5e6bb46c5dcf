"""The ``grove`` command line: every command takes --workdir, --database-url and --blob-url."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grove.errors import GroveError, exit_status
from grove.workspace import Workspace

if TYPE_CHECKING:
    from ledger.store import EventStore

__all__ = ["app", "main"]

app = typer.Typer(
    help="Grove: capture ledger and forest projector for RL of context-rewriting LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The ledger database: migrations and status.", no_args_is_help=True)
app.add_typer(db_app, name="db")

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


def _existing_parent(html: Path) -> Path:
    if not html.parent.is_dir():
        raise typer.BadParameter(f"directory {html.parent} does not exist", param_hint="--html")
    return html


HtmlOption = Annotated[
    Path,
    typer.Option(
        "--html", help="Write the page to this file.", dir_okay=False, callback=_existing_parent
    ),
]


def _resolvable_policy(spec: str | None) -> str | None:
    """A selection policy that resolves now (a custom ``module:function`` is imported here, on
    the operator's command line, before anything is served or replayed)."""
    from training.errors import SelectionPolicyError
    from training.selection import resolve_selection_policy

    if spec is not None:
        try:
            resolve_selection_policy(spec)
        except SelectionPolicyError as error:
            raise typer.BadParameter(str(error), param_hint="--selection-policy") from error
    return spec


def _workspace(workdir: Path | None, database_url: str | None, blob_url: str | None) -> Workspace:
    return Workspace.resolve(workdir, database_url, blob_url)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Create or upgrade the ledger schema."""
    from ledger import migrate

    ws = _workspace(workdir, database_url, blob_url)
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
    from ledger import migrate

    ws = _workspace(workdir, database_url, blob_url)
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
    from ledger import migrate
    from ledger.projections import projection_marks
    from ledger.store import EventStore

    ws = _workspace(workdir, database_url, blob_url)
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


StepsOption = Annotated[
    int | None,
    typer.Option("--steps", min=1, help="Train up to this many optimizer steps in all."),
]
ResumeOption = Annotated[
    bool, typer.Option("--resume", help="Continue the latest run (or --run) from its checkpoint.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print only one JSON line.")]


def _train(
    source: Path,
    steps: int | None,
    resume: bool,
    run: str | None,
    as_json: bool,
    ws: Workspace,
) -> None:
    from grove.config import load_config
    from grove.jobs.distributed import is_main_rank
    from grove.jobs.train import run_training

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


@app.command("train")
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
    _train(config, steps, resume, run, as_json, _workspace(workdir, database_url, blob_url))


@app.command("demo")
def demo(
    steps: StepsOption = None,
    resume: ResumeOption = False,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """``grove train examples/demo.yaml``: a tool-using compaction agent on the warm-started
    embedded model."""
    from examples import DEMO_CONFIG

    _train(DEMO_CONFIG, steps, resume, None, as_json, _workspace(workdir, database_url, blob_url))


def _exit_on_signal(signum: int, frame: object) -> None:
    """A signal as SystemExit, so that ``finally`` blocks run."""
    raise SystemExit(128 + signum)


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port.")] = 8000,
    auth_token: Annotated[
        str | None,
        typer.Option("--auth-token", envvar="GROVE_AUTH_TOKEN", help="Require this bearer token."),
    ] = None,
    settle_timeout: Annotated[
        float,
        typer.Option(
            "--settle-timeout", min=0.0, help="Seconds a posted result waits for pending calls."
        ),
    ] = 300.0,
    selection_policy: Annotated[
        str,
        typer.Option(
            "--selection-policy",
            callback=_resolvable_policy,
            help="The policy of attempts that name none: returned_history, all_captured or a "
            "custom module:function, which attempts may then name too (docs/gateway.md).",
        ),
    ] = "returned_history",
    forest_training: Annotated[
        bool,
        typer.Option(
            "--forest-training/--no-forest-training",
            help="The forest mode of attempts that give none.",
        ),
    ] = True,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Refuse (409) a call the template cannot continue from its parent's exact "
            "tokens, with its divergence (docs/normalization.md).",
        ),
    ] = False,
    engine: Annotated[
        str,
        typer.Option("--engine", help="embedded (in process) or vllm (docs/engines.md)."),
    ] = "embedded",
    model: Annotated[
        str,
        typer.Option("--model", help="`embedded` or a Hugging Face directory (vllm: required)."),
    ] = "embedded",
    architecture: Annotated[
        str,
        typer.Option(
            "--architecture",
            help="The embedded model: dense, moe or vlm (images, docs/media.md); "
            "as model.architecture.",
        ),
    ] = "dense",
    dtype: Annotated[
        str, typer.Option("--dtype", help="float32, bfloat16 or float16 (float64: embedded).")
    ] = "float32",
    vllm_url: Annotated[
        str | None,
        typer.Option(
            "--vllm-url", help="A running vLLM server serving --model (http://host:port)."
        ),
    ] = None,
    vllm_launch: Annotated[
        bool, typer.Option("--vllm-launch", help="Start vLLM on --model; stopped with Grove.")
    ] = False,
    vllm_python: Annotated[
        str | None,
        typer.Option("--vllm-python", help="The python that has vLLM (default: this one)."),
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option("--vllm-arg", help="An argument for the launched vLLM (repeat the option)."),
    ] = None,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Serve the OpenAI-compatible capture gateway on the embedded engine or a vLLM server
    (docs/gateway.md, docs/engines.md)."""
    from grove.jobs.engines import open_serving_engine
    from grove.jobs.serve import build_gateway, run_server

    ws = _workspace(workdir, database_url, blob_url)
    # uvicorn re-raises a SIGTERM it handled once it has shut down: as SystemExit, so that the
    # engine below is closed (a launched vLLM stopped) rather than the process killed.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    policy, loaded = open_serving_engine(
        engine,
        model,
        vllm_url=vllm_url,
        vllm_launch=vllm_launch,
        vllm_python=vllm_python,
        vllm_args=tuple(vllm_arg or ()),
        dtype=dtype,
        log_dir=ws.workdir,
        architecture=architecture,
    )
    try:
        app = build_gateway(
            ws,
            engine=policy.engine,
            tokenizer=loaded.tokenizer,
            model_name=loaded.name,
            auth_token=auth_token,
            max_context=policy.context_length,
            settle_timeout_s=settle_timeout,
            selection_policy=selection_policy,
            forest_mode=forest_training,
            strict=strict,
            image_processor=loaded.image_processor,
        )
        console.print(
            f"Grove gateway on http://{host}:{port}/v1 ({policy.engine.name} engine, model "
            f"{loaded.name}, ledger {ws.redacted(ws.database_url)})"
        )
        run_server(app, host, port)
    finally:
        policy.close()


@app.command("project")
def project(
    rollouts_per_group: Annotated[
        int, typer.Option("--rollouts-per-group", min=1, help="Logical rollouts per prompt group.")
    ],
    groups_per_step: Annotated[
        int, typer.Option("--groups-per-step", min=1, help="Prompt groups per published step.")
    ] = 1,
    steps: Annotated[
        int,
        typer.Option(
            "--steps",
            min=0,
            help="Publish steps 0..N-1 too and return when all are published (0: only "
            "finalize, until stopped).",
        ),
    ] = 0,
    max_groups: Annotated[
        int,
        typer.Option("--max-groups", min=1, help="Prompt groups this shard leases at once."),
    ] = 8,
    row_multiple: Annotated[
        int, typer.Option("--row-multiple", min=1, help="Pad each step's rows to a multiple.")
    ] = 1,
    pad_token_id: Annotated[
        int, typer.Option("--pad-token-id", min=0, help="Token id of padding rows.")
    ] = 0,
    forest_training: Annotated[
        bool,
        typer.Option(
            "--forest-training/--no-forest-training",
            help="The run's token_capture.forest_training.",
        ),
    ] = True,
    max_row_tokens: Annotated[
        int | None,
        typer.Option("--max-row-tokens", min=1, help="Mask rollouts with longer rows."),
    ] = None,
    training_stream: Annotated[
        str, typer.Option("--training-stream", help="The stream steps are published on.")
    ] = "training",
    capture_prefix: Annotated[
        str, typer.Option("--capture-prefix", help="Follow only attempts with this prefix.")
    ] = "",
    poll_interval: Annotated[
        float, typer.Option("--poll-interval", min=0.0, help="Seconds between polls.")
    ] = 0.2,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Run one projector shard on a PostgreSQL ledger: finalize the rollouts of the prompt
    groups it leases, and with --steps publish steps (docs/scale.md). Start several; a shard
    that dies releases its leases and another takes its groups over."""
    from grove.jobs.project import run_shard
    from training.projector import ProjectorSettings

    ws = _workspace(workdir, database_url, blob_url)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    settings = ProjectorSettings(
        rollouts_per_group=rollouts_per_group,
        groups_per_step=groups_per_step,
        row_multiple=row_multiple,
        pad_token_id=pad_token_id,
        training_stream=training_stream,
        capture_prefix=capture_prefix,
        forest_training=forest_training,
        max_row_tokens=max_row_tokens,
    )
    with _ledger(ws):  # the schema is this Grove's
        pass
    report = run_shard(ws, settings, max_groups=max_groups, steps=steps, poll_s=poll_interval)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        console.print(
            f"{report.holder}: finalized {report.finalized} rollouts, published steps "
            f"{list(report.published)}",
            highlight=False,
        )


@app.command("walkthrough")
def walkthrough(
    as_json: Annotated[bool, typer.Option("--json", help="Print only one JSON line.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Record one small attempt and show its capture graph (no training)."""
    from grove.jobs.walkthrough import run_walkthrough

    ws = _workspace(workdir, database_url, blob_url)
    print(json.dumps(run_walkthrough(ws, console=None if as_json else console)))


@contextmanager
def _ledger(ws: Workspace) -> Iterator[EventStore]:
    """The workspace's event store, once its schema is this Grove's (changed by nothing but
    ``grove db upgrade``), closed when the command is done."""
    from ledger import migrate
    from ledger.store import EventStore

    migrate.require_current(ws.existing_ledger())
    store = EventStore.open(ws.database_url, pool=False)
    try:
        yield store
    finally:
        store.close()


@app.command("lineage")
def lineage(
    key: Annotated[str, typer.Argument(help="A capture key, or a rollout id (all its attempts).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """The call tree of an attempt from the lineage views: status, selection, endpoints, rows."""
    from grove.tools.lineage import attempt_lineages, lineage_json, lineage_trees

    with _ledger(_workspace(workdir, database_url, blob_url)) as store:
        lineages = attempt_lineages(store, key)
    if as_json:
        print(json.dumps(lineage_json(key, lineages)))
        return
    for tree in lineage_trees(lineages):
        console.print(tree)


@app.command("replay")
def replay(
    capture_key: Annotated[str, typer.Argument(help="The attempt's capture key (or rollout id).")],
    until: Annotated[
        int | None,
        typer.Option("--until", min=0, help="Stop after the event at this ledger position."),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Re-run every recorded decision; exit 1 on a difference."),
    ] = False,
    selection_policy: Annotated[
        str | None,
        typer.Option(
            "--selection-policy",
            callback=_resolvable_policy,
            help="A custom module:function selection that --verify may re-run (built-ins always "
            "are; a policy the ledger names is never imported).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Fold an attempt's events one by one, printing the state after each (docs/debugging.md)."""
    from grove.tools.replay import render_replay
    from grove.tools.replay import replay as replay_attempt
    from storage import open_blob_store
    from training.selection import PolicyRegistry

    ws = _workspace(workdir, database_url, blob_url)
    with _ledger(ws) as store:
        blobs = open_blob_store(ws.blob_url) if verify else None
        result = replay_attempt(
            store,
            capture_key,
            until=until,
            blobs=blobs,
            policies=PolicyRegistry.of(
                registered=() if selection_policy is None else (selection_policy,)
            ),
        )
    if as_json:
        print(json.dumps(result.as_dict()))
    else:
        render_replay(result, console)
    if result.differences:
        raise typer.Exit(1)


@app.command("show")
def show(
    capture_key: Annotated[str, typer.Argument(help="The attempt's capture key (or rollout id).")],
    html: HtmlOption,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Draw an attempt's capture graph and training rows as one self-contained HTML page."""
    from grove.tools.show import write_attempt_page
    from storage import open_blob_store

    ws = _workspace(workdir, database_url, blob_url)
    with _ledger(ws) as store:
        page = write_attempt_page(store, open_blob_store(ws.blob_url), capture_key, html)
    console.print(f"wrote {html} ({page.calls} calls, {page.rows} rows)")


@app.command("report")
def report(
    run: Annotated[
        str, typer.Argument(help="A run id of WORKDIR/runs (or latest), or a run directory.")
    ],
    html: HtmlOption,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Draw a training run's metric curves as one self-contained HTML page (docs/metrics.md)."""
    from grove.tools.report import resolve_run_dir, write_report

    run_dir = resolve_run_dir(_workspace(workdir, database_url, blob_url).workdir, run)
    page = write_report(run_dir, html)
    console.print(
        f"wrote {html} ({page.steps} steps, {page.series} series)", highlight=False, soft_wrap=True
    )


@app.command("export")
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
    from grove.jobs.models import ModelLoadError
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


@app.command("gc")
def gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would be removed; remove nothing.")
    ] = False,
    settle_window: Annotated[
        float,
        typer.Option(
            "--settle-window",
            min=0.0,
            help="Seconds after an attempt settled before its pending calls' blobs may go "
            "(the run's token_capture.pending_call_timeout_s).",
        ),
    ] = 300.0,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Remove the staging blobs nothing needs: unselected calls of finished attempts, masked
    rollouts, orphans of crashed writers, pending calls after the wait (docs/storage.md)."""
    from storage import open_blob_store
    from training.cleanup import collect_garbage

    ws = _workspace(workdir, database_url, blob_url)
    with _ledger(ws) as store:
        report = collect_garbage(
            store, open_blob_store(ws.blob_url), window_s=settle_window, dry_run=dry_run
        )
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        console.print(
            f"{'would remove' if dry_run else 'removed'} {len(report.removed)} staging blobs "
            f"({report.removed_bytes} bytes) of {report.cleaned} attempts, {len(report.orphans)} "
            f"of them orphans; kept {report.kept} selected blobs of published rollouts; "
            f"{report.waiting} blobs of pending calls wait for teardown",
            highlight=False,
            soft_wrap=True,
        )
    if report.failed:
        errors.print(
            f"[bold red]error:[/] the blob store failed on {len(report.failed)} attempts "
            f"({', '.join(report.failed[:5])}); run grove gc again",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)


def main() -> None:
    """Entry point: run the app and report any Grove error as one clear line, without a trace,
    exiting with its status (``grove.errors.exit_status``: 75 when a service did not answer,
    else 1)."""
    try:
        app()
    except GroveError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        raise SystemExit(exit_status(error)) from None
