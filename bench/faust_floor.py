"""faust's own per-event ceiling: an agent that only counts the log's records in batches.

Started by ``sow_bench`` on the same log as the worker, so the engine's apply rate can be read
against what faust alone delivers on this machine. Prints ``RATE <events/s>`` to stdout.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import faust


def main() -> None:
    bootstrap, app_id, topic, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        web_enabled=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        datadir=f"/tmp/{app_id}",
        stream_buffer_maxsize=8192,
    )
    source = app.topic(
        topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    seen = {"n": 0, "t0": 0.0}

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for events in stream.take_events(2_000, within=0.005):
            if not seen["n"]:
                seen["t0"] = time.perf_counter()
            seen["n"] += len(events)
            if seen["n"] >= total:
                rate = seen["n"] / (time.perf_counter() - seen["t0"])
                sys.__stdout__.write(f"RATE {rate:.0f}\n")
                sys.__stdout__.flush()
                os._exit(0)  # the measurement is all this process is for

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
