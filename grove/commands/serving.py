"""``grove serve`` and ``grove project``: the gateway and the projector shards, the long-running
processes of a deployment (docs/gateway.md, docs/scale.md).

Both read the ``CONFIG.yaml`` that ``grove train`` reads, parsed by the one schema
(``grove.config``): the defaults of every key are the schema's, whichever command runs. A flag
of ``grove serve`` only overrides the key its help names (``SERVE_OVERRIDES``), and is checked
as that key is. ``grove project`` has no such flags: a shard must decide ``rollout.finalized``
with the settings of the run that trains on it, which is its configuration file.

The gateway's token is best passed in ``GROVE_AUTH_TOKEN`` (a flag shows in the process list).
An empty token is refused before anything starts (exit 2), never taken as "no authentication";
serving without a token on an address other than loopback is warned about on stderr.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from rich.markup import escape

from grove.commands.options import (
    BlobOption,
    ConfigArgument,
    ConfigOption,
    DatabaseOption,
    JsonOption,
    WorkdirOption,
    configured,
    console,
    errors,
    exit_on_signal,
    ledger_store,
    overrides,
    resolvable_policy,
    workspace,
)

if TYPE_CHECKING:
    from grove.config import GroveConfig
    from grove.workspace import Workspace

__all__ = ["AUTH_TOKEN_ENV", "SERVE_OVERRIDES", "project", "serve"]

AUTH_TOKEN_ENV: Final = "GROVE_AUTH_TOKEN"
EXIT_USAGE: Final = 2

SERVE_OVERRIDES: Final[dict[str, str]] = {
    "--host": "engine.host",
    "--port": "engine.port",
    "--auth-token": "engine.auth_token",
    "--settle-timeout": "token_capture.pending_call_timeout_s",
    "--selection-policy": "token_capture.selection_policy",
    "--forest-training": "token_capture.forest_training",
    "--strict": "token_capture.strict",
    "--engine": "engine.kind",
    "--model": "model.path",
    "--architecture": "model.architecture",
    "--dtype": "model.dtype",
    "--vllm-url": "engine.vllm_url",
    "--vllm-launch": "engine.vllm_launch",
    "--vllm-python": "engine.vllm_python",
    "--vllm-arg": "engine.vllm_args",
}
"""Each flag of ``grove serve`` that overrides a configuration key, and the key."""


def _help(flag: str, text: str) -> str:
    return overrides(SERVE_OVERRIDES[flag], text)


def _absolute(path: str | None) -> str | None:
    """A path given on the command line, made absolute (from the current directory) before it
    joins the configuration, whose relative paths are the file's."""
    if path is None or path == "embedded" or ("/" not in path and not Path(path).exists()):
        return path
    return os.path.abspath(Path(path).expanduser())


def _usage_error(message: str) -> typer.Exit:
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def _given_token(flag: str | None) -> str | None:
    """The token of ``--auth-token`` or ``GROVE_AUTH_TOKEN``; an empty or blank one stops the
    command (exit 2): taken as "no token", it would serve every route to anyone."""
    environment = os.environ.get(AUTH_TOKEN_ENV)
    from_environment = environment is not None and flag in (None, environment)
    if from_environment and not (environment or "").strip():
        raise _usage_error(
            f"{AUTH_TOKEN_ENV} is set but empty: Grove will not take that as no authentication. "
            f"Set it to the gateway's token, or unset it (unset {AUTH_TOKEN_ENV}) to serve "
            "without one"
        )
    if flag is not None and not flag.strip():
        raise _usage_error(
            "--auth-token is empty: give the gateway's token (best in GROVE_AUTH_TOKEN), or "
            "leave the option out to serve without authentication"
        )
    return flag


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    config: ConfigArgument = None,
    config_file: ConfigOption = None,
    host: Annotated[
        str | None, typer.Option("--host", help=_help("--host", "Address to listen on."))
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", help=_help("--port", "Port to listen on; 0 picks a free one.")),
    ] = None,
    auth_token: Annotated[
        str | None,
        typer.Option(
            "--auth-token",
            envvar=AUTH_TOKEN_ENV,
            show_envvar=True,
            help=_help(
                "--auth-token",
                "Require this bearer token; pass it in GROVE_AUTH_TOKEN (an option shows in the "
                "process list). Empty: refused.",
            ),
        ),
    ] = None,
    settle_timeout: Annotated[
        float | None,
        typer.Option(
            "--settle-timeout",
            help=_help("--settle-timeout", "Seconds a posted result waits for pending calls."),
        ),
    ] = None,
    selection_policy: Annotated[
        str | None,
        typer.Option(
            "--selection-policy",
            callback=resolvable_policy,
            help=_help(
                "--selection-policy",
                "The policy of attempts that name none: returned_history, all_captured or a "
                "custom module:function, which attempts may then name too (docs/gateway.md).",
            ),
        ),
    ] = None,
    forest_training: Annotated[
        bool | None,
        typer.Option(
            "--forest-training/--no-forest-training",
            help=_help("--forest-training", "The forest mode of attempts that give none."),
            show_default=False,
        ),
    ] = None,
    strict: Annotated[
        bool | None,
        typer.Option(
            "--strict/--no-strict",
            help=_help(
                "--strict",
                "Refuse (409) a call the template cannot continue from its parent's exact "
                "tokens, with its divergence (docs/normalization.md).",
            ),
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine", help=_help("--engine", "embedded (in process) or vllm (docs/engines.md).")
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help=_help("--model", "`embedded` or a Hugging Face directory (vllm: required)."),
        ),
    ] = None,
    architecture: Annotated[
        str | None,
        typer.Option(
            "--architecture",
            help=_help(
                "--architecture", "The embedded model: dense, moe or vlm (images, docs/media.md)."
            ),
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help=_help("--dtype", "float32, bfloat16 or float16 (float64: embedded).")
        ),
    ] = None,
    vllm_url: Annotated[
        str | None,
        typer.Option(
            "--vllm-url",
            help=_help("--vllm-url", "A running vLLM server serving the model (http://host:port)."),
        ),
    ] = None,
    vllm_launch: Annotated[
        bool | None,
        typer.Option(
            "--vllm-launch/--no-vllm-launch",
            help=_help("--vllm-launch", "Start vLLM on the model; stopped with Grove."),
            show_default=False,
        ),
    ] = None,
    vllm_python: Annotated[
        str | None,
        typer.Option(
            "--vllm-python",
            help=_help("--vllm-python", "The python that has vLLM (default: this one)."),
        ),
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--vllm-arg",
            help=_help("--vllm-arg", "An argument for the launched vLLM (repeat the option)."),
        ),
    ] = None,
    workdir: WorkdirOption = None,
    database_url: DatabaseOption = None,
    blob_url: BlobOption = None,
) -> None:
    """Serve the OpenAI-compatible capture gateway on the embedded engine or a vLLM server, as
    CONFIG.yaml configures it (docs/gateway.md, docs/engines.md)."""
    flags: dict[str, Any] = {
        "engine.host": host,
        "engine.port": port,
        "engine.auth_token": _given_token(auth_token),
        "token_capture.pending_call_timeout_s": settle_timeout,
        "token_capture.selection_policy": selection_policy,
        "token_capture.forest_training": forest_training,
        "token_capture.strict": strict,
        "engine.kind": engine,
        "model.path": _absolute(model),
        "model.architecture": architecture,
        "model.dtype": dtype,
        "engine.vllm_url": vllm_url,
        "engine.vllm_launch": vllm_launch,
        "engine.vllm_python": _absolute(vllm_python),
        "engine.vllm_args": list(vllm_arg) if vllm_arg else None,
    }
    settings = configured(config, config_file, flags)
    ws = workspace(workdir, database_url, blob_url)
    _serve(settings, ws)


def _serve(config: GroveConfig, ws: Workspace) -> None:
    from grove.engines.policy import open_serving_engine
    from grove.services.serve import build_gateway, gateway_options, run_server

    host = config.engine.host
    if config.engine.auth_token is None and not _is_loopback(host):
        errors.print(
            f"warning: serving on {host} without a token: anyone who reaches this address can "
            f"use the gateway; set {AUTH_TOKEN_ENV} (docs/security.md)",
            highlight=False,
            soft_wrap=True,
        )
    # uvicorn re-raises a SIGTERM it handled once it has shut down: as SystemExit, so that the
    # engine below is closed (a launched vLLM stopped) rather than the process killed.
    signal.signal(signal.SIGTERM, exit_on_signal)
    engine = config.engine
    policy, loaded = open_serving_engine(
        engine.kind,
        config.model.path,
        vllm_url=engine.vllm_url,
        vllm_launch=engine.vllm_launch,
        vllm_python=engine.vllm_python,
        vllm_args=tuple(engine.vllm_args),
        dtype=config.model.dtype,
        start_timeout_s=engine.vllm_start_timeout_s,
        log_dir=ws.workdir,
        architecture=config.model.architecture,
    )
    try:
        app = build_gateway(
            ws,
            engine=policy.engine,
            tokenizer=loaded.tokenizer,
            model_name=loaded.name,
            max_context=policy.context_length,
            image_processor=loaded.image_processor,
            **gateway_options(config),
        )

        def announce(url: str) -> None:
            console.print(
                f"Grove gateway on {url}/v1 ({policy.engine.name} engine, model {loaded.name}, "
                f"ledger {ws.redacted(ws.database_url)})",
                highlight=False,
                soft_wrap=True,
            )

        run_server(app, host, engine.port, on_listening=announce)
    finally:
        policy.close()


def project(
    config: ConfigArgument = None,
    config_file: ConfigOption = None,
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
    """Run one projector shard on a PostgreSQL ledger with the settings of CONFIG.yaml, the
    training run's (group sizes, forest mode, row limit, row multiple, group rules, the model's
    padding token): finalize the rollouts of the prompt groups it leases, and with --steps
    publish steps (docs/scale.md). Start several; a shard that dies releases its leases and
    another takes its groups over."""
    from grove.services.project import projector_settings, run_shard

    settings = configured(config, config_file, {})
    ws = workspace(workdir, database_url, blob_url)
    signal.signal(signal.SIGTERM, exit_on_signal)
    shard_settings = projector_settings(
        settings, training_stream=training_stream, capture_prefix=capture_prefix
    )
    with ledger_store(ws):  # the schema is this Grove's
        pass
    report = run_shard(ws, shard_settings, max_groups=max_groups, steps=steps, poll_s=poll_interval)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        console.print(
            f"{report.holder}: finalized {report.finalized} rollouts, published steps "
            f"{list(report.published)}",
            highlight=False,
        )
