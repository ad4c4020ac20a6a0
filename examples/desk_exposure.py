"""Desk exposure as a maintained view: positions joined with limits, grouped by desk.

Run from the repository root, with a broker and a worker on examples/views.yaml:

    sowstream broker start
    sowstream worker --config examples/views.yaml &
    python examples/desk_exposure.py

The script subscribes to the view ``desk_exposure`` (desks over 80% of their limit, with
out-of-focus notices), publishes positions and limits, and prints what the view says. It never
computes an exposure itself: the engine keeps the view current as the underlying topics change.
See docs/views.md.
"""

from __future__ import annotations

import time

from sowstream import Client

TIMEOUT = 30.0


def wait_for(client: Client, view: str, check: object, what: str) -> list[dict[str, object]]:
    """Poll the view until ``check(records)`` holds (views are updated asynchronously)."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        records = [m.json() for m in client.sow(view, order_by="/desk") if m.command == "sow"]
        if check(records) or time.monotonic() > deadline:  # type: ignore[operator]
            print(f"{what}:")
            for record in records:
                print("   ", record)
            return records
        time.sleep(0.2)


def main() -> None:
    with Client(name="desk-exposure") as client:
        for topic in ("positions", "limits"):
            client.sow_delete(topic, filter="1=1")
        wait_for(client, "desk_exposure", lambda rs: rs == [], "start: no desks")

        watch = client.sow_and_subscribe("desk_exposure", "/exposure > 0.8 * /limit", options="oof")
        client.publish("limits", {"desk": "rates", "limit": 1_000_000})
        client.publish("limits", {"desk": "fx", "limit": 500_000})
        client.publish(
            "positions", {"desk": "rates", "symbol": "UST10", "qty": 5_000, "price": 98.5}
        )
        client.publish(
            "positions", {"desk": "rates", "symbol": "UST2", "qty": 2_000, "price": 99.8}
        )
        client.publish(
            "positions", {"desk": "fx", "symbol": "EURUSD", "qty": 300_000, "price": 1.08}
        )
        client.publish("positions", {"desk": "equities", "symbol": "IBM", "qty": 100, "price": 180})
        wait_for(
            client, "desk_exposure", lambda rs: len(rs) == 3, "three desks (equities has no limit)"
        )

        # fx crosses 80% of its limit: the subscription hears of it; then fx gets a higher limit
        # and leaves the filter (an oof, reason match).
        client.publish(
            "positions", {"desk": "fx", "symbol": "EURUSD", "qty": 400_000, "price": 1.08}
        )
        client.publish("limits", {"desk": "fx", "limit": 2_000_000})
        # The rates desk closes its positions: its record is deleted.
        client.sow_delete("positions", filter="/desk = 'rates'")
        wait_for(client, "desk_exposure", lambda rs: len(rs) == 2, "rates closed")
        wait_for(client, "firm_exposure", lambda rs: rs and rs[0]["desks"] == 2, "the firm")

        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = watch.next(timeout=0.5)
            if msg is not None and msg.command in ("publish", "oof"):
                print(f"subscription: {msg.command} {msg.reason or ''} {msg.json()}")
        watch.close()


if __name__ == "__main__":
    main()
