"""The engine's subscription rules without Kafka: focus, oof, deltas, conflation, replace."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from sowstream.config import load_config_text
from sowstream.sow.compiled import compile_topic
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.matcher import TopicSubscriptions
from sowstream.subscriptions.model import Change, Delivery, SubscriptionSpec
from sowstream.subscriptions.options import parse_options

CONFIG = load_config_text(
    """
sow:
  - Name: t
    Key: /id
entitlements:
  alice: {t: "/owner = 'alice'"}
"""
)
TOPIC = CONFIG.topics[0]

_offset = iter(range(1, 1_000_000))


def rec(body: dict[str, Any]) -> SowRecord:
    return SowRecord(f"k{body['id']}", orjson.dumps(body), 0, 0)


def change(
    before: dict[str, Any] | None, after: dict[str, Any] | None, reason: str = "deleted"
) -> Change:
    key = f"k{(after or before or {})['id']}"
    return Change(
        key,
        rec(before) if before is not None else None,
        rec(after) if after is not None else None,
        0,
        next(_offset),
        0,
        reason,
    )


def subs(*specs: SubscriptionSpec) -> TopicSubscriptions:
    ts = TopicSubscriptions(compile_topic(TOPIC), CONFIG.entitlement_lookup("t"))
    for spec in specs:
        ts.upsert(spec)
    return ts


def spec(
    command: str = "subscribe", flt: str | None = None, options: str = "", identity: str = ""
) -> SubscriptionSpec:
    return SubscriptionSpec("s", "r", "t", command, flt, parse_options(options), identity)


def bodies(out: list[Delivery]) -> list[tuple[str, str, Any]]:
    return [(d.command, d.reason, orjson.loads(d.data)) for d in out]


def test_publish_goes_to_matching_subscriptions_only() -> None:
    ts = subs(spec(flt="/a = 1"))
    assert bodies(ts.dispatch([change(None, {"id": 1, "a": 2})], 0)) == []
    assert bodies(ts.dispatch([change(None, {"id": 1, "a": 1})], 0)) == [
        ("publish", "", {"id": 1, "a": 1})
    ]


def test_oof_reasons_and_their_data() -> None:
    ts = subs(spec(flt="/a = 1", options="oof", identity="alice"))
    old = {"id": 1, "a": 1, "owner": "alice"}
    assert bodies(ts.dispatch([change(old, None, "deleted")], 0)) == [("oof", "deleted", old)]
    assert bodies(ts.dispatch([change(old, None, "expired")], 0)) == [("oof", "expired", old)]
    moved = {"id": 1, "a": 2, "owner": "alice"}
    assert bodies(ts.dispatch([change(old, moved)], 0)) == [("oof", "match", moved)]
    # no longer entitled: the previous state, never the new one
    taken = {"id": 1, "a": 1, "owner": "bob"}
    assert bodies(ts.dispatch([change(old, taken)], 0)) == [("oof", "entitlement", old)]
    # both out of filter and not entitled: still entitlement (the new state must not leak)
    gone = {"id": 1, "a": 2, "owner": "bob"}
    assert bodies(ts.dispatch([change(old, gone)], 0)) == [("oof", "entitlement", old)]


def test_without_oof_option_nothing_is_sent_when_a_record_leaves() -> None:
    ts = subs(spec(flt="/a = 1"))
    assert ts.dispatch([change({"id": 1, "a": 1}, {"id": 1, "a": 2})], 0) == []


def test_entitlement_hides_records_from_subscriptions() -> None:
    ts = subs(spec(identity="alice"))
    assert ts.dispatch([change(None, {"id": 1, "owner": "bob"})], 0) == []
    assert len(ts.dispatch([change(None, {"id": 2, "owner": "alice"})], 0)) == 1


def test_delta_of_a_known_record_and_whole_new_record() -> None:
    ts = subs(spec("delta_subscribe"))
    new = ts.dispatch([change(None, {"id": 1, "a": 1, "b": 1})], 0)
    assert bodies(new) == [("publish", "", {"id": 1, "a": 1, "b": 1})] and not new[0].is_delta
    upd = ts.dispatch([change({"id": 1, "a": 1, "b": 1}, {"id": 1, "a": 1, "b": 2})], 0)
    assert bodies(upd) == [("publish", "", {"id": 1, "b": 2})] and upd[0].is_delta


def test_delta_coming_back_into_focus_is_whole() -> None:
    ts = subs(spec("delta_subscribe", "/s = 'open'", "oof"))
    out = ts.dispatch([change({"id": 1, "s": "done", "q": 1}, {"id": 1, "s": "open", "q": 1})], 0)
    assert bodies(out) == [("publish", "", {"id": 1, "s": "open", "q": 1})]


def test_conflated_delta_record_99() -> None:
    ts = subs(spec("delta_subscribe", options="conflation=1s"))
    states = [
        {"id": 99, "status": "open", "notes": "none", "xref": 82},
        {"id": 99, "status": "questioned", "notes": "none", "xref": 82},
        {"id": 99, "status": "questioned", "notes": "jcarlo hold", "xref": 82},
        {"id": 99, "status": "cleared", "notes": "none", "xref": 82},
        {"id": 99, "status": "open", "notes": "none", "xref": 82},
    ]
    for before, after in itertools.pairwise(states):
        assert ts.dispatch([change(before, after)], 100) == []
    assert ts.flush(1099) == []
    assert bodies(ts.flush(1100)) == [
        ("publish", "", {"id": 99, "status": "open", "notes": "none"})
    ]
    assert ts.flush(5000) == []


def test_conflation_update_then_out_gives_oof_with_delivered_state() -> None:
    ts = subs(spec(flt="/s = 'open'", options="oof,conflation=1s"))
    a = {"id": 1, "s": "open", "v": 0}
    b = {"id": 1, "s": "open", "v": 1}
    c = {"id": 1, "s": "done", "v": 2}
    ts.dispatch([change(a, b), change(b, c)], 0)
    assert bodies(ts.flush(1000)) == [("oof", "match", a)]


def test_a_conflated_subscriptions_replay_oof_carries_the_state_it_last_received() -> None:
    """A replay (a subscription placed again from its bookmarks) sends every change at once; on
    a conflated subscription an oof still carries the last data the subscriber received
    (chapter 04), which in a replay is the change's previous state, not the new one."""
    a = {"id": 1, "s": "open", "v": 0}
    b = {"id": 1, "s": "open", "v": 1}
    c = {"id": 1, "s": "done", "v": 2}
    conflated = subs(spec(flt="/s = 'open'", options="oof,conflation=1s"))
    assert bodies(conflated.replay(spec().key, [change(a, b), change(b, c)])) == [
        ("publish", "", b),
        ("oof", "match", b),
    ]
    plain = subs(spec(flt="/s = 'open'", options="oof"))
    assert bodies(plain.replay(spec().key, [change(b, c)])) == [("oof", "match", c)]
    forced = subs(spec(flt="/s = 'open'", options="oof"))
    forced.force_conflation("r", 500)
    assert bodies(forced.replay(spec().key, [change(b, c)])) == [("oof", "match", b)]


def test_conflation_out_and_back_in_gives_latest_state_only() -> None:
    ts = subs(spec(flt="/s = 'open'", options="oof,conflation=1s"))
    a = {"id": 1, "s": "open", "v": 0}
    b = {"id": 1, "s": "done", "v": 1}
    c = {"id": 1, "s": "open", "v": 2}
    ts.dispatch([change(a, b), change(b, c)], 0)
    assert bodies(ts.flush(1000)) == [("publish", "", c)]


def test_conflation_key_merges_records_sharing_it() -> None:
    ts = subs(spec(options="conflation=1s,conflation_key=/sym"))
    ts.dispatch([change(None, {"id": 1, "sym": "X", "v": 1})], 0)
    ts.dispatch([change(None, {"id": 2, "sym": "X", "v": 2})], 0)
    ts.dispatch([change(None, {"id": 3, "sym": "Y", "v": 3})], 0)
    assert sorted(b[2]["v"] for b in bodies(ts.flush(1000))) == [2, 3]


def test_forced_conflation_for_a_slow_client_and_pending_first() -> None:
    ts = subs(spec())
    ts.force_conflation("r", 500)
    for v in range(5):
        assert ts.dispatch([change({"id": 1, "v": v}, {"id": 1, "v": v + 1})], 0) == []
    ts.force_conflation("r", None)
    # not flushed yet: a new change must not overtake the pending one
    assert ts.dispatch([change({"id": 1, "v": 5}, {"id": 1, "v": 6})], 10) == []
    assert bodies(ts.flush(500)) == [("publish", "", {"id": 1, "v": 6})]
    assert len(ts.dispatch([change({"id": 1, "v": 6}, {"id": 1, "v": 7})], 600)) == 1


def test_replace_keeps_old_filter_on_held_partitions_until_pinned() -> None:
    old = spec(flt="/a = 1")
    ts = subs(old)
    new = SubscriptionSpec("s", "r", "t", "subscribe", "/a = 2", parse_options(""))
    ts.upsert(new, held=[0])
    # partition 0 has not run the replace yet: still the old filter
    assert len(ts.dispatch([change(None, {"id": 1, "a": 1})], 0)) == 1
    ts.pin(new, 0)
    assert ts.dispatch([change(None, {"id": 1, "a": 1})], 0) == []
    assert len(ts.dispatch([change(None, {"id": 2, "a": 2})], 0)) == 1


def test_remove_and_remove_client() -> None:
    ts = subs(spec())
    assert ts.remove_client("r")[0].sub_id == "s"
    assert not ts and ts.dispatch([change(None, {"id": 1})], 0) == []


def test_select_projects_full_and_delta_messages() -> None:
    ts = subs(spec("delta_subscribe", options="select=[/id,/a],no_empties"))
    full = ts.dispatch([change(None, {"id": 1, "a": 1, "b": 1})], 0)
    assert bodies(full) == [("publish", "", {"id": 1, "a": 1})]
    assert ts.dispatch([change({"id": 1, "a": 1, "b": 1}, {"id": 1, "a": 1, "b": 2})], 0) == []
    changed = ts.dispatch([change({"id": 1, "a": 1, "b": 2}, {"id": 1, "a": 3, "b": 2})], 0)
    assert bodies(changed) == [("publish", "", {"id": 1, "a": 3})]


def test_conflated_delta_removes_nested_fields_a_replacement_dropped() -> None:
    ts = subs(spec("delta_subscribe", options="conflation=1s"))
    states = [{"id": 1, "k": {"x": 0, "y": 2}}, {"id": 1, "k": 5}, {"id": 1, "k": {"x": 1}}]
    for before, after in itertools.pairwise(states):
        ts.dispatch([change(before, after)], 0)
    assert bodies(ts.flush(1000)) == [("publish", "", {"id": 1, "k": {"x": 1, "y": None}})]


def test_values_the_compiled_fold_read_decide_the_candidates_while_the_paths_hold() -> None:
    """A change carrying the values at the indexed paths is matched from them: a body no
    subscription may take is not parsed at all; values read at older paths are not used."""
    ts = subs(spec(flt="/sym = 'IBM'"))
    paths = ts.watched_paths()
    assert paths == ("/sym",)
    unparsable = Change("k1", None, SowRecord("k1", b"{not json", 0, 0), 0, next(_offset), 0)
    unparsable.watched_at, unparsable.watched = paths, (None, ("MSFT",))
    assert ts.dispatch([unparsable], 0) == []  # no candidate: the body was never read
    taken = change(None, {"id": 1, "sym": "IBM"})
    taken.watched_at, taken.watched = paths, (None, ("IBM",))
    assert [d.command for d in ts.dispatch([taken], 0)] == ["publish"]
    stale = change(None, {"id": 2, "sym": "IBM"})
    stale.watched_at, stale.watched = ("/sym",), (None, ("MSFT",))  # equal, not the same tuple
    assert [d.sow_key for d in ts.dispatch([stale], 0)] == ["k2"]


def test_passes_by_only_when_no_subscription_can_take_the_values() -> None:
    """``passes_by`` lets the compiled fold skip an event only when it is sure: every state read,
    at the index's current paths, and no unfiltered or pinned subscription."""
    ts = subs(spec(flt="/sym = 'IBM'"))
    paths = ts.watched_paths()
    assert ts.passes_by(0, paths, [("MSFT",), ("ORCL",)])
    assert ts.passes_by(0, paths, [])  # a delete of a record that was not there
    assert not ts.passes_by(0, paths, [("MSFT",), ("IBM",)])  # comes into focus
    assert not ts.passes_by(0, paths, [("IBM",), ("MSFT",)])  # goes out of focus
    assert not ts.passes_by(0, paths, [None, ("MSFT",)])  # a state not read
    assert not ts.passes_by(0, ("/sym",), [("MSFT",)])  # read at paths the index had before
    # a replace not yet run on a held partition: the old filter still applies there
    ts.upsert(
        SubscriptionSpec("s", "r", "t", "subscribe", "/sym = 'X'", parse_options("")), held=[0]
    )
    assert not ts.passes_by(0, ts.watched_paths(), [("MSFT",)])
    ts.upsert(SubscriptionSpec("all", "r", "t", "subscribe", None, parse_options("")))
    assert not ts.passes_by(0, ts.watched_paths(), [("MSFT",)])  # takes everything
