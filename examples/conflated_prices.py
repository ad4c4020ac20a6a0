"""Conflated prices: ticks published hundreds of times a second, read once a second per symbol.

Run from the repository root, with a broker and a worker on examples/conflated_prices.yaml:

    sowstream broker start
    sowstream worker --config examples/conflated_prices.yaml &
    python examples/conflated_prices.py

The script subscribes to the conflated topic ``prices-C``, publishes price ticks for three
symbols to ``prices`` as fast as it can for a few seconds, and prints what each side saw: many
ticks per symbol per second, at most one conflated update per symbol per second, and the last
conflated price equal to the last tick. See docs/conflated-topics.md.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

from sowstream import Client, Message

SYMBOLS = ("IBM", "MSFT", "ORCL")
SECONDS = 5.0
RATE = 600  # ticks per second over all symbols


def main() -> None:
    arrivals: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def on_conflated(msg: Message) -> None:
        if msg.command == "publish":
            tick = msg.json()
            arrivals[tick["sym"]].append((time.monotonic(), tick["px"]))

    with Client(name="conflated-prices") as client:
        client.sow_delete("prices", filter="1=1")
        time.sleep(2.0)  # the deletes reach prices-C at its next flush, before we subscribe
        sub = client.subscribe("prices-C", on_message=on_conflated)
        time.sleep(1.0)

        last: dict[str, float] = {}
        ticks = 0
        started = time.monotonic()
        while time.monotonic() - started < SECONDS:
            sym = SYMBOLS[ticks % len(SYMBOLS)]
            last[sym] = round(100 + ticks * 0.01, 2)
            client.publish("prices", {"sym": sym, "px": last[sym], "tick": ticks})
            ticks += 1
            time.sleep(1 / RATE)
        client.flush()
        time.sleep(2.5)  # one more Interval and then some: the last flush arrives
        sub.close()

    print(f"published {ticks} ticks over {SECONDS:.0f} s ({ticks / SECONDS:.0f}/s)")
    for sym in SYMBOLS:
        seen = arrivals[sym]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
        shortest = f"{min(gaps):.2f} s" if gaps else "-"
        final = seen[-1][1] if seen else None
        print(
            f"{sym}: {ticks // len(SYMBOLS)} ticks -> {len(seen)} conflated updates, "
            f"shortest gap between them {shortest}, last conflated px {final} "
            f"(last tick {last.get(sym)})"
        )


if __name__ == "__main__":
    main()
