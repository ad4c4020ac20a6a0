"""What every ``sowstream`` subcommand shares: consoles, the bootstrap option, error handling."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console

from sowstream.auth import Auth, BearerAuth, HmacAuth
from sowstream.cli.records import record_table
from sowstream.config import ConfigError
from sowstream.errors import SowstreamError
from sowstream.filters import FilterError
from sowstream.messagetypes import MessageParseError, MessageType

err = Console(stderr=True, soft_wrap=True)  # errors name paths: never break them
out = Console()

F = TypeVar("F", bound=Callable[..., Any])

MessageTypeOpt = Annotated[
    str,
    typer.Option(
        "--message-type",
        "-m",
        help="Message type of the topic: json, fix, nvfix, xml, binary, avro (or a plug-in's).",
    ),
]

Bootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="SOWSTREAM_BOOTSTRAP",
        help="Kafka bootstrap servers (default: the local broker).",
    ),
]


def show_logs() -> None:
    """``sowstream -v``: log lines on stderr, sowstream's and librdkafka's (the logger
    ``sowstream.kafka``, DEBUG records) included; without it a user sees neither."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("sowstream").setLevel(logging.DEBUG)


def friendly_errors(fn: F) -> F:
    """Turn our errors into one red line and exit status 1 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SowstreamError, FilterError, ConfigError) as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False)
            raise typer.Exit(1) from exc

    return wrapper  # type: ignore[return-value]


def print_records(
    title: str,
    rows: Sequence[tuple[str, str, bytes | str]],
    as_json: bool,
    codec: MessageType | None = None,
) -> None:
    """``(topic, sow_key, data)`` rows as a table, or as JSON lines for scripts; ``codec`` is
    the data's message type when it is not json."""
    if as_json:
        for topic, sow_key, data in rows:
            raw = data.encode() if isinstance(data, str) else data
            line = {"topic": topic, "sow_key": sow_key, "data": body_value(raw, codec)}
            sys.stdout.write(orjson.dumps(line, default=str).decode() + "\n")
        return
    records = []
    for _, sow_key, data in rows:
        raw = data.encode() if isinstance(data, str) else data
        records.append((sow_key, body_value(raw, codec)))
    out.print(record_table(title, records, out.width))


def body_value(data: bytes, codec: MessageType | None, *, delta: bool = False) -> Any:
    """A body for a JSON line: JSON as it is, other types' fields (binary: its text)."""
    if codec is None:
        return orjson.loads(data) if data else None
    if not codec.has_fields or not data:
        return data.decode("utf-8", "backslashreplace")
    try:
        return codec.parse_delta(data) if delta else codec.parse(data)
    except MessageParseError:
        return data.decode("utf-8", "backslashreplace")


# The types whose messages are not text: a command-line payload is a JSON object of the fields.
BINARY_ENCODED = ("avro", "bson", "bflat", "protobuf")


def payload_for(text: str, codec: MessageType, soh: str | None) -> str | dict[str, Any]:
    """A command-line payload for a topic of ``codec``'s type: for a type whose messages are not
    text (avro, bson, bflat, protobuf) a JSON object of the fields; otherwise the text, ``soh``
    standing for SOH."""
    if codec.name in BINARY_ENCODED:
        try:
            fields = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise SowstreamError(
                f"a {codec.name} payload is given as a JSON object of its fields: {exc}"
            ) from None
        if not isinstance(fields, dict):
            raise SowstreamError(f"a {codec.name} payload is given as a JSON object of its fields")
        return fields
    return text.replace(soh, "\x01") if soh else text


def client_auth(identity: str = "") -> Auth | None:
    """The credentials of the CLI's client, from the environment (never from the command line,
    where other users of the machine could read them): ``SOWSTREAM_TOKEN`` (a JWT), or
    ``SOWSTREAM_HMAC_SECRET`` with ``SOWSTREAM_IDENTITY`` (or ``--identity``)."""
    token = os.environ.get("SOWSTREAM_TOKEN")
    if token:
        return BearerAuth(token)
    secret = os.environ.get("SOWSTREAM_HMAC_SECRET")
    if secret:
        who = identity or os.environ.get("SOWSTREAM_IDENTITY", "")
        if not who:
            raise typer.BadParameter("SOWSTREAM_HMAC_SECRET needs --identity or SOWSTREAM_IDENTITY")
        return HmacAuth(who, secret)
    return None
