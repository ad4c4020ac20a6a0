"""The console's pure parts: who may log in as whom, and messages turned into grid row events."""

from __future__ import annotations

import orjson
import pytest

from sowstream.client import Message
from sowstream.console.auth import Auth, is_loopback, parse_users
from sowstream.console.rows import KEY, LiveGrid
from sowstream.errors import SowstreamError


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("console.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_localhost_without_tokens_is_open_as_the_default_identity() -> None:
    auth = Auth.for_host("127.0.0.1", identity="ops")
    assert not auth.required and auth.generated is None
    assert auth.identity(None, None) == "ops"


def test_off_loopback_a_token_is_generated_and_required() -> None:
    auth = Auth.for_host("0.0.0.0")
    assert auth.required and auth.generated
    assert auth.identity(None, None) is None
    assert auth.identity(None, f"Bearer {auth.generated}") == ""
    assert auth.identity(None, "Bearer wrong") is None


def test_a_token_on_localhost_still_requires_login() -> None:
    auth = Auth.for_host("127.0.0.1", token="t", users={"a-token": "alice"})
    assert auth.required and auth.generated is None
    assert auth.login("nope") is None
    session = auth.login("a-token")
    assert session is not None and auth.identity(session, None) == "alice"
    auth.logout(session)
    assert auth.identity(session, None) is None


def test_users_parse_and_bad_ones_are_named() -> None:
    assert parse_users(["alice=t1", "bob=t2"]) == {"t1": "alice", "t2": "bob"}
    with pytest.raises(SowstreamError, match=r"'alice'.*IDENTITY=TOKEN"):
        parse_users(["alice"])
    with pytest.raises(SowstreamError, match="IDENTITY=TOKEN"):
        parse_users(["alice="])
    with pytest.raises(SowstreamError, match="already given"):
        parse_users(["alice=t", "bob=t"])


def msg(command: str, key: str, body: dict[str, object], **kw: object) -> Message:
    return Message(command, topic="orders", sow_key=key, data=orjson.dumps(body), **kw)  # type: ignore[arg-type]


def test_rows_are_added_updated_with_their_changed_fields_and_removed_with_the_reason() -> None:
    grid = LiveGrid()
    assert grid.apply(Message("group_begin")) is None
    added = grid.apply(msg("sow", "k1", {"id": 1, "qty": 5, "tags": ["a"]}))
    assert added == {
        "op": "add",
        "key": "k1",
        "row": {KEY: "k1", "id": 1, "qty": 5, "tags": '["a"]'},
    }
    update = grid.apply(msg("publish", "k1", {"id": 1, "qty": 7}, delta=True))
    assert update is not None and update["op"] == "update" and update["changed"] == ["qty"]
    assert update["row"]["tags"] == '["a"]'  # a delta keeps the fields it does not carry
    whole = grid.apply(msg("publish", "k1", {"id": 1, "qty": 7}))
    assert whole is not None and whole["changed"] == ["tags"]  # a full publish drops them
    gone = grid.apply(msg("oof", "k1", {"id": 1, "qty": 7}, reason="deleted"))
    assert gone == {
        "op": "remove",
        "key": "k1",
        "reason": "deleted",
        "row": {KEY: "k1", "id": 1, "qty": 7},
    }
    assert grid.records == {}
