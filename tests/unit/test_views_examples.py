"""Worked examples of the views chapter (V1-V10, V13, V14) on the pure view maintainer.

V11 (inline conflation) and V15 (views over queues) are engine behaviour and are not here.
Every step also checks the incremental state against the naive recomputation.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from sowstream.config.views import ViewConfig
from sowstream.filters import compile_filter
from sowstream.sow.aggregate import parse_aggregation
from sowstream.sow.keys import sow_key_from_values
from sowstream.views.joins import JoinPlan, preserved_topic
from sowstream.views.maintainer import ViewChange, ViewMaintainer
from sowstream.views.projection import parse_join


class Harness:
    """A maintainer plus the underlying SOW state, fed with publishes and deletes."""

    def __init__(self, view: ViewConfig, **kwargs: Any) -> None:
        self.m = ViewMaintainer(view, **kwargs)
        self.state: dict[str, dict[str, tuple[dict[str, Any], int]]] = {}
        self.seq = 0

    def publish(self, topic: str, key: Any, record: dict[str, Any] | None) -> list[ViewChange]:
        self.seq += 1
        table = self.state.setdefault(topic, {})
        before = table.get(str(key))
        if record is None:
            table.pop(str(key), None)
        else:
            table[str(key)] = (record, self.seq)
        changes = self.m.apply(
            topic, str(key), None if before is None else before[0], record, seq=self.seq
        )
        assert self.m.records() == self.m.recompute(self.state)
        return changes

    def delete(self, topic: str, key: Any) -> list[ViewChange]:
        return self.publish(topic, key, None)

    def view(self) -> list[dict[str, Any]]:
        return sorted(self.m.records().values(), key=repr)


def by_region() -> ViewConfig:
    return ViewConfig(
        name="BY_REGION",
        underlying_topic="orders",
        projection=["/region", "SUM(/qty) AS /total", "COUNT(/orderId) AS /n"],
        grouping=["/region"],
    )


def test_v1_single_topic_aggregate_lifecycle() -> None:
    h = Harness(by_region())
    eu = sow_key_from_values("BY_REGION", ["EU"])
    c = h.publish("orders", 1, {"orderId": 1, "region": "EU", "qty": 10})
    assert c == [ViewChange(eu, {"region": "EU", "total": 10, "n": 1}, None)]
    h.publish("orders", 2, {"orderId": 2, "region": "EU", "qty": 5})
    assert h.view() == [{"region": "EU", "total": 15, "n": 2}]
    c = h.publish("orders", 1, {"orderId": 1, "region": "EU", "qty": 7})
    assert [x.record for x in c] == [{"region": "EU", "total": 12, "n": 2}]
    c = h.publish("orders", 2, {"orderId": 2, "region": "US", "qty": 5})
    assert [x.record for x in c] == [
        {"region": "EU", "total": 7, "n": 1},
        {"region": "US", "total": 5, "n": 1},
    ]
    c = h.delete("orders", 1)
    assert c == [ViewChange(eu, None, {"region": "EU", "total": 7, "n": 1})]
    assert c[0].deleted
    assert h.view() == [{"region": "US", "total": 5, "n": 1}]


def test_v2_filtered_view() -> None:
    view = ViewConfig(
        name="CompleteByRegion",
        underlying_topic="orders",
        projection=["COUNT(/orderId) AS /completedOrders", "/region AS /region"],
        grouping=["/region"],
        filter="/status = 'complete'",
    )
    h = Harness(view)
    assert h.publish("orders", 1, {"orderId": 1, "region": "A", "status": "open"}) == []
    h.publish("orders", 1, {"orderId": 1, "region": "A", "status": "complete"})
    assert h.view() == [{"completedOrders": 1, "region": "A"}]
    h.publish("orders", 2, {"orderId": 2, "region": "A", "status": "complete"})
    assert h.view() == [{"completedOrders": 2, "region": "A"}]
    h.publish("orders", 1, {"orderId": 1, "region": "A", "status": "open"})
    assert h.view() == [{"completedOrders": 1, "region": "A"}]
    c = h.publish("orders", 2, {"orderId": 2, "region": "A", "status": "cancelled"})
    assert len(c) == 1 and c[0].deleted and h.view() == []


def test_v3_last_processed_value_for_non_grouped_fields() -> None:
    view = ViewConfig(
        name="V3",
        underlying_topic="orders",
        projection=["/region", "/lastTrader", "SUM(/qty) AS /total"],
        grouping=["/region"],
    )
    h = Harness(view)
    h.publish("orders", 1, {"orderId": 1, "region": "EU", "lastTrader": "ann", "qty": 1})
    h.publish("orders", 2, {"orderId": 2, "region": "EU", "lastTrader": "bob", "qty": 1})
    assert h.view() == [{"region": "EU", "lastTrader": "bob", "total": 2}]
    h.publish("orders", 1, {"orderId": 1, "region": "EU", "lastTrader": "cat", "qty": 1})
    assert h.view() == [{"region": "EU", "lastTrader": "cat", "total": 2}]
    # The latest row leaving hands over to the next most recent one.
    h.delete("orders", 1)
    assert h.view() == [{"region": "EU", "lastTrader": "bob", "total": 1}]


def test_v4_null_handling() -> None:
    view = ViewConfig(
        name="V4",
        underlying_topic="orders",
        projection=[
            "/region",
            "COUNT(/price) AS /c",
            "SUM(/price) AS /s",
            "AVG(/price) AS /a",
            "MIN(/price) AS /lo",
        ],
        grouping=["/region"],
    )
    h = Harness(view)
    h.publish("orders", 1, {"region": "EU", "price": 10})
    h.publish("orders", 2, {"region": "EU"})
    h.publish("orders", 3, {"region": "EU", "price": 20})
    assert h.view() == [{"region": "EU", "c": 2, "s": 30, "a": 15.0, "lo": 10}]
    h.delete("orders", 1)
    h.delete("orders", 3)
    # Only a NULL price left: COUNT is 0, the others are NULL and left out.
    assert h.view() == [{"region": "EU", "c": 0}]


def test_v5_weighted_average() -> None:
    view = ViewConfig(
        name="TOTAL_VALUE",
        underlying_topic="ORDERS",
        projection=[
            "/ClientId",
            "SUM(/Shares * /Price) AS /TotalCost",
            "SUM(/Shares * /Price) / SUM(/Shares) AS /WeightedAveragePrice",
        ],
        grouping=["/ClientId"],
    )
    h = Harness(view)
    h.publish("ORDERS", 1, {"ClientId": 7, "Shares": 100, "Price": 10})
    h.publish("ORDERS", 2, {"ClientId": 7, "Shares": 300, "Price": 20})
    assert h.view() == [{"ClientId": 7, "TotalCost": 7000, "WeightedAveragePrice": 17.5}]


def tcv(**extra: Any) -> ViewConfig:
    return ViewConfig(
        name="TOTAL_COMPANY_VOLUME",
        joins=["[ORDERS]./Tick = [COMPANIES]./Tick"],
        projection=[
            "[COMPANIES]./CompanyId",
            "[COMPANIES]./Tick",
            "[COMPANIES]./Name",
            "SUM([ORDERS]./Shares) AS /TotalVolume",
        ],
        grouping=["[ORDERS]./Tick"],
        **extra,
    )


def test_v6_join_and_fan_out() -> None:
    h = Harness(tcv())
    h.publish("ORDERS", 1, {"OrderID": 1, "Tick": "IBM", "Shares": 100})
    assert h.view() == [{"TotalVolume": 100}]
    h.publish("COMPANIES", 9, {"CompanyId": 9, "Tick": "IBM", "Name": "IBM Corp"})
    assert h.view() == [{"CompanyId": 9, "Tick": "IBM", "Name": "IBM Corp", "TotalVolume": 100}]
    h.publish("ORDERS", 2, {"OrderID": 2, "Tick": "IBM", "Shares": 50})
    assert h.view()[0]["TotalVolume"] == 150
    c = h.publish("COMPANIES", 9, {"CompanyId": 9, "Tick": "IBM", "Name": "IBM"})
    assert len(c) == 1  # both joined rows recomputed, one update for the group
    assert c[0].record == {"CompanyId": 9, "Tick": "IBM", "Name": "IBM", "TotalVolume": 150}
    assert h.publish("COMPANIES", 3, {"CompanyId": 3, "Tick": "MSFT", "Name": "Microsoft"}) == []
    h.delete("COMPANIES", 9)
    assert h.view() == [{"TotalVolume": 150}]
    h.delete("ORDERS", 1)
    c = h.delete("ORDERS", 2)
    assert len(c) == 1 and c[0].deleted and h.view() == []


def test_v6_preserved_side_is_decided_in_one_place() -> None:
    joins = [parse_join("[ORDERS]./Tick = [COMPANIES]./Tick")]
    assert preserved_topic(joins) == "ORDERS"
    assert preserved_topic(joins, "right") == "COMPANIES"
    assert JoinPlan(joins, "right").topics[0].topic == "COMPANIES"
    # Flipped: a company without orders appears, orders without a company do not.
    h = Harness(tcv(), preserve="right")
    h.publish("ORDERS", 1, {"OrderID": 1, "Tick": "IBM", "Shares": 100})
    assert h.view() == []
    h.publish("COMPANIES", 3, {"CompanyId": 3, "Tick": "MSFT", "Name": "Microsoft"})
    assert h.view() == [{"CompanyId": 3, "Tick": "MSFT", "Name": "Microsoft"}]


def test_inner_join_drops_unmatched_rows() -> None:
    h = Harness(tcv(), outer=False)
    h.publish("ORDERS", 1, {"OrderID": 1, "Tick": "IBM", "Shares": 100})
    assert h.view() == []
    h.publish("COMPANIES", 9, {"CompanyId": 9, "Tick": "IBM", "Name": "IBM Corp"})
    assert h.view() == [{"CompanyId": 9, "Tick": "IBM", "Name": "IBM Corp", "TotalVolume": 100}]
    h.delete("COMPANIES", 9)
    assert h.view() == []


def ab_view(**extra: Any) -> ViewConfig:
    return ViewConfig(
        name="AB",
        joins=["[A]./k = [B]./k"],
        projection=["[A]./id AS /a", "COUNT([B]./id) AS /matches"],
        grouping=["[A]./id"],
        **extra,
    )


@pytest.mark.parametrize("equivalency", [False, True])
def test_v7_null_equivalency(equivalency: bool) -> None:
    h = Harness(ab_view(join_null_equivalency=equivalency))
    h.publish("A", 1, {"id": 1})
    h.publish("B", 7, {"id": 7, "k": ""})
    h.publish("B", 8, {"id": 8, "k": None})
    assert h.view() == [{"a": 1, "matches": 2 if equivalency else 0}]


def test_v8_join_values_compare_as_strings() -> None:
    h = Harness(ab_view())
    h.publish("A", 1, {"id": 1, "k": 12345})
    h.publish("B", 2, {"id": 2, "k": "12345.00"})
    assert h.view() == [{"a": 1, "matches": 0}]
    h.publish("B", 3, {"id": 3, "k": "12345"})
    assert h.view() == [{"a": 1, "matches": 1}]


def test_v9_composite_join_key() -> None:
    view = ViewConfig(
        name="V9",
        joins=[
            "[Orders].[/OrderId]=[Extra].[/OrderId]",
            "[Orders].[/OrderType]=[Extra].[/OrderType]",
        ],
        projection=["[Orders]./OrderId AS /id", "[Extra]./note AS /note"],
        grouping=["[Orders]./OrderId"],
    )
    h = Harness(view)
    h.publish("Orders", 1, {"OrderId": 1, "OrderType": "A"})
    h.publish("Extra", 1, {"OrderId": 1, "OrderType": "B", "note": "b"})
    assert h.view() == [{"id": 1}]
    h.publish("Extra", 2, {"OrderId": 1, "OrderType": "A", "note": "a"})
    assert h.view() == [{"id": 1, "note": "a"}]


def test_v10_one_to_many_counts_each_joined_row() -> None:
    h = Harness(tcv())
    h.publish("COMPANIES", 9, {"CompanyId": 9, "Tick": "IBM", "Name": "IBM Corp"})
    h.publish("COMPANIES", 10, {"CompanyId": 10, "Tick": "IBM", "Name": "IBM Corp"})
    h.publish("ORDERS", 1, {"OrderID": 1, "Tick": "IBM", "Shares": 100})
    assert h.view()[0]["TotalVolume"] == 200


def test_chained_joins_over_different_pairs() -> None:
    view = ViewConfig(
        name="CHAIN",
        joins=[
            "[Orders]./CustomerID = [Addresses]./CustomerID",
            "[Orders]./ItemId = [Catalog]./ItemId",
        ],
        projection=[
            "[Orders]./OrderId AS /order",
            "[Addresses]./City AS /city",
            "[Catalog]./Title AS /title",
        ],
        grouping=["[Orders]./OrderId"],
    )
    h = Harness(view)
    h.publish("Orders", 1, {"OrderId": 1, "CustomerID": "c", "ItemId": "i"})
    h.publish("Catalog", "i", {"ItemId": "i", "Title": "Book"})
    assert h.view() == [{"order": 1, "title": "Book"}]
    h.publish("Addresses", "c", {"CustomerID": "c", "City": "Oslo"})
    assert h.view() == [{"order": 1, "city": "Oslo", "title": "Book"}]


def test_v13_view_records_under_a_subscriber_filter() -> None:
    h = Harness(by_region())
    flt = compile_filter("/total > 10")
    seen: list[tuple[str, int]] = []
    steps = [
        (1, {"orderId": 1, "region": "EU", "qty": 10}),
        (2, {"orderId": 2, "region": "EU", "qty": 5}),
        (1, {"orderId": 1, "region": "EU", "qty": 7}),
        (2, {"orderId": 2, "region": "US", "qty": 5}),
    ]
    for key, record in steps:
        for change in h.publish("orders", key, record):
            assert change.record is not None
            was = change.previous is not None and flt.matches(change.previous)
            now = flt.matches(change.record)
            if now:
                seen.append(("publish", change.record["total"]))
            elif was:
                seen.append(("oof match", change.record["total"]))
    assert seen == [("publish", 15), ("publish", 12), ("oof match", 7)]


def test_v14_aggregated_query_equals_the_view() -> None:
    h = Harness(by_region())
    records = {
        1: {"orderId": 1, "region": "EU", "qty": 10},
        2: {"orderId": 2, "region": "EU", "qty": 5.5},
        3: {"orderId": 3, "region": "US", "qty": "7"},
        4: {"orderId": 4, "qty": 1},
    }
    for key, record in records.items():
        h.publish("orders", key, record)
    query = parse_aggregation(
        "[/region]", "[/region, SUM(/qty) AS /total, COUNT(/orderId) AS /n]"
    ).aggregate(records.values())
    assert sorted(query, key=repr) == h.view()


def test_stddev_any_min_max_count_distinct_retract() -> None:
    view = ViewConfig(
        name="STATS",
        underlying_topic="t",
        projection=[
            "/g",
            "STDDEV_POP(/x) AS /pop",
            "STDDEV_SAMP(/x) AS /samp",
            "ANY(/x) AS /any",
            "MIN(/x) AS /lo",
            "MAX(/x) AS /hi",
            "COUNT_DISTINCT(/x) AS /d",
        ],
        grouping=["/g"],
    )
    h = Harness(view)
    for key, x in enumerate([2, 4, 4, 4, 5, 5, 7, 9]):
        h.publish("t", key, {"g": 1, "x": x})
    (record,) = h.view()
    assert record["pop"] == 2.0
    assert math.isclose(record["samp"], math.sqrt(32 / 7))
    assert (record["any"], record["lo"], record["hi"], record["d"]) == (2, 2, 9, 5)
    h.delete("t", 0)  # the minimum and ANY's pick leave
    h.delete("t", 7)  # the maximum leaves
    (record,) = h.view()
    assert (record["any"], record["lo"], record["hi"], record["d"]) == (4, 4, 7, 3)
    for key in range(1, 7):
        h.delete("t", key)
    assert h.view() == []


def test_nested_output_paths_and_bare_qualified_names() -> None:
    view = ViewConfig(
        name="NESTED",
        underlying_topic="lines",
        projection=["/orderId", "/detail/product", "SUM(/detail/qty) AS /detail/qty"],
        grouping=["/orderId", "/detail/product"],
    )
    h = Harness(view)
    h.publish("lines", 1, {"orderId": 42, "line": 1, "detail": {"product": "AAPL", "qty": 40}})
    h.publish("lines", 2, {"orderId": 42, "line": 2, "detail": {"product": "AAPL", "qty": 60}})
    assert h.view() == [{"orderId": 42, "detail": {"product": "AAPL", "qty": 100}}]


def test_type_qualified_single_topic_identifiers() -> None:
    view = ViewConfig(
        name="example_view",
        underlying_topic="[json].[example]",
        projection=["[json].[example]./id AS /id"],
        grouping=["[json].[example]./id"],
    )
    h = Harness(view)
    h.publish("example", 5, {"id": 5})
    assert h.view() == [{"id": 5}]


def test_key_domain_seeds_the_view_sow_keys() -> None:
    view = by_region().model_copy(update={"key_domain": "shared"})
    m = ViewMaintainer(view)
    (change,) = m.apply("orders", "1", None, {"orderId": 1, "region": "EU", "qty": 1}, seq=1)
    assert change.sow_key == sow_key_from_values("shared", ["EU"])


def test_replayed_change_is_ignored() -> None:
    m = ViewMaintainer(by_region())
    record = {"orderId": 1, "region": "EU", "qty": 1}
    assert m.apply("orders", "1", None, record, seq=5)
    assert m.apply("orders", "1", None, record, seq=5) == []
    assert m.apply("orders", "1", None, record, seq=4) == []
    assert list(m.records().values()) == [{"region": "EU", "total": 1, "n": 1}]


def test_unknown_topic_and_inconsistent_before_image_are_errors() -> None:
    m = ViewMaintainer(by_region())
    with pytest.raises(ValueError, match="does not read topic 'trades'"):
        m.apply("trades", "1", None, {"region": "EU"}, seq=1)
    with pytest.raises(ValueError, match="holds no rows"):
        m.apply("orders", "1", {"orderId": 1, "region": "EU", "qty": 1}, None, seq=2)


def test_min_max_pick_the_same_spelling_as_aggregated_queries() -> None:
    view = ViewConfig(
        name="SPELL",
        underlying_topic="t",
        projection=["/g", "MIN(/x) AS /lo", "MAX(/x) AS /hi"],
        grouping=["/g"],
    )
    h = Harness(view)
    records = {1: {"g": 7.0, "x": 7.0}, 2: {"g": "7", "x": 7}, 3: {"g": 7, "x": "7"}}
    for key, record in records.items():
        h.publish("t", key, record)
    assert h.view() == [{"g": 7, "lo": 7, "hi": 7}]
    assert type(h.view()[0]["hi"]) is int
    query = parse_aggregation("[/g]", "[/g, MIN(/x) AS /lo, MAX(/x) AS /hi]")
    assert query.aggregate(records.values()) == h.view()


def test_conditionals_in_projection_and_filter() -> None:
    """Projections may hold conditionals (IF) and CRC32, in and outside aggregates; so may the
    Filter. The result equals a recomputation after every change."""
    view = ViewConfig(
        name="SIZES",
        underlying_topic="t",
        projection=[
            "/g AS /g",
            "SUM(IF(/q > 5, /q, 0)) AS /bigQty",
            "COUNT(IF(/q > 5, /q, NULL)) AS /bigOrders",
            "IF(/q > 5, 'big', 'small') AS /lastSize",
        ],
        grouping=["/g"],
        filter="IF(/q > 100, 0, 1) = 1",
    )
    h = Harness(view)
    h.publish("t", 1, {"g": "a", "q": 7})
    h.publish("t", 2, {"g": "a", "q": 3})
    h.publish("t", 3, {"g": "a", "q": 300})  # outside the Filter
    assert h.view() == [{"g": "a", "bigQty": 7, "bigOrders": 1, "lastSize": "small"}]
    h.publish("t", 2, {"g": "a", "q": 9})
    assert h.view() == [{"g": "a", "bigQty": 16, "bigOrders": 2, "lastSize": "big"}]


@pytest.mark.parametrize(
    ("field", "function"),
    [("UNIX_TIMESTAMP() AS /t", "UNIX_TIMESTAMP"), ("SUM(/q OF PREVIOUS) AS /p", "OF PREVIOUS")],
)
def test_functions_that_differ_between_replays_are_refused_in_views(
    field: str, function: str
) -> None:
    with pytest.raises(ValueError, match=f"Field\\[2\\], position \\d+: {function} is only"):
        ViewConfig(name="V", underlying_topic="t", projection=["/g", field], grouping=["/g"])
