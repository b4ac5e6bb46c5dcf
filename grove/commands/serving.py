"""``grove serve`` and ``grove project``: the gateway and the projector shards, the long-running
processes of a deployment (docs/gateway.md, docs/scale.md)."""

from __future__ import annotations

import json
import signal
from typing import Annotated

import typer

from grove.commands.options import (
    BlobOption,
    DatabaseOption,
    JsonOption,
    WorkdirOption,
    console,
    exit_on_signal,
    ledger_store,
    resolvable_policy,
    workspace,
)

__all__ = ["project", "serve"]


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
            callback=resolvable_policy,
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

    ws = workspace(workdir, database_url, blob_url)
    # uvicorn re-raises a SIGTERM it handled once it has shut down: as SystemExit, so that the
    # engine below is closed (a launched vLLM stopped) rather than the process killed.
    signal.signal(signal.SIGTERM, exit_on_signal)
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
    from grove.training.projector import ProjectorSettings

    ws = workspace(workdir, database_url, blob_url)
    signal.signal(signal.SIGTERM, exit_on_signal)
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
    with ledger_store(ws):  # the schema is this Grove's
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
