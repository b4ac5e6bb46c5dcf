"""The debugging and maintenance commands over ``grove.tools``: walkthrough, lineage, replay,
show, fork, report and gc (docs/debugging.md, docs/fork.md, docs/storage.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from grove.commands.options import (
    BlobOption,
    DatabaseOption,
    HtmlOption,
    JsonOption,
    WorkdirOption,
    console,
    errors,
    ledger_store,
    resolvable_policy,
    workspace,
)
from grove.ledger.attempt import DEFAULT_SETTLE_TIMEOUT_S

__all__ = ["fork", "gc", "lineage", "replay", "report", "show", "walkthrough"]


def walkthrough(
    as_json: Annotated[bool, typer.Option("--json", help="Print only one JSON line.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Record one small attempt and show its capture graph (no training)."""
    from grove.demo.walkthrough import run_walkthrough

    ws = workspace(workdir, database_url, blob_url)
    print(json.dumps(run_walkthrough(ws, console=None if as_json else console)))


def lineage(
    key: Annotated[str, typer.Argument(help="A capture key, or a rollout id (all its attempts).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """The call tree of an attempt from the lineage views: status, selection, endpoints, rows."""
    from grove.tools.lineage import attempt_lineages, lineage_json, lineage_trees

    with ledger_store(workspace(workdir, database_url, blob_url)) as store:
        lineages = attempt_lineages(store, key)
    if as_json:
        print(json.dumps(lineage_json(key, lineages)))
        return
    for tree in lineage_trees(lineages):
        console.print(tree)


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
            callback=resolvable_policy,
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
    from grove.storage import open_blob_store
    from grove.tools.replay import render_replay
    from grove.tools.replay import replay as replay_attempt
    from grove.training.selection import PolicyRegistry

    ws = workspace(workdir, database_url, blob_url)
    with ledger_store(ws) as store:
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


def show(
    capture_key: Annotated[str, typer.Argument(help="The attempt's capture key (or rollout id).")],
    html: HtmlOption,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Draw an attempt's capture graph and training rows as one self-contained HTML page."""
    from grove.storage import open_blob_store
    from grove.tools.show import write_attempt_page

    ws = workspace(workdir, database_url, blob_url)
    with ledger_store(ws) as store:
        page = write_attempt_page(store, open_blob_store(ws.blob_url), capture_key, html)
    console.print(f"wrote {html} ({page.calls} calls, {page.rows} rows)")


def fork(
    capture_key: Annotated[str, typer.Argument(help="The attempt's capture key.")],
    call_id: Annotated[str, typer.Argument(help="The committed call to sample again.")],
    n: Annotated[int, typer.Option("--n", min=1, max=64, help="How many samples to draw.")] = 4,
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="Sample i is drawn with seed SEED + i.")
    ] = 0,
    temperature: Annotated[
        float,
        typer.Option(
            "--temperature", help="Sampling temperature (the embedded engine samples at 1 only)."
        ),
    ] = 1.0,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            help="Tokens a sample may generate (default: the recorded answer's length when it "
            "stopped at the limit, else 256; within the model's context).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            dir_okay=False,
            help="The configuration grove train read (its model); default: the config.json "
            "beside --checkpoint, else the run's.",
        ),
    ] = None,
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            help="A checkpoint directory (step_…), `latest` (the run's newest; none yet: the "
            "model as configured) or `none` (the model as configured).",
        ),
    ] = "latest",
    run: Annotated[
        str | None,
        typer.Option("--run", help="The run of WORKDIR/runs whose checkpoints and model to use."),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="Record each sample as an attempt of its own through the capture service "
            "(KEY-fork-CALL_ID-SEED: a fork of the call's parent, or a new root).",
        ),
    ] = False,
    tools: Annotated[
        Path | None,
        typer.Option(
            "--tools",
            dir_okay=False,
            help="With --record: a JSON file of the Chat Completions tools the call's request "
            "sent (the ledger records only their digest).",
        ),
    ] = None,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Sample a recorded call again on its exact prompt tokens, beside its recorded answer with
    each token's logprob then and now and its TMPE; writes nothing unless --record
    (docs/fork.md)."""
    from grove.storage import open_blob_store
    from grove.tools.fork import (
        fork_call,
        fork_configuration,
        load_fork_model,
        read_recorded_call,
        render_fork,
    )
    from grove.tools.fork_recording import ForkRecorder, read_tools

    if tools is not None and not record:
        raise typer.BadParameter("--tools goes with --record", param_hint="--tools")
    ws = workspace(workdir, database_url, blob_url)
    with ledger_store(ws) as store:
        blobs = open_blob_store(ws.blob_url)
        call = read_recorded_call(store, blobs, capture_key, call_id)
        settings, weights = fork_configuration(ws, config=config, checkpoint=checkpoint, run=run)
        errors.print(
            f"loading {settings.model.path} ({'as configured' if weights is None else weights})",
            highlight=False,
            soft_wrap=True,
        )
        model = load_fork_model(
            settings, weights, workdir=ws.workdir, origin=str(config or "the run's configuration")
        )
        recorder = None
        if record:
            recorder = ForkRecorder(
                store,
                blobs,
                call,
                model_name=model.loaded.name,
                policy_version=model.step or 0,
                tools=None if tools is None else read_tools(tools),
            )
        report = fork_call(
            call,
            model,
            n=n,
            seed=seed,
            temperature=temperature,
            max_tokens=max_tokens,
            progress=lambda line: errors.print(line, highlight=False),
            recorder=recorder,
        )
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        render_fork(report, console)


def report(
    run: Annotated[
        str, typer.Argument(help="A run id of WORKDIR/runs (or latest), or a run directory.")
    ],
    html: HtmlOption,
    workdir: WorkdirOption = None,
) -> None:
    """Draw a training run's metric curves as one self-contained HTML page (docs/metrics.md).
    It reads only WORKDIR/runs, so it takes no ledger or blob-store option."""
    from grove.tools.report import resolve_run_dir, write_report

    run_dir = resolve_run_dir(workspace(workdir, None, None).workdir, run)
    page = write_report(run_dir, html)
    console.print(
        f"wrote {html} ({page.steps} steps, {page.series} series)", highlight=False, soft_wrap=True
    )


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
    ] = DEFAULT_SETTLE_TIMEOUT_S,
    as_json: JsonOption = False,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Remove the staging blobs nothing needs: unselected calls of finished attempts, masked
    rollouts, orphans of crashed writers, pending calls after the wait (docs/storage.md)."""
    from grove.storage import open_blob_store
    from grove.training.cleanup import collect_garbage

    ws = workspace(workdir, database_url, blob_url)
    with ledger_store(ws) as store:
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
