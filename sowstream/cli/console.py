"""``sowstream console``: serve the web console (sowstream.console) until stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sowstream.cli.common import Bootstrap, client_auth, err, friendly_errors


@friendly_errors
def console(
    host: Annotated[
        str, typer.Option(help="Address to listen on; off loopback a login is required.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8700,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SOWSTREAM_CONSOLE_TOKEN",
            help="Token that logs in as --identity (off loopback without one, one is generated).",
        ),
    ] = None,
    user: Annotated[
        list[str] | None,
        typer.Option(help="IDENTITY=TOKEN: a token that logs in as that identity (repeatable)."),
    ] = None,
    identity: Annotated[
        str,
        typer.Option(
            help="Identity of the open console and of --token (entitlements); with "
            "SOWSTREAM_HMAC_SECRET, the identity the console's engine credential signs as."
        ),
    ] = "",
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Engine config: its prefix and Kafka settings."),
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix of the engine.")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between fleet samples.")] = 2.0,
    metrics: Annotated[
        list[str] | None,
        typer.Option(
            help="A worker's Prometheus endpoint (http://host:port/metrics) to chart (repeatable)."
        ),
    ] = None,
) -> None:
    """Serve the web console: topics, queries, live grids, views, the fleet and its rates.

    To an engine that requires credentials (engine.authentication) the console's client proves
    itself as the CLI does: SOWSTREAM_TOKEN, or SOWSTREAM_HMAC_SECRET with SOWSTREAM_IDENTITY."""
    from aiohttp import web

    from sowstream.broker.bootstrap import resolve_bootstrap
    from sowstream.config import load_config
    from sowstream.console import Auth, Console, Settings
    from sowstream.console.auth import parse_users
    from sowstream.console.server import describe_credential

    cfg = load_config(config) if config is not None else None
    settings = Settings(
        bootstrap=resolve_bootstrap(bootstrap or (cfg.engine.bootstrap_servers if cfg else None)),
        prefix=prefix or (cfg.engine.topic_prefix if cfg else "sowstream"),
        kafka=dict(cfg.engine.kafka) if cfg else {},
        poll=poll,
        metrics=tuple(metrics or ()),
        credential=client_auth(identity),
    )
    auth = Auth.for_host(host, token=token, users=parse_users(user or []), identity=identity)
    shown = f"[{host}]" if ":" in host else host
    err.print(
        f"[bold green]sowstream console[/] at http://{shown}:{port}/ (Kafka {settings.bootstrap})"
    )
    err.print(describe_credential(settings.credential), highlight=False)
    if auth.generated:
        err.print(f"login token (identity {identity!r}): {auth.generated}", highlight=False)
    elif auth.required:
        err.print(f"login required: {len(auth.tokens)} token(s) configured", highlight=False)
    web.run_app(Console(settings, auth).app(), host=host, port=port, print=None)


def register(app: typer.Typer) -> None:
    """Add the ``console`` command to the ``sowstream`` CLI."""
    app.command("console")(console)
